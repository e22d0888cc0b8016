//! How the packages run cotald. The service manager protocol (`sd_notify`, systemd's
//! `Type=notify`): the real appliance notifies a real datagram socket the test binds in place
//! of systemd's. The container's settings: the listener and hostnames from the environment.

use std::time::Duration;

use tokio::net::UnixDatagram;

use crate::helper::{Cotald, TIMEOUT, cotald_bin};

/// The next notification, bounded.
async fn notification(socket: &UnixDatagram) -> String {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(TIMEOUT, socket.recv(&mut buf))
        .await
        .expect("a notification within the timeout")
        .unwrap();
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

#[tokio::test]
async fn ready_is_notified_once_the_spaces_are_served_and_stopping_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let notify_path = tmp.path().join("notify.sock");
    let socket = UnixDatagram::bind(&notify_path).unwrap();
    let mut c = Cotald::spawn_with_env(
        &data,
        &[],
        &[("NOTIFY_SOCKET", notify_path.to_str().unwrap())],
    );

    // Everything before READY=1 is a status; READY=1 comes exactly once.
    let ready = loop {
        let message = notification(&socket).await;
        if message.lines().any(|l| l == "READY=1") {
            break message;
        }
        assert!(
            message.lines().all(|l| l.starts_with("STATUS=")),
            "before READY=1 only statuses: {message:?}"
        );
    };

    // At READY=1 the banner is out, the spaces are served and the broker is healthy.
    c.wait_stdout("cotald is ready").await;
    let status = tokio::process::Command::new(cotald_bin())
        .args(["status", "--json", "--data-dir"])
        .arg(&data)
        .output()
        .await
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(status.status.success(), "healthy at READY=1: {report}");
    assert_eq!(report["healthy"], true);
    assert_eq!(report["spaces"], serde_json::json!(["main"]));
    let state = c.state();
    assert!(
        ready.contains(&format!("STATUS=serving space main on {} ", state.listen)),
        "{ready:?}"
    );

    // The broker child does not inherit the socket: only cotald speaks to the manager.
    #[cfg(target_os = "linux")]
    let environ = std::fs::read(format!("/proc/{}/environ", state.broker_pid)).unwrap();
    #[cfg(target_os = "linux")]
    assert!(
        !environ
            .split(|b| *b == 0)
            .any(|var| var.starts_with(b"NOTIFY_SOCKET=")),
        "the broker inherited NOTIFY_SOCKET"
    );

    // Nothing more while it serves; STOPPING=1 once SIGTERM starts the teardown.
    let mut buf = [0u8; 64];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), socket.recv(&mut buf))
            .await
            .is_err(),
        "no notification while serving"
    );
    c.signal(libc::SIGTERM);
    let stopping = notification(&socket).await;
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    assert_eq!(c.wait_exit().await.code(), Some(0));
}

#[tokio::test]
async fn cotald_down_also_notifies_stopping() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let notify_path = tmp.path().join("notify.sock");
    let socket = UnixDatagram::bind(&notify_path).unwrap();
    let mut c = Cotald::spawn_with_env(
        &data,
        &[],
        &[("NOTIFY_SOCKET", notify_path.to_str().unwrap())],
    );
    while !notification(&socket).await.contains("READY=1") {}
    let down = tokio::process::Command::new(cotald_bin())
        .args(["down", "--data-dir"])
        .arg(&data)
        .output()
        .await
        .unwrap();
    assert!(down.status.success(), "{down:?}");
    assert!(notification(&socket).await.contains("STOPPING=1"));
    assert_eq!(c.wait_exit().await.code(), Some(0));
}

/// The packaged unit: a notify service whose data dir is its state directory, and a unit
/// `systemd-analyze verify` accepts (run where systemd's tools are installed).
#[tokio::test]
async fn the_packaged_unit_waits_for_ready_and_verifies() {
    let unit_path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/systemd/cotald.service"
    );
    let unit = std::fs::read_to_string(unit_path).unwrap();
    let settings: Vec<&str> = unit.lines().filter(|l| !l.starts_with('#')).collect();
    for expected in [
        "Type=notify",
        "StateDirectory=cotald",
        "Environment=COTALD_DATA_DIR=%S/cotald",
        "ExecStart=/usr/local/bin/cotald up",
        "KillMode=mixed",
        "ProtectSystem=strict",
        "NoNewPrivileges=true",
    ] {
        assert!(settings.contains(&expected), "the unit lacks {expected}");
    }

    // verify resolves ExecStart: point it at the binary under test.
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("cotald.service");
    std::fs::write(&copy, unit.replace("/usr/local/bin/cotald", cotald_bin())).unwrap();
    match tokio::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .await
    {
        Ok(out) => assert!(
            out.status.success() && out.stderr.is_empty(),
            "systemd-analyze verify: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("systemd-analyze is not installed: the unit was not verified");
        }
        Err(e) => panic!("cannot run systemd-analyze: {e}"),
    }
}

/// What the container image sets: `COTALD_LISTEN` on every interface, `COTALD_HOSTNAME` the
/// names clients dial (comma-separated), the first of which the links name.
#[tokio::test]
async fn listener_and_hostnames_come_from_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::spawn_with_env(
        tmp.path(),
        &[],
        &[
            ("COTALD_LISTEN", "0.0.0.0:0"),
            ("COTALD_HOSTNAME", "localhost,cotal.invalid"),
        ],
    );
    let link = c.wait_stdout("join link").await;
    let state = c.state();
    assert!(state.listen.ip().is_unspecified(), "{}", state.listen);
    let port = state.listen.port();
    assert!(
        link.ends_with(&format!("cotals://localhost:{port}/main")),
        "{link}"
    );
    // The certificate covers the name the links give: an agent dials it, TLS verified.
    let minted = crate::helper::mint(tmp.path(), "agent", "main", &[]).await;
    assert!(
        minted.link.contains(&format!("localhost:{port}")),
        "{}",
        minted.link
    );
    let conn = crate::helper::endpoint(&minted, |_| {}).await;
    conn.client.close().await;
    c.stop().await;
}
