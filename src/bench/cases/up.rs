//! Startup: `cotald up` to ready, cold and warm, against the bundled nats-server alone.

use std::path::Path;
use std::time::Instant;

use crate::bench::{Appliance, Better, CaseResult, Sizes};

/// `cotald up` to ready, cold (a new data dir) and warm (the same one again), against the
/// bundled nats-server alone started on the config cotald rendered, to `/healthz` 200.
pub(in crate::bench) async fn startup(
    exe: &Path,
    tmp: &Path,
    sizes: Sizes,
) -> anyhow::Result<Vec<CaseResult>> {
    let (mut cold, mut warm, mut alone) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..sizes.runs {
        let dir = tmp.join(format!("startup{i}"));
        cold.push(time_up(exe, &dir, tmp).await?);
        warm.push(time_up(exe, &dir, tmp).await?);
        let broker_dir = dir.clone();
        alone.push(tokio::task::spawn_blocking(move || broker_alone::time(&broker_dir)).await??);
    }
    let baseline = "nats-server alone on the config cotald rendered, to /healthz 200";
    Ok(vec![
        CaseResult::new(
            "startup_cold",
            "ms",
            Better::Lower,
            (cold, alone.clone()),
            baseline,
            "as low as it goes",
        ),
        CaseResult::new(
            "startup_warm",
            "ms",
            Better::Lower,
            (warm, alone),
            baseline,
            "<= 3.0",
        ),
    ])
}

/// Starts `cotald up` on `dir` (its stderr in `logs`), waits until it is ready, stops it; the
/// time to ready in ms.
async fn time_up(exe: &Path, dir: &Path, logs: &Path) -> anyhow::Result<f64> {
    let start = Instant::now();
    let appliance = Appliance::start(exe, dir, None, logs).await?;
    let elapsed = start.elapsed();
    appliance.stop().await;
    Ok(elapsed.as_secs_f64() * 1e3)
}

mod broker_alone {
    use std::net::{SocketAddr, TcpStream};
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use anyhow::{Context, bail};
    use rustix::process::{Pid, Signal, kill_process};

    const TIMEOUT: Duration = Duration::from_secs(60);

    /// Spawns the installed broker of `dir` on the config cotald rendered there, with an HTTP
    /// monitoring port added (cotald asks over the system account instead, which a bare
    /// broker cannot be asked without a client), waits for `/healthz` 200, stops it; the time
    /// in ms.
    pub(super) fn time(dir: &Path) -> anyhow::Result<f64> {
        let broker = std::fs::read_dir(dir.join("bin"))?
            .flatten()
            .map(|e| e.path())
            .find(|p| !p.to_string_lossy().ends_with(".tmp"))
            .context("no installed broker")?;
        let ports_dir = dir.join("run");
        let mut conf = std::fs::read_to_string(dir.join("run/nats-server.conf"))?;
        conf.push_str("http: \"127.0.0.1:-1\"\n");
        let conf_path = dir.join("run/bench-broker.conf");
        std::fs::write(&conf_path, conf)?;
        let start = Instant::now();
        let mut child = Command::new(&broker)
            .arg("-c")
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let suffix = format!("_{}.ports", child.id());
        let result = (|| {
            let monitor = loop {
                if start.elapsed() > TIMEOUT {
                    bail!("nats-server did not write its ports file");
                }
                let found = std::fs::read_dir(&ports_dir)?
                    .flatten()
                    .find(|e| e.file_name().to_string_lossy().ends_with(&suffix));
                if let Some(entry) = found {
                    let ports: serde_json::Value =
                        serde_json::from_slice(&std::fs::read(entry.path())?).unwrap_or_default();
                    if let Some(url) = ports["monitoring"][0].as_str() {
                        let port: u16 = url.rsplit_once(':').context("port")?.1.parse()?;
                        break SocketAddr::from(([127, 0, 0, 1], port));
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            while !healthy(monitor) {
                if start.elapsed() > TIMEOUT {
                    bail!("nats-server never became healthy");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(start.elapsed().as_secs_f64() * 1e3)
        })();
        let _ = kill_process(Pid::from_child(&child), Signal::TERM);
        child.wait()?;
        result
    }

    fn healthy(addr: SocketAddr) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = TcpStream::connect(addr) else {
            return false;
        };
        let _ = s.write_all(b"GET /healthz?js-server-only=true HTTP/1.0\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.starts_with("HTTP/1.1 200") || out.starts_with("HTTP/1.0 200")
    }
}
