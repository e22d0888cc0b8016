//! `cotald backup` and `cotald restore`: an archive taken while agents talk, made into a new
//! data dir served on other ports, where the same credentials connect and a durable member
//! that was away is handed its whole backlog, once.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cotald::client::Replay;
use cotald::protocol::{Channel, InstanceId, Routing};

use crate::helper::{Cotald, Minted, Probe, cotald_in, endpoint, mint, next_text};

fn general() -> Routing {
    Routing::channel(&Channel::new("general").unwrap())
}

/// `m`'s credential (minted by the first appliance), reaching the restored one.
fn on(c: &Cotald, m: &Minted) -> Minted {
    Minted {
        id: m.id.clone(),
        creds: m.creds.clone(),
        link: format!("cotals://127.0.0.1:{}/main", c.state().listen.port()),
        ca: c.data_dir.join("tls/ca.pem"),
    }
}

#[tokio::test]
async fn a_backup_taken_under_traffic_is_restored_on_other_ports_and_the_backlog_delivered_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (first, second) = (tmp.path().join("first"), tmp.path().join("second"));
    let c = Cotald::up(&first).await;
    let alice = mint(&first, "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(&first, "bob", "main", &["--subscribe", "general"]).await;
    let carol = mint(&first, "carol", "main", &[]).await;
    let carol_id = InstanceId::from_user_nkey(&carol.id).unwrap();

    // bob: a durable member of general, away.
    let b = endpoint(&bob, |o| o.receive_backstop = false).await;
    b.client.join("general", Replay::Off).await.unwrap();
    b.client.close().await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    for i in 0..300 {
        a.client
            .send_text(general(), &format!("before-{i}"))
            .await
            .unwrap();
    }
    a.client
        .send_text(Routing::to(&carol_id), "dm-1")
        .await
        .unwrap();

    // alice keeps talking while the backup is taken.
    let stop = Arc::new(AtomicBool::new(false));
    let talking = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut sent = 0;
            while !stop.load(Ordering::Relaxed) && sent < 900 {
                a.client
                    .send_text(general(), &format!("during-{sent}"))
                    .await
                    .unwrap();
                sent += 1;
            }
            a.client.close().await;
            sent
        })
    };
    let archive = tmp.path().join("main.backup");
    let out = cotald_in(&first, &["backup", archive.to_str().unwrap()]).await;
    stop.store(true, Ordering::Relaxed);
    let during = talking.await.unwrap();
    assert!(
        out.status.success(),
        "backup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("backup written"), "{said}");
    let mode = std::fs::metadata(&archive).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the archive holds every key: owner-only");
    let again = cotald_in(&first, &["backup", archive.to_str().unwrap()]).await;
    assert!(!again.status.success(), "a backup never writes over a file");
    c.stop().await;

    // A new data dir; a directory in use is refused.
    let out = cotald_in(&second, &["restore", archive.to_str().unwrap()]).await;
    assert!(
        out.status.success(),
        "restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refused = cotald_in(&second, &["restore", archive.to_str().unwrap()]).await;
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not empty"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let profile = second.join("profile.toml");
    let mut c = Cotald::spawn(&second, &["--config", profile.to_str().unwrap()]);
    c.wait_stdout("cotald is ready").await;
    assert!(
        !second.join("restore").exists(),
        "every restored stream's files are gone once it is back"
    );

    // What the restored CHAT holds: everything before the backup, and a prefix of what was
    // said during it.
    let op = Probe::connect(&c, &second.join("spaces/main/local-operator.creds")).await;
    let js = async_nats::jetstream::new(op.client.clone());
    let held = js
        .get_stream("CHAT_main")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages;
    eprintln!("restored CHAT holds {held}; {during} were sent during the backup");
    assert!(held >= 300, "the backlog before the backup: {held}");
    assert!(held <= 300 + during as u64, "{held} of {during}");

    // bob, with the credential minted by the first appliance, gets all of it, in order, once.
    let mut bob = endpoint(&on(&c, &bob), |_| {}).await;
    let mut expected: Vec<String> = (0..300).map(|i| format!("before-{i}")).collect();
    expected.extend((0..held - 300).map(|i| format!("during-{i}")));
    let mut got = Vec::new();
    while got.len() < expected.len() {
        got.push(next_text(&mut bob).await);
    }
    assert_eq!(got, expected);
    let alice = endpoint(&on(&c, &alice), |o| o.presence = false).await;
    alice.client.send_text(general(), "after").await.unwrap();
    assert_eq!(next_text(&mut bob).await, "after", "nothing surfaced twice");

    // carol's DM, once.
    let mut carol = endpoint(&on(&c, &carol), |_| {}).await;
    assert_eq!(next_text(&mut carol).await, "dm-1");
    alice
        .client
        .send_text(Routing::to(&carol_id), "dm-2")
        .await
        .unwrap();
    assert_eq!(next_text(&mut carol).await, "dm-2", "the old DM not again");
    c.stop().await;
}
