//! Startup figures: `cotald up` cold (fresh data dir) and warm (existing keys and store) to
//! ready, against the bundled nats-server alone started on the very config cotald rendered,
//! measured in the same run. Prints medians and ratios; asserts nothing about time.
//!
//! Run: `cargo bench --bench startup` (optionally `-- RUNS`, default 10).

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);

fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10);
    let cotald = env!("CARGO_BIN_EXE_cotald");
    let tmp = tempfile::tempdir().unwrap();

    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for i in 0..runs {
        let dir = tmp.path().join(format!("cold{i}"));
        cold.push(time_up(cotald, &dir));
        warm.push(time_up(cotald, &dir));
    }
    // The child alone, on the config cotald generated (operator mode, TLS, JetStream).
    let conf_dir = tmp.path().join("cold0");
    let broker = std::fs::read_dir(conf_dir.join("bin"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| !p.to_string_lossy().ends_with(".tmp"))
        .unwrap();
    let conf = conf_dir.join("run/nats-server.conf");
    let mut child_alone = Vec::new();
    for _ in 0..runs {
        child_alone.push(time_child(&broker, &conf, &conf_dir.join("run")));
    }

    let (cold, warm, alone) = (median(cold), median(warm), median(child_alone));
    println!("startup to ready, median of {runs} runs");
    println!("  nats-server alone (same config)  {:>8.1} ms", ms(alone));
    println!(
        "  cotald up, warm restart          {:>8.1} ms  ({:.2}x the child alone)",
        ms(warm),
        ratio(warm, alone)
    );
    println!(
        "  cotald up, cold (new data dir)   {:>8.1} ms  ({:.2}x the child alone)",
        ms(cold),
        ratio(cold, alone)
    );
}

/// Spawns `cotald up`, waits for its ready line, stops it with SIGTERM.
fn time_up(cotald: &str, dir: &Path) -> Duration {
    let start = Instant::now();
    let mut child = Command::new(cotald)
        .args(["up", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("cotald is ready"));
    let elapsed = start.elapsed();
    assert!(ready, "cotald did not become ready");
    assert!(elapsed < TIMEOUT);
    // SAFETY: plain syscall on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success());
    elapsed
}

/// Spawns nats-server on `conf`, waits for `/healthz` 200 (as cotald does), kills it.
fn time_child(broker: &Path, conf: &Path, ports_dir: &Path) -> Duration {
    let start = Instant::now();
    let mut child = Command::new(broker)
        .arg("-c")
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let suffix = format!("_{}.ports", child.id());
    let monitor = loop {
        assert!(
            start.elapsed() < TIMEOUT,
            "nats-server did not become ready"
        );
        let found = std::fs::read_dir(ports_dir)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(&suffix));
        if let Some(entry) = found {
            let ports: serde_json::Value =
                serde_json::from_slice(&std::fs::read(entry.path()).unwrap()).unwrap_or_default();
            if let Some(url) = ports["monitoring"][0].as_str() {
                let port: u16 = url.rsplit_once(':').unwrap().1.parse().unwrap();
                break SocketAddr::from(([127, 0, 0, 1], port));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    while !healthy(monitor) {
        assert!(start.elapsed() < TIMEOUT, "nats-server never healthy");
        std::thread::sleep(Duration::from_millis(1));
    }
    let elapsed = start.elapsed();
    // SAFETY: plain syscall on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    elapsed
}

fn healthy(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200") || out.starts_with("HTTP/1.0 200")
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}
