//! Leaf node mode (`[leaf]`): the appliance joins a plain nats-server hub started here (the
//! bundled binary, its own config, no JetStream); space traffic crosses both ways, JetStream and
//! KV subjects do not, and local agents are served whether the hub is up or not.

use std::path::Path;
use std::time::Duration;

use cotald::client::Replay;
use cotald::protocol::{Channel, Routing};
use futures_util::StreamExt;

use crate::helper::{Cotald, Probe, TIMEOUT, delivery, endpoint, mint};

fn general() -> Routing {
    Routing::channel(&Channel::new("general").unwrap())
}

fn text(d: &cotald::client::Delivery) -> String {
    serde_json::to_value(&d.message.parts[0]).unwrap()["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A port nothing listens on now, below the kernel's ephemeral range (32768 and up on Linux),
/// so that no listener of a parallel test, which binds port 0, can take it before the process
/// it is meant for binds it.
pub(crate) fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Spread by process and by call: parallel tests of this binary never pick the same one.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = (std::process::id() % 1_000) as u16 * 12;
    loop {
        let port = 20_000 + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The nats-server `cotald up` installed in `data_dir`.
pub(crate) fn installed_broker(data_dir: &Path) -> std::path::PathBuf {
    std::fs::read_dir(data_dir.join("bin"))
        .unwrap()
        .next()
        .expect("the installed nats-server")
        .unwrap()
        .path()
}

/// A plain hub: client and leaf listeners on loopback, no auth, no JetStream.
fn start_hub(bin: &Path, dir: &Path, client: u16, leaf: u16) -> tokio::process::Child {
    std::fs::create_dir_all(dir).unwrap();
    let conf = dir.join("hub.conf");
    std::fs::write(
        &conf,
        format!(
            "server_name: hub\nhost: \"127.0.0.1\"\nport: {client}\n\
             leafnodes {{\n  host: \"127.0.0.1\"\n  port: {leaf}\n}}\n"
        ),
    )
    .unwrap();
    tokio::process::Command::new(bin)
        .arg("-c")
        .arg(&conf)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Connects to the hub, waiting for it to listen (bounded).
async fn hub_client(port: u16) -> async_nats::Client {
    tokio::time::timeout(
        TIMEOUT,
        async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(format!("nats://127.0.0.1:{port}")),
    )
    .await
    .expect("the hub listens in time")
    .unwrap()
}

/// Publishes from `publish` until `sub` receives one (the leaf connection and its interest are
/// up once something crosses); returns what crossed.
async fn until_crossed(
    sub: &mut async_nats::Subscriber,
    mut publish: impl AsyncFnMut(),
) -> async_nats::Message {
    tokio::time::timeout(TIMEOUT, async {
        loop {
            publish().await;
            if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(250), sub.next()).await
            {
                return m;
            }
        }
    })
    .await
    .expect("traffic crosses the leaf connection in time")
}

#[tokio::test]
async fn a_leaf_appliance_exchanges_with_its_hub_and_serves_locally_without_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("leaf");
    let (hub_port, leaf_port) = (free_port(), free_port());
    let profile = tmp.path().join("leaf.toml");
    std::fs::write(
        &profile,
        format!(
            "{}\n[leaf]\nremote = \"nats-leaf://127.0.0.1:{leaf_port}\"\n",
            cotald::profile::EMBEDDED_LOCAL
        ),
    )
    .unwrap();
    let mut c = Cotald::spawn(&data, &["--config", profile.to_str().unwrap()]);
    c.wait_stdout("cotald is ready").await;
    let conf = std::fs::read_to_string(data.join("run/nats-server.conf")).unwrap();
    let account = cotald::provision::KeyStore::open(&data.join("keys"))
        .unwrap()
        .space("main")
        .unwrap()
        .account_public();
    assert!(conf.contains(&format!("account: \"{account}\"")), "{conf}");
    assert!(conf.contains("deny_imports"), "{conf}");

    // The hub is down: the appliance serves its agents all the same.
    let alice = mint(&data, "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(&data, "bob", "main", &[]).await;
    let a = endpoint(&alice, |_| {}).await;
    let mut b = endpoint(&bob, |_| {}).await;
    b.client.join("general", Replay::Off).await.unwrap();
    a.client.send_text(general(), "no hub yet").await.unwrap();
    assert_eq!(text(&delivery(&mut b.deliveries).await), "no hub yet");

    // The hub comes up: the leaf connects to it on its own.
    let mut hub = start_hub(
        &installed_broker(&data),
        &tmp.path().join("hub"),
        hub_port,
        leaf_port,
    );
    let hub_nc = hub_client(hub_port).await;

    // Leaf to hub: an agent's post reaches a subscriber of the hub.
    let mut at_hub = hub_nc.subscribe("cotal.main.chat.>").await.unwrap();
    hub_nc.flush().await.unwrap();
    let crossed = until_crossed(&mut at_hub, async || {
        a.client.send_text(general(), "to the hub").await.unwrap();
    })
    .await;
    let body: serde_json::Value = serde_json::from_slice(&crossed.payload).unwrap();
    assert_eq!(body["parts"][0]["text"], "to the hub");
    assert_eq!(
        crossed.subject.as_str(),
        format!("cotal.main.chat.{}.general", alice.id)
    );

    // Hub to leaf: a hub publisher reaches a local subscriber.
    let local = Probe::connect(&c, &data.join("spaces/main/local-operator.creds")).await;
    let mut from_hub = local
        .client
        .subscribe("cotal.main.chat.HUBSIDE.>")
        .await
        .unwrap();
    let mut kv_seen = local.client.subscribe("$KV.>").await.unwrap();
    local.client.flush().await.unwrap();
    let publisher = hub_nc.clone();
    until_crossed(&mut from_hub, async || {
        publisher
            .publish("cotal.main.chat.HUBSIDE.hub", "from the hub".into())
            .await
            .unwrap();
        publisher.flush().await.unwrap();
    })
    .await;

    // What never crosses: the leaf's JetStream API and its buckets.
    let asked = tokio::time::timeout(TIMEOUT, hub_nc.request("$JS.cotald.API.INFO", "".into()))
        .await
        .expect("the request ends in time");
    assert!(
        asked.is_err(),
        "the leaf's JetStream answered the hub: {asked:?}"
    );
    hub_nc
        .publish("$KV.cotal_presence_main.HUBSIDE", "{}".into())
        .await
        .unwrap();
    // Sent after it on the same connection: once this has crossed, so would have the KV put.
    hub_nc
        .publish("cotal.main.chat.HUBSIDE.after", "barrier".into())
        .await
        .unwrap();
    hub_nc.flush().await.unwrap();
    loop {
        let m = tokio::time::timeout(TIMEOUT, from_hub.next())
            .await
            .expect("the barrier crosses")
            .unwrap();
        if m.subject.as_str() == "cotal.main.chat.HUBSIDE.after" {
            break;
        }
    }
    // Both subscriptions share one connection, read in order: a crossed KV put would already
    // be queued (local presence heartbeats are, and are fine).
    while let Ok(Some(m)) = tokio::time::timeout(Duration::ZERO, kv_seen.next()).await {
        assert!(
            !m.subject.contains("HUBSIDE"),
            "a KV put from the hub crossed: {}",
            m.subject
        );
    }

    // The hub goes away: local agents keep working.
    hub.kill().await.unwrap();
    let mut got = Vec::new();
    a.client.send_text(general(), "hub gone").await.unwrap();
    while got.last().is_none_or(|t| t != "hub gone") {
        got.push(text(&delivery(&mut b.deliveries).await));
    }
    c.stop().await;
}
