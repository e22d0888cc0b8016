//! The appliance foundation: `up`, readiness, TLS-only access with minted users, broker
//! restarts, clean shutdown, restarts of cotald itself, and the refusals.

use std::os::unix::fs::PermissionsExt;

use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::helper::{
    Cotald, Probe, TIMEOUT, alive, cotald_bin, cotald_in, eventually, gone, into_a_closed_pipe,
    mint, mint_user, wait_event,
};

async fn round_trip(client: &async_nats::Client, subject: &str) {
    let mut sub = client.subscribe(subject.to_owned()).await.unwrap();
    client
        .publish(subject.to_owned(), "ping".into())
        .await
        .unwrap();
    let msg = tokio::time::timeout(TIMEOUT, sub.next())
        .await
        .expect("message within timeout")
        .expect("subscription open");
    assert_eq!(&msg.payload[..], b"ping");
}

async fn status_json(data_dir: &std::path::Path) -> (bool, serde_json::Value) {
    let out = tokio::process::Command::new(cotald_bin())
        .args(["status", "--json", "--data-dir"])
        .arg(data_dir)
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

#[tokio::test]
async fn up_becomes_ready_and_status_reports_it() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::spawn(tmp.path(), &[]);
    let ready = c.wait_stdout("cotald is ready").await;
    assert!(ready.contains("TLS on"), "{ready}");
    let link = c.wait_stdout("join link").await;
    let port = c.state().listen.port();
    assert!(
        link.ends_with(&format!("cotals://127.0.0.1:{port}/main")),
        "{link}"
    );

    let (ok, report) = status_json(tmp.path()).await;
    assert!(ok, "status exits 0 while healthy: {report}");
    assert_eq!(report["running"], true);
    assert_eq!(report["healthy"], true);
    assert_eq!(report["spaces"], serde_json::json!(["main"]));
    assert_eq!(
        report["reported_version"],
        cotald::supervisor::BUNDLED_VERSION
    );
    assert_eq!(report["broker_pid"], c.state().broker_pid);

    let conf = std::fs::read_to_string(tmp.path().join("run/nats-server.conf")).unwrap();
    for secret in [
        "keys/operator.nk",
        "keys/system/account.nk",
        "keys/spaces/main/signing.nk",
        "tls/ca.key",
        "tls/server.key",
        "spaces/main/local-operator.creds",
    ] {
        let mode = std::fs::metadata(tmp.path().join(secret))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{secret}");
        if secret.ends_with(".nk") {
            let seed = std::fs::read_to_string(tmp.path().join(secret)).unwrap();
            assert!(
                !conf.contains(seed.trim()),
                "{secret} leaked into the broker config"
            );
        }
    }
    c.stop().await;

    let (ok, report) = status_json(tmp.path()).await;
    assert!(!ok, "status exits non-zero once stopped");
    assert_eq!(report["running"], false);
}

#[tokio::test]
async fn minted_user_round_trips_over_tls_and_uses_jetstream() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let creds = mint_user(tmp.path(), "main", &tmp.path().join("alice.creds"));
    let client = Probe::try_connect(&c, &creds)
        .await
        .expect("TLS connect with the CA")
        .client;
    round_trip(&client, "cotal.main.probe").await;

    // The space account has JetStream (non-zero storage limits).
    let js = async_nats::jetstream::new(client.clone());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "PROBE".into(),
        subjects: vec!["probe.>".into()],
        ..Default::default()
    })
    .await
    .expect("JetStream enabled for the space account");
    let ack = js
        .publish("probe.one", "x".into())
        .await
        .unwrap()
        .await
        .unwrap();
    assert_eq!(ack.sequence, 1);

    // The machine operator's own credentials work too.
    let own = tmp.path().join("spaces/main/local-operator.creds");
    let client = Probe::connect(&c, &own).await.client;
    round_trip(&client, "cotal.main.own").await;
    c.stop().await;
}

#[tokio::test]
async fn plain_and_untrusted_connections_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let addr = c.state().listen;

    // Plain NATS: the server announces TLS and never answers a plaintext CONNECT.
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut info = String::new();
    read.read_line(&mut info).await.unwrap();
    assert!(info.contains("\"tls_required\":true"), "{info}");
    let _ = write
        .write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n")
        .await;
    // The server closes the plaintext session (at the latest when its 5 s TLS timeout fires).
    let mut rest = Vec::new();
    tokio::time::timeout(TIMEOUT, read.read_to_end(&mut rest))
        .await
        .expect("the server closes a plaintext session")
        .ok();
    let rest = String::from_utf8_lossy(&rest);
    assert!(!rest.contains("PONG"), "plaintext session answered: {rest}");

    // TLS without trusting the CA: the handshake fails.
    let creds = mint_user(tmp.path(), "main", &tmp.path().join("u.creds"));
    let untrusted = async_nats::ConnectOptions::with_credentials_file(&creds)
        .await
        .unwrap()
        .require_tls(true)
        .connect(format!("tls://{addr}"))
        .await;
    assert!(
        untrusted.is_err(),
        "a client that does not trust ca.pem must fail"
    );

    // Trusting the CA but without credentials: refused by the operator-mode server.
    let anonymous = async_nats::ConnectOptions::new()
        .add_root_certificates(tmp.path().join("tls/ca.pem"))
        .require_tls(true)
        .connect(format!("tls://{addr}"))
        .await;
    assert!(anonymous.is_err(), "no credentials, no connection");
    c.stop().await;
}

#[tokio::test]
async fn killed_broker_is_restarted_and_clients_reconnect() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::up(tmp.path()).await;
    let creds = mint_user(tmp.path(), "main", &tmp.path().join("u.creds"));
    let Probe { client, mut events } = Probe::connect(&c, &creds).await;
    let mut sub = client.subscribe("cotal.main.after").await.unwrap();

    let before = c.state();
    // SAFETY: plain syscall on the broker child.
    assert_eq!(
        unsafe { libc::kill(before.broker_pid as i32, libc::SIGKILL) },
        0
    );
    let line = c.wait_stderr("nats-server restarted").await;
    assert!(
        line.contains("killed by signal 9"),
        "the restart names the exit: {line}"
    );
    wait_event(&mut events, "disconnect", |e| {
        matches!(e, async_nats::Event::Disconnected)
    })
    .await;
    wait_event(&mut events, "reconnect", |e| {
        matches!(e, async_nats::Event::Connected)
    })
    .await;

    client
        .publish("cotal.main.after", "back".into())
        .await
        .unwrap();
    let msg = tokio::time::timeout(TIMEOUT, sub.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&msg.payload[..], b"back");

    // The state file is written once the supervisor has told the appliance (after the line).
    let after = wait_state(&c, "the new broker", |s| s.broker_pid != before.broker_pid).await;
    assert_eq!(
        after.listen, before.listen,
        "the restarted broker keeps its port"
    );
    assert_eq!(after.broker_restarts, 1);
    assert!(!alive(before.broker_pid));
    c.stop().await;
}

/// Polls the state file (nothing else signals its writes) until `pred` holds; bounded.
async fn wait_state(
    c: &Cotald,
    what: &str,
    pred: impl Fn(&cotald::datadir::RuntimeState) -> bool,
) -> cotald::datadir::RuntimeState {
    let pred = &pred;
    eventually(&format!("state.json showing {what}"), || async move {
        Some(c.state()).filter(|state| pred(state))
    })
    .await
}

/// A process stopped with SIGSTOP; if it is still there, stopped, when this is dropped (the
/// test failed before the appliance killed it), it is killed, so nothing is left behind.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        // SAFETY: plain syscall on the broker child.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0)).unwrap_or_default();
        let stopped = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']));
        if stopped {
            // SAFETY: plain syscalls on the process this guard stopped.
            unsafe {
                libc::kill(self.0 as i32, libc::SIGKILL);
                libc::kill(self.0 as i32, libc::SIGCONT);
            }
        }
    }
}

#[tokio::test]
async fn an_unresponsive_broker_is_killed_and_restarted() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::up(tmp.path()).await;
    let creds = mint_user(tmp.path(), "main", &tmp.path().join("u.creds"));
    let Probe { client, mut events } = Probe::connect(&c, &creds).await;
    let mut sub = client.subscribe("cotal.main.after").await.unwrap();
    let before = c.state();
    assert_eq!(before.broker_last_restart, None);

    // Stopped, the broker keeps its ports and the kernel accepts connections for it, but
    // HEALTHZ never answers.
    let stopped = Stopped::stop(before.broker_pid);
    let line = c.wait_stderr("nats-server restarted").await;
    assert!(
        line.contains("unresponsive: no answer to HEALTHZ"),
        "the restart names the reason: {line}"
    );
    assert!(
        gone(before.broker_pid),
        "the stopped broker was killed and reaped"
    );
    drop(stopped);

    wait_event(&mut events, "disconnect", |e| {
        matches!(e, async_nats::Event::Disconnected)
    })
    .await;
    wait_event(&mut events, "reconnect", |e| {
        matches!(e, async_nats::Event::Connected)
    })
    .await;
    client
        .publish("cotal.main.after", "back".into())
        .await
        .unwrap();
    let msg = tokio::time::timeout(TIMEOUT, sub.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&msg.payload[..], b"back");
    let mut fresh = Probe::connect(&c, &creds).await;
    fresh.barrier().await;

    let after = wait_state(&c, "the new broker", |s| s.broker_pid != before.broker_pid).await;
    assert_eq!(after.listen, before.listen, "the new broker keeps the port");
    // Healthy again once the services' connection is back too (until then status says it is
    // reconnecting).
    let dir = tmp.path();
    let report = eventually("status healthy again", || async move {
        let (ok, report) = status_json(dir).await;
        ok.then_some(report)
    })
    .await;
    assert_eq!(report["broker_restarts"], 1);
    let reason = report["broker_last_restart"]["reason"].as_str().unwrap();
    assert!(reason.starts_with("unresponsive: "), "{report}");
    assert!(
        report["broker_last_restart"]["at"]
            .as_str()
            .is_some_and(|at| at.ends_with('Z')),
        "{report}"
    );
    let text = tokio::time::timeout(
        TIMEOUT,
        tokio::process::Command::new(cotald_bin())
            .args(["status", "--data-dir"])
            .arg(tmp.path())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("status answers in time")
    .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("last restart") && text.contains(reason),
        "{text}"
    );
    c.stop().await;
}

#[tokio::test]
async fn a_killed_cotald_leaves_no_broker_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let mut first = Cotald::up(tmp.path()).await;
    let before = first.state();
    first.signal(libc::SIGKILL);
    first.wait_exit().await;

    // At once, on the same port.
    let listen = before.listen.to_string();
    let mut second = Cotald::spawn(tmp.path(), &["--listen", &listen]);
    second.wait_stdout("cotald is ready").await;
    assert!(gone(before.broker_pid), "the old broker is gone");
    let after = second.state();
    assert_eq!(after.listen, before.listen);
    assert_ne!(after.broker_pid, before.broker_pid);
    second.stop().await;
}

#[tokio::test]
async fn up_ends_a_broker_of_its_data_dir_left_running() {
    let tmp = tempfile::tempdir().unwrap();
    Cotald::up(tmp.path()).await.stop().await;

    // A broker of this data dir without its cotald: its own executable on its own config.
    let bin = std::fs::read_dir(tmp.path().join("bin"))
        .unwrap()
        .next()
        .expect("the installed nats-server")
        .unwrap()
        .path();
    let mut leftover = tokio::process::Command::new(bin)
        .arg("-c")
        .arg(tmp.path().join("run/nats-server.conf"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = leftover.id().unwrap();
    // Nothing signals that it has bound its listeners but the ports file it writes then.
    let suffix = format!("_{pid}.ports");
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let ports: serde_json::Value = loop {
        let written = std::fs::read_dir(tmp.path().join("run"))
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(&suffix))
            .and_then(|e| std::fs::read(e.path()).ok())
            .and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(ports) = written {
            break ports;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no ports file from the leftover broker"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let url = ports["nats"][0].as_str().unwrap();
    let port = url.rsplit_once(':').unwrap().1;

    // `up` on the port it holds: it ends the leftover, then starts its own.
    let listen = format!("127.0.0.1:{port}");
    let mut c = Cotald::spawn(tmp.path(), &["--listen", &listen]);
    let line = c.wait_stderr("was left running").await;
    assert!(line.contains(&pid.to_string()), "{line}");
    c.wait_stdout("cotald is ready").await;
    tokio::time::timeout(TIMEOUT, leftover.wait())
        .await
        .expect("the leftover broker exited")
        .unwrap();
    assert_eq!(c.state().listen.to_string(), listen);
    c.stop().await;
}

#[tokio::test]
async fn sigterm_exits_zero_and_leaves_no_child() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::up(tmp.path()).await;
    let broker = c.state().broker_pid;
    assert!(alive(broker));
    c.signal(libc::SIGTERM);
    let status = c.wait_exit().await;
    assert_eq!(status.code(), Some(0));
    assert!(
        !alive(broker),
        "the broker child is gone after cotald exits"
    );
    assert!(
        cotald::datadir::DataDir::new(tmp.path())
            .read_state()
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn sigint_also_stops_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::up(tmp.path()).await;
    let broker = c.state().broker_pid;
    c.signal(libc::SIGINT);
    assert_eq!(c.wait_exit().await.code(), Some(0));
    assert!(!alive(broker));
}

#[tokio::test]
async fn restart_on_the_same_data_dir_keeps_credentials_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let creds = mint_user(tmp.path(), "main", &tmp.path().join("u.creds"));
    let own = tmp.path().join("spaces/main/local-operator.creds");
    let own_before = std::fs::read_to_string(&own).unwrap();
    let ca_before = std::fs::read_to_string(tmp.path().join("tls/ca.pem")).unwrap();
    c.stop().await;

    let c = Cotald::up(tmp.path()).await;
    let client = Probe::try_connect(&c, &creds)
        .await
        .expect("old creds still connect")
        .client;
    round_trip(&client, "cotal.main.again").await;
    let own_after = std::fs::read_to_string(&own).unwrap();
    let id = |text: &str| {
        cotald::binding::Creds::parse(text)
            .unwrap()
            .public_key()
            .unwrap()
    };
    assert_eq!(
        id(&own_before),
        id(&own_after),
        "the operator keeps its identity"
    );
    assert_eq!(
        ca_before,
        std::fs::read_to_string(tmp.path().join("tls/ca.pem")).unwrap()
    );
    c.stop().await;
}

#[tokio::test]
async fn second_up_on_the_same_data_dir_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let first = Cotald::up(tmp.path()).await;
    let mut second = Cotald::spawn(tmp.path(), &[]);
    let status = second.wait_exit().await;
    assert!(!status.success());
    let err = second.drain_stderr().await;
    assert!(err.contains("already running"), "{err}");
    assert!(
        err.contains(&format!("pid {}", first.child.id().unwrap())),
        "{err}"
    );
    first.stop().await;
}

#[tokio::test]
async fn a_port_in_use_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut c = Cotald::spawn(tmp.path(), &["--listen", &addr]);
    let status = c.wait_exit().await;
    assert!(!status.success());
    let err = c.drain_stderr().await;
    assert!(err.contains(&format!("{addr} is already in use")), "{err}");
}

#[tokio::test]
async fn a_loose_key_store_is_refused_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    Cotald::up(tmp.path()).await.stop().await;
    let seed = tmp.path().join("keys/operator.nk");
    std::fs::set_permissions(&seed, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut c = Cotald::spawn(tmp.path(), &[]);
    assert!(!c.wait_exit().await.success());
    let err = c.drain_stderr().await;
    assert!(err.contains("chmod 600"), "{err}");
}

/// One agent cannot erase the record: 1,000 refused publishes with 200 KiB subjects (200 MB
/// the broker would have logged, quoted) grow the log by less than 1 MB, and the line the
/// broker wrote at its start is still in the current file, as is a count of what was left out.
#[tokio::test]
async fn one_agents_refusals_cannot_push_the_record_out_of_the_log() {
    const PUBLISHES: usize = 1000;
    const SUBJECT_LEN: usize = 200 * 1024;
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let log = tmp.path().join("log/nats-server.log");
    let before = std::fs::read_to_string(&log).unwrap();
    let first = before.lines().next().unwrap().to_owned();
    let agent = mint(tmp.path(), "flood", "main", &[]).await;
    let mut p = Probe::connect(&c, &agent.creds).await;
    let filler = "x".repeat(SUBJECT_LEN);
    for i in 0..PUBLISHES {
        p.client
            .publish(format!("cotal.main.chat.{i}.{filler}"), "x".into())
            .await
            .unwrap();
    }
    // The broker handles a connection's operations in order: once this round trip is answered,
    // every refusal before it was written to its stderr. Another identity's refusal, after it,
    // is logged in full: once it is in the file, the flood's lines before it were all read.
    // The flood (200 MB) is written out first, within the test's bound: a request queued
    // behind it would otherwise count it against its own timeout (10 s), which a slow
    // machine exceeds.
    tokio::time::timeout(TIMEOUT, p.client.flush())
        .await
        .expect("the flood written within the timeout")
        .unwrap();
    p.barrier().await;
    let other = mint(tmp.path(), "marker", "main", &[]).await;
    let mut m = Probe::connect(&c, &other.creds).await;
    m.client
        .publish("cotal.main.chat.x.end-of-flood", "x".into())
        .await
        .unwrap();
    m.barrier().await;
    let log_ref = &log;
    let after = eventually("the marker's refusal in the log", || async move {
        let text = std::fs::read_to_string(log_ref).ok()?;
        text.contains("end-of-flood").then_some(text)
    })
    .await;
    let grown: u64 = std::fs::read_dir(tmp.path().join("log"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum::<u64>()
        - before.len() as u64;
    eprintln!(
        "{} bytes of refused subjects grew the log by {grown} bytes",
        PUBLISHES * SUBJECT_LEN
    );
    assert!(grown < 1024 * 1024, "the log grew by {grown} bytes");
    assert!(
        after.starts_with(&first),
        "the first line is still there: {first}"
    );
    let shown = after.matches("Publish Violation").count();
    assert_eq!(
        shown,
        cotald::supervisor::REFUSALS_SHOWN as usize + 1,
        "the first refusals of the minute, and the marker's"
    );
    assert!(
        after.contains(&format!(
            "…({} bytes)",
            "cotal.main.chat.0.".len() + SUBJECT_LEN
        )),
        "a cut subject says its length"
    );

    // The appliance keeps serving: healthy, and a fresh connection works.
    let (ok, report) = status_json(tmp.path()).await;
    assert!(ok, "{report}");
    let mut fresh = Probe::connect(&c, &agent.creds).await;
    fresh.barrier().await;
    c.stop().await;
}

#[tokio::test]
async fn a_bad_hostname_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let long_label = format!("{}.example", "a".repeat(64));
    for bad in ["*", "a/b", " ", "", long_label.as_str()] {
        let out = tokio::time::timeout(
            TIMEOUT,
            tokio::process::Command::new(cotald_bin())
                .args([
                    "up",
                    "--listen",
                    "127.0.0.1:0",
                    "--hostname",
                    bad,
                    "--data-dir",
                ])
                .arg(&dir)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("refused at once")
        .unwrap();
        assert!(!out.status.success(), "{bad:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("{bad:?}")), "{bad:?}: {err}");
        assert!(err.contains("not a DNS name or an IP address"), "{err}");
        assert!(!dir.exists(), "{bad:?}: the data dir was created");
    }
}

#[tokio::test]
async fn status_into_a_closed_pipe_exits_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let c = Cotald::up(tmp.path()).await;
    for json in [false, true] {
        let mut args = vec!["status", "--data-dir", dir];
        if json {
            args.push("--json");
        }
        let out = into_a_closed_pipe(&args).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
    c.stop().await;
    // Not running: the exit code still says so.
    let out = into_a_closed_pipe(&["status", "--data-dir", dir]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_damaged_account_file_in_the_resolver_does_not_stop_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    c.stop().await;
    let mut damaged = 0;
    for entry in std::fs::read_dir(tmp.path().join("jwt")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "jwt") {
            std::fs::write(&path, "garbage").unwrap();
            damaged += 1;
        }
    }
    assert!(damaged > 0, "the resolver keeps account files");
    // The broker is ready although it cannot load the accounts; cotald pushes them again.
    let c = Cotald::up(tmp.path()).await;
    let alice = crate::helper::mint(tmp.path(), "alice", "main", &[]).await;
    let mut a = Probe::connect(&c, &alice.creds).await;
    a.barrier().await;
    c.stop().await;
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn down_stops_the_appliance_and_a_picked_port_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::up(tmp.path()).await;
    let first = c.state();
    let broker = first.broker_pid;

    let down = cotald_in(tmp.path(), &["down"]).await;
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert!(
        text(&down.stdout).contains(&format!("cotald stopped (pid {})", first.pid)),
        "{}",
        text(&down.stdout)
    );
    // `down` returns once the appliance has exited: nothing of it is left.
    let exited = tokio::time::timeout(std::time::Duration::from_secs(1), c.child.wait())
        .await
        .expect("cotald has exited when `down` returns")
        .unwrap();
    assert!(exited.success(), "a requested stop exits 0");
    assert!(gone(broker), "its broker is gone too");

    // Stopped: `down` has nothing to do, `status` says so in words and exits 1, `space list`
    // answers from what was served, and an offline mint names the port that will be reused.
    let again = cotald_in(tmp.path(), &["down"]).await;
    assert!(again.status.success());
    assert!(
        text(&again.stdout).contains("nothing to stop"),
        "{}",
        text(&again.stdout)
    );
    let status = cotald_in(tmp.path(), &["status"]).await;
    assert_eq!(status.status.code(), Some(1));
    assert!(
        text(&status.stdout).contains("not running") && text(&status.stdout).contains("cotald up"),
        "{}",
        text(&status.stdout)
    );
    let list = cotald_in(tmp.path(), &["space", "list"]).await;
    assert!(list.status.success(), "{}", text(&list.stderr));
    assert!(
        text(&list.stdout).starts_with("main "),
        "{}",
        text(&list.stdout)
    );
    assert!(text(&list.stderr).contains("not running"));
    let port = first.listen.port();
    let minted = mint(tmp.path(), "alice", "main", &[]).await;
    assert!(
        minted.link.contains(&format!("127.0.0.1:{port}/main")),
        "an offline mint names the port picked last time: {}",
        minted.link
    );

    // `--listen 127.0.0.1:0` again: the same port, so that link works; and the dashboard's
    // (`--dashboard 127.0.0.1:0`) too, so that its URL does.
    let c = Cotald::up(tmp.path()).await;
    assert_eq!(c.state().listen.port(), port);
    assert_eq!(
        c.state().dashboard,
        first.dashboard,
        "the dashboard's URL is kept"
    );
    let conn = crate::helper::endpoint(&minted, |_| {}).await;
    conn.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn a_taken_port_is_found_before_any_key_is_generated() {
    let tmp = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = cotald_in(tmp.path(), &["up", "--listen", &addr]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(&format!("{addr} is already in use")),
        "{}",
        text(&out.stderr)
    );
    assert!(!tmp.path().join("keys").exists(), "keys were generated");
    assert!(
        !tmp.path().join("tls").exists(),
        "TLS material was generated"
    );
}

#[tokio::test]
async fn version_completions_man_page_and_plain_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |args: &'static [&'static str]| async move {
        tokio::process::Command::new(cotald_bin())
            .args(args)
            .output()
            .await
            .unwrap()
    };
    let version = run(&["--version"]).await;
    let v = text(&version.stdout);
    assert!(
        v.contains(&format!(
            "nats-server {}",
            cotald::supervisor::BUNDLED_VERSION
        )),
        "{v}"
    );
    assert!(v.contains("Cotal Wire Specification v0.3"), "{v}");
    for (shell, args) in [
        ("bash", &["completions", "bash"]),
        ("zsh", &["completions", "zsh"]),
        ("fish", &["completions", "fish"]),
    ] {
        let script = run(args).await;
        assert!(script.status.success(), "{shell}");
        assert!(
            text(&script.stdout).contains("mint"),
            "{shell} completes subcommands"
        );
    }
    let man = run(&["man"]).await;
    assert!(text(&man.stdout).contains(".TH cotald 1"));
    // Every page the first one names is there.
    assert!(text(&man.stdout).contains("cotald\\-send(1)"));
    let send = run(&["man", "send"]).await;
    assert!(
        text(&send.stdout).contains(".TH cotald-send 1"),
        "{}",
        text(&send.stdout)
    );
    assert!(text(&send.stdout).contains("\\fBcotald send\\fR"));
    let set = run(&["man", "channels", "set"]).await;
    assert!(text(&set.stdout).contains(".TH cotald-channels-set 1"));
    let unknown = run(&["man", "nope"]).await;
    assert!(!unknown.status.success());
    assert!(text(&unknown.stderr).contains("has no command `nope`; it has: up"));

    // Logs into a pipe carry no colour codes; --log-format json prints one object per line.
    let mut c = Cotald::spawn(tmp.path(), &["--log-format", "json"]);
    let line = c.wait_stderr("phase: ready").await;
    let record: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
    assert_eq!(record["fields"]["message"], "phase: ready", "{line}");
    c.wait_stdout("cotald is ready").await;
    c.stop().await;
    let mut plain = Cotald::up(tmp.path()).await;
    let line = plain.wait_stderr("phase: ready").await;
    assert!(!line.contains('\u{1b}'), "ANSI in a pipe: {line:?}");
    plain.stop().await;
}

#[tokio::test]
async fn a_wildcard_listener_links_an_address_peers_can_dial() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::spawn(tmp.path(), &["--listen", "0.0.0.0:0"]);
    let remote = c.wait_stdout("remote peers").await;
    let last = cotald::datadir::DataDir::new(tmp.path())
        .read_last_served()
        .expect("served.json is written");
    let host = last.link_host.rsplit_once(':').unwrap().0.to_owned();
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_loopback() => {
            // No route off this machine: the banner says how to name one.
            assert!(remote.contains("--hostname"), "{remote}");
        }
        _ => {
            assert!(remote.contains(&last.link_host), "{remote}");
            // The certificate covers the address the links name: a minted agent connects
            // through it, TLS verified against the CA.
            let minted = mint(tmp.path(), "remote", "main", &[]).await;
            assert!(minted.link.contains(&last.link_host), "{}", minted.link);
            let conn = crate::helper::endpoint(&minted, |_| {}).await;
            conn.client.close().await;
        }
    }
    c.stop().await;
}

/// A service that panics is restarted like one that fails, and `status` says so: its restart
/// count and its reason (§8's services must not stop for good while `status` reads healthy).
/// The panic is injected by a fault hook that only debug builds have (no fault hook belongs in
/// a release binary), so the test is built with them only.
#[cfg(debug_assertions)]
#[tokio::test]
async fn a_panicking_service_is_restarted_and_status_json_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::spawn_with_env(tmp.path(), &[], &[("COTALD_FAULT_PANIC", "mentions")]);
    c.wait_stdout("cotald is ready").await;
    let restarted = |report: &serde_json::Value| {
        report["services"].as_array().and_then(|services| {
            services
                .iter()
                .find(|s| s["scope"] == "main" && s["name"] == "mentions")
                .filter(|s| s["restarts"].as_u64() >= Some(1) && s["state"] == "running")
                .cloned()
        })
    };
    let (dir, restarted) = (tmp.path(), &restarted);
    let service = eventually(
        "the panicked service restarted and running",
        || async move { restarted(&status_json(dir).await.1) },
    )
    .await;
    let reason = service["last_failure"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("panicked: fault injected"),
        "status names the panic: {service}"
    );
    let text = cotald_in(tmp.path(), &["status"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("mentions running, restarted once (last: panicked: fault injected"),
        "{text}"
    );
    c.stop().await;
}

/// A stop is bounded whatever the broker does: with the broker hung (SIGSTOP: its ports open,
/// nothing answered), `cotald down` returns within 10 s, and the broker is gone.
#[tokio::test]
async fn down_returns_within_ten_seconds_with_the_broker_hung() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::up(tmp.path()).await;
    let broker = c.state().broker_pid;
    let stopped = Stopped::stop(broker);
    let asked = std::time::Instant::now();
    let down = cotald_in(tmp.path(), &["down"]).await;
    let took = asked.elapsed();
    let exit = c.wait_exit().await;
    let log = c.drain_stderr().await;
    eprintln!("`cotald down` with the broker hung returned after {took:?}");
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert!(exit.success(), "exit {exit:?}\n{log}");
    assert!(gone(broker), "the hung broker was killed\n{log}");
    assert!(
        took < std::time::Duration::from_secs(10),
        "`cotald down` took {took:?} with the broker hung\n{log}"
    );
    drop(stopped);
}

/// The TCP ports `pid` listens on, read from `/proc` (its socket inodes matched against the
/// kernel's IPv4 and IPv6 tables).
fn listening_ports(pid: u32) -> std::collections::BTreeSet<u16> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let mut ports = std::collections::BTreeSet::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address, …, st (0A = LISTEN), …, inode
            if fields.len() > 9 && fields[3] == "0A" && inodes.contains(fields[9]) {
                let port = fields[1].rsplit_once(':').unwrap().1;
                ports.insert(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

#[tokio::test]
async fn the_broker_listens_only_on_its_client_port_which_demands_tls_and_credentials() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let state = c.state();
    assert_eq!(state.monitor, None, "no monitoring listener is recorded");
    let ports = listening_ports(state.broker_pid);
    assert_eq!(
        ports,
        std::collections::BTreeSet::from([state.listen.port()]),
        "the broker's listeners"
    );

    // What the client port says to a stranger before anything else: TLS and auth required.
    let mut stranger = tokio::net::TcpStream::connect(state.listen).await.unwrap();
    let mut info = vec![0; 4096];
    let n = tokio::time::timeout(
        TIMEOUT,
        tokio::io::AsyncReadExt::read(&mut stranger, &mut info),
    )
    .await
    .unwrap()
    .unwrap();
    let info = String::from_utf8_lossy(&info[..n]);
    assert!(info.starts_with("INFO "), "{info}");
    assert!(info.contains(r#""tls_required":true"#), "{info}");
    assert!(info.contains(r#""auth_required":true"#), "{info}");

    // Health and figures still come: status asks the broker over the system account.
    let (ok, report) = status_json(tmp.path()).await;
    assert!(ok, "status exits 0 while healthy: {report}");
    assert_eq!(report["healthy"], true);
    assert_eq!(
        report["reported_version"],
        cotald::supervisor::BUNDLED_VERSION
    );
    c.stop().await;
}

/// A log line that cannot be written never costs the appliance: `cotald up` whose stderr is a
/// pipe nobody reads any more (as a terminal that closed: every write fails) keeps serving, its
/// log goes to the data dir's `log/cotald.log`, and `mint` and `down` succeed.
#[tokio::test]
async fn an_appliance_whose_stderr_is_gone_keeps_serving_and_logs_to_its_data_dir() {
    use tokio::io::AsyncBufReadExt;
    let tmp = tempfile::tempdir().unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut up = tokio::process::Command::new(cotald_bin())
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--dashboard",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(tmp.path())
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(writer)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = tokio::io::BufReader::new(up.stdout.take().unwrap()).lines();
    tokio::time::timeout(TIMEOUT, async {
        while let Some(line) = stdout.next_line().await.unwrap() {
            if line.contains("cotald is ready") {
                return;
            }
        }
        panic!("cotald exited before it was ready");
    })
    .await
    .expect("ready in time");
    // Every request the appliance serves logs; none may fail for it.
    for name in ["bob", "carol"] {
        let minted = mint(tmp.path(), name, "main", &[]).await;
        assert!(minted.creds.exists(), "{}", minted.creds.display());
    }
    let down = cotald_in(tmp.path(), &["down"]).await;
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    let exit = tokio::time::timeout(TIMEOUT, up.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    let log = std::fs::read_to_string(tmp.path().join("log/cotald.log")).unwrap();
    assert!(log.contains("stderr failed"), "{log}");
    assert!(
        log.contains("minted"),
        "the log goes on in the file:\n{log}"
    );
}
