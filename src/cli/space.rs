//! `cotald space add|list`: spaces of a running appliance; `list` also answers when it is
//! stopped, from what it recorded as served (`served.json` in the data dir).

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use super::DataDirArg;
use crate::ops::{Request, SpaceAdd, SpaceInfo};
use crate::profile::DeploymentProfile;

/// Options of `cotald space`.
#[derive(Debug, Args)]
pub struct SpaceArgs {
    #[command(subcommand)]
    command: SpaceCommand,
    #[command(flatten)]
    pub(super) data_dir: DataDirArg,
}

#[derive(Debug, Subcommand)]
enum SpaceCommand {
    /// Create a space on the running appliance: its account (no restart), streams and buckets.
    /// It is remembered in the data dir and served at every later start.
    Add {
        /// The space name: 1 to 64 characters from [A-Za-z0-9_-].
        name: String,
        /// local: channels durable by default; public: channels live by default.
        #[arg(long, value_enum, default_value = "local")]
        profile: DeploymentProfile,
    },
    /// List the spaces the appliance serves (when it is stopped: those it served last).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

pub(super) async fn run(args: SpaceArgs) -> anyhow::Result<ExitCode> {
    let dir = args.data_dir.resolve()?;
    let (req, json) = match &args.command {
        SpaceCommand::Add { name, profile } => (
            Request::SpaceAdd(SpaceAdd {
                name: name.clone(),
                profile: *profile,
            }),
            false,
        ),
        SpaceCommand::List { json } => (Request::SpaceList, *json),
    };
    let data = match super::admin_call(&dir, &req).await? {
        Some(data) => data,
        // Stopped: the spaces it served last are what it serves at the next start.
        None if matches!(args.command, SpaceCommand::List { .. }) => {
            let Some(last) = dir.read_last_served() else {
                bail!(
                    "no cotald has served data dir {} yet; start it with `cotald up`",
                    dir.root().display()
                );
            };
            eprintln!("cotald is not running; the spaces it served last:");
            serde_json::to_value(last.spaces)?
        }
        None => bail!(
            "no cotald is running on data dir {}; start it with `cotald up`",
            dir.root().display()
        ),
    };
    match args.command {
        SpaceCommand::Add { .. } => {
            let info: SpaceInfo = serde_json::from_value(data).context("malformed reply")?;
            println!(
                "space {} added ({})",
                info.name,
                format!("{:?}", info.profile).to_lowercase()
            );
            println!("  join link   {}", info.link);
            println!("  your creds  {}", info.operator_creds.display());
        }
        SpaceCommand::List { .. } if json => println!("{}", serde_json::to_string_pretty(&data)?),
        SpaceCommand::List { .. } => {
            let spaces: Vec<SpaceInfo> = serde_json::from_value(data).context("malformed reply")?;
            for s in spaces {
                println!(
                    "{:<16} {:<7} {}",
                    s.name,
                    format!("{:?}", s.profile).to_lowercase(),
                    s.link
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
