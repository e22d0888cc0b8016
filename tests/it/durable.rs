//! Durable delivery (§4 `durable`, §7 membership, §8 trusted reader, §9 items 5–6): the
//! manager and the backstop reader of the running appliance, seen through real clients.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use cotald::binding::interval_consumer;
use cotald::client::{Connection, DurableState, Replay};
use cotald::protocol::{Channel, Routing};
use serde_json::json;

use crate::helper::{
    Cotald, Minted, Probe, TIMEOUT, delivery, endpoint, eventually,
    join_durable_and_leave_the_room, mint,
};

fn channel(name: &str) -> Routing {
    Routing::channel(&Channel::new(name).unwrap())
}

fn text(d: &cotald::client::Delivery) -> String {
    serde_json::to_value(&d.message.parts[0]).unwrap()["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Publishes the texts `{prefix}{i}` on `ch`, 64 acks in flight; returns them in stream
/// order (concurrent publishes may be stored in another order than they were started).
async fn publish(
    poster: &Connection,
    ch: &str,
    prefix: &str,
    range: std::ops::Range<usize>,
) -> Vec<String> {
    use futures_util::StreamExt;
    let mut stored: Vec<(u64, String)> = futures_util::stream::iter(range)
        .map(|i| {
            let client = poster.client.clone();
            let text = format!("{prefix}{i}");
            async move {
                let (_, seq) = client.send_text(channel(ch), &text).await.unwrap();
                (seq, text)
            }
        })
        .buffered(64)
        .collect()
        .await;
    stored.sort();
    stored.into_iter().map(|(_, text)| text).collect()
}

/// Receives until `want` distinct texts arrived; every copy is durable and acked once
/// handled. Returns the texts in arrival order.
async fn receive(conn: &mut Connection, want: usize) -> Vec<String> {
    let mut texts = Vec::with_capacity(want);
    while texts.len() < want {
        let d = delivery(&mut conn.deliveries).await;
        assert!(d.durable && d.needs_ack(), "a durable copy: {d:?}");
        texts.push(text(&d));
        d.ack().await.unwrap();
    }
    texts
}

/// The machine operator's JetStream view (to read consumer state).
async fn operator(c: &Cotald, dir: &Path) -> async_nats::jetstream::Context {
    let probe = Probe::connect(c, &dir.join("spaces/main/local-operator.creds")).await;
    async_nats::jetstream::new(probe.client)
}

/// Waits until the interval consumer has nothing pending and nothing unacknowledged.
async fn drained(js: &async_nats::jetstream::Context, consumer: &str) {
    drained_on(js, "CHAT_main", consumer).await;
}

/// Waits until `consumer` of `stream` has nothing pending and nothing unacknowledged.
async fn drained_on(js: &async_nats::jetstream::Context, stream: &str, consumer: &str) {
    let stream = &js.get_stream(stream).await.unwrap();
    eventually(&format!("{consumer} drained"), || async move {
        match stream.consumer_info(consumer).await {
            Ok(info) => (info.num_pending == 0 && info.num_ack_pending == 0).then_some(()),
            Err(_) => Some(()), // deleted: its interval is fully delivered
        }
    })
    .await;
}

#[tokio::test]
async fn a_returning_member_gets_its_backlog_exactly_once_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    join_durable_and_leave_the_room(&bob, "general").await;

    let a = endpoint(&alice, |o| o.presence = false).await;
    let stored = publish(&a, "general", "m", 0..1000).await;
    // While bob is away the broker holds no consumer for him: his backlog is a position.
    let js = operator(&c, tmp.path()).await;
    let chat = js.get_stream("CHAT_main").await.unwrap();
    assert!(
        chat.consumer_info(interval_consumer(&bob.id, "general", 1))
            .await
            .is_err(),
        "no consumer for an absent member"
    );

    // Bob comes back: no join, no history read; the backlog is delivered by the backstop.
    let mut b = endpoint(&bob, |_| {}).await;
    let got = receive(&mut b, 1000).await;
    assert_eq!(got, stored, "all 1,000, once each, in stream order");
    // Nothing more is due: the reader's consumer is drained once the acks land.
    drained(&js, &interval_consumer(&bob.id, "general", 1)).await;
    // And a new message still flows, once.
    publish(&a, "general", "after", 0..1).await;
    assert_eq!(receive(&mut b, 1).await, ["after0"]);
    for conn in [a, b] {
        conn.client.close().await;
    }
    c.stop().await;
}

#[tokio::test]
async fn a_member_resumes_where_it_left_off() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    join_durable_and_leave_the_room(&bob, "general").await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    let stored = publish(&a, "general", "m", 0..1000).await;
    let js = operator(&c, tmp.path()).await;
    let chat = js.get_stream("CHAT_main").await.unwrap();
    let consumer = interval_consumer(&bob.id, "general", 1);

    // Bob handles 300, his acks land, he goes away: his position is saved, his consumer gone.
    // His backlog is read as a range (he reads it himself): his progress is saved as it comes.
    let members = js.get_key_value("cotal_members_main").await.unwrap();
    let key = format!("{}.general", bob.id);
    let record = || async {
        let stored = members.get(&key).await.unwrap().unwrap();
        serde_json::from_slice::<serde_json::Value>(&stored).unwrap()
    };
    let joined = record().await["intervals"][0]["joinCursor"]
        .as_u64()
        .unwrap();
    let mut b = endpoint(&bob, |_| {}).await;
    assert_eq!(receive(&mut b, 300).await, stored[..300]);
    // Nothing else is stored on CHAT after the join: the 300th is at join + 300.
    let last = joined + 300;
    eventually("bob's 300 acks landing", || async {
        let delivered = record().await["intervals"][0]["delivered"].as_u64();
        (delivered == Some(last)).then_some(())
    })
    .await;
    b.client.close().await;
    let (chat_ref, consumer_ref) = (&chat, &consumer);
    eventually("the session ending with bob's presence", || async move {
        chat_ref
            .consumer_info(consumer_ref)
            .await
            .is_err()
            .then_some(())
    })
    .await;
    let record = record().await;
    assert_eq!(record["intervals"][0]["delivered"], last, "{record}");

    // A new connection (no memory of what it surfaced) gets exactly the other 700.
    let mut b = endpoint(&bob, |_| {}).await;
    assert_eq!(receive(&mut b, 700).await, stored[300..]);
    drained(&js, &consumer).await;
    for conn in [a, b] {
        conn.client.close().await;
    }
    c.stop().await;
}

/// A member over a plain connection of its own, speaking to the manager itself as a foreign
/// client does: its backstop inbox subscribed, its requests on `ctl.manager`.
struct PlainMember {
    probe: Probe,
    copies: async_nats::Subscriber,
    ctl: String,
    from: serde_json::Value,
}

impl PlainMember {
    async fn connect(c: &Cotald, member: &Minted) -> PlainMember {
        let mut probe = Probe::connect(c, &member.creds).await;
        let copies = probe
            .client
            .subscribe(format!("_INBOX_{}.backstop", member.id))
            .await
            .unwrap();
        probe.barrier().await;
        PlainMember {
            probe,
            copies,
            ctl: format!("cotal.main.ctl.manager.{}", member.id),
            from: json!({"id": member.id, "name": "plain"}),
        }
    }

    /// The manager's answer to `op` with `args`.
    async fn ask(&mut self, op: &str, args: serde_json::Value) -> serde_json::Value {
        let request = json!({"op": op, "args": args, "from": self.from});
        self.probe.request(&self.ctl, request).await
    }
}

/// A member that takes plain copies (a foreign client: neither offers nor ranges) has its
/// position saved while its session lasts, not only when the session ends: its consumer keeps
/// its state in the broker's memory, so a broker restart would otherwise hand over again
/// everything the session had handled.
#[tokio::test]
async fn a_plain_members_position_is_saved_while_its_session_lasts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    join_durable_and_leave_the_room(&bob, "general").await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    publish(&a, "general", "m", 0..50).await;
    let js = operator(&c, tmp.path()).await;
    let chat = js.get_stream("CHAT_main").await.unwrap();
    let consumer = interval_consumer(&bob.id, "general", 1);
    let members = js.get_key_value("cotal_members_main").await.unwrap();
    let key = format!("{}.general", bob.id);
    let record = || async {
        let stored = members.get(&key).await.unwrap().unwrap();
        serde_json::from_slice::<serde_json::Value>(&stored).unwrap()
    };
    let joined = record().await["intervals"][0]["joinCursor"]
        .as_u64()
        .unwrap();

    // Bob is there (a client of his beats his presence) and reads his copies over a plain
    // connection of his own.
    let present = endpoint(&bob, |o| {
        o.receive_backstop = false;
        o.receive_dms = false;
    })
    .await;
    let mut plain = PlainMember::connect(&c, &bob).await;
    assert_eq!(
        plain.ask("resume", json!({"session": "plain"})).await["ok"],
        true
    );
    let mut tokens = Vec::new();
    while tokens.len() < 50 {
        let batch = crate::helper::next(&mut plain.copies).await;
        if batch.headers.is_some() {
            continue; // the caught-up word
        }
        for copy in cotald::ops::copies(&batch.payload).unwrap() {
            tokens.push(copy.token.to_owned());
        }
    }
    let acked = plain.ask("backstop-ack", json!({"tokens": tokens})).await;
    assert_eq!(acked["ok"], true);

    let saved = joined + 50;
    eventually("bob's position saved while his session lasts", || async {
        let delivered = record().await["intervals"][0]["delivered"].as_u64();
        (delivered == Some(saved)).then_some(())
    })
    .await;
    let info = chat
        .consumer_info(&consumer)
        .await
        .expect("the session holds its consumer");
    assert!(info.config.memory_storage, "{:?}", info.config);

    // A broker restart takes the consumer with it. Bob asks for a session again once he is
    // back, as a member does after every reconnect: his consumer is made from the saved
    // position, so what comes next is handed over, and nothing he acknowledged.
    let broker = c.state().broker_pid;
    // SAFETY: plain syscall on the broker child.
    assert_eq!(unsafe { libc::kill(broker as i32, libc::SIGKILL) }, 0);
    c.wait_stderr("nats-server restarted").await;
    eventually("bob's session again", || {
        let (client, ctl) = (plain.probe.client.clone(), plain.ctl.clone());
        let again = json!({"op": "resume", "args": {"session": "again"}, "from": plain.from});
        async move {
            let reply = client.request(ctl, again.to_string().into()).await.ok()?;
            let reply: serde_json::Value = serde_json::from_slice(&reply.payload).ok()?;
            (reply["ok"] == true).then_some(())
        }
    })
    .await;
    publish(&a, "general", "n", 0..10).await;
    let mut texts = Vec::new();
    while texts.len() < 10 {
        let batch = crate::helper::next(&mut plain.copies).await;
        if batch.headers.is_some() {
            continue;
        }
        for copy in cotald::ops::copies(&batch.payload).unwrap() {
            let message: serde_json::Value = serde_json::from_slice(copy.payload).unwrap();
            texts.push(message["parts"][0]["text"].as_str().unwrap().to_owned());
        }
    }
    let want: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
    assert_eq!(texts, want, "handed over after the restart");
    present.client.close().await;
    a.client.close().await;
    c.stop().await;
}

/// What is killed in the middle of a catch-up.
enum Crash {
    /// `cotald` itself (its broker follows it).
    Appliance,
    /// Only the broker (the appliance restarts it).
    Broker,
}

/// Bob has a backlog of 1,000; `crash` happens after he surfaced 300 of them; he keeps
/// running and must end with all 1,000, none twice.
async fn catch_up_across(crash: Crash) {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    join_durable_and_leave_the_room(&bob, "general").await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    publish(&a, "general", "m", 0..1000).await;
    a.client.close().await;

    let mut b = endpoint(&bob, |_| {}).await;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for t in receive(&mut b, 300).await {
        *seen.entry(t).or_default() += 1;
    }
    let state = c.state();
    match crash {
        Crash::Appliance => {
            c.signal(libc::SIGKILL);
            c.wait_exit().await;
            // The broker follows its parent (parent-death signal); the port is then free.
            tokio::time::timeout(TIMEOUT, async {
                while crate::helper::alive(state.broker_pid) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
            .expect("the orphaned broker exits");
            let listen = state.listen.to_string();
            c = Cotald::spawn(tmp.path(), &["--listen", &listen]);
            c.wait_stdout("cotald is ready").await;
        }
        Crash::Broker => {
            // SAFETY: plain syscall on the broker child.
            assert_eq!(
                unsafe { libc::kill(state.broker_pid as i32, libc::SIGKILL) },
                0
            );
            c.wait_stderr("nats-server restarted").await;
        }
    }
    while seen.len() < 1000 {
        for t in receive(&mut b, 1).await {
            *seen.entry(t).or_default() += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "surfaced twice: {twice:?}");
    let want: BTreeSet<String> = (0..1000).map(|i| format!("m{i}")).collect();
    assert_eq!(seen.keys().cloned().collect::<BTreeSet<_>>(), want);
    b.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn catch_up_survives_kill_9_of_the_whole_appliance() {
    catch_up_across(Crash::Appliance).await;
}

#[tokio::test]
async fn catch_up_survives_kill_9_of_the_broker() {
    catch_up_across(Crash::Broker).await;
}

#[tokio::test]
async fn a_rejoin_after_a_drained_leave_is_a_new_generation() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let mut generations = Vec::new();
    for _ in 0..2 {
        let b = endpoint(&bob, |_| {}).await;
        let report = b.client.join("general", Replay::Off).await.unwrap();
        assert_eq!(report.durable, DurableState::Established, "{report:?}");
        // Nothing was posted: the interval is delivered to its end at the leave, and goes.
        let left = b.client.durable_leave("general").await.unwrap();
        generations.push(left.generation);
        b.client.close().await;
    }
    // A generation names an interval's consumer and its saved position: one generation for
    // two intervals would let what belongs to the first reach the second.
    assert_eq!(generations, [1, 2]);
    c.stop().await;
}

#[tokio::test]
async fn leave_is_a_hard_boundary_and_a_rejoin_does_not_replay_the_gap() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    join_durable_and_leave_the_room(&bob, "general").await;
    publish(&a, "general", "before", 0..3).await;

    // Leave while away (no live half joined in this process): the leave cursor is now.
    let b = endpoint(&bob, |o| o.receive_backstop = false).await;
    let left = b.client.durable_leave("general").await.unwrap();
    assert_eq!(left.generation, 1);
    assert!(left.leave_cursor.is_some());
    b.client.close().await;
    publish(&a, "general", "gap", 0..3).await;

    // Rejoin: a new cursor; the pre-leave backlog is still due, the gap is not.
    let mut b = endpoint(&bob, |_| {}).await;
    let report = b.client.join("general", Replay::Off).await.unwrap();
    assert_eq!(report.durable, DurableState::Established);
    let mut got = BTreeSet::new();
    while got.len() < 3 {
        let d = delivery(&mut b.deliveries).await;
        got.insert(text(&d));
        d.ack().await.unwrap();
    }
    assert_eq!(
        got,
        ["before0", "before1", "before2"].map(String::from).into()
    );
    // The first interval is delivered to its end: its consumer is done, and nothing of the
    // gap was handed over.
    let js = operator(&c, tmp.path()).await;
    drained(&js, &interval_consumer(&bob.id, "general", 1)).await;
    publish(&a, "general", "rejoined", 0..1).await;
    let d = delivery(&mut b.deliveries).await;
    assert_eq!(text(&d), "rejoined0", "nothing of the gap arrives");
    d.ack().await.unwrap();
    for conn in [a, b] {
        conn.client.close().await;
    }
    c.stop().await;
}

#[tokio::test]
async fn a_channel_dropped_from_the_acl_is_never_surfaced_from_the_backstop() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(
        tmp.path(),
        "alice",
        "main",
        &["--allow-publish", "general,secret"],
    )
    .await;
    let bob = mint(
        tmp.path(),
        "bob",
        "main",
        &["--subscribe", "general,secret"],
    )
    .await;
    join_durable_and_leave_the_room(&bob, "general").await;
    join_durable_and_leave_the_room(&bob, "secret").await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    publish(&a, "secret", "early", 0..2).await;

    // Re-minting bob with a narrower ACL revokes the old credential; the reader authorizes
    // against the new one.
    let narrowed = mint(
        tmp.path(),
        "bob",
        "main",
        &["--subscribe", "general", "--replace"],
    )
    .await;
    assert_eq!(narrowed.id, bob.id, "a re-mint keeps the identity");
    publish(&a, "secret", "late", 0..3).await;
    publish(&a, "general", "open", 0..3).await;

    let mut b = endpoint(&narrowed, |_| {}).await;
    assert_eq!(receive(&mut b, 3).await, ["open0", "open1", "open2"]);
    let js = operator(&c, tmp.path()).await;
    drained(&js, &interval_consumer(&bob.id, "secret", 1)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), b.deliveries.next())
            .await
            .is_err(),
        "nothing of `secret` is handed over"
    );
    // Leave works after the ACL narrowed (it is the only thing that ends a membership).
    let left = b.client.durable_leave("secret").await.unwrap();
    assert_eq!(left.channel, "secret");
    for conn in [a, b] {
        conn.client.close().await;
    }
    c.stop().await;
}

#[tokio::test]
async fn the_manager_answers_only_its_caller_and_checks_the_sender() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let mut watcher =
        Probe::connect(&c, &tmp.path().join("spaces/main/local-operator.creds")).await;
    let mut stolen = watcher.client.subscribe("elsewhere.>").await.unwrap();
    let mut alice_inbox = watcher
        .client
        .subscribe(format!("_INBOX_{}.>", alice.id))
        .await
        .unwrap();
    watcher.barrier().await;

    let mut b = Probe::connect(&c, &bob.creds).await;
    let ctl = format!("cotal.main.ctl.manager.{}", bob.id);
    let from = json!({"id": bob.id, "name": "bob"});
    let request = json!({"op": "memberships", "from": from}).to_string();
    // A forged reply subject: elsewhere, and another identity's inbox. No answer goes out.
    for forged in ["elsewhere.x".to_owned(), format!("_INBOX_{}.x", alice.id)] {
        b.client
            .publish_with_reply(ctl.clone(), forged, request.clone().into())
            .await
            .unwrap();
    }
    // A request whose `from.id` is not the subject sender is refused (§5).
    let spoof = json!({"op": "memberships", "from": {"id": alice.id, "name": "alice"}});
    let reply = b.request(&ctl, spoof).await;
    assert_eq!(reply["ok"], false, "{reply}");
    assert_eq!(reply["error"], "sender-mismatch", "{reply}");
    // An unknown op is refused by name; a machine-operator op is not served on ctl.
    let reply = b
        .request(&ctl, json!({"op": "frobnicate", "from": from}))
        .await;
    assert_eq!(reply["ok"], false);
    assert!(
        reply["error"].as_str().unwrap().contains("frobnicate"),
        "{reply}"
    );
    let reply = b
        .request(&ctl, json!({"op": "space-list", "from": from}))
        .await;
    assert_eq!(reply["ok"], false);
    assert!(
        reply["error"].as_str().unwrap().contains("not served"),
        "{reply}"
    );
    // A durable join outside the read ACL is refused.
    let reply = b
        .request(
            &ctl,
            json!({"op": "durable-join", "args": {"channel": "secret", "cursor": 0}, "from": from}),
        )
        .await;
    assert_eq!(reply["ok"], false);
    assert!(
        reply["error"].as_str().unwrap().contains("read ACL"),
        "{reply}"
    );
    // The genuine request on the caller's own inbox is answered.
    let reply = b
        .request(&ctl, json!({"op": "memberships", "from": from}))
        .await;
    assert_eq!(reply, json!({"ok": true, "data": []}));
    // The forged requests came first on the same connection, and the manager handles a
    // subscription in order: had it answered them, the watcher would hold the answers now.
    watcher.barrier().await;
    for sub in [&mut stolen, &mut alice_inbox] {
        assert!(
            tokio::time::timeout(
                Duration::from_millis(200),
                futures_util::StreamExt::next(sub)
            )
            .await
            .is_err(),
            "the manager published on a forged reply subject"
        );
    }
    c.stop().await;
}

#[tokio::test]
async fn closing_says_whether_what_was_handled_is_settled() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    join_durable_and_leave_the_room(&bob, "general").await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    let js = operator(&c, tmp.path()).await;
    let consumer = interval_consumer(&bob.id, "general", 1);

    // An orderly close: everything handled is acknowledged, and the broker agrees.
    publish(&a, "general", "m", 0..20).await;
    let mut b = endpoint(&bob, |_| {}).await;
    receive(&mut b, 20).await;
    let settled = b.client.close().await;
    assert!(settled.complete(), "{settled:?}");
    drained(&js, &consumer).await;

    // A session whose credential is revoked under it cannot confirm its last acks: it says so
    // rather than claim they arrived.
    publish(&a, "general", "n", 0..5).await;
    let mut b = endpoint(&bob, |_| {}).await;
    receive(&mut b, 5).await;
    let out = crate::helper::cotald_in(tmp.path(), &["revoke", "bob", "--space", "main"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nor does it wait out its requests' timeouts (10 s each) against a broker that refuses
    // it now: what needs the broker is given up once the connection has been down for a
    // moment.
    let settled = tokio::time::timeout(std::time::Duration::from_secs(9), b.client.close())
        .await
        .expect("a close against a broker that refuses it now is not held for its timeouts");
    assert!(!settled.acks_confirmed, "{settled:?}");
    assert!(!settled.complete());
    a.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn a_revoked_identity_cannot_connect_and_its_backlog_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    join_durable_and_leave_the_room(&bob, "general").await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    publish(&a, "general", "m", 0..10).await;
    let js = operator(&c, tmp.path()).await;
    let members = js.get_key_value("cotal_members_main").await.unwrap();
    let key = format!("{}.general", bob.id);
    assert!(
        members.get(&key).await.unwrap().is_some(),
        "bob is a member"
    );
    let chat = js.get_stream("CHAT_main").await.unwrap();
    let consumer = interval_consumer(&bob.id, "general", 1);
    // Bob is connected (his reader consumer exists) when he is revoked.
    let _b = endpoint(&bob, |_| {}).await;
    let (chat_ref, consumer_ref) = (&chat, &consumer);
    eventually("bob's session reading his backlog", || async move {
        chat_ref.consumer_info(consumer_ref).await.ok().map(|_| ())
    })
    .await;

    // A copy of the credential, which revoke deletes where mint wrote it.
    let kept = tmp.path().join("bob-kept.creds");
    std::fs::copy(&bob.creds, &kept).unwrap();
    let out = tokio::process::Command::new(crate::helper::cotald_bin())
        .args(["revoke", "bob", "--space", "main", "--data-dir"])
        .arg(tmp.path())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!bob.creds.exists(), "its credential file is deleted");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("credential file"), "{said}");
    let listed = crate::helper::cotald_in(tmp.path(), &["identities", "--json"]).await;
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let bob_row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "bob")
        .unwrap_or_else(|| panic!("bob listed as revoked: {listed}"));
    assert!(bob_row["revokedAt"].is_string(), "{bob_row}");

    assert!(
        Probe::try_connect(&c, &kept).await.is_err(),
        "the broker refuses the revoked credential"
    );
    assert!(
        chat.consumer_info(&consumer).await.is_err(),
        "its backlog consumer is deleted"
    );
    assert!(
        members.get(&key).await.unwrap().is_none(),
        "its membership is gone"
    );
    a.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn status_shows_each_service() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let out = tokio::process::Command::new(crate::helper::cotald_bin())
        .args(["status", "--json", "--data-dir"])
        .arg(tmp.path())
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let services = status["services"].as_array().unwrap();
    for name in [
        "connection",
        "presence",
        "registry",
        "mentions",
        "warden",
        "consumer-guard",
        "backstop",
        "manager",
        "membership",
    ] {
        let s = services
            .iter()
            .find(|s| s["scope"] == "main" && s["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {status}"));
        assert_eq!(s["state"], "running", "{s}");
    }
    // The appliance's own services too: a failing renewal of the server certificate, say,
    // makes `status` degraded like a failing service of a space.
    for name in ["state", "admin-socket", "certificate", "dashboard"] {
        let s = services
            .iter()
            .find(|s| s["scope"] == "appliance" && s["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {status}"));
        assert_eq!(s["state"], "running", "{s}");
    }
    let out = tokio::process::Command::new(crate::helper::cotald_bin())
        .args(["status", "--data-dir"])
        .arg(tmp.path())
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "services    main: connection running, presence running, registry running, \
             warden running, consumer-guard running, membership running, mentions running, backstop running, \
             manager running"
        ),
        "{text}"
    );
    c.stop().await;
}

#[tokio::test]
async fn a_space_whose_services_cannot_start_fails_up_loudly() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    // A members record nobody can read: the manager cannot know who is a member.
    let js = operator(&c, tmp.path()).await;
    let members = js.get_key_value("cotal_members_main").await.unwrap();
    members
        .put("UBROKEN.general", "{not json".into())
        .await
        .unwrap();
    c.stop().await;
    let mut again = Cotald::spawn(tmp.path(), &[]);
    let status = again.wait_exit().await;
    assert!(!status.success());
    let stderr = again.drain_stderr().await;
    assert!(
        stderr.contains("members registry: UBROKEN.general holds no member record"),
        "{stderr}"
    );
}

/// A member's mention consumer is made once it has a mention copy, not at every session: one
/// that never had one starts its session without it, and a copy stored while the session lasts
/// is pumped at once.
#[tokio::test]
async fn a_mention_consumer_is_made_for_the_first_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "lounge"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "lounge"]).await;
    let op = crate::helper::operator_endpoint(tmp.path(), &alice, true).await;
    crate::helper::set_channel(&op, "lounge", json!({"deliveryClass": "live"})).await;
    // Bob is there (a client of his beats his presence, so his name resolves) and reads his
    // copies over a plain connection of his own.
    let present = endpoint(&bob, |o| {
        o.receive_backstop = false;
        o.receive_dms = false;
    })
    .await;
    let roster = op.client.roster().clone();
    while roster.peer(&bob.id).is_none() {
        tokio::time::timeout(TIMEOUT, roster.changed())
            .await
            .unwrap();
    }
    let mut plain = PlainMember::connect(&c, &bob).await;
    let resumed = plain.ask("resume", json!({"session": "plain"})).await;
    assert_eq!(resumed["ok"], true, "{resumed}");
    let mention_consumer = cotald::binding::mention_consumer(&bob.id);
    assert!(
        !resumed["data"]["consumers"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c == mention_consumer.as_str())),
        "{resumed}"
    );
    let js = operator(&c, tmp.path()).await;
    let inbox = js.get_stream("INBOX_main").await.unwrap();
    assert!(inbox.consumer_info(&mention_consumer).await.is_err());

    let a = endpoint(&alice, |o| o.presence = false).await;
    a.client
        .send(
            channel("lounge"),
            vec![cotald::protocol::Part::text("ping")],
            &["bob".into()],
        )
        .await
        .unwrap();
    let batch = loop {
        let batch = crate::helper::next(&mut plain.copies).await;
        if batch.headers.is_none() {
            break batch;
        }
    };
    let copy = &cotald::ops::copies(&batch.payload).unwrap()[0];
    assert!(
        copy.token.starts_with('m'),
        "a mention copy: {}",
        copy.token
    );
    let message: serde_json::Value = serde_json::from_slice(copy.payload).unwrap();
    assert_eq!(message["parts"][0]["text"], "ping");
    assert!(inbox.consumer_info(&mention_consumer).await.is_ok());
    for conn in [a, present, op] {
        conn.client.close().await;
    }
    c.stop().await;
}

#[tokio::test]
async fn a_mention_on_a_live_channel_reaches_an_offline_authorized_target_once() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "lounge"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "lounge"]).await;
    // carol may not read lounge.
    mint(tmp.path(), "carol", "main", &["--subscribe", "general"]).await;
    // "dup" is also a minted name: an unheard live pair would resolve to it.
    let dup1 = mint(tmp.path(), "dup", "main", &["--subscribe", "lounge"]).await;
    let dup2 = mint(tmp.path(), "dup2", "main", &["--subscribe", "lounge"]).await;
    // `lounge` is live (the space default is durable): only mentions are kept for the absent.
    let op = crate::helper::operator_endpoint(tmp.path(), &alice, true).await;
    crate::helper::set_channel(&op, "lounge", json!({"deliveryClass": "live"})).await;
    // Two live instances both called "dup": a mention of "dup" is ambiguous.
    let named_dup = |o: &mut cotald::client::ConnectOptions| {
        o.name = Some("dup".into());
        o.receive_backstop = false;
    };
    let d1 = endpoint(&dup1, named_dup).await;
    let d2 = endpoint(&dup2, named_dup).await;
    let roster = op.client.roster().clone();
    while [&dup1.id, &dup2.id].iter().any(|id| {
        roster
            .peer(id)
            .is_none_or(|p| p.status() == cotald::protocol::PresenceStatus::Offline)
    }) {
        tokio::time::timeout(TIMEOUT, roster.changed())
            .await
            .unwrap();
    }

    let a = endpoint(&alice, |o| o.presence = false).await;
    let (sent, _) = a
        .client
        .send(
            channel("lounge"),
            vec![cotald::protocol::Part::text("ping")],
            &["Bob".into(), "carol".into(), "dup".into(), "nobody".into()],
        )
        .await
        .unwrap();
    let js = operator(&c, tmp.path()).await;
    let stored = mention_copies_once_routed(&js).await;
    assert_eq!(
        stored,
        BTreeMap::from([(format!("cotal.main.backstop.{}.m", bob.id), 1)]),
        "one copy, for bob only: carol may not read lounge, dup is ambiguous, nobody unknown"
    );

    // Bob was never connected: he gets it when he comes, once, as a durable copy.
    let mut b = endpoint(&bob, |_| {}).await;
    let d = delivery(&mut b.deliveries).await;
    assert_eq!(d.message.id, sent.id);
    assert!(d.durable && d.needs_ack());
    assert_eq!(d.channel.as_deref(), Some("lounge"));
    d.ack().await.unwrap();
    drained_on(
        &js,
        "INBOX_main",
        &cotald::binding::mention_consumer(&bob.id),
    )
    .await;
    for conn in [a, b, d1, d2, op] {
        conn.client.close().await;
    }
    c.stop().await;
}

/// The mention copies stored per subject, once everything the router read is settled.
async fn mention_copies_once_routed(
    js: &async_nats::jetstream::Context,
) -> BTreeMap<String, usize> {
    use futures_util::StreamExt;
    let chat = js.get_stream("CHAT_main").await.unwrap();
    let chat = &chat;
    eventually("the router settling", || async move {
        let info = chat
            .consumer_info(cotald::services::mentions::CONSUMER)
            .await
            .unwrap();
        (info.num_pending == 0 && info.num_ack_pending == 0).then_some(())
    })
    .await;
    let inbox = js.get_stream("INBOX_main").await.unwrap();
    inbox
        .info_with_subjects("cotal.main.backstop.>")
        .await
        .unwrap()
        .map(|s| s.unwrap())
        .collect()
        .await
}

/// The router reads CHAT in bursts of up to 1,024 entries: a flood of posts, more than a
/// burst, with a mention every hundredth, leaves every mention copied once and every entry
/// settled.
#[tokio::test]
async fn a_flood_of_posts_has_each_mention_copied_once() {
    use futures_util::StreamExt;
    const POSTS: usize = 2_500;
    const EVERY: usize = 100;
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "lounge"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "lounge"]).await;
    let op = crate::helper::operator_endpoint(tmp.path(), &alice, true).await;
    crate::helper::set_channel(&op, "lounge", json!({"deliveryClass": "live"})).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    let client = &a.client;
    let sent: Vec<_> = futures_util::stream::iter(0..POSTS)
        .map(|i| async move {
            let mentions: Vec<String> = match i % EVERY {
                0 => vec!["bob".into()],
                _ => Vec::new(),
            };
            let text = vec![cotald::protocol::Part::text(format!("post {i}"))];
            client.send(channel("lounge"), text, &mentions).await
        })
        .buffer_unordered(64)
        .collect()
        .await;
    assert!(sent.iter().all(Result::is_ok), "every post stored");
    let js = operator(&c, tmp.path()).await;
    let stored = mention_copies_once_routed(&js).await;
    assert_eq!(
        stored,
        BTreeMap::from([(format!("cotal.main.backstop.{}.m", bob.id), POSTS / EVERY)]),
        "one copy per mention of bob"
    );
    for conn in [a, op] {
        conn.client.close().await;
    }
    c.stop().await;
}

/// Waits until the feed entry of `id` satisfies `pred` (`None`: no entry).
async fn feed_until(
    kv: &async_nats::jetstream::kv::Store,
    id: &str,
    what: &str,
    pred: impl Fn(Option<&cotald::services::membership::MembershipEntry>) -> bool,
) {
    use futures_util::StreamExt;
    let mut watch = kv.watch_with_history(id).await.unwrap();
    tokio::time::timeout(TIMEOUT, async {
        while let Some(entry) = watch.next().await {
            let entry = entry.unwrap();
            let value = match entry.operation {
                async_nats::jetstream::kv::Operation::Put => {
                    Some(serde_json::from_slice(&entry.value).unwrap())
                }
                _ => None,
            };
            if pred(value.as_ref()) {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the feed never showed {what}"));
}

#[tokio::test]
async fn the_membership_feed_shows_live_and_durable_members() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let bob = mint(
        tmp.path(),
        "bob",
        "main",
        &["--subscribe", "general,team.>"],
    )
    .await;
    let js = operator(&c, tmp.path()).await;
    let kv = js.get_key_value("cotal_membership_main").await.unwrap();
    let is = |live: &[&str], durable: &[&str]| {
        let (live, durable): (Vec<String>, Vec<String>) = (
            live.iter().map(|s| s.to_string()).collect(),
            durable.iter().map(|s| s.to_string()).collect(),
        );
        move |e: Option<&cotald::services::membership::MembershipEntry>| {
            e.is_some_and(|e| e.live == live && e.durable == durable && e.observed_at > 0)
        }
    };

    join_durable_and_leave_the_room(&bob, "general").await;
    feed_until(&kv, &bob.id, "a durable member away", is(&[], &["general"])).await;

    let b = endpoint(&bob, |_| {}).await;
    b.client.join("general", Replay::Off).await.unwrap();
    b.client.join("team.>", Replay::Off).await.unwrap();
    feed_until(
        &kv,
        &bob.id,
        "live subscriptions, wildcards kept",
        is(&["general", "team.>"], &["general"]),
    )
    .await;
    b.client.durable_leave("general").await.unwrap();
    feed_until(&kv, &bob.id, "the leave", is(&["general", "team.>"], &[])).await;
    b.client.close().await;
    feed_until(&kv, &bob.id, "nothing left", |e| e.is_none()).await;
    c.stop().await;
}

/// Runs `cotald ARGS… --creds --link --ca` of `m`, bounded.
async fn endpoint_cli(args: &[&str], m: &Minted) -> std::process::Output {
    tokio::time::timeout(
        TIMEOUT,
        tokio::process::Command::new(crate::helper::cotald_bin())
            .args(args)
            .arg("--creds")
            .arg(&m.creds)
            .args(["--link", &m.link, "--ca"])
            .arg(&m.ca)
            .output(),
    )
    .await
    .expect("the command finishes")
    .unwrap()
}

#[tokio::test]
async fn join_tail_and_leave_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;

    let out = endpoint_cli(&["join", "general"], &bob).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "joined durable general"
    );

    // Exiting was not leaving: what is posted now is kept for bob, and tail delivers it even
    // without history.
    let a = endpoint(&alice, |o| o.presence = false).await;
    let stored = publish(&a, "general", "kept ", 0..3).await;
    let out = endpoint_cli(&["tail", "--no-history", "--count", "3", "--json"], &bob).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let texts: Vec<&str> = printed
        .iter()
        .map(|p| p["parts"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, stored);
    assert!(printed.iter().all(|p| p["durable"] == true), "{printed:?}");
    // tail acked what it printed: the reader holds nothing for bob any more.
    let js = operator(&c, tmp.path()).await;
    drained(&js, &interval_consumer(&bob.id, "general", 1)).await;

    let out = endpoint_cli(&["leave", "general"], &bob).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("left durable general (leave cursor "),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let again = endpoint_cli(&["leave", "general"], &bob).await;
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("not durable-joined to general"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    a.client.close().await;
    c.stop().await;
}

/// `tail --resume` on a live channel: a second run prints what came after what the first
/// had read, where a plain `tail` replays the history again.
#[tokio::test]
async fn tail_resume_prints_on_a_live_channel_only_what_came_after_what_it_read() {
    use tokio::io::AsyncBufReadExt;
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "news"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "news"]).await;
    let op = crate::helper::operator_endpoint(tmp.path(), &alice, false).await;
    crate::helper::set_channel(&op, "news", json!({"deliveryClass": "live"})).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    a.client.send_text(channel("news"), "one").await.unwrap();

    let mut first = tokio::process::Command::new(crate::helper::cotald_bin())
        .args(["tail", "--resume", "--creds"])
        .arg(&bob.creds)
        .args(["--link", &bob.link, "--ca"])
        .arg(&bob.ca)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(first.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(TIMEOUT, lines.next_line())
        .await
        .expect("a line in time")
        .unwrap()
        .unwrap();
    assert!(line.ends_with("one"), "{line}");
    // Once the stream is quiet, what was printed is marked read, in the appliance.
    let js = operator(&c, tmp.path()).await;
    let registry = js.get_key_value("cotal_members_main").await.unwrap();
    let key = format!("mark.{}", bob.id);
    eventually("bob's replay mark of news", || async {
        let marks = registry.get(&key).await.ok().flatten()?;
        let marks: serde_json::Value = serde_json::from_slice(&marks).ok()?;
        marks.get("news").map(|_| ())
    })
    .await;
    first.kill().await.unwrap();

    a.client.send_text(channel("news"), "two").await.unwrap();
    let printed = |out: &std::process::Output| -> Vec<String> {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["parts"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    };
    let resumed = endpoint_cli(&["tail", "--resume", "--count", "1", "--json"], &bob).await;
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert_eq!(printed(&resumed), ["two"]);
    let plain = endpoint_cli(&["tail", "--count", "2", "--json"], &bob).await;
    assert_eq!(
        printed(&plain),
        ["one", "two"],
        "without --resume: the history as configured"
    );
    a.client.close().await;
    op.client.close().await;
    c.stop().await;
}

/// Ten durable members online while one posts: one of them drops in the middle of the traffic
/// and comes back on a new connection. It still surfaces every message published while it was
/// away (from its durable backlog) and after, and the nine others surface everything.
#[tokio::test]
async fn with_ten_members_online_one_that_drops_and_returns_misses_nothing() {
    use std::collections::HashSet;
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    let mut members = Vec::new();
    for i in 0..10 {
        let m = mint(
            tmp.path(),
            &format!("m{i}"),
            "main",
            &["--subscribe", "general"],
        )
        .await;
        let conn = endpoint(&m, |_| {}).await;
        let report = conn.client.join("general", Replay::Off).await.unwrap();
        assert_eq!(report.durable, DurableState::Established, "{report:?}");
        members.push((m, conn));
    }
    let (dropper, mut first) = members.remove(0);
    // The nine others read everything, live or durable, each text counted once.
    let others: Vec<_> = members
        .into_iter()
        .map(|(_, mut conn)| {
            tokio::spawn(async move {
                let mut seen = HashSet::new();
                while seen.len() < 300 {
                    let d = delivery(&mut conn.deliveries).await;
                    seen.insert(text(&d));
                    d.ack().await.unwrap();
                }
                conn.client.close().await;
                seen.len()
            })
        })
        .collect();
    let until_seen = async |conn: &mut Connection, want: &[String]| {
        let mut missing: HashSet<&String> = want.iter().collect();
        while !missing.is_empty() {
            let d = delivery(&mut conn.deliveries).await;
            missing.remove(&text(&d));
            d.ack().await.unwrap();
        }
    };
    let before = publish(&a, "general", "m", 0..100).await;
    until_seen(&mut first, &before).await;
    first.client.close().await;
    let away = publish(&a, "general", "m", 100..200).await;
    let mut back = endpoint(&dropper, |_| {}).await;
    let after = publish(&a, "general", "m", 200..300).await;
    let mut want = away.clone();
    want.extend(after);
    until_seen(&mut back, &want).await;
    for other in others {
        assert_eq!(other.await.unwrap(), 300);
    }
    back.client.close().await;
    a.client.close().await;
    c.stop().await;
}

/// A durable member that comes back on a new connection (an agent restarted by its host;
/// `cotald mcp` joins so) and joins again to resume does not surface the history it read before: its backlog comes from the
/// backstop after what it acknowledged, and the first thing it surfaces is new.
#[tokio::test]
async fn a_returning_member_does_not_replay_the_history_it_read() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    publish(&a, "general", "old", 0..5).await;

    let mut first = endpoint(&bob, |_| {}).await;
    let report = first
        .client
        .join("general", Replay::AsConfigured)
        .await
        .unwrap();
    assert_eq!(report.durable, DurableState::Established, "{report:?}");
    assert_eq!(report.backfilled, 5, "the first join reads the history");
    for _ in 0..5 {
        delivery(&mut first.deliveries).await.ack().await.unwrap();
    }
    publish(&a, "general", "live", 0..3).await;
    for _ in 0..3 {
        let d = delivery(&mut first.deliveries).await;
        assert!(text(&d).starts_with("live"), "{d:?}");
        d.ack().await.unwrap();
    }
    let js = operator(&c, tmp.path()).await;
    drained(&js, &interval_consumer(&bob.id, "general", 1)).await;
    first.client.close().await;

    let mut again = endpoint(&bob, |_| {}).await;
    let report = again.client.join("general", Replay::Resume).await.unwrap();
    assert_eq!(report.durable, DurableState::Established, "{report:?}");
    assert_eq!(report.backfilled, 0, "resumed: no history replayed");
    let (new, _) = a.client.send_text(channel("general"), "new").await.unwrap();
    let d = delivery(&mut again.deliveries).await;
    assert_eq!(
        d.message.id,
        new.id,
        "the first thing surfaced is new: {}",
        text(&d)
    );
    for conn in [a, again] {
        conn.client.close().await;
    }
    c.stop().await;
}

/// Shorter than the handoff timeout (30 s), after which an offer is handed over as a copy even
/// if nothing asked for it.
const WANTED_WITHIN: Duration = Duration::from_secs(10);

/// Alice, who posts on `general`, and bob, online with the durable membership of `general` and
/// not its live half (he surfaces nothing live), once bob's consumer caught up on a first
/// message and he follows the channel's feed.
struct Following {
    alice: Connection,
    bob: Connection,
    bob_identity: Minted,
    chat: async_nats::jetstream::stream::Stream,
    /// The name bob's own consumer of `general` has while he does not follow.
    bobs_consumer: String,
}

async fn a_follower(c: &Cotald, dir: &Path) -> Following {
    let alice = mint(dir, "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(dir, "bob", "main", &["--subscribe", "general"]).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    join_durable_and_leave_the_room(&bob, "general").await;
    let mut b = endpoint(&bob, |_| {}).await;
    publish(&a, "general", "first", 0..1).await;
    assert_eq!(receive(&mut b, 1).await, ["first0"]);
    // Caught up and acknowledged: the interval leaves its consumer for the channel's feed.
    let js = operator(c, dir).await;
    let stream = js.get_stream("CHAT_main").await.unwrap();
    let consumer = interval_consumer(&bob.id, "general", 1);
    eventually("bob follows the feed", || {
        let (stream, consumer) = (&stream, &consumer);
        async move { stream.consumer_info(consumer).await.is_err().then_some(()) }
    })
    .await;
    Following {
        alice: a,
        bob: b,
        bob_identity: bob,
        chat: stream,
        bobs_consumer: consumer,
    }
}

/// What a follower that surfaces nothing live gets of `sent`: each a durable copy it asked for,
/// acknowledged, in the order received.
async fn asked_for(b: &mut Connection, sent: &[String]) -> Vec<String> {
    let mut got = Vec::new();
    while got.len() < sent.len() {
        let d = tokio::time::timeout(WANTED_WITHIN, b.deliveries.next())
            .await
            .expect("a wanted copy before the handoff timeout")
            .expect("deliveries open");
        assert!(d.durable && d.needs_ack(), "a durable copy: {d:?}");
        got.push(text(&d));
        d.ack().await.unwrap();
    }
    got
}

/// An online member that surfaces nothing live (it holds the durable membership, not the live
/// half) follows its channel once its consumer caught up: the entries offered to it are ones it
/// has not surfaced, so it asks for each, and each arrives as a copy, once, in order, well
/// before an unconfirmed offer would be handed over again. Its position is saved when its
/// session ends: the next session gets nothing of it again.
#[tokio::test]
async fn a_follower_asks_for_what_it_did_not_surface_live_and_gets_each_once() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let Following {
        alice: a,
        bob: mut b,
        bob_identity,
        ..
    } = a_follower(&c, tmp.path()).await;
    let sent = publish(&a, "general", "followed", 0..20).await;
    assert_eq!(asked_for(&mut b, &sent).await, sent, "each once, in order");
    b.client.close().await;

    let mut again = endpoint(&bob_identity, |_| {}).await;
    publish(&a, "general", "after", 0..1).await;
    assert_eq!(receive(&mut again, 1).await, ["after0"], "nothing again");
    for conn in [a, again] {
        conn.client.close().await;
    }
    c.stop().await;
}

/// The feed reads its channel through a consumer of its own (headers only, what is new once per
/// `LINGER`). When that consumer is gone (deleted here from outside, while the feed's
/// connection stays up), the feed reads on through a new one from the entry after the last it
/// took: its followers miss nothing, get nothing twice, and go on following (their own
/// consumers are not made again).
#[tokio::test]
async fn a_feed_whose_consumer_is_lost_reads_on_and_keeps_its_followers() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let Following {
        alice: a,
        bob: mut b,
        chat: mut stream,
        bobs_consumer: consumer,
        ..
    } = a_follower(&c, tmp.path()).await;
    let before = publish(&a, "general", "before", 0..5).await;
    assert_eq!(asked_for(&mut b, &before).await, before);

    let feeds = feed_consumers(&mut stream).await;
    assert_eq!(feeds.len(), 1, "one feed's consumer on general: {feeds:?}");
    stream.delete_consumer(&feeds[0]).await.unwrap();
    let sent = publish(&a, "general", "after-loss", 0..20).await;
    assert_eq!(asked_for(&mut b, &sent).await, sent, "each once, in order");

    let now = feed_consumers(&mut stream).await;
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, feeds, "read through a new consumer");
    assert!(
        stream.consumer_info(&consumer).await.is_err(),
        "bob still follows: his own consumer was not made again"
    );
    for conn in [a, b] {
        conn.client.close().await;
    }
    c.stop().await;
}

/// The names of the consumers of `general` on CHAT that read headers only (the feed's).
async fn feed_consumers(stream: &mut async_nats::jetstream::stream::Stream) -> Vec<String> {
    let mut names = Vec::new();
    let mut infos = stream.consumers();
    while let Some(info) = futures_util::StreamExt::next(&mut infos).await {
        let info = info.unwrap();
        if info.config.headers_only && info.config.filter_subject == "cotal.main.chat.*.general" {
            names.push(info.name);
        }
    }
    names
}

/// A follower across a kill -9 of the broker, which takes the feed's consumer (in its memory)
/// and every connection with it: every message posted after the restart reaches the follower,
/// each once.
#[tokio::test]
async fn a_follower_misses_nothing_across_kill_9_of_the_broker() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::up(tmp.path()).await;
    let Following {
        alice: a,
        bob: mut b,
        ..
    } = a_follower(&c, tmp.path()).await;
    let before = publish(&a, "general", "before", 0..5).await;
    assert_eq!(asked_for(&mut b, &before).await, before);

    let broker = c.state().broker_pid;
    // SAFETY: plain syscall on the broker child.
    assert_eq!(unsafe { libc::kill(broker as i32, libc::SIGKILL) }, 0);
    c.wait_stderr("nats-server restarted").await;
    let sent = publish(&a, "general", "after", 0..20).await;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    while !sent.iter().all(|t| seen.contains_key(t)) {
        let d = tokio::time::timeout(WANTED_WITHIN, b.deliveries.next())
            .await
            .expect("a copy within the bound")
            .expect("deliveries open");
        *seen.entry(text(&d)).or_default() += 1;
        d.ack().await.unwrap();
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "surfaced twice: {twice:?}");
    for conn in [a, b] {
        conn.client.close().await;
    }
    c.stop().await;
}

/// Space `main` served over a connection of the test's own, as the appliance's manager user:
/// a writer of the space's buckets other than the appliance (as another node of a cluster is).
async fn another_writer(c: &Cotald, dir: &Path) -> std::sync::Arc<cotald::space::Space> {
    let dir = cotald::datadir::DataDir::new(dir);
    let keys = cotald::provision::KeyStore::open(&dir.keys())
        .unwrap()
        .space("main")
        .unwrap();
    let config =
        cotald::profile::SpaceConfig::with_profile(cotald::profile::DeploymentProfile::Local);
    let space = cotald::space::Space::connect(&keys, config, c.state().listen, &dir.ca_cert())
        .await
        .unwrap();
    std::sync::Arc::new(space)
}

/// The members registry writes from the records it holds in memory, each write checked by
/// its revision: a change another writer made meanwhile (a cluster node handing the space
/// over) is read and the change made again on it, and a refusal or a delete decided from a
/// record no longer stored is decided again on the stored one.
#[tokio::test]
async fn the_members_registry_writes_over_another_writers_change() {
    use cotald::space::members::{Interval, MemberRecord, Members};
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let space = another_writer(&c, tmp.path()).await;
    let (member, ch) = ("UXWRITERTEST", "general");
    let first = Members::open(&space).await.unwrap();
    // Opened before `first` writes: they hold nothing of what follows.
    let second = Members::open(&space).await.unwrap();
    let third = Members::open(&space).await.unwrap();
    let record = MemberRecord {
        member: member.to_owned(),
        channel: ch.to_owned(),
        intervals: vec![Interval {
            generation: 1,
            join_cursor: 0,
            leave_cursor: None,
            delivered: 0,
        }],
        generation: 1,
    };
    let made = first.update(member, ch, |_| Some(record.clone())).await;
    assert_eq!(made.unwrap(), Some(record.clone()));

    // `second` holds no record: its write is refused as a create, and made on the stored one.
    let bumped = second
        .update(member, ch, |stored| {
            Some(match stored {
                Some(mut r) => {
                    r.generation += 1;
                    r
                }
                // What a write from second's empty memory alone would store.
                None => MemberRecord {
                    generation: 100,
                    ..record.clone()
                },
            })
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(bumped.generation, 2);
    assert_eq!(second.get(member, ch).unwrap().generation, 2);

    // `first` holds generation 1: a refusal decided on it is decided again on generation 2.
    let decided = first
        .try_update(member, ch, |stored| match stored {
            Some(r) if r.generation == 1 => Err("decided on a stale record"),
            other => Ok(other),
        })
        .await
        .unwrap();
    assert_eq!(decided.unwrap().unwrap().generation, 2);

    // `third` holds nothing: a delete decided on its memory (nothing to delete) is decided
    // again on the stored record, and deletes it.
    assert_eq!(third.update(member, ch, |_| None).await.unwrap(), None);
    assert_eq!(Members::open(&space).await.unwrap().get(member, ch), None);
    // `second` and `first` still hold a record the bucket no longer has: keeping "whatever is
    // stored", or deleting it, writes nothing and forgets it.
    assert_eq!(
        second.update(member, ch, |stored| stored).await.unwrap(),
        None
    );
    assert_eq!(second.get(member, ch), None);
    assert_eq!(first.update(member, ch, |_| None).await.unwrap(), None);
    assert_eq!(first.get(member, ch), None);
    let reopened = Members::open(&space).await.unwrap();
    assert_eq!(reopened.get(member, ch), None, "nothing stored");
    space.close().await;
    c.stop().await;
}

/// A durable join's cursor beyond the CHAT frontier is refused, naming the frontier, whether
/// the appliance has read a frontier as high before or must ask; one within it is recorded.
#[tokio::test]
async fn a_join_cursor_beyond_the_chat_frontier_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let mut b = Probe::connect(&c, &bob.creds).await;
    let ctl = format!("cotal.main.ctl.manager.{}", bob.id);
    let from = json!({"id": bob.id, "name": "bob"});
    let join = |cursor: u64| json!({"op": "durable-join", "args": {"channel": "general", "cursor": cursor}, "from": from});
    let leave = json!({"op": "durable-leave", "args": {"channel": "general"}, "from": from});

    let reply = b.request(&ctl, join(3)).await;
    assert_eq!(reply["ok"], false, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("beyond the CHAT frontier 0"),
        "{reply}"
    );
    let a = endpoint(&alice, |o| o.presence = false).await;
    publish(&a, "general", "m", 0..5).await;
    let reply = b.request(&ctl, join(5)).await;
    assert_eq!(reply["ok"], true, "a cursor at the frontier: {reply}");
    assert_eq!(reply["data"]["join_cursor"], 5, "{reply}");
    assert_eq!(b.request(&ctl, leave.clone()).await["ok"], true);
    // Within the frontier read for the join above.
    let reply = b.request(&ctl, join(2)).await;
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["data"]["join_cursor"], 2, "{reply}");
    assert_eq!(b.request(&ctl, leave).await["ok"], true);
    // Beyond it: asked, and refused.
    let reply = b.request(&ctl, join(6)).await;
    assert_eq!(reply["ok"], false, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("beyond the CHAT frontier 5"),
        "{reply}"
    );
    a.client.close().await;
    c.stop().await;
}

/// Whether a durable join decides on a channel's class as the registry has it: a change the
/// appliance makes (`cotald channels set`) at once, one another writer puts in the bucket as
/// the appliance's watch of it brings it.
#[tokio::test]
async fn a_join_follows_the_channel_registry_whoever_wrote_it() {
    use cotald::protocol::{ChannelConfig, DeliveryClass};
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "quiet"]).await;
    let b = Probe::connect(&c, &bob.creds).await;
    let ctl = format!("cotal.main.ctl.manager.{}", bob.id);
    let from = json!({"id": bob.id, "name": "bob"});
    let join =
        json!({"op": "durable-join", "args": {"channel": "quiet", "cursor": 0}, "from": from});
    let leave = json!({"op": "durable-leave", "args": {"channel": "quiet"}, "from": from});
    let ask = |body: &serde_json::Value| {
        let (client, ctl, body) = (b.client.clone(), ctl.clone(), body.to_string());
        async move {
            let reply = tokio::time::timeout(TIMEOUT, client.request(ctl, body.into()))
                .await
                .expect("a reply in time")
                .expect("a reply");
            serde_json::from_slice::<serde_json::Value>(&reply.payload).unwrap()
        }
    };

    let out =
        crate::helper::cotald_in(tmp.path(), &["channels", "set", "quiet", "--class", "live"])
            .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply = ask(&join).await;
    assert_eq!(
        reply["ok"], false,
        "the appliance's own write, at once: {reply}"
    );
    assert!(
        reply["error"].as_str().unwrap().contains("live channel"),
        "{reply}"
    );

    let other = another_writer(&c, tmp.path()).await;
    let class = |class| ChannelConfig {
        delivery_class: Some(class),
        ..Default::default()
    };
    other
        .set_channel("quiet", &class(DeliveryClass::Durable))
        .await
        .unwrap();
    eventually("a join on quiet accepted", || async {
        (ask(&join).await["ok"] == true).then_some(())
    })
    .await;
    assert_eq!(ask(&leave).await["ok"], true);
    other
        .set_channel("quiet", &class(DeliveryClass::Live))
        .await
        .unwrap();
    let refused = eventually("a join on quiet refused", || async {
        let reply = ask(&join).await;
        (reply["ok"] == false).then_some(reply)
    })
    .await;
    assert!(
        refused["error"].as_str().unwrap().contains("live channel"),
        "{refused}"
    );
    other.close().await;
    c.stop().await;
}
