//! Durable delivery figures, each beside a raw baseline measured in the same run on the same
//! broker. Starts a real appliance (`cotald up` on a fresh data dir), mints identities with
//! the real CLI, and prints medians of N repetitions and their ratios; asserts nothing about
//! time.
//!
//! 1. Publish on a durable channel with 1 durable member vs 100 (the members joined durably,
//!    then went away, so only the backstop keeps their backlog): `Client::send` msgs/s with
//!    [`IN_FLIGHT`] publishes in flight; raw baseline: async-nats JetStream publish with a
//!    `Nats-Msg-Id` of the same payload on the same subject, as the machine operator.
//! 2. Catch-up of [`CATCH_UP`] messages by a returning member: from `Client::connect` until it
//!    surfaced and acked every durable copy; raw baseline: a pull consumer on `CHAT_<space>`
//!    filtered to the channel, from the same first sequence, fetch 256 + plain `ack()`.
//! 3. End to end with the member online: publisher to receiver on a durable channel vs a
//!    channel set `live`.
//!
//! Run: `cargo bench --bench durable` (optionally `-- RUNS`, default 3).

use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, message::PublishMessage};
use cotald::client::{Client, ConnectOptions, Connection, DurableState, Replay};
use cotald::protocol::{Channel, CotalMessage, Part, Routing};
use cotald::services::backstop::interval_consumer;
use futures_util::{StreamExt, TryStreamExt};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The bound on every single wait.
const TIMEOUT: Duration = Duration::from_secs(120);
/// The bound on the whole bench.
const DEADLINE: Duration = Duration::from_secs(1200);
/// Publishes in flight (scenarios 1 and 3).
const IN_FLIGHT: usize = 256;
/// Text length of every message.
const TEXT_LEN: usize = 256;
/// Publishes per measurement in scenario 1.
const PUBLISHES: usize = 20_000;
/// Durable members in the crowded case of scenario 1.
const MEMBERS: usize = 100;
/// Backlog of the returning member (scenario 2).
const CATCH_UP: usize = 10_000;
/// Messages end to end (scenario 3).
const E2E: usize = 5_000;
/// `CHAT_<space>` keeps the last 1,000 messages per (sender, channel) subject: a backlog of
/// 10,000 needs 10 senders, or the oldest would be discarded before the member came back.
const PER_SUBJECT: usize = 1_000;
/// Pull batch of the raw catch-up.
const RAW_BATCH: usize = 256;
/// Concurrent `cotald mint` processes.
const MINT_CONCURRENCY: usize = 4;
/// Concurrent member connections while setting up memberships.
const JOIN_CONCURRENCY: usize = 8;

const SPACE: &str = "main";
const CH_ONE: &str = "bench-one";
const CH_CROWD: &str = "bench-crowd";
const CH_CATCH: &str = "bench-catch";
const CH_DURABLE: &str = "bench-e2e-durable";
const CH_LIVE: &str = "bench-e2e-live";

fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(DEADLINE, bench(runs))
            .await
            .unwrap_or_else(|_| panic!("the bench did not finish within {DEADLINE:?}"))
    });
}

async fn bench(runs: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let appliance = Appliance::up(&dir, tmp.path()).await;
    println!(
        "appliance ready on {} ({} cores available to this process)",
        appliance.listen,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    // Identities. Every publisher may post on every bench channel.
    let channels = [CH_ONE, CH_CROWD, CH_CATCH, CH_DURABLE, CH_LIVE].join(",");
    let started = Instant::now();
    let publishers: Vec<Minted> = mint_many(
        &dir,
        (0..10)
            .map(|i| (format!("bench-pub{i}"), vec!["--allow-publish", &channels]))
            .collect(),
    )
    .await;
    let both = format!("{CH_DURABLE},{CH_LIVE}");
    let singles = mint_many(
        &dir,
        vec![
            ("bench-solo".into(), vec!["--subscribe", CH_ONE]),
            ("bench-returning".into(), vec!["--subscribe", CH_CATCH]),
            ("bench-receiver".into(), vec!["--subscribe", &both]),
        ],
    )
    .await;
    let crowd: Vec<Minted> = mint_many(
        &dir,
        (0..MEMBERS)
            .map(|i| (format!("bench-member{i:03}"), vec!["--subscribe", CH_CROWD]))
            .collect(),
    )
    .await;
    let [solo, returning, receiver] = <[Minted; 3]>::try_from(singles).unwrap();
    println!(
        "minted {} identities through `cotald mint` in {:.1} s",
        publishers.len() + 3 + crowd.len(),
        started.elapsed().as_secs_f64()
    );
    let operator = Minted {
        id: creds_id(&dir.join(format!("spaces/{SPACE}/local-operator.creds"))),
        creds: dir.join(format!("spaces/{SPACE}/local-operator.creds")),
        link: publishers[0].link.clone(),
        ca: publishers[0].ca.clone(),
    };
    let raw = raw_connect(&operator, appliance.listen).await;
    let raw_js = jetstream::new(raw.clone());

    publish_with_members(runs, &publishers[0], &solo, &crowd, &raw_js).await;
    catch_up(
        runs,
        &publishers,
        &returning,
        &operator,
        appliance.listen,
        &raw_js,
    )
    .await;
    end_to_end(
        runs,
        &publishers[..E2E / PER_SUBJECT],
        &receiver,
        &operator,
        &raw_js,
    )
    .await;

    drop(raw_js);
    let _ = tokio::time::timeout(Duration::from_secs(5), raw.drain()).await;
    appliance.stop().await;
}

// ---------------------------------------------------------------------------------------------
// 1. Publish with 1 vs 100 durable members.

async fn publish_with_members(
    runs: usize,
    publisher: &Minted,
    solo: &Minted,
    crowd: &[Minted],
    raw_js: &jetstream::Context,
) {
    // Memberships: join durably (no history), then go away.
    let started = Instant::now();
    join_and_leave(solo, CH_ONE).await;
    futures_util::stream::iter(crowd)
        .map(|m| join_and_leave(m, CH_CROWD))
        .buffer_unordered(JOIN_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
    let members_of = |ch: &'static str| async move {
        let stream = raw_js.get_stream(chat_stream()).await.unwrap();
        let filter = format!("cotal.{SPACE}.chat.*.{ch}");
        stream
            .consumers()
            .try_filter(|c| {
                std::future::ready(c.name.starts_with("bk_") && c.config.filter_subject == filter)
            })
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .len()
    };
    println!(
        "\n1. publish on a durable channel, {IN_FLIGHT} in flight, {PUBLISHES} messages of \
         {TEXT_LEN}-byte text per measurement"
    );
    println!(
        "   memberships set up in {:.1} s; backstop consumers held for the absent members: \
         {CH_ONE} {}, {CH_CROWD} {}",
        started.elapsed().as_secs_f64(),
        members_of(CH_ONE).await,
        members_of(CH_CROWD).await
    );

    let conn = connect(publisher, |o| {
        o.presence = false;
        o.receive_backstop = false;
        o.receive_dms = false;
    })
    .await;
    let client = &conn.client;
    let text = text(TEXT_LEN);
    let one = Channel::new(CH_ONE).unwrap();
    let many = Channel::new(CH_CROWD).unwrap();
    let subject = |ch: &Channel| format!("cotal.{SPACE}.chat.{}.{ch}", client.id().as_str());
    // The raw payload is the JSON of a message as `Client::send` builds it.
    let payload = CotalMessage::new(
        SPACE,
        client.endpoint(),
        Routing::channel(&one),
        vec![Part::text(text.clone())],
    )
    .to_json()
    .unwrap();
    let template = PublishMessage::build().payload(payload.into());

    // Warm-up, not measured.
    send_many(client, &[&one, &many], 1_000, &text).await;
    raw_publish(raw_js, &subject(&one), &template, 1_000).await;

    let mut cotald_one = Vec::new();
    let mut cotald_many = Vec::new();
    let mut raw_one = Vec::new();
    let mut raw_many = Vec::new();
    for run in 0..runs {
        // Rotate the order, so that no path always runs first.
        for step in 0..4 {
            match (run + step) % 4 {
                0 => cotald_one.push(rate(
                    PUBLISHES,
                    send_many(client, &[&one], PUBLISHES, &text).await,
                )),
                1 => cotald_many.push(rate(
                    PUBLISHES,
                    send_many(client, &[&many], PUBLISHES, &text).await,
                )),
                2 => raw_one.push(rate(
                    PUBLISHES,
                    raw_publish(raw_js, &subject(&one), &template, PUBLISHES).await,
                )),
                _ => raw_many.push(rate(
                    PUBLISHES,
                    raw_publish(raw_js, &subject(&many), &template, PUBLISHES).await,
                )),
            }
        }
        println!(
            "   run {}: cotald 1 member {:.0}/s, 100 members {:.0}/s; raw 1 member {:.0}/s, \
             100 members {:.0}/s",
            run + 1,
            cotald_one[run],
            cotald_many[run],
            raw_one[run],
            raw_many[run]
        );
    }
    let (c1, c100, r1, r100) = (
        median(cotald_one),
        median(cotald_many),
        median(raw_one),
        median(raw_many),
    );
    println!("   median of {runs} runs, msgs/s:");
    println!(
        "   {:<52}{:>10.0}",
        "raw JetStream publish + Msg-Id, 1 member", r1
    );
    println!(
        "   {:<52}{:>10.0}  ({:.2}x raw, 1 member)",
        "raw JetStream publish + Msg-Id, 100 members",
        r100,
        r100 / r1
    );
    println!(
        "   {:<52}{:>10.0}  ({:.2}x raw)",
        "cotald Client::send, 1 member",
        c1,
        c1 / r1
    );
    println!(
        "   {:<52}{:>10.0}  ({:.2}x raw, 100 members; {:.2}x cotald 1 member, goal >= 0.90)",
        "cotald Client::send, 100 members",
        c100,
        c100 / r100,
        c100 / c1
    );
    conn.client.close().await;
}

/// Connects without the backstop, joins `ch` durably without history, disconnects: the
/// membership stays, kept by the backstop alone.
async fn join_and_leave(member: &Minted, ch: &str) {
    let conn = connect(member, |o| o.receive_backstop = false).await;
    let report = bounded("durable join", conn.client.join(ch, Replay::Off))
        .await
        .unwrap();
    assert_eq!(report.durable, DurableState::Established, "{report:?}");
    conn.client.close().await;
}

/// `n` sends of `text`, round robin over `channels`, [`IN_FLIGHT`] at a time; returns the
/// elapsed time.
async fn send_many(client: &Client, channels: &[&Channel], n: usize, text: &str) -> Duration {
    send_many_from(&[client], channels, n, text).await.0
}

/// `n` sends of `text`, round robin over `clients` and `channels`, [`IN_FLIGHT`] at a time;
/// returns the elapsed time and the lowest stream sequence.
async fn send_many_from(
    clients: &[&Client],
    channels: &[&Channel],
    n: usize,
    text: &str,
) -> (Duration, u64) {
    let start = Instant::now();
    let first = bounded(
        "publishing",
        futures_util::stream::iter(0..n)
            .map(|i| {
                let client = clients[i % clients.len()];
                let routing = Routing::channel(channels[i % channels.len()]);
                async move { client.send_text(routing, text).await.map(|(_, seq)| seq) }
            })
            .buffer_unordered(IN_FLIGHT)
            .try_fold(u64::MAX, |low, seq| std::future::ready(Ok(low.min(seq)))),
    )
    .await
    .expect("publish");
    (start.elapsed(), first)
}

/// `n` raw JetStream publishes of `template` on `subject`, each with its own `Nats-Msg-Id`,
/// [`IN_FLIGHT`] at a time.
async fn raw_publish(
    js: &jetstream::Context,
    subject: &str,
    template: &PublishMessage,
    n: usize,
) -> Duration {
    let prefix = cotald::protocol::new_message_id();
    let start = Instant::now();
    bounded(
        "raw publishing",
        futures_util::stream::iter(0..n)
            .map(|i| {
                let message = template.clone().message_id(format!("{prefix}.{i}"));
                async move { js.send_publish(subject.to_owned(), message).await?.await }
            })
            .buffer_unordered(IN_FLIGHT)
            .try_for_each(|_| std::future::ready(Ok(()))),
    )
    .await
    .expect("raw publish");
    start.elapsed()
}

// ---------------------------------------------------------------------------------------------
// 2. Catch-up of a returning member.

async fn catch_up(
    runs: usize,
    publishers: &[Minted],
    returning: &Minted,
    operator: &Minted,
    listen: SocketAddr,
    raw_js: &jetstream::Context,
) {
    let senders = CATCH_UP / PER_SUBJECT;
    println!(
        "\n2. catch-up of {CATCH_UP} messages by a returning member ({senders} senders x \
         {PER_SUBJECT}: CHAT keeps {PER_SUBJECT} per sender and channel)"
    );
    join_and_leave(returning, CH_CATCH).await;
    let consumer = interval_consumer(&returning.id, CH_CATCH, 1);
    let conns = connect_publishers(&publishers[..senders]).await;
    let clients: Vec<&Client> = conns.iter().map(|c| &c.client).collect();
    let ch = Channel::new(CH_CATCH).unwrap();
    let text = text(TEXT_LEN);

    let mut cotald_surfaced = Vec::new();
    let mut cotald_settled = Vec::new();
    let mut raw = Vec::new();
    for run in 0..runs {
        // The member is away: the broker holds no consumer for it, its backlog is a position.
        let (_, first) = send_many_from(&clients, &[&ch], CATCH_UP, &text).await;
        let stream = raw_js.get_stream(chat_stream()).await.unwrap();
        bounded("the member's session to end", async {
            while stream.consumer_info(&consumer).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let (member, raw_time) = if run % 2 == 0 {
            let member = returning_member(returning, raw_js, &consumer).await;
            (member, raw_catch_up(operator, listen, first).await)
        } else {
            let raw_time = raw_catch_up(operator, listen, first).await;
            (
                returning_member(returning, raw_js, &consumer).await,
                raw_time,
            )
        };
        cotald_surfaced.push(rate(CATCH_UP, member.0));
        cotald_settled.push(rate(CATCH_UP, member.1));
        raw.push(rate(CATCH_UP, raw_time));
        println!(
            "   run {}: cotald {:.0}/s surfaced and acked ({:.0}/s until the stored entries \
             were acknowledged); raw {:.0}/s",
            run + 1,
            cotald_surfaced[run],
            cotald_settled[run],
            raw[run]
        );
    }
    for c in conns {
        c.client.close().await;
    }
    let (surfaced, settled, raw) = (median(cotald_surfaced), median(cotald_settled), median(raw));
    println!("   median of {runs} runs, msgs/s (connect included in both):");
    println!(
        "   {:<52}{:>10.0}",
        "raw pull consumer, fetch 256 + ack", raw
    );
    println!(
        "   {:<52}{:>10.0}  ({:.2}x raw, goal >= 0.50)",
        "cotald returning member, surfaced and acked",
        surfaced,
        surfaced / raw
    );
    println!(
        "   {:<52}{:>10.0}  ({:.2}x raw)",
        "  ... until the backstop acknowledged every entry",
        settled,
        settled / raw
    );
}

/// Connects the returning member, surfaces and acks its whole backlog; returns the time until
/// the last copy was surfaced and acked, and until the backstop's consumer was drained.
async fn returning_member(
    member: &Minted,
    js: &jetstream::Context,
    consumer: &str,
) -> (Duration, Duration) {
    let start = Instant::now();
    let mut conn = connect(member, |_| {}).await;
    let mut ids = HashSet::with_capacity(CATCH_UP);
    let mut other = 0usize;
    while ids.len() < CATCH_UP {
        let d = next_delivery(&mut conn).await;
        if d.durable && d.channel.as_deref() == Some(CH_CATCH) {
            ids.insert(d.message.id.clone());
        } else {
            other += 1;
        }
        d.ack().await.unwrap();
    }
    let surfaced = start.elapsed();
    wait_for(js, consumer, "the backlog acknowledged", |i| {
        i.num_pending == 0 && i.num_ack_pending == 0
    })
    .await;
    let settled = start.elapsed();
    assert_eq!(other, 0, "only durable copies of {CH_CATCH} were expected");
    conn.client.close().await;
    // The session ends once the services see the member offline (their sweep runs every
    // second); the next backlog must build up with nobody to hand it to.
    tokio::time::sleep(Duration::from_secs(2)).await;
    (surfaced, settled)
}

/// The raw baseline: a fresh connection as the machine operator, a pull consumer on CHAT
/// filtered to the channel from `first`, fetch 256 + plain ack until [`CATCH_UP`] were read.
async fn raw_catch_up(operator: &Minted, listen: SocketAddr, first: u64) -> Duration {
    let start = Instant::now();
    let nats = raw_connect(operator, listen).await;
    let js = jetstream::new(nats.clone());
    let stream = js.get_stream(chat_stream()).await.unwrap();
    let name = format!("bench_raw_{first}");
    let consumer = stream
        .create_consumer(pull::Config {
            name: Some(name.clone()),
            filter_subject: format!("cotal.{SPACE}.chat.*.{CH_CATCH}"),
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: first,
            },
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut read = 0;
    bounded("raw catch-up", async {
        while read < CATCH_UP {
            let mut batch = consumer
                .fetch()
                .max_messages(RAW_BATCH.min(CATCH_UP - read))
                .expires(Duration::from_secs(2))
                .messages()
                .await
                .unwrap();
            while let Some(msg) = batch.next().await {
                msg.unwrap().ack().await.unwrap();
                read += 1;
            }
        }
        nats.flush().await.unwrap();
    })
    .await;
    let elapsed = start.elapsed();
    let _ = stream.delete_consumer(&name).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), nats.drain()).await;
    elapsed
}

// ---------------------------------------------------------------------------------------------
// 3. End to end, member online: durable vs live channel.

async fn end_to_end(
    runs: usize,
    publishers: &[Minted],
    receiver: &Minted,
    operator: &Minted,
    raw_js: &jetstream::Context,
) {
    println!(
        "\n3. end to end, {E2E} messages, {IN_FLIGHT} in flight, the member online and joined \
         ({} senders x {PER_SUBJECT})",
        publishers.len()
    );
    let op = connect(operator, |o| {
        o.receive_backstop = false;
        o.receive_dms = false;
    })
    .await;
    bounded(
        "channels-set",
        op.client
            .manager::<serde_json::Value>(&cotald::ops::Request::ChannelsSet(
                cotald::ops::ChannelsSet {
                    space: None,
                    channel: CH_LIVE.into(),
                    config: serde_json::from_value(json!({"deliveryClass": "live"})).unwrap(),
                },
            )),
    )
    .await
    .unwrap();

    let mut conn = connect(receiver, |_| {}).await;
    let report = bounded("join", conn.client.join(CH_DURABLE, Replay::Off))
        .await
        .unwrap();
    assert_eq!(report.durable, DurableState::Established, "{report:?}");
    let report = bounded("join", conn.client.join(CH_LIVE, Replay::Off))
        .await
        .unwrap();
    assert_eq!(report.durable, DurableState::NotApplicable, "{report:?}");
    let consumer = interval_consumer(&receiver.id, CH_DURABLE, 1);

    let pubs = connect_publishers(publishers).await;
    let clients: Vec<Client> = pubs.iter().map(|c| c.client.clone()).collect();
    let text = text(TEXT_LEN);
    let mut durable_surfaced = Vec::new();
    let mut durable_settled = Vec::new();
    let mut live = Vec::new();
    for run in 0..runs {
        for step in 0..2 {
            if (run + step) % 2 == 0 {
                let (surfaced, settled) = deliver(
                    &clients,
                    &mut conn,
                    CH_DURABLE,
                    &text,
                    Some((raw_js, &consumer)),
                )
                .await;
                durable_surfaced.push(rate(E2E, surfaced));
                durable_settled.push(rate(E2E, settled));
            } else {
                let (surfaced, _) = deliver(&clients, &mut conn, CH_LIVE, &text, None).await;
                live.push(rate(E2E, surfaced));
            }
        }
        println!(
            "   run {}: durable {:.0}/s surfaced ({:.0}/s until every durable copy was \
             acknowledged); live {:.0}/s",
            run + 1,
            durable_surfaced[run],
            durable_settled[run],
            live[run]
        );
    }
    let (surfaced, settled, live) = (
        median(durable_surfaced),
        median(durable_settled),
        median(live),
    );
    println!("   median of {runs} runs, msgs/s from the first publish:");
    println!("   {:<52}{:>10.0}", "live channel, all surfaced", live);
    println!(
        "   {:<52}{:>10.0}  ({:.2}x live)",
        "durable channel, all surfaced",
        surfaced,
        surfaced / live
    );
    println!(
        "   {:<52}{:>10.0}  ({:.2}x live)",
        "  ... and every durable copy acknowledged",
        settled,
        settled / live
    );
    for c in pubs.into_iter().chain([conn, op]) {
        c.client.close().await;
    }
}

/// Publishes [`E2E`] messages on `ch` round robin over `clients` while the receiver surfaces
/// them; returns the time until all were surfaced, and until the durable copies were
/// acknowledged (the backstop consumer drained) when `durable` names it.
async fn deliver(
    clients: &[Client],
    conn: &mut Connection,
    ch: &'static str,
    text: &str,
    durable: Option<(&jetstream::Context, &str)>,
) -> (Duration, Duration) {
    let channel = Channel::new(ch).unwrap();
    let start = Instant::now();
    let publishing = {
        let clients = clients.to_vec();
        let text = text.to_owned();
        tokio::spawn(async move {
            let refs: Vec<&Client> = clients.iter().collect();
            send_many_from(&refs, &[&channel], E2E, &text).await
        })
    };
    let mut ids = HashSet::with_capacity(E2E);
    while ids.len() < E2E {
        let d = next_delivery(conn).await;
        if d.channel.as_deref() == Some(ch) {
            ids.insert(d.message.id.clone());
        }
        d.ack().await.unwrap();
    }
    let surfaced = start.elapsed();
    bounded("the publisher", publishing).await.unwrap();
    let settled = match durable {
        Some((js, consumer)) => {
            wait_for(js, consumer, "the durable copies acknowledged", |i| {
                i.num_pending == 0 && i.num_ack_pending == 0
            })
            .await;
            start.elapsed()
        }
        None => surfaced,
    };
    (surfaced, settled)
}

// ---------------------------------------------------------------------------------------------
// The appliance, identities, connections.

/// A running `cotald up` (killed if dropped).
struct Appliance {
    child: tokio::process::Child,
    listen: SocketAddr,
}

impl Appliance {
    async fn up(dir: &Path, logs: &Path) -> Appliance {
        let stderr = std::fs::File::create(logs.join("cotald.stderr")).unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_cotald"))
            .args(["up", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn cotald");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = tokio::time::timeout(TIMEOUT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("cotald is ready") {
                    return true;
                }
            }
            false
        })
        .await;
        if !matches!(ready, Ok(true)) {
            let log = std::fs::read_to_string(logs.join("cotald.stderr")).unwrap_or_default();
            panic!("cotald did not become ready; stderr:\n{log}");
        }
        // Keep reading stdout so that the appliance never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let state = cotald::datadir::DataDir::new(dir)
            .read_state()
            .unwrap()
            .expect("state.json exists while running");
        Appliance {
            child,
            listen: state.listen,
        }
    }

    /// SIGTERM, then a bounded wait; SIGKILL if it does not exit.
    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: plain syscall on our own child.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// What `cotald mint --json` prints.
#[derive(Debug, serde::Deserialize)]
struct Minted {
    id: String,
    creds: PathBuf,
    link: String,
    ca: PathBuf,
}

/// Runs `cotald mint NAME --space main --json ARGS…` for each entry, a few at a time.
async fn mint_many(dir: &Path, who: Vec<(String, Vec<&str>)>) -> Vec<Minted> {
    futures_util::stream::iter(who)
        .map(|(name, args)| async move {
            let out = bounded(
                "cotald mint",
                tokio::process::Command::new(env!("CARGO_BIN_EXE_cotald"))
                    .args(["mint", &name, "--space", SPACE, "--json", "--data-dir"])
                    .arg(dir)
                    .args(&args)
                    .kill_on_drop(true)
                    .output(),
            )
            .await
            .unwrap();
            assert!(
                out.status.success(),
                "mint {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice::<Minted>(&out.stdout).expect("mint --json output")
        })
        .buffered(MINT_CONCURRENCY)
        .collect()
        .await
}

/// The user id a `.creds` file holds.
fn creds_id(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    cotald::binding::Creds::parse(&text)
        .unwrap()
        .public_key()
        .unwrap()
}

/// A client endpoint of `m`.
async fn connect(m: &Minted, tweak: impl FnOnce(&mut ConnectOptions)) -> Connection {
    let link = cotald::protocol::JoinLink::parse(&m.link).unwrap();
    let mut opts = ConnectOptions::new(link, std::fs::read_to_string(&m.creds).unwrap());
    opts.ca = Some(m.ca.clone());
    tweak(&mut opts);
    bounded("connect", Client::connect(opts)).await.unwrap()
}

/// Publisher endpoints: no presence, no DMs, no backstop.
async fn connect_publishers(publishers: &[Minted]) -> Vec<Connection> {
    let mut conns = Vec::new();
    for p in publishers {
        conns.push(
            connect(p, |o| {
                o.presence = false;
                o.receive_backstop = false;
                o.receive_dms = false;
            })
            .await,
        );
    }
    conns
}

/// A plain async-nats connection with `m`'s credential (TLS, the appliance's CA).
async fn raw_connect(m: &Minted, listen: SocketAddr) -> async_nats::Client {
    let text = std::fs::read_to_string(&m.creds).unwrap();
    let options = async_nats::ConnectOptions::with_credentials(&text)
        .unwrap()
        .custom_inbox_prefix(format!("_INBOX_{}", m.id))
        .add_root_certificates(m.ca.clone())
        .require_tls(true);
    bounded("raw connect", options.connect(format!("tls://{listen}")))
        .await
        .unwrap()
}

async fn next_delivery(conn: &mut Connection) -> cotald::client::Delivery {
    bounded("a delivery", conn.deliveries.next())
        .await
        .expect("the client is alive")
}

/// Polls `consumer` on CHAT until `done` holds; returns its info then.
async fn wait_for(
    js: &jetstream::Context,
    consumer: &str,
    what: &str,
    done: impl Fn(&jetstream::consumer::Info) -> bool,
) -> jetstream::consumer::Info {
    let stream = js.get_stream(chat_stream()).await.unwrap();
    bounded(what, async {
        loop {
            let info = stream.consumer_info(consumer).await.unwrap();
            if done(&info) {
                return info;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// `fut`, or a panic naming `what` after [`TIMEOUT`].
async fn bounded<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {TIMEOUT:?}"))
}

fn chat_stream() -> String {
    format!("CHAT_{SPACE}")
}

fn text(len: usize) -> String {
    "durable bench text ".chars().cycle().take(len).collect()
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
