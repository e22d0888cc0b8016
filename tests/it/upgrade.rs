//! Upgrades keep data. A data dir written by release 0.1.0 is kept in
//! `tests/fixtures/datadir-0.1.0.tar.gz` (made by [`write_the_fixture`], run once per release:
//! `cargo test --test it upgrade::write_the_fixture -- --ignored`), and every later build
//! starts it: its identities connect with the credentials minted then, a durable member gets
//! the backlog published while it was away, a DM and a queued task are delivered, a channel
//! config is kept; each once. A change to a stored format that breaks this needs a migration
//! and a line in the README's upgrade section.

use std::path::{Path, PathBuf};

use cotald::client::Replay;
use cotald::protocol::{Channel, InstanceId, Routing};

use crate::helper::{Cotald, Minted, endpoint, mint, next_text, operator_endpoint, set_channel};

const FIXTURE: &str = "tests/fixtures/datadir-0.1.0.tar.gz";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE)
}

fn general() -> Routing {
    Routing::channel(&Channel::new("general").unwrap())
}

/// Where the fixture keeps `name`'s credential (`spaces/main/creds/<name>-<id prefix>.creds`).
fn creds(c: &Cotald, name: &str) -> PathBuf {
    std::fs::read_dir(c.data_dir.join("spaces/main/creds"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with(&format!("{name}-")))
        })
        .unwrap_or_else(|| panic!("no credential of {name} in the fixture"))
}

/// An identity of the fixture, as the running appliance names its link.
fn identity(c: &Cotald, name: &str) -> Minted {
    Minted {
        id: String::new(),
        creds: creds(c, name),
        link: format!("cotals://127.0.0.1:{}/main", c.state().listen.port()),
        ca: c.data_dir.join("tls/ca.pem"),
    }
}

/// carol's id: the public key of her credential.
fn carol_key(c: &Cotald) -> String {
    let text = std::fs::read_to_string(creds(c, "carol")).unwrap();
    cotald::binding::Creds::parse(&text)
        .unwrap()
        .public_key()
        .unwrap()
}

/// Writes the fixture: space `main` with bob a durable member of `general` away while three
/// messages were posted, a DM waiting for carol, a task queued for role `reviewer` (rev), and
/// a channel config for `design`. Only what a data dir keeps across runs is archived (not the
/// installed broker, the runtime files or the logs).
#[tokio::test]
#[ignore = "writes tests/fixtures: run once per release"]
async fn write_the_fixture() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let c = Cotald::up(&dir).await;
    let alice = mint(&dir, "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(&dir, "bob", "main", &["--subscribe", "general"]).await;
    let carol = mint(&dir, "carol", "main", &[]).await;
    let carol_id = InstanceId::from_user_nkey(&carol.id).unwrap();
    let rev = mint(&dir, "rev", "main", &["--role", "reviewer"]).await;
    drop(rev);
    let b = endpoint(&bob, |o| o.receive_backstop = false).await;
    b.client.join("general", Replay::Off).await.unwrap();
    b.client.close().await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    for i in 0..3 {
        a.client
            .send_text(general(), &format!("backlog-{i}"))
            .await
            .unwrap();
    }
    a.client
        .send_text(Routing::to(&carol_id), "dm-1")
        .await
        .unwrap();
    a.client
        .send_text(Routing::to_service("reviewer"), "task-1")
        .await
        .unwrap();
    let op = operator_endpoint(&dir, &alice, false).await;
    set_channel(
        &op,
        "design",
        serde_json::json!({"description": "kept across upgrades"}),
    )
    .await;
    a.client.close().await;
    op.client.close().await;
    c.stop().await;
    let out = std::process::Command::new("tar")
        .args(["-czf"])
        .arg(fixture())
        .args(["--exclude=./bin", "--exclude=./run", "--exclude=./log"])
        .args(["--exclude=./cotald.lock", "-C"])
        .arg(&dir)
        .arg(".")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_data_dir_of_release_0_1_0_is_served_and_delivers_what_it_held_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    let out = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(fixture())
        .arg("-C")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = Cotald::up(&dir).await;

    // The durable member's backlog, once, then what is new.
    let alice = endpoint(&identity(&c, "alice"), |o| o.presence = false).await;
    let mut bob = endpoint(&identity(&c, "bob"), |_| {}).await;
    let backlog: Vec<String> = [
        next_text(&mut bob).await,
        next_text(&mut bob).await,
        next_text(&mut bob).await,
    ]
    .into();
    assert_eq!(backlog, ["backlog-0", "backlog-1", "backlog-2"]);
    alice.client.send_text(general(), "after").await.unwrap();
    assert_eq!(next_text(&mut bob).await, "after", "nothing surfaced twice");

    // The DM waiting for carol, once.
    let mut carol = endpoint(&identity(&c, "carol"), |_| {}).await;
    assert_eq!(next_text(&mut carol).await, "dm-1");
    let carol_id = InstanceId::from_user_nkey(&carol_key(&c)).unwrap();
    alice
        .client
        .send_text(Routing::to(&carol_id), "dm-2")
        .await
        .unwrap();
    assert_eq!(next_text(&mut carol).await, "dm-2", "the old DM not again");

    // The task queued for the role, once.
    let mut rev = endpoint(&identity(&c, "rev"), |o| o.role = Some("reviewer".into())).await;
    assert_eq!(next_text(&mut rev).await, "task-1");
    alice
        .client
        .send_text(Routing::to_service("reviewer"), "task-2")
        .await
        .unwrap();
    assert_eq!(
        next_text(&mut rev).await,
        "task-2",
        "the old task not again"
    );

    // The channel config.
    let registry = alice.client.channel_registry().await.unwrap();
    let design = registry
        .channels
        .get("design")
        .expect("design's config kept");
    assert_eq!(
        design.description.as_ref().map(|d| d.as_str()),
        Some("kept across upgrades")
    );
    for conn in [alice, bob, carol, rev] {
        conn.client.close().await;
    }
    c.stop().await;
}
