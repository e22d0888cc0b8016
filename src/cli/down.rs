//! `cotald down`: stop the appliance of a data dir, as Ctrl-C on its `cotald up` would, and
//! wait until it has exited (its data dir lock is released when the process is gone).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use super::DataDirArg;
use crate::ops::{Request, Stopping};

/// How long the appliance may take to stop: its services, then the broker's own graceful stop
/// (10 s before it is killed), with room to spare.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// Options of `cotald down`.
#[derive(Debug, Args)]
pub struct DownArgs {
    #[command(flatten)]
    pub(super) data_dir: DataDirArg,
}

pub(super) async fn run(args: DownArgs) -> anyhow::Result<ExitCode> {
    let dir = args.data_dir.resolve()?;
    let Some(data) = super::admin_call(&dir, &Request::Shutdown).await? else {
        println!(
            "cotald is not running (data dir {}): nothing to stop",
            dir.root().display()
        );
        return Ok(ExitCode::SUCCESS);
    };
    let stopping: Stopping = serde_json::from_value(data).context("malformed reply")?;
    let waiting = dir.clone();
    let exited = tokio::time::timeout(
        STOP_WAIT,
        tokio::task::spawn_blocking(move || waiting.wait_unlocked()),
    )
    .await;
    match exited {
        Ok(joined) => joined.context("waiting for the appliance to exit")??,
        Err(_) => bail!(
            "cotald (pid {pid}) was asked to stop but has not exited after {}s; its log says \
             why (stderr of `cotald up`); end it with `kill {pid}`",
            STOP_WAIT.as_secs(),
            pid = stopping.pid
        ),
    }
    println!("cotald stopped (pid {})", stopping.pid);
    Ok(ExitCode::SUCCESS)
}
