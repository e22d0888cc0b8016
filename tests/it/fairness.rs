//! One agent against the others: an ordinary agent credential (minted by the real `cotald
//! mint`) on a raw NATS client floods DMs, tasks and consumer creates; each test asserts the
//! flood is refused or bounded and that the victims lose nothing: their acknowledged DM or task
//! is still delivered, they can still send, their roster still works. The figures (what the
//! attacker got stored, what was refused) are printed for the record.

use std::path::Path;
use std::time::Duration;

use async_nats::jetstream;
use cotald::binding::streams::DM_MAX_MSGS_PER_PAIR;
use cotald::client::{ClientError, StoreLimit};
use cotald::protocol::{InstanceId, PresenceStatus, Routing};
use serde_json::json;

use crate::helper::{Cotald, Minted, Probe, TIMEOUT, delivery, endpoint, mint};

/// A profile whose DM and TASK budgets are small enough for a test to fill many times over.
pub(crate) const SMALL_BUDGETS: &str = r#"
[broker]
listen = "127.0.0.1:0"
monitor = "127.0.0.1:0"

[spaces.main]
profile = "local"

[spaces.main.jetstream]
max_memory_store = "64M"
max_file_store = "256M"

[spaces.main.retention]
dm_max_bytes = "16M"
task_max_bytes = "16M"
"#;

/// `cotald up` with [`SMALL_BUDGETS`].
async fn up_small(dir: &Path) -> Cotald {
    up_with(dir, SMALL_BUDGETS).await
}

/// `cotald up` with [`SMALL_BUDGETS`] but a 512 MiB quota and DM and TASK of 64 MiB: room for
/// a sender to overshoot its share (an eighth, 8 MiB) while it is being held.
async fn up_roomy(dir: &Path) -> Cotald {
    let budgets = SMALL_BUDGETS
        .replace(r#"max_file_store = "256M""#, r#"max_file_store = "512M""#)
        .replace(r#""16M""#, r#""64M""#);
    up_with(dir, &budgets).await
}

async fn up_with(dir: &Path, profile_text: &str) -> Cotald {
    let profile = dir.join("profile.toml");
    std::fs::write(&profile, profile_text).unwrap();
    let mut c = Cotald::spawn(dir, &["--config", profile.to_str().unwrap()]);
    c.wait_stdout("cotald is ready").await;
    c
}

pub(crate) fn to(id: &str) -> Routing {
    Routing::to(&InstanceId::from_user_nkey(id).unwrap())
}

/// The attacker: a raw NATS client with its minted agent credential.
async fn raw(c: &Cotald, m: &Minted) -> (Probe, jetstream::Context) {
    let p = Probe::connect(c, &m.creds).await;
    let js = jetstream::new(p.client.clone());
    (p, js)
}

/// Publishes `count` payloads of `size` bytes to the subjects `subject(i)` through JetStream;
/// returns (stored, refused) and the first refusal's text.
pub(crate) async fn flood(
    js: &jetstream::Context,
    count: usize,
    size: usize,
    subject: impl Fn(usize) -> String,
) -> (usize, usize, Option<String>) {
    let (mut stored, mut refused, mut first) = (0, 0, None);
    for i in 0..count {
        let ack = js
            .publish(subject(i), vec![b'x'; size].into())
            .await
            .unwrap();
        match tokio::time::timeout(TIMEOUT, ack).await.expect("an answer") {
            Ok(_) => stored += 1,
            Err(e) => {
                refused += 1;
                first.get_or_insert_with(|| e.to_string());
            }
        }
    }
    (stored, refused, first)
}

/// The machine operator's raw view of the space (stream state).
async fn operator(c: &Cotald) -> Probe {
    Probe::connect(c, &c.data_dir.join("spaces/main/local-operator.creds")).await
}

/// Messages and bytes a stream holds whose subjects match `filter`, and in all.
async fn held(op: &mut Probe, stream: &str, filter: &str) -> (u64, u64, u64) {
    let info = op
        .request(
            &format!("$JS.API.STREAM.INFO.{stream}"),
            json!({"subjects_filter": filter}),
        )
        .await;
    let matching = info["state"]["subjects"]
        .as_object()
        .map(|s| s.values().map(|n| n.as_u64().unwrap()).sum())
        .unwrap_or(0);
    (
        matching,
        info["state"]["messages"].as_u64().unwrap(),
        info["state"]["bytes"].as_u64().unwrap(),
    )
}

/// Waits (bounded) until `filter` holds no message in `stream`: the warden has purged it.
async fn purged(op: &mut Probe, stream: &str, filter: &str) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if held(op, stream, filter).await.0 == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{filter} still held in {stream}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn junk_dms_neither_evict_an_unread_dm_nor_stop_others_sending() {
    let tmp = tempfile::tempdir().unwrap();
    let c = up_small(tmp.path()).await;
    let mallory = mint(tmp.path(), "mallory", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let carol = mint(tmp.path(), "carol", "main", &[]).await;
    let mut op = operator(&c).await;

    // Carol's DM to Bob is acknowledged; Bob is offline.
    let cc = endpoint(&carol, |o| o.presence = false).await;
    let (first, _) = cc.client.send_text(to(&bob.id), "before").await.unwrap();

    // Mallory: 64 × 512 KiB (32 MiB, twice the DM budget) to made-up targets.
    let (_m, js) = raw(&c, &mallory).await;
    let made_up = |i: usize| format!("cotal.main.inst.UFAKE{i}.{}", mallory.id);
    let (stored, refused, _) = flood(&js, 64, 512 << 10, made_up).await;
    purged(
        &mut op,
        "DM_main",
        &format!("cotal.main.inst.*.{}", mallory.id),
    )
    .await;
    eprintln!(
        "made-up targets: {stored} of 64 × 512 KiB acknowledged, {refused} refused; \
         all purged by the warden"
    );

    // Mallory → Bob, a real target: 44 more than the pair keeps, 128 bytes each (within her
    // share of DM); the rest is refused.
    let pair = format!("cotal.main.inst.{}.{}", bob.id, mallory.id);
    let bound = DM_MAX_MSGS_PER_PAIR as usize;
    let (stored, refused, why) = flood(&js, bound + 44, 128, |_| pair.clone()).await;
    assert_eq!(stored, bound, "the (target, sender) pair bound");
    assert_eq!(refused, 44);
    let why = why.unwrap();
    assert!(
        why.contains("maximum messages per subject exceeded"),
        "{why}"
    );
    let (pair_held, dm_msgs, dm_bytes) = held(&mut op, "DM_main", &pair).await;
    eprintln!(
        "to bob: {stored} × 128 B stored ({pair_held} held), {refused} refused ({why}); \
         DM holds {dm_msgs} messages, {dm_bytes} bytes"
    );

    // Mallory's own client waits a moment for Bob to read, then names the bound and what to do.
    let mc = endpoint(&mallory, |o| {
        o.presence = false;
        o.pair_wait = Duration::from_millis(500);
    })
    .await;
    let err = mc
        .client
        .send_text(to(&bob.id), "one more")
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::StoreFull {
                limit: StoreLimit::PairFull,
                ..
            }
        ),
        "{err:?}"
    );
    let said = err.to_string();
    assert!(said.contains("wait unread for this recipient"), "{said}");

    // Carol still reaches Bob; Bob gets Carol's first DM, untouched, and her second.
    let (second, _) = cc.client.send_text(to(&bob.id), "after").await.unwrap();
    let mut bb = endpoint(&bob, |o| o.presence = false).await;
    let mut from_carol = Vec::new();
    while from_carol.len() < 2 {
        let d = delivery(&mut bb.deliveries).await;
        if d.message.from.id == carol.id {
            from_carol.push(d.message.id.clone());
        }
        d.ack().await.unwrap();
    }
    assert_eq!(from_carol, [first.id, second.id], "the victim lost nothing");
    c.stop().await;
}

/// Waits (bounded) until `target` has nothing pending or unacknowledged in `dm_<target>`.
async fn all_read(op: &mut Probe, target: &str) {
    let consumer = format!("$JS.API.CONSUMER.INFO.DM_main.dm_{target}");
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let info = op.request(&consumer, json!({})).await;
        if info["num_pending"] == 0 && info["num_ack_pending"] == 0 {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{info}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Mallory floods 160 × 512 KiB (80 MiB, more than a 64 MiB store) round robin to the four
/// pairs `pair(0..4)`, none of which comes near its bound; asserts she is refused once past her
/// share of `stream` and that nothing acknowledged was dropped; returns how many were
/// acknowledged.
async fn flood_past_share(
    c: &Cotald,
    op: &mut Probe,
    mallory: &Minted,
    stream: &str,
    pair: impl Fn(usize) -> String,
) -> usize {
    let (_m, js) = raw(c, mallory).await;
    let started = tokio::time::Instant::now();
    let (stored, refused, why) = flood(&js, 160, 512 << 10, &pair).await;
    let took = started.elapsed();
    let why = why.expect("Mallory is refused once past her share");
    assert!(why.contains("more than your share"), "{why}");
    // Her pairs: `cotal.main.<kind>.<target>.<her>` with any target.
    let first = pair(0);
    let kind = first.rsplitn(3, '.').nth(2).unwrap();
    let (kept, msgs, bytes) = held(op, stream, &format!("{kind}.*.{}", mallory.id)).await;
    eprintln!(
        "to four, in {took:?}: {stored} × 512 KiB acknowledged ({kept} held), {refused} refused \
         ({why}); {stream} holds {msgs} messages, {bytes} bytes of 64 MiB"
    );
    // What she stored while the warden judged her counts on top of her share: below the
    // store's limit, as the victims' messages show.
    assert_eq!(kept, stored as u64, "nothing acknowledged was dropped");
    stored
}

/// Sends with `send` until it is refused for its sender's share (bounded, a pause between
/// sends); returns how many were accepted first.
async fn until_held<T, F>(mut send: impl FnMut() -> F) -> usize
where
    T: std::fmt::Debug,
    F: std::future::Future<Output = Result<T, ClientError>>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let mut accepted = 0;
    loop {
        match send().await {
            Err(e) if e.to_string().contains("more than your share") => return accepted,
            Ok(_) if tokio::time::Instant::now() < deadline => accepted += 1,
            other => panic!("not held again after the restart: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends with `send` until it is accepted (bounded), a refusal of the store followed by a
/// pause; returns how many were refused first.
async fn until_accepted<T, F>(mut send: impl FnMut() -> F) -> (T, usize)
where
    F: std::future::Future<Output = Result<T, ClientError>>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let mut refused = 0;
    loop {
        match send().await {
            Ok(sent) => return (sent, refused),
            Err(ClientError::StoreFull { .. }) if tokio::time::Instant::now() < deadline => {
                refused += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
}

#[tokio::test]
async fn one_sender_cannot_fill_dm_through_many_real_targets() {
    let tmp = tempfile::tempdir().unwrap();
    let c = up_roomy(tmp.path()).await;
    let mallory = mint(
        tmp.path(),
        "mallory",
        "main",
        &["--allow-publish", "general"],
    )
    .await;
    let carol = mint(tmp.path(), "carol", "main", &[]).await;
    let mut targets = Vec::new();
    for name in ["bob", "dan", "erin", "fay"] {
        targets.push(mint(tmp.path(), name, "main", &[]).await);
    }
    let bob = &targets[0];
    let mut op = operator(&c).await;
    let cc = endpoint(&carol, |o| o.presence = false).await;
    let (first, _) = cc.client.send_text(to(&bob.id), "before").await.unwrap();

    // Mallory, to four real agents who do not read. Her share is 8 MiB of DM's 64.
    let pair = |i: usize| format!("cotal.main.inst.{}.{}", targets[i % 4].id, mallory.id);
    flood_past_share(&c, &mut op, &mallory, "DM_main", pair).await;

    // Her own client says why, with the figures; her channel posts still go through.
    let mc = endpoint(&mallory, |o| o.presence = false).await;
    let err = mc
        .client
        .send_text(to(&carol.id), "one more")
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::StoreFull { .. }), "{err:?}");
    assert!(err.to_string().contains("more than your share"), "{err}");
    eprintln!("Mallory's client: {err}");
    let general = Routing::channel(&cotald::protocol::Channel::new("general").unwrap());
    mc.client.send_text(general, "still here").await.unwrap();

    // The hold outlives a restart: the warden counts again from what DM holds.
    drop((mc, cc, op));
    c.stop().await;
    let c = up_roomy(tmp.path()).await;
    let mut op = operator(&c).await;
    let cc = endpoint(&carol, |o| o.presence = false).await;
    let mc = endpoint(&mallory, |o| o.presence = false).await;
    let accepted = until_held(|| mc.client.send_text(to(&carol.id), "after the restart")).await;
    eprintln!("after a restart: held again ({accepted} small DMs accepted before)");

    // Carol still reaches Bob, and Bob gets both her DMs.
    let (second, _) = cc.client.send_text(to(&bob.id), "after").await.unwrap();
    let mut readers = Vec::new();
    for target in &targets {
        readers.push(endpoint(target, |o| o.presence = false).await);
    }
    let mut from_carol = Vec::new();
    while from_carol.len() < 2 {
        let d = delivery(&mut readers[0].deliveries).await;
        if d.message.from.id == carol.id {
            from_carol.push(d.message.id.clone());
        }
        d.ack().await.unwrap();
    }
    assert_eq!(from_carol, [first.id, second.id], "the victim lost nothing");

    // The four read (the junk is not JSON: their clients terminate it); the hold ends with no
    // operator and Mallory's DMs are accepted again.
    for target in &targets {
        all_read(&mut op, &target.id).await;
    }
    let (_, refused) = until_accepted(|| mc.client.send_text(to(&carol.id), "again")).await;
    eprintln!("after they read: {refused} more refused before the hold ended");
    drop(readers);
    c.stop().await;
}

#[tokio::test]
async fn tasks_nobody_serves_are_purged_and_a_pair_is_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let c = up_small(tmp.path()).await;
    let mallory = mint(tmp.path(), "mallory", "main", &[]).await;
    let carol = mint(tmp.path(), "carol", "main", &["--allow-publish", "general"]).await;
    let rita = mint(tmp.path(), "rita", "main", &["--role", "reviewer"]).await;
    let mut op = operator(&c).await;

    let cc = endpoint(&carol, |o| o.presence = false).await;
    let (task, _) = cc
        .client
        .send_text(Routing::to_service("reviewer"), "review this")
        .await
        .unwrap();

    // 64 × 512 KiB (twice the TASK budget) to a role nobody holds: purged as it arrives.
    let (_m, js) = raw(&c, &mallory).await;
    let ghost = format!("cotal.main.svc.ghost.{}", mallory.id);
    let (stored, refused, _) = flood(&js, 64, 512 << 10, |_| ghost.clone()).await;
    purged(&mut op, "TASK_main", "cotal.main.svc.ghost.>").await;
    eprintln!(
        "role nobody holds: {stored} of 64 × 512 KiB acknowledged, {refused} refused; all purged"
    );

    // To the real role: 256 wait for a worker, the rest is refused to Mallory alone (4 KiB
    // each: within her share of TASK).
    let pair = format!("cotal.main.svc.reviewer.{}", mallory.id);
    let (stored, refused, why) = flood(&js, 300, 4 << 10, |_| pair.clone()).await;
    assert_eq!((stored, refused), (256, 44));
    let (_, task_msgs, task_bytes) = held(&mut op, "TASK_main", ">").await;
    eprintln!(
        "to reviewer: {stored} × 4 KiB stored, {refused} refused ({}); TASK holds {task_msgs} \
         messages, {task_bytes} bytes",
        why.unwrap()
    );
    let mc = endpoint(&mallory, |o| o.presence = false).await;
    let err = mc
        .client
        .send_text(Routing::to_service("reviewer"), "one more")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("already wait for this role"),
        "{err}"
    );

    // Carol can still send everything: a task, a DM, a chat message.
    let (later, _) = cc
        .client
        .send_text(Routing::to_service("reviewer"), "and this")
        .await
        .unwrap();
    cc.client.send_text(to(&rita.id), "hi").await.unwrap();
    cc.client
        .send_text(
            Routing::channel(&cotald::protocol::Channel::new("general").unwrap()),
            "hello",
        )
        .await
        .unwrap();

    // The worker gets Carol's tasks: nothing of hers was lost.
    let mut rr = endpoint(&rita, |o| {
        o.presence = false;
        o.role = Some("reviewer".into());
    })
    .await;
    let mut from_carol = Vec::new();
    while from_carol.len() < 2 {
        let d = delivery(&mut rr.deliveries).await;
        if d.message.from.id == carol.id && d.kind.as_str() == "anycast" {
            from_carol.push(d.message.id.clone());
        }
        d.ack().await.unwrap();
    }
    assert_eq!(from_carol, [task.id, later.id]);
    c.stop().await;
}

#[tokio::test]
async fn one_sender_cannot_fill_task_through_many_real_roles() {
    let tmp = tempfile::tempdir().unwrap();
    let c = up_roomy(tmp.path()).await;
    let mallory = mint(
        tmp.path(),
        "mallory",
        "main",
        &["--allow-publish", "general"],
    )
    .await;
    let carol = mint(tmp.path(), "carol", "main", &[]).await;
    let roles = ["r0", "r1", "r2", "r3"];
    let mut workers = Vec::new();
    for role in roles {
        workers.push(
            mint(
                tmp.path(),
                &format!("worker-{role}"),
                "main",
                &["--role", role],
            )
            .await,
        );
    }
    let mut op = operator(&c).await;
    let cc = endpoint(&carol, |o| o.presence = false).await;
    let (task, _) = cc
        .client
        .send_text(Routing::to_service("r0"), "before")
        .await
        .unwrap();

    // Mallory, to four real roles whose workers are away. Her share is 8 MiB of TASK's 64.
    let pair = |i: usize| format!("cotal.main.svc.{}.{}", roles[i % 4], mallory.id);
    flood_past_share(&c, &mut op, &mallory, "TASK_main", pair).await;

    // Her own client says why; her channel posts still go through; Carol's tasks still do.
    let mc = endpoint(&mallory, |o| o.presence = false).await;
    let err = mc
        .client
        .send_text(Routing::to_service("r1"), "one more")
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::StoreFull { .. }), "{err:?}");
    assert!(err.to_string().contains("tasks wait untaken"), "{err}");
    eprintln!("Mallory's client: {err}");
    let general = Routing::channel(&cotald::protocol::Channel::new("general").unwrap());
    mc.client.send_text(general, "still here").await.unwrap();

    // The hold outlives a restart: TASK, a work queue, has no feed to count again from, so
    // the first task seen after it has the stream's own counts read.
    drop((mc, cc, op));
    c.stop().await;
    let c = up_roomy(tmp.path()).await;
    let cc = endpoint(&carol, |o| o.presence = false).await;
    let mc = endpoint(&mallory, |o| o.presence = false).await;
    let after = || {
        mc.client
            .send_text(Routing::to_service("r1"), "after the restart")
    };
    let accepted = until_held(after).await;
    eprintln!("after a restart: held again ({accepted} small tasks accepted before)");
    let (later, _) = cc
        .client
        .send_text(Routing::to_service("r0"), "after")
        .await
        .unwrap();

    // The workers come back and take everything (the junk is not JSON: their clients
    // terminate it, which takes it off the work queue); Carol's two tasks arrive; the hold
    // ends with no operator.
    let mut takers = Vec::new();
    for (worker, role) in workers.iter().zip(roles) {
        takers.push(
            endpoint(worker, |o| {
                o.presence = false;
                o.role = Some(role.into());
            })
            .await,
        );
    }
    let mut from_carol = Vec::new();
    while from_carol.len() < 2 {
        let d = delivery(&mut takers[0].deliveries).await;
        if d.message.from.id == carol.id && d.kind.as_str() == "anycast" {
            from_carol.push(d.message.id.clone());
        }
        d.ack().await.unwrap();
    }
    assert_eq!(from_carol, [task.id, later.id], "the victim lost nothing");
    let again = || mc.client.send_text(Routing::to_service("r1"), "again");
    let (_, refused) = until_accepted(again).await;
    eprintln!("after the workers took them: {refused} more refused before the hold ended");
    drop(takers);
    c.stop().await;
}

/// The names of `stream`'s consumers, as the machine operator lists them.
async fn consumer_names(op: &mut Probe, stream: &str) -> Vec<String> {
    let reply = op
        .request(&format!("$JS.API.CONSUMER.NAMES.{stream}"), json!({}))
        .await;
    serde_json::from_value(reply["consumers"].clone()).unwrap_or_default()
}

/// Waits until `stream` holds no consumer `pred` picks more than `most` of; returns how many
/// it holds then.
async fn until_at_most(
    op: &mut Probe,
    stream: &str,
    most: usize,
    pred: impl Fn(&str) -> bool,
) -> usize {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let n = consumer_names(op, stream)
            .await
            .iter()
            .filter(|n| pred(n))
            .count();
        if n <= most {
            return n;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{stream} still holds {n} (more than {most})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for the next notice of the consumer guard on `sub`, and returns its description.
async fn guard_notice(sub: &mut async_nats::Subscriber) -> String {
    let msg = crate::helper::next(sub).await;
    let body: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(body["error"]["code"], 429, "{body}");
    body["error"]["description"].as_str().unwrap().to_owned()
}

/// Appendix B grants every agent consumer creates on the presence and registry buckets. One
/// agent creating 1,200 (more than nats-server's default limit of 1,000 a stream) stops no one's
/// watch, a raw KV watch and cotald's roster alike; the flooder keeps its bound, is told why the
/// rest is deleted, and a durable or a consumer delivering outside the creator's inbox is
/// deleted at once.
#[tokio::test]
async fn a_consumer_flood_on_the_buckets_stops_no_watch() {
    use cotald::services::consumers::PER_IDENTITY;
    use futures_util::StreamExt;
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let mallory = mint(tmp.path(), "mallory", "main", &["--subscribe", "general"]).await;
    let eve = mint(tmp.path(), "eve", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let carol = mint(tmp.path(), "carol", "main", &[]).await;
    let dave = mint(tmp.path(), "dave", "main", &[]).await;
    let mut op = operator(&c).await;
    let (mut m, _) = raw(&c, &mallory).await;
    let mut told = m
        .client
        .subscribe(format!("_INBOX_{}.cotal.held", mallory.id))
        .await
        .unwrap();

    // Bob watches presence as a client written to the appendix does: a KV watch.
    let (b, _) = raw(&c, &bob).await;
    let mut watch = crate::helper::appendix_watch(&b.client, "cotal_presence_main").await;

    let bucket = "KV_cotal_presence_main";
    let create = |name: &str, config: serde_json::Value| {
        let mut config = config;
        config["name"] = json!(name);
        config["filter_subject"] = json!("$KV.cotal_presence_main.>");
        config["ack_policy"] = json!("none");
        (
            format!("$JS.API.CONSUMER.CREATE.{bucket}.{name}.$KV.cotal_presence_main.>"),
            json!({"stream_name": bucket, "config": config}),
        )
    };
    let started = std::time::Instant::now();
    for i in 0..1200 {
        let (subject, body) = create(
            &format!("flood{i}"),
            json!({"inactive_threshold": 60_000_000_000u64}),
        );
        let reply = m.request(&subject, body).await;
        assert!(reply.get("error").is_none(), "create {i}: {reply}");
    }
    eprintln!("1,200 creates answered in {:?}", started.elapsed());
    let notice = guard_notice(&mut told).await;
    assert!(
        notice.starts_with("held: ")
            && notice.contains(&format!("the most one identity may ({PER_IDENTITY})")),
        "{notice}"
    );
    let kept = until_at_most(&mut op, bucket, PER_IDENTITY, |n| n.starts_with("flood")).await;
    eprintln!("Mallory keeps {kept}; told: {notice}");

    // Bob's watch goes on, and a watch made after the flood starts.
    let c_end = endpoint(&carol, |_| {}).await;
    let after = tokio::time::timeout(TIMEOUT, async {
        while let Some(key) = watch.next().await {
            if key == carol.id {
                return;
            }
        }
        panic!("Bob's watch ended");
    });
    after.await.expect("Bob's watch saw Carol after the flood");
    let mut fresh = crate::helper::appendix_watch(&b.client, "cotal_presence_main").await;
    tokio::time::timeout(TIMEOUT, fresh.next())
        .await
        .expect("the new watch delivers")
        .unwrap();
    // cotald's own roster sees a newcomer.
    let d = endpoint(&dave, |_| {}).await;
    let roster = c_end.client.roster().clone();
    tokio::time::timeout(TIMEOUT, async {
        loop {
            let changed = roster.changed();
            if roster.status(&dave.id) == Some(PresenceStatus::Idle) {
                return;
            }
            changed.await;
        }
    })
    .await
    .expect("Carol's roster saw Dave");

    // A durable on a bucket, and a watch delivering onto Bob's chat subject, are deleted at once.
    let (mut e, _) = raw(&c, &eve).await;
    let mut eve_told = e
        .client
        .subscribe(format!("_INBOX_{}.cotal.held", eve.id))
        .await
        .unwrap();
    let (subject, mut body) = create("kept-forever", json!({"durable_name": "kept-forever"}));
    body["config"]["name"] = json!("kept-forever");
    let reply = e.request(&subject, body).await;
    assert!(reply.get("error").is_none(), "{reply}");
    until_at_most(&mut op, bucket, 0, |n| n == "kept-forever").await;
    let notice = guard_notice(&mut eve_told).await;
    assert!(notice.contains("durable consumer"), "{notice}");
    tokio::time::sleep(Duration::from_millis(1100)).await; // the guard tells once a second
    let target = format!("cotal.main.chat.{}.general", bob.id);
    let (subject, body) = create(
        "inject",
        json!({"deliver_subject": target, "deliver_policy": "all", "inactive_threshold": 5_000_000_000u64}),
    );
    let reply = e.request(&subject, body).await;
    assert!(reply.get("error").is_none(), "{reply}");
    until_at_most(&mut op, bucket, 0, |n| n == "inject").await;
    let notice = guard_notice(&mut eve_told).await;
    assert!(
        notice.contains(&format!("delivered to `{target}`")),
        "{notice}"
    );

    // The one CHAT consumer create an agent holds names one consumer: itself.
    let filter = "cotal.main.chat.*.general";
    for i in 0..50 {
        let body = json!({"stream_name": "CHAT_main", "config": {
            "name": format!("chathist_{}", mallory.id), "filter_subject": filter,
            "ack_policy": "none", "deliver_policy": if i % 2 == 0 { "all" } else { "new" },
        }});
        m.request(
            &format!(
                "$JS.API.CONSUMER.CREATE.CHAT_main.chathist_{}.{filter}",
                mallory.id
            ),
            body,
        )
        .await;
    }
    let chat = consumer_names(&mut op, "CHAT_main").await;
    let mallorys: Vec<&String> = chat.iter().filter(|n| n.contains(&mallory.id)).collect();
    assert!(
        mallorys.len() <= 1,
        "one history consumer at most: {mallorys:?}"
    );
    drop((b, d));
    c.stop().await;
}

#[tokio::test]
async fn a_full_pair_is_trimmed_of_what_its_target_has_read() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    // Refused at once when full (the wait for a reader is another test's).
    let a = endpoint(&alice, |o| {
        o.presence = false;
        o.pair_wait = Duration::ZERO;
    })
    .await;
    {
        use futures_util::StreamExt;
        futures_util::stream::iter(0..DM_MAX_MSGS_PER_PAIR)
            .map(|i| {
                let client = a.client.clone();
                let target = to(&bob.id);
                async move { client.send_text(target, &format!("{i}")).await.unwrap() }
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
            .await;
    }
    let err = a.client.send_text(to(&bob.id), "full").await.unwrap_err();
    assert!(matches!(err, ClientError::StoreFull { .. }), "{err:?}");

    // Bob reads them all; the pair is trimmed of what he read and Alice can write again.
    let mut b = endpoint(&bob, |o| o.presence = false).await;
    for _ in 0..DM_MAX_MSGS_PER_PAIR {
        delivery(&mut b.deliveries).await.ack().await.unwrap();
    }
    let ((again, _), refused) = until_accepted(|| a.client.send_text(to(&bob.id), "again")).await;
    eprintln!("after Bob read them: {refused} more refused before the warden trimmed the pair");
    assert_eq!(delivery(&mut b.deliveries).await.message.id, again.id);
    c.stop().await;
}

#[cfg(target_os = "linux")] // tmpfs and mount(2) as Linux has them
/// A 256 MiB tmpfs on a fresh directory, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

#[cfg(target_os = "linux")]
impl Tmpfs {
    /// Mounts it; `None` (the caller skips, saying so) only when this machine does not permit
    /// mounting (not root, or a container without the capability). Any other failure panics.
    fn mount() -> Option<Tmpfs> {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let target = std::ffi::CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        let fs = c"tmpfs";
        let data = c"size=256m";
        // SAFETY: NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                fs.as_ptr(),
                target.as_ptr(),
                fs.as_ptr(),
                0,
                data.as_ptr().cast(),
            )
        };
        if rc == 0 {
            return Some(Tmpfs { dir });
        }
        let e = std::io::Error::last_os_error();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EPERM),
            "mounting a tmpfs failed for a reason other than permission: {e}"
        );
        eprintln!("SKIPPED: this machine does not permit mounting a tmpfs ({e})");
        None
    }
}

#[cfg(target_os = "linux")]
impl Drop for Tmpfs {
    fn drop(&mut self) {
        let target =
            std::ffi::CString::new(self.dir.path().as_os_str().to_string_lossy().as_bytes())
                .unwrap();
        // SAFETY: a NUL-terminated path we mounted.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_default_profile_fits_a_small_disk_and_degrades_clearly_when_it_fills() {
    let Some(disk) = Tmpfs::mount() else {
        return;
    };
    let dir = disk.dir.path().join("d");
    let c = Cotald::up(&dir).await;
    assert!(c.state().unserved.is_empty(), "{:?}", c.state().unserved);

    // A second space does not fit: said in words.
    let out = tokio::process::Command::new(crate::helper::cotald_bin())
        .args(["space", "add", "lab", "--data-dir"])
        .arg(&dir)
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("space `lab` refused: the JetStream storage budget of this disk is used up"),
        "{said}"
    );
    eprintln!("space add on a full budget: {}", said.trim());

    let mallory = mint(&dir, "mallory", "main", &[]).await;
    let bob = mint(&dir, "bob", "main", &[]).await;
    let carol = mint(&dir, "carol", "main", &["--allow-publish", "general"]).await;
    let cc = endpoint(&carol, |o| o.presence = false).await;
    let (kept, _) = cc.client.send_text(to(&bob.id), "keep me").await.unwrap();

    // Senders fill DM with 512 KiB DMs to Bob, who is offline: each is held at its share of
    // DM, so it takes several, until DM itself refuses.
    let mut op = operator(&c).await;
    let mut senders = vec![mallory];
    let mut full = None;
    for round in 0..16 {
        if round > 0 {
            senders.push(mint(&dir, &format!("mallory{round}"), "main", &[]).await);
        }
        let sender = senders.last().unwrap();
        let (_m, js) = raw(&c, sender).await;
        let pair = format!("cotal.main.inst.{}.{}", bob.id, sender.id);
        let (stored, refused, why) = flood(&js, 16, 512 << 10, |_| pair.clone()).await;
        eprintln!(
            "filling DM, sender {round}: {stored} × 512 KiB stored, {refused} refused ({why:?})"
        );
        if let Some(why) = why.filter(|w| !w.contains("more than your share")) {
            full = Some(why);
            break;
        }
    }
    let (_, dm_msgs, dm_bytes) = held(&mut op, "DM_main", ">").await;
    let full = full.expect("DM is bounded by its share of the quota");
    eprintln!(
        "DM full after {} senders ({full}); DM holds {dm_msgs} messages, {dm_bytes} bytes",
        senders.len()
    );
    assert!(full.contains("maximum bytes exceeded"), "{full}");

    // Clear to the sender, and the rest of the space still works.
    let big = "x".repeat(512 << 10);
    let err = cc.client.send_text(to(&bob.id), &big).await.unwrap_err();
    assert!(err.to_string().contains("is full"), "{err}");
    cc.client
        .send_text(
            Routing::channel(&cotald::protocol::Channel::new("general").unwrap()),
            "chat still works",
        )
        .await
        .unwrap();
    let status = tokio::process::Command::new(crate::helper::cotald_bin())
        .args(["status", "--data-dir"])
        .arg(&dir)
        .output()
        .await
        .unwrap();
    assert!(status.status.success(), "the appliance stays healthy");

    // Bob reads; what he read is trimmed and Carol can send again, with no operator.
    let mut b = endpoint(&bob, |o| o.presence = false).await;
    let first = delivery(&mut b.deliveries).await;
    assert_eq!(first.message.id, kept.id, "Carol's DM survived the flood");
    first.ack().await.unwrap();
    // The junk is not JSON: Bob's client terminates it (which the ack floor counts).
    all_read(&mut op, &bob.id).await;
    let ((again, _), _) = until_accepted(|| cc.client.send_text(to(&bob.id), &big)).await;
    assert_eq!(delivery(&mut b.deliveries).await.message.id, again.id);
    drop(b);
    c.stop().await;

    // What JetStream stores counts in the budget: the next start still serves `main`.
    let c = Cotald::up(&dir).await;
    assert!(c.state().unserved.is_empty(), "{:?}", c.state().unserved);
    c.stop().await;
}

/// A full pair is backpressure, not a failure, while its reader keeps up: 20,000 DMs sent
/// 256 at a time (20 times the pair's bound) to a reader acking as it goes are all accepted,
/// each surfaced once.
#[tokio::test]
async fn a_reader_that_keeps_up_never_gets_its_sender_refused() {
    use futures_util::StreamExt;
    const DMS: usize = 20_000;
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    let mut b = endpoint(&bob, |o| o.presence = false).await;
    let reader = tokio::spawn(async move { read_acking(&mut b, DMS).await });
    let started = std::time::Instant::now();
    let sends = futures_util::stream::iter(0..DMS)
        .map(|i| {
            let client = a.client.clone();
            let target = to(&bob.id);
            async move { client.send_text(target, &format!("{i}")).await.map(|_| ()) }
        })
        .buffer_unordered(256);
    let refused: Vec<ClientError> = sends.filter_map(|r| async move { r.err() }).collect().await;
    let sent_in = started.elapsed();
    assert!(
        refused.is_empty(),
        "{} refused, the first: {}",
        refused.len(),
        refused[0]
    );
    let (surfaced, twice) = tokio::time::timeout(Duration::from_secs(120), reader)
        .await
        .expect("every DM surfaced")
        .unwrap();
    eprintln!("{DMS} DMs accepted in {sent_in:?}; {surfaced} surfaced, {twice} twice");
    assert_eq!((surfaced, twice), (DMS, 0));
    c.stop().await;
}

/// A client written to the spec, not cotald's (which waits and sends again when a pair is
/// full): a raw JetStream publisher sends 5,000 DMs to a reader that acks each as it arrives,
/// 256 publishes in flight, then 1,024. None is refused, and each is surfaced once. (With the
/// pair bound at 1,000, the first pace passed here but was refused outside, from a faster
/// client on a release build, 3,536 of 5,000; the second was refused here, 150 of 5,000.)
#[tokio::test]
async fn a_raw_pipelined_sender_to_a_reader_that_keeps_up_is_never_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let (_p, js) = raw(&c, &alice).await;
    for in_flight in [256, 1024] {
        let b = endpoint(&bob, |o| o.presence = false).await;
        raw_pipelined_dms(&js, &alice, &bob, b, in_flight).await;
    }
    c.stop().await;
}

/// Sends 5,000 DMs from `from` to `to` raw, `in_flight` at a time, while `reader` acks each as
/// it arrives; asserts none refused and each surfaced once.
async fn raw_pipelined_dms(
    js: &jetstream::Context,
    from: &Minted,
    to: &Minted,
    mut reader: cotald::client::Connection,
    in_flight: usize,
) {
    use futures_util::StreamExt;
    const DMS: usize = 5_000;
    let reading = tokio::spawn(async move {
        let read = read_acking(&mut reader, DMS).await;
        reader.client.close().await;
        read
    });
    let subject = format!("cotal.main.inst.{}.{}", to.id, from.id);
    let started = std::time::Instant::now();
    let outcomes: Vec<Result<(), String>> = futures_util::stream::iter(0..DMS)
        .map(|i| {
            let (js, subject) = (js.clone(), subject.clone());
            let id = cotald::protocol::new_message_id();
            let body = json!({
                "id": id, "ts": 1, "space": "main",
                "from": {"id": from.id, "name": "alice"},
                "to": to.id,
                "parts": [{"kind": "text", "text": format!("{i}")}],
            })
            .to_string();
            async move {
                let message = async_nats::jetstream::message::PublishMessage::build()
                    .payload(body.into())
                    .message_id(id);
                let ack = js
                    .send_publish(subject, message)
                    .await
                    .map_err(|e| e.to_string())?;
                ack.await.map(|_| ()).map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let refused: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    eprintln!(
        "{DMS} raw DMs, {in_flight} in flight, in {:?}: {} refused",
        started.elapsed(),
        refused.len()
    );
    assert!(
        refused.is_empty(),
        "{} refused, the first: {}",
        refused.len(),
        refused[0]
    );
    let (surfaced, twice) = tokio::time::timeout(Duration::from_secs(120), reading)
        .await
        .expect("every DM surfaced")
        .unwrap();
    assert_eq!((surfaced, twice), (DMS, 0));
}

/// Reads until `count` distinct messages surfaced, acking each as it arrives; returns how many
/// distinct, and how many came twice.
async fn read_acking(conn: &mut cotald::client::Connection, count: usize) -> (usize, usize) {
    let mut seen = std::collections::HashSet::new();
    let mut twice = 0;
    while seen.len() < count {
        let d = delivery(&mut conn.deliveries).await;
        if !seen.insert(d.message.id.clone()) {
            twice += 1;
        }
        d.ack().await.unwrap();
    }
    (seen.len(), twice)
}
