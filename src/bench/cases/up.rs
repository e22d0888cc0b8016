//! Startup: `cotald up` to ready, cold and warm, against the bundled nats-server alone.

use std::path::Path;

use crate::bench::{Better, CaseResult, Sizes};

/// `cotald up` to ready, cold (a new data dir) and warm (the same one again), against the
/// bundled nats-server alone started on the config cotald rendered, to `/healthz` 200.
pub(in crate::bench) async fn startup(
    exe: &Path,
    tmp: &Path,
    sizes: Sizes,
) -> anyhow::Result<Vec<CaseResult>> {
    let exe = exe.to_owned();
    let tmp = tmp.to_owned();
    tokio::task::spawn_blocking(move || {
        let (mut cold, mut warm, mut alone) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..sizes.runs {
            let dir = tmp.join(format!("startup{i}"));
            cold.push(startup::time_up(&exe, &dir)?);
            warm.push(startup::time_up(&exe, &dir)?);
            alone.push(startup::time_broker_alone(&dir)?);
        }
        let baseline = "nats-server alone on the config cotald rendered, to /healthz 200";
        anyhow::Ok(vec![
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
                "as low as it goes",
            ),
        ])
    })
    .await?
}

mod startup {
    use std::io::{BufRead, BufReader};
    use std::net::{SocketAddr, TcpStream};
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use anyhow::{Context, bail};

    const TIMEOUT: Duration = Duration::from_secs(60);

    /// Spawns `cotald up`, waits for its ready line, stops it; the time to ready in ms.
    pub(super) fn time_up(exe: &Path, dir: &Path) -> anyhow::Result<f64> {
        let start = Instant::now();
        let mut child = Command::new(exe)
            .args([
                "up",
                "--listen",
                "127.0.0.1:0",
                "--dashboard",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(dir)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().context("stdout")?;
        let ready = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("cotald is ready"));
        let elapsed = start.elapsed();
        // SAFETY: a plain signal to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait()?;
        if !ready {
            bail!("cotald up on {} did not become ready", dir.display());
        }
        Ok(elapsed.as_secs_f64() * 1e3)
    }

    /// Spawns the installed broker of `dir` on the config cotald rendered there, with an HTTP
    /// monitoring port added (cotald asks over the system account instead, which a bare
    /// broker cannot be asked without a client), waits for `/healthz` 200, stops it; the time
    /// in ms.
    pub(super) fn time_broker_alone(dir: &Path) -> anyhow::Result<f64> {
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
        // SAFETY: a plain signal to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
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
