//! `cotald space add|list`: spaces of a running appliance.

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use super::DataDirArg;
use crate::daemon::admin;
use crate::ops::{Request, SpaceAdd, SpaceInfo};
use crate::profile::DeploymentProfile;

/// Options of `cotald space`.
#[derive(Debug, Args)]
pub struct SpaceArgs {
    #[command(subcommand)]
    command: SpaceCommand,
    #[command(flatten)]
    data_dir: DataDirArg,
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
    /// List the spaces the running appliance serves.
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
    let Some(data) = admin::call(&dir, &req).await? else {
        bail!(
            "no cotald is running on data dir {}; start it with `cotald up`",
            dir.root().display()
        );
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
