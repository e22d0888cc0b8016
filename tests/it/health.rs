//! Health that follows delivery: `cotald status` exits 0 only while delivery progresses, says
//! `DEGRADED` with the reason (and exits 1) when it does not, and the appliance serves again
//! on its own after its connection is cut.

use std::path::Path;
use std::time::{Duration, Instant};

use cotald::client::{Connection, Replay};
use cotald::protocol::{Channel, Routing};

use crate::helper::{Cotald, TIMEOUT, cotald_in, delivery, endpoint, mint};

fn general() -> Routing {
    Routing::channel(&Channel::new("general").unwrap())
}

/// `cotald status --json` once: whether it exited 0, and what it said.
async fn status(dir: &Path) -> (bool, serde_json::Value) {
    let out = cotald_in(dir, &["status", "--json"]).await;
    let said = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.success(), said)
}

/// Polls `status` every 100 ms until `seen` holds of it, for at most `within`; returns how
/// long that took and what it said.
async fn status_until(
    dir: &Path,
    within: Duration,
    what: &str,
    seen: impl Fn(bool, &serde_json::Value) -> bool,
) -> (Duration, serde_json::Value) {
    let start = Instant::now();
    let mut last = serde_json::Value::Null;
    while start.elapsed() < within {
        let (ok, said) = status(dir).await;
        if seen(ok, &said) {
            return (start.elapsed(), said);
        }
        last = said;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("status never showed {what} within {within:?}; last:\n{last:#}");
}

/// A profile like the embedded one, with a stall threshold of `stall_after`.
fn profile_with_stall(dir: &Path, stall_after: &str) -> std::path::PathBuf {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/local.toml")).unwrap();
    let path = dir.join("profile.toml");
    std::fs::write(
        &path,
        format!("{text}\n[spaces.main.delivery]\nstall_after = \"{stall_after}\"\n"),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn a_stuck_reader_makes_status_degraded_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let profile = profile_with_stall(tmp.path(), "5s");
    let mut c = Cotald::spawn(&data, &["--config", profile.to_str().unwrap()]);
    c.wait_stdout("cotald is ready").await;
    let alice = mint(&data, "alice", "main", &["--allow-publish", "general"]).await;
    let dave = mint(&data, "dave", "main", &["--subscribe", "general"]).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    let mut d = endpoint(&dave, |_| {}).await;
    d.client.join("general", Replay::Off).await.unwrap();
    let (ok, said) = status(&data).await;
    assert!(ok, "healthy before: {said:#}");

    // Dave's application takes the messages and never acknowledges them.
    let sent = Instant::now();
    for i in 0..5 {
        a.client
            .send_text(general(), &format!("m{i}"))
            .await
            .unwrap();
    }
    let mut taken = Vec::new();
    for _ in 0..5 {
        taken.push(delivery(&mut d.deliveries).await);
    }
    let (_, said) = status_until(&data, TIMEOUT, "dave stalled", |ok, said| {
        !ok && said["degraded"].to_string().contains(&dave.id)
    })
    .await;
    let after = sent.elapsed();
    eprintln!(
        "stalled after {after:?} (threshold 5 s): {}",
        said["degraded"]
    );
    assert!(
        after <= Duration::from_secs(15),
        "within 10 s of the threshold"
    );
    assert!(!said["healthy"].as_bool().unwrap());
    let member = said["delivery"]["main"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == dave.id.as_str())
        .unwrap_or_else(|| panic!("dave among the online members: {said:#}"));
    assert_eq!(member["name"], "dave");
    assert!(member["stalled"].as_bool().unwrap(), "{member}");
    assert!(member["unacknowledged"].as_u64().unwrap() > 0, "{member}");
    assert!(member["waiting_secs"].as_u64().unwrap() >= 5, "{member}");
    let text = cotald_in(&data, &["status"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    // The dashboard's health page says so too (its state follows within a second).
    let site = crate::dashboard::Site::of(&c).await;
    site.page_with(
        "/health",
        &[r#"<span class="health-degraded">DEGRADED</span>"#, &dave.id],
    )
    .await;
    assert!(
        text.contains("DEGRADED") && text.contains("STALLED"),
        "{text}"
    );

    // Once the application handles them, delivery goes on and status is healthy again.
    for t in taken {
        t.ack().await.unwrap();
    }
    status_until(&data, TIMEOUT, "healthy again", |ok, _| ok).await;
    for conn in [a, d] {
        conn.client.close().await;
    }
    c.stop().await;
}

/// Every service serves: the manager answers a durable join, an online member gets a post
/// live and its durable copy is confirmed, a member that was away catches up.
async fn serving(dir: &Path, poster: &Connection, away: &crate::helper::Minted, round: &str) {
    let newcomer = mint(
        dir,
        &format!("newcomer-{round}"),
        "main",
        &["--subscribe", "general"],
    )
    .await;
    let mut n = endpoint(&newcomer, |_| {}).await;
    let joined = tokio::time::timeout(TIMEOUT, async {
        loop {
            match n.client.join("general", Replay::Off).await {
                Ok(report) => return report,
                Err(e) => {
                    eprintln!("join refused for now: {e}");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    })
    .await
    .expect("the manager answers a join");
    assert_eq!(joined.durable, cotald::client::DurableState::Established);
    let text = format!("after {round}");
    poster.client.send_text(general(), &text).await.unwrap();
    let got = delivery(&mut n.deliveries).await;
    assert_eq!(crate::helper::next_text_of(&got), text);
    got.ack().await.unwrap();
    let mut a = endpoint(away, |_| {}).await;
    loop {
        let d = delivery(&mut a.deliveries).await;
        let t = crate::helper::next_text_of(&d);
        d.ack().await.unwrap();
        if t == text {
            break;
        }
    }
    for conn in [n, a] {
        conn.client.close().await;
    }
}

#[tokio::test]
async fn a_cut_connection_is_reported_and_every_service_serves_again() {
    let tmp = tempfile::tempdir().unwrap();
    // In a debug build the appliance closes the services' connection for good once, 3 s
    // after it is up (a fault hook that release builds do not have).
    let env: &[(&str, &str)] = match cfg!(debug_assertions) {
        true => &[("COTALD_FAULT_CLOSE", "main")],
        false => &[],
    };
    let mut c = Cotald::spawn_with_env(tmp.path(), &[], env);
    c.wait_stdout("cotald is ready").await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    crate::helper::join_durable_and_leave_the_room(&bob, "general").await;
    let a = endpoint(&alice, |o| o.presence = false).await;

    if cfg!(debug_assertions) {
        // Found by the connection watch within its probe interval, dialed again at once: the
        // window is too short to catch with `status`, so its log and its record say it.
        c.wait_stderr("the connection to the broker is closed; dialing again")
            .await;
        c.wait_stderr("connected again").await;
        let restarted_and_healthy = |ok: bool, said: &serde_json::Value| {
            ok && said["services"].as_array().is_some_and(|services| {
                services
                    .iter()
                    .any(|s| s["name"] == "manager" && s["restarts"].as_u64() > Some(0))
            })
        };
        let (_, said) = status_until(
            tmp.path(),
            TIMEOUT,
            "the services restarted and healthy",
            restarted_and_healthy,
        )
        .await;
        let restarted: Vec<&str> = said["services"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["restarts"].as_u64() > Some(0))
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        eprintln!("restarted on the new connection: {restarted:?}");
        serving(tmp.path(), &a, &bob, "closed").await;
    }

    // The broker killed: the supervisor starts it again, the services reconnect.
    let broker = c.state().broker_pid;
    // SAFETY: plain syscall on the appliance's child.
    assert_eq!(unsafe { libc::kill(broker as i32, libc::SIGKILL) }, 0);
    let (took, said) = status_until(tmp.path(), TIMEOUT, "DEGRADED", |ok, _| !ok).await;
    eprintln!(
        "broker killed: DEGRADED after {took:?}: {}",
        said["degraded"]
    );
    let (took, _) = status_until(tmp.path(), TIMEOUT, "healthy again", |ok, _| ok).await;
    eprintln!("healthy again {took:?} later");
    serving(tmp.path(), &a, &bob, "restarted").await;
    a.client.close().await;
    c.stop().await;
}
