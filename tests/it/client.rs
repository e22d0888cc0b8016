//! The client endpoint against the real broker (§12): the interop scenario, the join window,
//! raw-NATS adversaries, presence across a broker crash, and the CLI over it.

use std::collections::BTreeMap;

use cotald::client::{ClientError, ConnectionState, DurableState, JoinError, Notice, Replay};
use cotald::protocol::{Channel, InstanceId, PresenceStatus, RejectReason, Routing};
use serde_json::json;

use crate::helper::{Cotald, Probe, TIMEOUT, cotald_in, delivery, endpoint, mint, notice};

fn channel(name: &str) -> Routing {
    Routing::channel(&Channel::new(name).unwrap())
}

fn to(id: &str) -> Routing {
    Routing::to(&InstanceId::from_user_nkey(id).unwrap())
}

fn text(d: &cotald::client::Delivery) -> String {
    serde_json::to_value(&d.message.parts[0]).unwrap()["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn interop_scenario_of_section_12() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let team = [
        "--subscribe",
        "team.backend",
        "--allow-publish",
        "team.backend",
    ];
    let alice = mint(tmp.path(), "alice", "main", &team).await;
    let bob = mint(tmp.path(), "bob", "main", &team).await;
    let carol = mint(tmp.path(), "carol", "main", &["--role", "reviewer"]).await;
    let dave = mint(tmp.path(), "dave", "main", &["--role", "reviewer"]).await;
    let erin = mint(tmp.path(), "erin", "main", &["--subscribe", "team.backend"]).await;

    // 1–3: connect with `_INBOX_<id>`, write presence, join team.backend.
    let a = endpoint(&alice, |_| {}).await;
    let mut b = endpoint(&bob, |_| {}).await;
    assert_eq!(
        a.client.id().as_str(),
        alice.id,
        "the credential's id is adopted (§2)"
    );
    for conn in [&a, &b] {
        let report = conn
            .client
            .join("team.backend", Replay::AsConfigured)
            .await
            .unwrap();
        assert_eq!(
            report.durable,
            DurableState::Established,
            "durable channel: the manager recorded the membership"
        );
        assert_eq!(report.summary(), "joined durable team.backend");
    }
    loop {
        if a.client
            .roster()
            .peer(&bob.id)
            .is_some_and(|p| p.status() == PresenceStatus::Idle)
        {
            break;
        }
        tokio::time::timeout(TIMEOUT, a.client.roster().changed())
            .await
            .expect("bob appears in alice's roster");
    }

    // 4: multicast → kind=channel.
    let (sent, _) = a
        .client
        .send_text(channel("team.backend"), "multicast")
        .await
        .unwrap();
    let got = delivery(&mut b.deliveries).await;
    assert_eq!(got.message.id, sent.id);
    assert_eq!(got.kind.as_str(), "channel");
    assert_eq!(got.channel.as_deref(), Some("team.backend"));
    assert!(
        !got.historical && !got.needs_ack(),
        "the live copy is not acked"
    );

    // 5: unicast → kind=dm, acked after handling.
    let (sent, _) = a.client.send_text(to(&bob.id), "unicast").await.unwrap();
    let got = delivery(&mut b.deliveries).await;
    assert_eq!(
        (got.message.id.as_str(), got.kind.as_str()),
        (sent.id.as_str(), "dm")
    );
    assert!(got.needs_ack());
    got.ack().await.unwrap();

    // 6: anycast to `reviewer` with two holders → exactly one receives kind=anycast.
    let mut cc = endpoint(&carol, |o| o.role = Some("reviewer".into())).await;
    let mut dd = endpoint(&dave, |o| o.role = Some("reviewer".into())).await;
    let (sent, _) = a
        .client
        .send_text(Routing::to_service("reviewer"), "anycast")
        .await
        .unwrap();
    let got = tokio::select! {
        d = delivery(&mut cc.deliveries) => d,
        d = delivery(&mut dd.deliveries) => d,
    };
    assert_eq!(
        (got.message.id.as_str(), got.kind.as_str()),
        (sent.id.as_str(), "anycast")
    );
    got.ack().await.unwrap();
    let mut w = Probe::connect(&c, &tmp.path().join("spaces/main/local-operator.creds")).await;
    let svc = w
        .request("$JS.API.CONSUMER.INFO.TASK_main.svc_reviewer", json!({}))
        .await;
    assert_eq!(svc["num_pending"], 0, "{svc}");
    assert_eq!(svc["num_ack_pending"], 0, "no second copy in flight: {svc}");
    assert_eq!(
        svc["delivered"]["consumer_seq"], 1,
        "one task, delivered once: {svc}"
    );
    assert_eq!(svc["num_redelivered"], 0, "{svc}");

    // 7: a late joiner replays with historical=true, no duplicates.
    for i in 0..5 {
        a.client
            .send_text(channel("team.backend"), &format!("history {i}"))
            .await
            .unwrap();
    }
    let mut e = endpoint(&erin, |_| {}).await;
    let report = e
        .client
        .join("team.backend", Replay::AsConfigured)
        .await
        .unwrap();
    assert_eq!(report.backfilled, 6, "everything at or below the watermark");
    let (marker, _) = a
        .client
        .send_text(channel("team.backend"), "after join")
        .await
        .unwrap();
    let mut seen = BTreeMap::new();
    loop {
        let d = delivery(&mut e.deliveries).await;
        let id = d.message.id.clone();
        *seen.entry(id.clone()).or_insert(0) += 1;
        if id == marker.id {
            assert!(!d.historical);
            break;
        }
        assert!(d.historical, "{}", text(&d));
    }
    assert_eq!(seen.len(), 7);
    assert!(seen.values().all(|&n| n == 1), "no duplicates: {seen:?}");
    for conn in [a, b, cc, dd, e] {
        conn.client.close().await;
    }
    c.stop().await;
}

#[tokio::test]
async fn nothing_is_lost_or_duplicated_in_the_join_window() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    let mut b = endpoint(&bob, |o| o.presence = false).await;

    // Four publishers at once, so that several messages are in flight while the join runs.
    const PUBLISHERS: usize = 4;
    const EACH: usize = 100;
    const N: usize = PUBLISHERS * EACH;
    let mut senders = Vec::new();
    for p in 0..PUBLISHERS {
        let publisher = a.client.clone();
        senders.push(tokio::spawn(async move {
            let mut ids = Vec::with_capacity(EACH);
            for i in 0..EACH {
                let (m, _) = publisher
                    .send_text(channel("general"), &format!("{p}/{i}"))
                    .await
                    .unwrap();
                ids.push(m.id);
            }
            ids
        }));
    }
    // Join while the publisher is mid-stream.
    tokio::task::yield_now().await;
    let report = b
        .client
        .join("general", Replay::AsConfigured)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for sender in senders {
        ids.extend(sender.await.unwrap());
    }
    assert!(
        (report.watermark as usize) < N,
        "the join landed inside the burst: {report:?}"
    );
    let mut seen = BTreeMap::new();
    let mut historical = 0;
    while seen.len() < N {
        let d = delivery(&mut b.deliveries).await;
        historical += usize::from(d.historical);
        *seen.entry(d.message.id.clone()).or_insert(0) += 1;
    }
    assert!(
        historical <= report.backfilled,
        "backfill counts what it surfaced"
    );
    // One more live message proves nothing else was queued behind.
    let (last, _) = a.client.send_text(channel("general"), "end").await.unwrap();
    loop {
        let d = delivery(&mut b.deliveries).await;
        if d.message.id == last.id {
            break;
        }
        *seen.entry(d.message.id.clone()).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), N);
    assert!(
        ids.iter().all(|id| seen.get(id) == Some(&1)),
        "each message exactly once"
    );
    c.stop().await;
}

#[tokio::test]
async fn raw_nats_adversaries_are_rejected_not_surfaced_not_redelivered() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let mut b = endpoint(&bob, |o| o.presence = false).await;
    b.client.join("general", Replay::Off).await.unwrap();
    // The adversary: an unrestricted user of the space, publishing raw NATS.
    let mut raw = Probe::connect(&c, &tmp.path().join("spaces/main/local-operator.creds")).await;
    let js = async_nats::jetstream::new(raw.client.clone());
    let mallory = "UAQGWOEVJKMIO4WXSYOTLARXYOZTCXFK67JASEH6AFFFYK6FOPSKQCAD";
    let envelope = |from: &str, routing: serde_json::Value| {
        let mut m = json!({
            "id": cotald::protocol::new_message_id(),
            "ts": 1,
            "space": "main",
            "from": {"id": from, "name": "mallory"},
            "parts": [{"kind": "text", "text": "x"}],
        });
        m.as_object_mut()
            .unwrap()
            .extend(routing.as_object().unwrap().clone());
        m.to_string()
    };
    let dm_subject = format!("cotal.main.inst.{}.{mallory}", bob.id);
    let cases = [
        // A spoofed `from` on a DM.
        (
            dm_subject.clone(),
            envelope(&bob.id, json!({"to": bob.id})),
            RejectReason::SenderMismatch,
        ),
        // Malformed JSON on a DM.
        (
            dm_subject.clone(),
            "{not json".to_owned(),
            RejectReason::MalformedJson,
        ),
        // A sender token outside the token alphabet: the subject does not parse.
        (
            format!("cotal.main.inst.{}.bad$sender", bob.id),
            envelope("bad$sender", json!({"to": bob.id})),
            RejectReason::MalformedSubject,
        ),
    ];
    for (subject, payload, reason) in cases {
        js.publish(subject.clone(), payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
        match notice(&mut b.deliveries).await {
            Notice::Rejected(a) => {
                assert_eq!(a.reason, reason, "{subject}: {}", a.detail);
                assert_eq!(a.subject, subject);
            }
            other => panic!("{other:?}"),
        }
    }
    // Spoofed sender on the live channel: dropped with its reason (the live copy has no ack).
    raw.client
        .publish(
            format!("cotal.main.chat.{mallory}.general"),
            envelope(&bob.id, json!({"channel": "general"})).into(),
        )
        .await
        .unwrap();
    match notice(&mut b.deliveries).await {
        Notice::Rejected(a) => assert_eq!(a.reason, RejectReason::SenderMismatch),
        other => panic!("{other:?}"),
    }
    // A payload `to` on a chat subject is a channel delivery (§4: kind from the subject).
    raw.client
        .publish(
            format!("cotal.main.chat.{mallory}.general"),
            envelope(mallory, json!({"to": bob.id})).into(),
        )
        .await
        .unwrap();
    let d = delivery(&mut b.deliveries).await;
    assert_eq!(d.kind.as_str(), "channel");
    assert!(b.deliveries.try_notice().is_none(), "no other notice");

    // None of the rejected DM copies is pending or redelivered: they were terminated (the
    // terms travel on bob's connection, this check on another: wait until they landed).
    let info = tokio::time::timeout(TIMEOUT, async {
        loop {
            let info = raw
                .request(
                    &format!("$JS.API.CONSUMER.INFO.DM_main.dm_{}", bob.id),
                    json!({}),
                )
                .await;
            if info["num_ack_pending"] == 0 {
                return info;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the terminated copies settle");
    assert_eq!(info["num_redelivered"], 0, "{info}");
    assert_eq!(info["num_pending"], 0, "{info}");
    c.stop().await;
}

#[tokio::test]
async fn refusals_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(
        tmp.path(),
        "alice",
        "main",
        &[
            "--allow-subscribe",
            "general,team.>",
            "--subscribe",
            "general",
        ],
    )
    .await;
    let mut a = endpoint(&alice, |o| o.presence = false).await;

    // Outside the read ACL: refused by the broker, reported as such, not joined.
    let err = a
        .client
        .join("ops", Replay::AsConfigured)
        .await
        .unwrap_err();
    assert!(matches!(err, JoinError::Refused { .. }), "{err}");
    assert!(a.client.joined().await.is_empty());
    // A wildcard join within the ACL works, and so does leaving the last channel.
    let report = a.client.join("team.>", Replay::AsConfigured).await.unwrap();
    assert_eq!(report.channel, "team.>");
    a.client.leave("team.>").await.unwrap();
    assert!(a.client.joined().await.is_empty());
    // The bare parent of a `team.>` grant is not covered.
    assert!(matches!(
        a.client.join("team", Replay::Off).await,
        Err(JoinError::Refused { .. })
    ));

    // A publish outside allowPublish (default deny): a clear error naming the subject.
    let err = a
        .client
        .send_text(channel("general"), "x")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::PublishRefused { subject } if subject.starts_with("cotal.main.chat.")),
        "{err}"
    );

    // An explicit id that is not the credential's: refused before connecting.
    let link = cotald::protocol::JoinLink::parse(&alice.link).unwrap();
    let mut opts =
        cotald::client::ConnectOptions::new(link, std::fs::read_to_string(&alice.creds).unwrap());
    opts.ca = Some(alice.ca.clone());
    opts.expect_id = Some("UDI36ZKVNUM5WMO4QQ6HDQU7F4OH2RCXOJRX6GAIOS5SKVNNSKCDNLJA".into());
    let err = cotald::client::Client::connect(opts)
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, ClientError::IdMismatch { .. }), "{err}");
    // A role the credential was not minted for.
    let link = cotald::protocol::JoinLink::parse(&alice.link).unwrap();
    let mut opts =
        cotald::client::ConnectOptions::new(link, std::fs::read_to_string(&alice.creds).unwrap());
    opts.ca = Some(alice.ca.clone());
    opts.role = Some("reviewer".into());
    let err = cotald::client::Client::connect(opts)
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&err, ClientError::RoleNotGranted { role, .. } if role == "reviewer"),
        "{err}"
    );
    let _ = a.deliveries.try_notice();
    c.stop().await;
}

#[tokio::test]
async fn presence_survives_a_broker_crash() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let a = endpoint(&alice, |_| {}).await;
    let b = endpoint(&bob, |_| {}).await;
    let roster = b.client.roster().clone();
    let online = |r: &cotald::client::Roster| {
        r.peer(&alice.id)
            .is_some_and(|p| p.status() == PresenceStatus::Idle)
    };
    while !online(&roster) {
        tokio::time::timeout(TIMEOUT, roster.changed())
            .await
            .expect("alice appears");
    }

    // Bob is also a member of a channel and has a DM consumer: both must survive.
    let mut b = b;
    b.client.join("general", Replay::Off).await.unwrap();
    let mut state = a.client.state();
    let broker = c.state().broker_pid;
    // SAFETY: plain syscall on the broker child.
    assert_eq!(unsafe { libc::kill(broker as i32, libc::SIGKILL) }, 0);
    c.wait_stderr("nats-server restarted").await;
    // The connection state is observable: reconnecting, then connected again.
    let mut seen_reconnecting = false;
    tokio::time::timeout(TIMEOUT, async {
        loop {
            state.changed().await.unwrap();
            match *state.borrow_and_update() {
                cotald::client::ConnectionState::Reconnecting => seen_reconnecting = true,
                cotald::client::ConnectionState::Connected if seen_reconnecting => break,
                _ => {}
            }
        }
    })
    .await
    .expect("alice reconnects");
    // After the restart the roster is rebound without restarting the client, and shows
    // heartbeats written after the crash.
    let restarted_at = cotald::protocol::EpochMillis::now().as_u64().unwrap();
    loop {
        let fresh = roster
            .peer(&alice.id)
            .and_then(|p| p.presence.ts.as_u64())
            .is_some_and(|ts| ts >= restarted_at);
        if fresh && online(&roster) && !roster.is_stale() {
            break;
        }
        tokio::time::timeout(TIMEOUT, roster.changed())
            .await
            .expect("the roster recovers");
    }
    // Subscriptions and consumers were re-established: a DM and a channel message arrive.
    let alice_poster = mint(
        tmp.path(),
        "poster",
        "main",
        &["--allow-publish", "general"],
    )
    .await;
    let p = endpoint(&alice_poster, |o| o.presence = false).await;
    let (dm, _) = p
        .client
        .send_text(to(&bob.id), "after the crash")
        .await
        .unwrap();
    let (multi, _) = p
        .client
        .send_text(channel("general"), "after the crash")
        .await
        .unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let d = delivery(&mut b.deliveries).await;
        got.push(d.message.id.clone());
        d.ack().await.unwrap();
    }
    got.sort();
    let mut want = vec![dm.id, multi.id];
    want.sort();
    assert_eq!(got, want);
    a.client.close().await;
    // The graceful close writes one final offline record.
    while roster
        .peer(&alice.id)
        .is_some_and(|p| p.status() != PresenceStatus::Offline)
    {
        tokio::time::timeout(TIMEOUT, roster.changed())
            .await
            .expect("alice goes offline");
    }
    b.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn send_and_tail_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let cli = |args: Vec<String>| {
        tokio::process::Command::new(crate::helper::cotald_bin())
            .args(args)
            .output()
    };
    let base = |m: &crate::helper::Minted| {
        vec![
            "--creds".to_owned(),
            m.creds.display().to_string(),
            "--link".to_owned(),
            m.link.clone(),
            "--ca".to_owned(),
            m.ca.display().to_string(),
        ]
    };
    let mut send = vec!["send".to_owned()];
    send.extend(base(&alice));
    send.extend(["--channel".into(), "general".into(), "from the cli".into()]);
    let out = cli(send.clone()).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut dm = vec!["send".to_owned()];
    dm.extend(base(&alice));
    dm.extend(["--to".into(), bob.id.clone(), "a dm".into()]);
    assert!(cli(dm).await.unwrap().status.success());

    let mut tail = vec!["tail".to_owned()];
    tail.extend(base(&bob));
    tail.extend([
        "--channel".into(),
        "general".into(),
        "--dm".into(),
        "--count".into(),
        "2".into(),
        "--json".into(),
    ]);
    let out = tokio::time::timeout(TIMEOUT, cli(tail))
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    let kinds: Vec<&str> = lines.iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert!(
        kinds.contains(&"dm") && kinds.contains(&"channel"),
        "{kinds:?}"
    );
    for l in &lines {
        for key in ["id", "kind", "historical", "channel", "from", "parts", "ts"] {
            assert!(l.get(key).is_some(), "{key} in {l}");
        }
        if l["kind"] == "channel" {
            assert_eq!(l["historical"], true, "sent before the join: replayed");
        }
    }
    // The DM was acked by tail: nothing pending for bob.
    let mut w = Probe::connect(&c, &tmp.path().join("spaces/main/local-operator.creds")).await;
    let info = w
        .request(
            &format!("$JS.API.CONSUMER.INFO.DM_main.dm_{}", bob.id),
            json!({}),
        )
        .await;
    assert_eq!(info["num_ack_pending"], 0, "{info}");
    assert_eq!(info["num_pending"], 0, "{info}");

    // A refused send exits non-zero with the reason.
    let mut bad = vec!["send".to_owned()];
    bad.extend(base(&bob));
    bad.extend(["--channel".into(), "general".into(), "x".into()]);
    let out = cli(bad).await.unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused to publish"));
    c.stop().await;
}

#[tokio::test]
async fn endpoint_semantics() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(
        tmp.path(),
        "alice",
        "main",
        &["--allow-publish", "general", "--role", "reviewer"],
    )
    .await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let mut a = endpoint(&alice, |o| o.role = Some("reviewer".into())).await;
    let mut b = endpoint(&bob, |_| {}).await;
    b.client.join("general", Replay::Off).await.unwrap();

    // Mentions are normalized (§5).
    let (sent, _) = a
        .client
        .send(
            channel("general"),
            vec![cotald::protocol::Part::text("hi")],
            &[" Bob ".into(), "bob".into(), "".into()],
        )
        .await
        .unwrap();
    assert_eq!(sent.mentions, ["bob"]);
    let got = delivery(&mut b.deliveries).await;
    assert_eq!(got.message.mentions, ["bob"]);

    // Nak is a transient failure: the DM is redelivered; ack ends it.
    let (dm, _) = a.client.send_text(to(&bob.id), "retry me").await.unwrap();
    let first = delivery(&mut b.deliveries).await;
    assert_eq!(first.message.id, dm.id);
    first.nak().await.unwrap();
    let again = delivery(&mut b.deliveries).await;
    assert_eq!(again.message.id, dm.id, "redelivered after nak");
    again.ack().await.unwrap();

    // Own anycast on a shared role queue is not consumed away: the holder receives it.
    let (task, _) = a
        .client
        .send_text(Routing::to_service("reviewer"), "self-assigned")
        .await
        .unwrap();
    let got = delivery(&mut a.deliveries).await;
    assert_eq!(
        (got.message.id.as_str(), got.kind.as_str()),
        (task.id.as_str(), "anycast")
    );
    got.ack().await.unwrap();

    // Control requests: an unknown op is refused by name (§5 `{ok: false, error}`).
    let reply = a
        .client
        .control(
            "manager",
            &cotald::protocol::ControlRequest::new("ping", a.client.endpoint()),
        )
        .await
        .unwrap();
    assert!(!reply.ok);
    assert!(reply.error.unwrap().contains("unknown op `ping`"));
    // A typed error when nobody serves the service (the machine operator may publish on any
    // ctl subject; nobody serves `nobody`).
    let op = crate::helper::operator_endpoint(tmp.path(), &alice, false).await;
    let err = op
        .client
        .control(
            "nobody",
            &cotald::protocol::ControlRequest::new("ping", op.client.endpoint()),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, cotald::client::ClientError::NoResponders { .. }),
        "{err}"
    );
    op.client.close().await;
    // A control subject outside the credential: refused, named, not a timeout.
    let err = a
        .client
        .control(
            "admin",
            &cotald::protocol::ControlRequest::new("ping", a.client.endpoint()),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, cotald::client::ClientError::PublishRefused { .. }),
        "{err}"
    );

    // Presence: status, activity, attention and channel modes reach peers; a record whose
    // key is not its card id is dropped from the roster.
    a.client
        .set_status(PresenceStatus::Working, Some("reviewing".into()))
        .await
        .unwrap();
    a.client
        .set_attention(Some(cotald::protocol::AttentionMode::Focus))
        .await
        .unwrap();
    a.client
        .set_channel_mode(
            &Channel::new("general").unwrap(),
            Some(cotald::protocol::ChannelMode::Quiet),
        )
        .await
        .unwrap();
    assert!(
        a.client
            .set_status(PresenceStatus::Offline, None)
            .await
            .is_err(),
        "never offline while live"
    );
    let roster = b.client.roster().clone();
    loop {
        let done = roster.peer(&alice.id).is_some_and(|p| {
            p.status() == PresenceStatus::Working
                && p.presence.activity.as_deref() == Some("reviewing")
                && p.presence.attention == Some(cotald::protocol::AttentionMode::Focus)
                && p.presence.channel_modes.get("general")
                    == Some(&cotald::protocol::ChannelMode::Quiet)
        });
        if done {
            break;
        }
        tokio::time::timeout(TIMEOUT, roster.changed())
            .await
            .expect("alice's presence arrives");
    }
    let mut raw = Probe::connect(&c, &tmp.path().join("spaces/main/local-operator.creds")).await;
    let impostor = "UDI36ZKVNUM5WMO4QQ6HDQU7F4OH2RCXOJRX6GAIOS5SKVNNSKCDNLJA";
    let record = json!({"card": {"id": alice.id, "name": "not alice", "kind": "agent"}, "status": "idle", "ts": 1});
    async_nats::jetstream::new(raw.client.clone())
        .publish(
            format!("$KV.cotal_presence_main.{impostor}"),
            record.to_string().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    raw.barrier().await;
    let written_at = cotald::protocol::EpochMillis::now().as_u64().unwrap();
    // A heartbeat of alice written after the impostor record is applied after it too (one
    // ordered watch): then check the impostor is absent.
    while roster
        .peer(&alice.id)
        .and_then(|p| p.presence.ts.as_u64())
        .is_none_or(|ts| ts <= written_at)
    {
        tokio::time::timeout(TIMEOUT, roster.changed())
            .await
            .expect("heartbeats keep coming");
    }
    assert!(roster.peer(impostor).is_none(), "key ≠ card.id is dropped");
    assert_eq!(roster.peer(&alice.id).unwrap().presence.card.name, "alice");
    a.client.close().await;
    b.client.close().await;
    c.stop().await;
}

/// A DM this session handled, delivered again (here stored a second time under another stream
/// id, as an unclean broker stop that lost its ack or its dedup window leaves it), is settled
/// without being surfaced again (§4); a DM never handled still comes again (the nak test
/// above).
#[tokio::test]
async fn a_dm_handled_in_this_session_is_not_surfaced_again() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let mut b = endpoint(&bob, |o| o.presence = false).await;
    // Alice publishes raw, so that one message can be stored twice.
    let raw = Probe::connect(&c, &alice.creds).await;
    let js = async_nats::jetstream::new(raw.client.clone());
    let subject = format!("cotal.main.inst.{}.{}", bob.id, alice.id);
    let from = cotald::protocol::EndpointRef::new(
        &InstanceId::from_user_nkey(&alice.id).unwrap(),
        "alice".to_owned(),
    );
    let dm = |text: &str| {
        let parts = vec![cotald::protocol::Part::text(text)];
        cotald::protocol::CotalMessage::new("main", from.clone(), to(&bob.id), parts)
    };
    let store = |message: &cotald::protocol::CotalMessage, msg_id: &str| {
        let publish = async_nats::jetstream::message::PublishMessage::build()
            .payload(message.to_json().unwrap().into())
            .message_id(msg_id);
        let (js, subject) = (js.clone(), subject.clone());
        async move {
            js.send_publish(subject, publish)
                .await
                .unwrap()
                .await
                .unwrap()
        }
    };
    let once = dm("once");
    store(&once, "first copy").await;
    let got = delivery(&mut b.deliveries).await;
    assert_eq!(got.message.id, once.id);
    got.ack().await.unwrap();
    // The same message again, then another: the next one surfaced is the other.
    store(&once, "second copy").await;
    let next = dm("next");
    store(&next, "next").await;
    let got = delivery(&mut b.deliveries).await;
    assert_eq!(
        (got.message.id.as_str(), text(&got)),
        (next.id.as_str(), "next".to_owned()),
        "the copy of a handled DM is not surfaced again"
    );
    // Confirmed: the copy's ack, sent before on the same connection, has landed too.
    got.ack_confirmed().await.unwrap();
    let mut operator =
        Probe::connect(&c, &tmp.path().join("spaces/main/local-operator.creds")).await;
    let info = operator
        .request(
            &format!("$JS.API.CONSUMER.INFO.DM_main.dm_{}", bob.id),
            json!({}),
        )
        .await;
    assert_eq!(
        (&info["num_ack_pending"], &info["num_pending"]),
        (&json!(0), &json!(0)),
        "the copy of the handled DM was settled: {info:#}"
    );
    b.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn a_dm_sent_while_offline_arrives_on_connect() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    // Bob has never connected: his dm_<id> was created at mint and holds the message.
    let (sent, _) = a
        .client
        .send_text(to(&bob.id), "while you were away")
        .await
        .unwrap();
    let mut b = endpoint(&bob, |_| {}).await;
    let got = delivery(&mut b.deliveries).await;
    assert_eq!(got.message.id, sent.id);
    assert_eq!(got.kind.as_str(), "dm");
    got.ack().await.unwrap();
    b.client.close().await;
    a.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn tail_drains_history_deeper_than_its_queue() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let mut publishers = Vec::new();
    for name in ["p1", "p2"] {
        let m = mint(tmp.path(), name, "main", &["--allow-publish", "general"]).await;
        publishers.push(endpoint(&m, |o| o.presence = false).await);
    }
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    // 1200 retained messages (600 per sender, within 1000 per subject): more than the 1024
    // deliveries the client queues.
    let mut tasks = Vec::new();
    for p in &publishers {
        for lane in 0..4 {
            let client = p.client.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..150 {
                    client
                        .send_text(channel("general"), &format!("{lane}/{i}"))
                        .await
                        .unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let out = tokio::time::timeout(
        TIMEOUT,
        tokio::process::Command::new(crate::helper::cotald_bin())
            .arg("tail")
            .arg("--creds")
            .arg(&bob.creds)
            .args(["--link", &bob.link, "--ca"])
            .arg(&bob.ca)
            .args(["--channel", "general", "--count", "1200", "--json"])
            .output(),
    )
    .await
    .expect("tail finishes")
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: std::collections::BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 1200, "every retained message once");
    c.stop().await;
}

#[tokio::test]
async fn plain_tail_shows_controls_from_the_wire_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let a = endpoint(&alice, |_| {}).await;
    a.client
        .send_text(
            channel("general"),
            "\u{1b}]0;owned\u{7}\u{1b}[2Jhi\r\n#general mallory: forged\u{202e}",
        )
        .await
        .unwrap();
    let out = tokio::time::timeout(
        TIMEOUT,
        tokio::process::Command::new(crate::helper::cotald_bin())
            .arg("tail")
            .arg("--creds")
            .arg(&bob.creds)
            .args(["--link", &bob.link, "--ca"])
            .arg(&bob.ca)
            .args(["--channel", "general", "--count", "1"])
            .output(),
    )
    .await
    .expect("tail finishes")
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(
        !shown
            .chars()
            .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
        "{shown:?}"
    );
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(
        lines,
        [
            "#general alice (history): \\u{1b}]0;owned\\u{7}\\u{1b}[2Jhi\\u{d}",
            "    #general mallory: forged\\u{202e}",
        ]
    );
    a.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn tail_into_a_closed_pipe_exits_quietly_and_acks_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let a = endpoint(&alice, |_| {}).await;
    a.client.send_text(to(&bob.id), "unread").await.unwrap();
    a.client.close().await;
    let (creds, ca) = (bob.creds.to_str().unwrap(), bob.ca.to_str().unwrap());
    let out = crate::helper::into_a_closed_pipe(&[
        "tail", "--creds", creds, "--link", &bob.link, "--ca", ca, "--dm", "--count", "1",
    ])
    .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked") && !err.contains("error"), "{err}");
    // Not printed, so not acked: the DM is still bob's to read.
    let mut w = Probe::connect(&c, &tmp.path().join("spaces/main/local-operator.creds")).await;
    let info = w
        .request(
            &format!("$JS.API.CONSUMER.INFO.DM_main.dm_{}", bob.id),
            json!({}),
        )
        .await;
    let unacked = info["num_ack_pending"].as_u64().unwrap() + info["num_pending"].as_u64().unwrap();
    assert_eq!(unacked, 1, "{info}");
    c.stop().await;
}

#[tokio::test]
async fn a_reconnect_leaves_no_gap_on_a_joined_channel() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(
        tmp.path(),
        "alice",
        "main",
        &["--allow-publish", "lounge,quiet"],
    )
    .await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "lounge,quiet"]).await;
    // Live channels: nothing but the live subscription and the history read can bring a
    // message to bob. `quiet` may not be read back (replay off): its gap is reported.
    let op = crate::helper::operator_endpoint(tmp.path(), &alice, false).await;
    crate::helper::set_channel(&op, "lounge", json!({"deliveryClass": "live"})).await;
    crate::helper::set_channel(
        &op,
        "quiet",
        json!({"deliveryClass": "live", "replay": false}),
    )
    .await;
    op.client.close().await;

    // Bob reaches the broker through a relay the test cuts; alice directly.
    let relay = crate::helper::Relay::start(c.state().listen).await;
    let via_relay = crate::helper::Minted {
        link: format!("cotals://{}/main", relay.addr),
        ..bob
    };
    let mut b = endpoint(&via_relay, |_| {}).await;
    for ch in ["lounge", "quiet"] {
        b.client.join(ch, Replay::Off).await.unwrap();
    }
    let a = endpoint(&alice, |o| o.presence = false).await;
    let (before, _) = a
        .client
        .send_text(channel("lounge"), "before")
        .await
        .unwrap();
    assert_eq!(delivery(&mut b.deliveries).await.message.id, before.id);

    let mut state = b.client.state();
    relay.close();
    tokio::time::timeout(
        TIMEOUT,
        state.wait_for(|s| *s == ConnectionState::Reconnecting),
    )
    .await
    .expect("bob notices the drop")
    .unwrap();
    let mut missed = std::collections::BTreeSet::new();
    for i in 0..50 {
        let (m, _) = a
            .client
            .send_text(channel("lounge"), &format!("while away {i}"))
            .await
            .unwrap();
        missed.insert(m.id);
    }
    a.client
        .send_text(channel("quiet"), "unrecoverable")
        .await
        .unwrap();
    relay.open();

    let mut surfaced = std::collections::BTreeSet::new();
    let mut gap_reported = false;
    tokio::time::timeout(TIMEOUT, async {
        while !missed.is_subset(&surfaced) || !gap_reported {
            match b.deliveries.next_event().await.unwrap() {
                cotald::client::deliver::Event::Message(d) => {
                    assert!(surfaced.insert(d.message.id.clone()), "surfaced twice");
                    assert!(!d.historical, "a missed live message is not history");
                    d.ack().await.unwrap();
                }
                cotald::client::deliver::Event::Notice(Notice::Gap { channel, .. }) => {
                    assert_eq!(channel, "quiet");
                    gap_reported = true;
                }
                cotald::client::deliver::Event::Notice(other) => panic!("{other:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{} of {} messages published while away surfaced; gap reported: {gap_reported}",
            missed.intersection(&surfaced).count(),
            missed.len()
        )
    });
    assert!(!surfaced.contains(&before.id), "nothing surfaced twice");
    for conn in [a, b] {
        conn.client.close().await;
    }
    c.stop().await;
}

#[tokio::test]
async fn names_resolve_through_the_loaded_roster() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let twin_a = mint(tmp.path(), "twin-a", "main", &[]).await;
    let twin_b = mint(tmp.path(), "twin-b", "main", &[]).await;
    let b = endpoint(&bob, |_| {}).await;
    let twin = |o: &mut cotald::client::ConnectOptions| o.name = Some("twin".into());
    let ta = endpoint(&twin_a, twin).await;
    let tb = endpoint(&twin_b, twin).await;

    // Alice connects after the others announced themselves: once loaded, her roster holds them
    // without waiting for a heartbeat.
    let a = endpoint(&alice, |_| {}).await;
    let roster = a.client.roster();
    tokio::time::timeout(TIMEOUT, roster.loaded())
        .await
        .expect("the roster loads");
    assert_eq!(roster.resolve("bob").unwrap().as_str(), bob.id);
    assert_eq!(
        roster.resolve(&twin_a.id).unwrap().as_str(),
        twin_a.id,
        "an id is taken as given"
    );
    match roster.resolve("carol") {
        Err(cotald::client::ResolveError::Unknown { known, .. }) => {
            assert!(known.contains("bob") && known.contains("twin"), "{known:?}");
        }
        other => panic!("an unknown name is an error listing the names: {other:?}"),
    }
    let ambiguous = roster.resolve("twin").unwrap_err();
    let text = ambiguous.to_string();
    assert!(
        text.contains(&twin_a.id) && text.contains(&twin_b.id),
        "both candidates are listed: {text}"
    );

    // When one of the two has gone offline, the name picks the one online.
    tb.client.close().await;
    loop {
        if roster.resolve("twin").is_ok() {
            break;
        }
        tokio::time::timeout(TIMEOUT, roster.changed())
            .await
            .expect("twin_b's offline record arrives");
    }
    assert_eq!(roster.resolve("twin").unwrap().as_str(), twin_a.id);
    for conn in [a, b, ta] {
        conn.client.close().await;
    }
    c.stop().await;
}

/// A person and their agents, both ways: the machine operator DMs an agent, the agent answers
/// the sender of what it got, and `cotald tail --dm` as the operator prints the answer. The
/// warden purges nothing addressed to an identity that exists (the operator is a person with a
/// DM inbox, not an agent).
#[tokio::test]
async fn the_operator_reads_an_agents_reply_to_its_dm() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let mut a = endpoint(&alice, |o| o.presence = false).await;
    let sent = cotald_in(tmp.path(), &["send", "--to", "alice", "are you there?"]).await;
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let asked = delivery(&mut a.deliveries).await;
    assert_eq!(asked.message.from.name, "local-operator");
    let operator = InstanceId::from_user_nkey(&asked.message.from.id).unwrap();
    asked.ack().await.unwrap();
    a.client
        .send_text(Routing::to(&operator), "yes, on it")
        .await
        .unwrap();
    let tail = cotald_in(tmp.path(), &["tail", "--dm", "--count", "1", "--json"]).await;
    assert!(
        tail.status.success(),
        "{}",
        String::from_utf8_lossy(&tail.stderr)
    );
    let line: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&tail.stdout).trim()).unwrap();
    assert_eq!(line["kind"], "dm", "{line}");
    assert_eq!(line["from"]["name"], "alice", "{line}");
    assert_eq!(line["parts"][0]["text"], "yes, on it", "{line}");
    a.client.close().await;
    let log = c.stop_for_log().await;
    assert!(!log.contains("purged messages"), "nothing purged:\n{log}");
}

/// A send while the broker is paused past the acknowledgement's timeout (SIGSTOP, then
/// SIGCONT): the client sends the same message again, with the same id, until it is
/// acknowledged, and reports it sent; the stream holds it exactly once.
#[tokio::test]
async fn a_send_across_a_paused_broker_is_reported_sent_and_stored_once() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "pause"]).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    let broker = c.state().broker_pid;
    // SAFETY: plain syscall on the appliance's child.
    assert_eq!(unsafe { libc::kill(broker as i32, libc::SIGSTOP) }, 0);
    let sending = {
        let client = a.client.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let sent = client
                .send_text(Routing::channel(&Channel::new("pause").unwrap()), "once")
                .await;
            (sent, started.elapsed())
        })
    };
    // Past two of the acknowledgement's timeouts (5 s each; the client sent it again once, and
    // gave up, before it kept sending until acknowledged). The appliance restarts the stopped
    // broker meanwhile (it kills one that does not answer for several seconds).
    tokio::time::sleep(std::time::Duration::from_secs(12)).await;
    // SAFETY: as above (a broker already killed and replaced ignores it: ESRCH).
    unsafe { libc::kill(broker as i32, libc::SIGCONT) };
    let (sent, took) = tokio::time::timeout(2 * TIMEOUT, sending)
        .await
        .expect("the send ends")
        .unwrap();
    let restarted = c.state().broker_pid != broker;
    eprintln!("sent after {took:?} (broker restarted meanwhile: {restarted}): {sent:?}");
    let (message, _) = sent.expect("reported sent, not refused");
    let op = Probe::connect(&c, &tmp.path().join("spaces/main/local-operator.creds")).await;
    let js = async_nats::jetstream::new(op.client.clone());
    let subject = format!("cotal.main.chat.{}.pause", alice.id);
    let stream = js.get_stream("CHAT_main").await.unwrap();
    let mut subjects = stream.info_with_subjects(&subject).await.unwrap();
    let mut stored = 0;
    while let Some(entry) = futures_util::StreamExt::next(&mut subjects).await {
        stored += entry.unwrap().1;
    }
    assert_eq!(stored, 1, "{} stored once", message.id);
    a.client.close().await;
    c.stop().await;
}

/// A sender is known by name once its message was received (its id is the subject's, §5): a
/// peer that is away, and never was in the roster, is addressed by the name it signed with.
#[tokio::test]
async fn the_sender_of_a_received_message_is_addressed_by_name_while_away() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    let mut b = endpoint(&bob, |_| {}).await;
    assert!(
        b.client.roster().resolve("alice").is_err(),
        "unknown before"
    );
    a.client
        .send_text(
            Routing::to(&InstanceId::from_user_nkey(&bob.id).unwrap()),
            "hi bob",
        )
        .await
        .unwrap();
    delivery(&mut b.deliveries).await.ack().await.unwrap();
    a.client.close().await;
    let resolved = b.client.roster().resolve("alice").unwrap();
    assert_eq!(resolved.as_str(), alice.id);
    b.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn a_client_closed_after_its_credential_was_revoked_stops_dialing() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let b = endpoint(&bob, |_| {}).await;
    let out = cotald_in(tmp.path(), &["revoke", "bob", "--space", "main"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The broker logs each connection it refuses.
    let log = tmp.path().join("log").join("nats-server.log");
    let refused = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("authentication error")
            .count()
    };
    // While the client is open it dials again (a restarted broker may let it back in)...
    crate::helper::eventually("the revoked client dialing again", || async {
        (refused() >= 2).then_some(())
    })
    .await;
    // ...and once it is closed, never again: nothing is left to use the connection.
    b.client.close().await;
    let closed = refused();
    // A window, not a wait for an event: at the loopback pace (every 250 ms) a client still
    // dialing would be refused about eight times in it.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(
        refused() <= closed + 1,
        "refused {} more times after the close",
        refused() - closed
    );
    c.stop().await;
}

/// The pinned history consumer an interrupted read leaves behind (same name, filter and start,
/// some of the channel delivered) is not read on from where it stopped: the next read of the
/// history sees all of it.
#[tokio::test]
async fn a_history_read_after_an_interrupted_one_reads_from_the_start() {
    use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
    use futures_util::StreamExt;

    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let agent = ["--subscribe", "general", "--allow-publish", "general"];
    let alice = mint(tmp.path(), "alice", "main", &agent).await;
    let bob = mint(tmp.path(), "bob", "main", &agent).await;
    let b = endpoint(&bob, |_| {}).await;
    for i in 0..3 {
        b.client
            .send_text(channel("general"), &format!("m{i}"))
            .await
            .unwrap();
    }
    let raw = Probe::connect(&c, &alice.creds).await;
    let stream = async_nats::jetstream::new(raw.client.clone())
        .get_stream("CHAT_main")
        .await
        .unwrap();
    let left: PullConsumer = stream
        .create_consumer(pull::Config {
            name: Some(format!("chathist_{}", alice.id)),
            filter_subject: "cotal.main.chat.*.general".into(),
            ack_policy: AckPolicy::None,
            deliver_policy: DeliverPolicy::All,
            memory_storage: true,
            inactive_threshold: std::time::Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut batch = left.fetch().max_messages(2).messages().await.unwrap();
    let mut read = 0;
    while let Some(m) = tokio::time::timeout(TIMEOUT, batch.next()).await.unwrap() {
        m.unwrap();
        read += 1;
    }
    assert_eq!(read, 2, "the interrupted read delivered two");

    let a = endpoint(&alice, |_| {}).await;
    let general = cotald::protocol::Channel::new("general").unwrap();
    let history = tokio::time::timeout(TIMEOUT, a.client.history(&general, 10))
        .await
        .unwrap()
        .unwrap();
    let texts: Vec<String> = history
        .iter()
        .map(|m| match &m.parts[0] {
            cotald::protocol::Part::Text { text, .. } => text.clone(),
            other => panic!("not a text part: {other:?}"),
        })
        .collect();
    assert_eq!(texts, ["m0", "m1", "m2"]);
    c.stop().await;
}

/// A history of more bytes than one pull of a history read asks for, of messages near the
/// largest the broker takes, is read whole: by a join's replay and by a history read.
#[tokio::test]
async fn a_history_of_large_messages_is_read_whole() {
    const LARGE: usize = 1000 * 1024;
    const N: usize = 12;
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let agent = ["--subscribe", "general", "--allow-publish", "general"];
    let alice = mint(tmp.path(), "alice", "main", &agent).await;
    let bob = mint(tmp.path(), "bob", "main", &agent).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    let mut b = endpoint(&bob, |o| o.presence = false).await;
    for i in 0..N {
        let body = format!("{i:02}{}", "x".repeat(LARGE - 2));
        a.client.send_text(channel("general"), &body).await.unwrap();
    }
    let join = b.client.join("general", Replay::AsConfigured);
    let surfaced = async {
        let mut texts = Vec::new();
        while texts.len() < N {
            let d = delivery(&mut b.deliveries).await;
            assert!(d.historical, "only history was published: {d:?}");
            texts.push(text(&d));
        }
        texts
    };
    let (report, texts) = tokio::join!(join, surfaced);
    assert_eq!(report.unwrap().backfilled, N);
    let order: Vec<&str> = texts.iter().map(|t| &t[..2]).collect();
    let expected: Vec<String> = (0..N).map(|i| format!("{i:02}")).collect();
    assert_eq!(order, expected);
    assert!(texts.iter().all(|t| t.len() == LARGE));

    let general = Channel::new("general").unwrap();
    let history = tokio::time::timeout(TIMEOUT, b.client.history(&general, N))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(history.len(), N, "a history read of the same");
    a.client.close().await;
    b.client.close().await;
    c.stop().await;
}

/// A task reading the deliveries of a client that another task closes is not left waiting:
/// its reads end once the client is closed (what was queued before is still handed to it:
/// `client::deliver::sink::tests`).
#[tokio::test]
async fn reading_deliveries_ends_when_the_client_is_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    let mut b = endpoint(&bob, |_| {}).await;
    a.client
        .send_text(to(bob.id.as_str()), "before the close")
        .await
        .unwrap();
    let first = delivery(&mut b.deliveries).await;
    assert_eq!(text(&first), "before the close");
    first.ack().await.unwrap();
    let closing = b.client.clone();
    let reading = tokio::spawn(async move {
        let mut after = Vec::new();
        while let Some(d) = b.deliveries.next().await {
            after.push(text(&d));
        }
        after
    });
    closing.close().await;
    let after = tokio::time::timeout(TIMEOUT, reading)
        .await
        .expect("the reader's deliveries end once the client is closed")
        .unwrap();
    assert!(after.is_empty(), "nothing arrived after: {after:?}");
    a.client.close().await;
    c.stop().await;
}
