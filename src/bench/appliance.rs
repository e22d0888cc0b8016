//! The appliance under test: `cotald up` as a child process on a data dir of the bench's. Every
//! case, each node of `--cluster` and the startup case start it here, wait for it to say it is
//! ready, and stop it as an operator would (SIGTERM) or, for a failover, as a crash would
//! (SIGKILL).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rustix::process::{Pid, Signal, kill_process};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::TIMEOUT;
use crate::datadir::DataDir;

/// A `cotald up` child on a data dir (killed if dropped).
pub(crate) struct Appliance {
    child: tokio::process::Child,
    pub(crate) dir: DataDir,
    pub(crate) listen: SocketAddr,
}

impl Appliance {
    /// Starts `cotald up` on `dir` (on the profile `config`, when given; its stderr in `logs`)
    /// and waits until it says it is ready.
    pub(crate) async fn start(
        exe: &Path,
        dir: &Path,
        config: Option<&Path>,
        logs: &Path,
    ) -> anyhow::Result<Appliance> {
        let stderr = std::fs::File::create(logs.join("cotald-up.stderr"))?;
        let mut command = tokio::process::Command::new(exe);
        command
            .args([
                "up",
                "--listen",
                "127.0.0.1:0",
                "--dashboard",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(dir);
        if let Some(config) = config {
            command.arg("--config").arg(config);
        }
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .context("starting `cotald up`")?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let ready = tokio::time::timeout(TIMEOUT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("cotald is ready") {
                    return true;
                }
            }
            false
        })
        .await;
        if !matches!(ready, Ok(true)) {
            let log = std::fs::read_to_string(logs.join("cotald-up.stderr")).unwrap_or_default();
            bail!("the appliance under test did not become ready:\n{log}");
        }
        // Keep reading stdout so that the appliance never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let dir = DataDir::new(dir);
        let state = dir.read_state()?.context("no state.json while running")?;
        Ok(Appliance {
            child,
            dir,
            listen: state.listen,
        })
    }

    /// Stops it as an operator would (SIGTERM); kills it if it has not exited within 30 s.
    pub(crate) async fn stop(mut self) {
        if let Some(pid) = self.child.id().and_then(|id| Pid::from_raw(id as i32)) {
            let _ = kill_process(pid, Signal::TERM);
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }

    /// Kills it as a crash would (SIGKILL; its broker follows) and waits until it is gone;
    /// when it was killed.
    pub(crate) async fn kill(mut self) -> anyhow::Result<Instant> {
        self.child.start_kill()?;
        let killed = Instant::now();
        let _ = self.child.wait().await;
        Ok(killed)
    }
}
