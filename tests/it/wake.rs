//! An idle agent woken through its host's push when something is addressed to it: Claude
//! Code's channel event (`notifications/claude/channel`) once per DM (sent from a second MCP
//! session) it then reads, one wake
//! for a burst, a DM that came before the host was initialized still announced once it is, and
//! the inbox resource said updated to a host that subscribed to it.

use std::time::{Duration, Instant};

use rmcp::model::{CustomNotification, ResourceUpdatedNotificationParam, SubscribeRequestParams};
use rmcp::service::NotificationContext;
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use cotald::protocol::{InstanceId, Routing};

use crate::helper::{Cotald, Probe, TIMEOUT, endpoint, eventually, mint};
use crate::mcp::{Agent, agent_as, call, initialize, launch};

/// What the host was told.
#[derive(Debug)]
enum Told {
    /// A channel event: when it arrived, its content and meta.
    Wake {
        at: Instant,
        content: String,
        meta: Value,
    },
    /// `cotal://inbox` was said updated.
    InboxUpdated,
}

/// A host that records the wakes and inbox updates it gets, as they arrive.
struct Host(mpsc::UnboundedSender<Told>);

impl ClientHandler for Host {
    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        if notification.method == "notifications/claude/channel" {
            let params = notification.params.unwrap_or_default();
            let _ = self.0.send(Told::Wake {
                at: Instant::now(),
                content: params["content"].as_str().unwrap_or_default().to_owned(),
                meta: params["meta"].clone(),
            });
        }
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        if params.uri == "cotal://inbox" {
            let _ = self.0.send(Told::InboxUpdated);
        }
    }
}

/// The next wake (counting the inbox updates on the way), within `bound`; `None` past it.
async fn next_wake(
    told: &mut mpsc::UnboundedReceiver<Told>,
    updates: &mut usize,
    bound: Duration,
) -> Option<(Instant, String, Value)> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        match tokio::time::timeout_at(deadline, told.recv()).await {
            Ok(Some(Told::Wake { at, content, meta })) => return Some((at, content, meta)),
            Ok(Some(Told::InboxUpdated)) => *updates += 1,
            Ok(None) | Err(_) => return None,
        }
    }
}

/// Takes what waits (no wait), as the agent does once woken: the texts.
async fn read(agent: &Agent) -> Vec<String> {
    let got = call(agent, "cotal_inbox", json!({"limit": 200})).await;
    got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap().to_owned())
        .collect()
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

#[tokio::test]
#[allow(deprecated)] // resources/subscribe: what hosts of the current revisions send.
async fn an_idle_agent_is_woken_once_per_dm_and_once_for_a_burst() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let sender = endpoint(&alice, |o| o.presence = false).await;
    let to_bob = Routing::to(&InstanceId::from_user_nkey(&bob.id).unwrap());
    let general = Routing::channel(&cotald::protocol::Channel::new("general").unwrap());
    let (tx, mut told) = mpsc::unbounded_channel();
    let b = agent_as(&bob, Host(tx)).await;
    b.subscribe(SubscribeRequestParams::new("cotal://inbox"))
        .await
        .expect("the inbox can be subscribed to");
    call(&b, "cotal_orientation", json!({})).await;
    let mut updates = 0;

    // 100 DMs from a second MCP session, one at a time: each wakes the idle agent, which
    // reads it. Timed from just before the send was asked for (an upper bound on publish →
    // wake).
    let a = crate::mcp::agent(&alice).await;
    let bob_id = InstanceId::from_user_nkey(&bob.id).unwrap();
    let mut latencies = Vec::new();
    for i in 0..100 {
        let text = format!("dm {i}");
        let sent = Instant::now();
        call(&a, "cotal_dm", json!({"to": bob_id.as_str(), "text": text})).await;
        let (at, content, meta) = next_wake(&mut told, &mut updates, TIMEOUT)
            .await
            .unwrap_or_else(|| panic!("no wake for {text}"));
        latencies.push(at - sent);
        assert!(content.contains("1 DM from alice"), "{content}");
        assert!(!content.contains(&text), "a wake names who, never the text");
        assert_eq!(meta["dms"], "1", "{meta}");
        assert_eq!(read(&b).await, [text]);
    }
    latencies.sort_unstable();
    eprintln!(
        "publish → wake over 100 DMs: p50 {:?}, p95 {:?}, max {:?}",
        percentile(&latencies, 50),
        percentile(&latencies, 95),
        latencies[latencies.len() - 1]
    );
    assert!(updates >= 99, "the inbox resource said updated: {updates}");

    // A burst while the agent does not read: one wake outstanding, then none once it read.
    for i in 0..5 {
        let text = format!("burst {i}");
        sender
            .client
            .send_text(to_bob.clone(), &text)
            .await
            .unwrap();
    }
    next_wake(&mut told, &mut updates, TIMEOUT)
        .await
        .expect("the burst wakes the agent");
    let second = next_wake(&mut told, &mut updates, Duration::from_secs(2)).await;
    assert!(
        second.is_none(),
        "a second wake while one is unread: {second:?}"
    );
    assert_eq!(read(&b).await.len(), 5);
    let after = next_wake(&mut told, &mut updates, Duration::from_secs(1)).await;
    assert!(after.is_none(), "a wake for what was read: {after:?}");

    // Channel traffic wakes the agent when it mentions it, or where it asked for every message.
    let post = |text: &'static str, mentions: &'static [&'static str]| {
        let (client, general) = (sender.client.clone(), general.clone());
        async move {
            let mentions: Vec<String> = mentions.iter().map(|m| m.to_string()).collect();
            let parts = vec![cotald::protocol::Part::text(text)];
            client.send(general, parts, &mentions).await.unwrap();
        }
    };
    post("nothing for bob", &[]).await;
    post("@bob have a look", &["bob"]).await;
    let (_, content, meta) = next_wake(&mut told, &mut updates, TIMEOUT)
        .await
        .expect("a mention wakes the agent");
    assert!(content.contains("1 mention in #general"), "{content}");
    assert_eq!(
        (&meta["mentions"], &meta["count"]),
        (&json!("1"), &json!("1"))
    );
    // The mention comes first: what is addressed to the agent before what it overhears.
    assert_eq!(read(&b).await, ["@bob have a look", "nothing for bob"]);
    call(
        &b,
        "cotal_channel_mode",
        json!({"channel": "general", "mode": "all"}),
    )
    .await;
    post("news for everyone", &[]).await;
    let (_, content, _) = next_wake(&mut told, &mut updates, TIMEOUT)
        .await
        .expect("every message wakes the agent where it asked");
    assert!(content.contains("1 message in #general"), "{content}");
    assert_eq!(read(&b).await, ["news for everyone"]);
    b.cancel().await.unwrap();
    a.cancel().await.unwrap();
    sender.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn a_dm_sent_before_the_host_initialized_wakes_the_agent_once_it_has() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let sender = endpoint(&alice, |o| o.presence = false).await;
    let to_bob = Routing::to(&InstanceId::from_user_nkey(&bob.id).unwrap());
    let transport = launch(&bob);
    sender
        .client
        .send_text(to_bob, "before you were ready")
        .await
        .unwrap();
    // The server has connected and taken the DM into its inbox: it waits unacknowledged.
    let op = Probe::connect(&c, &tmp.path().join("spaces/main/local-operator.creds")).await;
    let js = async_nats::jetstream::new(op.client.clone());
    let durable = cotald::binding::dm_durable(&bob.id);
    eventually("the DM taken by the unready server", || {
        let (js, durable) = (js.clone(), durable.clone());
        async move {
            let stream = js.get_stream("DM_main").await.ok()?;
            let info = stream.consumer_info(&durable).await.ok()?;
            (info.num_ack_pending == 1).then_some(())
        }
    })
    .await;

    let (tx, mut told) = mpsc::unbounded_channel();
    let b = initialize(transport, Host(tx)).await;
    let mut updates = 0;
    let (_, content, _) = next_wake(&mut told, &mut updates, TIMEOUT)
        .await
        .expect("the DM is announced once the host is initialized");
    assert!(content.contains("1 DM from alice"), "{content}");
    assert_eq!(read(&b).await, ["before you were ready"]);
    b.cancel().await.unwrap();
    sender.client.close().await;
    c.stop().await;
}
