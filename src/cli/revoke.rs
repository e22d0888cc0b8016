//! `cotald revoke`: end an identity of a space.

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use super::DataDirArg;
use crate::ops::{IdentityRecord, Request, Revoke};

/// Options of `cotald revoke`.
#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The identity's name (or its id).
    name: String,
    /// The space it belongs to [default: main].
    #[arg(long, value_name = "SPACE")]
    pub(super) space: Option<String>,
    #[command(flatten)]
    pub(super) data_dir: DataDirArg,
}

pub(super) async fn run(args: RevokeArgs) -> anyhow::Result<ExitCode> {
    let dir = args.data_dir.resolve()?;
    let req = Request::Revoke(Revoke {
        space: args
            .space
            .clone()
            .unwrap_or_else(|| super::DEFAULT_SPACE.to_owned()),
        name: args.name.clone(),
    });
    let Some(data) = super::admin_call(&dir, &req).await? else {
        bail!(
            "no cotald is running on data dir {}; start it with `cotald up` (a revocation must \
             reach the broker)",
            dir.root().display()
        );
    };
    let record: IdentityRecord = serde_json::from_value(data).context("malformed reply")?;
    // The credential `mint` wrote where it writes by default is of no use any more.
    let creds = super::endpoint::default_creds_path(&dir, &record);
    let removed = match std::fs::remove_file(&creds) {
        Ok(()) => format!("; its credential file {} deleted", creds.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => format!(
            "; its credential file {} could not be deleted: {e}",
            creds.display()
        ),
    };
    super::stdout(|out| {
        writeln!(
            out,
            "revoked {} ({}) in space {}: its connections are closed, its durables and backlog \
             deleted{removed}",
            record.name, record.id, record.space
        )
    })?;
    Ok(ExitCode::SUCCESS)
}
