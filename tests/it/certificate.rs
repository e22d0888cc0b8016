//! The server certificate is renewed while the appliance runs: an appliance up longer than the
//! certificate's lifetime keeps accepting new clients, and the clients connected before the
//! renewal stay connected. A lifetime of seconds stands for a year. And a client that connects
//! while the broker reloads (what a renewal makes it do) is not told its credential was refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::helper::{Cotald, Probe, TIMEOUT, mint, mint_user};

/// The shortest lifetime the profile accepts is 10 s; 15 s renews after 10 s.
const LIFETIME: Duration = Duration::from_secs(15);

#[tokio::test]
async fn the_server_certificate_is_renewed_before_it_ends_and_new_clients_still_connect() {
    let tmp = tempfile::tempdir().unwrap();
    let local =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/local.toml")).unwrap();
    let profile = tmp.path().join("short.toml");
    let text = local.replacen(
        "[broker]\n",
        &format!(
            "[broker]\ncertificate_lifetime = \"{}s\"\n",
            LIFETIME.as_secs()
        ),
        1,
    );
    assert_ne!(text, local, "the profile has a [broker] table");
    std::fs::write(&profile, text).unwrap();
    let dir = tmp.path().join("data");

    let issued = Instant::now();
    let mut c = Cotald::spawn(&dir, &["--config", profile.to_str().unwrap()]);
    c.wait_stdout("cotald is ready").await;
    let first = std::fs::read(dir.join("tls/server.pem")).unwrap();
    let creds = mint_user(&dir, "main", &tmp.path().join("user.creds"));
    let mut before = Probe::connect(&c, &creds).await;

    // Renewed with a third of its life left, and loaded by the broker.
    c.wait_stderr("server certificate renewed").await;
    let renewed = std::fs::read(dir.join("tls/server.pem")).unwrap();
    assert_ne!(first, renewed, "a new certificate is written");

    // Past the end of the first certificate: a client that connects now verifies the one the
    // broker presents, so it connects only if the broker loaded the renewed one.
    let first_ends = issued + LIFETIME + Duration::from_secs(1);
    tokio::time::sleep_until(first_ends.into()).await;
    let mut after = Probe::try_connect(&c, &creds)
        .await
        .unwrap_or_else(|e| panic!("no new connection after the first certificate ended: {e}"));
    after.barrier().await;

    // The client connected before the renewal was never cut off.
    before.barrier().await;
    while let Ok(event) = before.events.try_recv() {
        assert!(
            !matches!(event, async_nats::Event::Disconnected),
            "the renewal disconnected a client"
        );
    }
    let state = c.state();
    let renewal = state
        .services
        .iter()
        .find(|s| s.scope == "appliance" && s.name == "certificate")
        .expect("the renewal is a service of the appliance");
    assert_eq!(
        renewal.health,
        cotald::ops::status::Health::Running,
        "{renewal:?}"
    );
    c.stop().await;
}

/// A broker that reloads its configuration refuses the connections that register in that
/// instant, whatever their credential. Reloads back to back (a renewal makes one): every
/// connect of a valid credential succeeds, and says nothing of a refusal.
#[tokio::test]
async fn a_client_connecting_while_the_broker_reloads_is_not_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let broker = c.state().broker_pid as i32;
    let stop = Arc::new(AtomicBool::new(false));
    let reloads = Arc::new(AtomicUsize::new(0));
    let reloading = tokio::spawn({
        let (stop, reloads) = (stop.clone(), reloads.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: a signal to the broker's pid, read from the appliance's state.
                assert_eq!(unsafe { libc::kill(broker, libc::SIGHUP) }, 0);
                reloads.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    let link = cotald::protocol::JoinLink::parse(&alice.link).unwrap();
    let creds = std::fs::read_to_string(&alice.creds).unwrap();
    // Connects until at least 30 were made and the broker reloaded at least 10 times
    // meanwhile (a connect takes a few milliseconds, a reload comes every 100).
    let started = std::time::Instant::now();
    let mut attempt = 0;
    while attempt < 30 || reloads.load(Ordering::Relaxed) < 10 {
        assert!(
            started.elapsed() < TIMEOUT,
            "the broker did not reload 10 times within {TIMEOUT:?}"
        );
        attempt += 1;
        let mut opts = cotald::client::ConnectOptions::new(link.clone(), creds.clone());
        opts.ca = Some(alice.ca.clone());
        let connected = tokio::time::timeout(TIMEOUT, cotald::client::Client::connect(opts))
            .await
            .expect("connect in time");
        match connected {
            Ok(conn) => {
                conn.client.close().await;
            }
            Err(e) => panic!("connect {attempt} during reloads: {e} ({e:?})"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    reloading.await.unwrap();
    let log = std::fs::read_to_string(tmp.path().join("log/nats-server.log")).unwrap();
    assert!(log.contains("Reloaded server configuration"), "{log}");
    c.stop().await;
}
