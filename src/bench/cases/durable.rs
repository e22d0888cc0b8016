//! Durable channels: publishing with absent members, a returning member's catch-up, history
//! on join, end to end, and fan-out to online members.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream;
use async_nats::jetstream::consumer::pull;
use futures_util::{StreamExt, TryStreamExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{
    CpuSplit, JOIN_CONCURRENCY, PER_SUBJECT, RAW_BATCH, Side, channel, clock_ticks, interleaved,
    names, next, proc_usage, rate, send_many, set_class, text,
};
use crate::bench::{Bench, Better, CaseResult, Minted, Sizes, bounded, spread};
use crate::client::{Client, Connection, DurableState, Replay};
use crate::protocol::Routing;

const CH_ONE: &str = "bench-one";
const CH_CROWD: &str = "bench-crowd";
const CH_CATCH: &str = "bench-catch";

/// Connects without the backstop, joins `ch` durably without history, disconnects: the
/// membership stays, kept by the trusted reader alone.
async fn join_and_leave(bench: &Bench, member: &Minted, ch: &str) -> anyhow::Result<()> {
    let conn = bench
        .connect(member, |o| o.receive_backstop = false)
        .await?;
    let report = bounded("durable join", conn.client.join(ch, Replay::Off)).await??;
    if report.durable != DurableState::Established {
        bail!("the durable join of {ch} was not established: {report:?}");
    }
    conn.client.close().await;
    Ok(())
}

pub(super) async fn durable_publish(
    bench: &Bench,
    sizes: Sizes,
) -> anyhow::Result<Vec<CaseResult>> {
    let n = sizes.messages;
    let publisher = bench
        .mint("bench-pub", json!({"allow_publish": [CH_ONE, CH_CROWD]}))
        .await?;
    let solo = bench
        .mint("bench-solo", json!({"subscribe": [CH_ONE]}))
        .await?;
    join_and_leave(bench, &solo, CH_ONE).await?;
    let mut crowd = Vec::with_capacity(sizes.members);
    for i in 0..sizes.members {
        crowd.push(
            bench
                .mint(
                    &format!("bench-member{i:03}"),
                    json!({"subscribe": [CH_CROWD]}),
                )
                .await?,
        );
    }
    futures_util::stream::iter(&crowd)
        .map(|m| join_and_leave(bench, m, CH_CROWD))
        .buffer_unordered(JOIN_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    let conn = bench.sender(&publisher).await?;
    let one = [Routing::channel(&channel(CH_ONE)?)];
    let many = [Routing::channel(&channel(CH_CROWD)?)];
    let figures = interleaved(
        sizes.runs,
        |warm| {
            let (client, many) = (&conn.client, &many);
            async move {
                let n = if warm { n / 10 } else { n };
                let start = Instant::now();
                send_many(&[client], many, n).await?;
                Ok(rate(n, start.elapsed()))
            }
        },
        |warm| {
            let (client, one) = (&conn.client, &one);
            async move {
                let n = if warm { n / 10 } else { n };
                let start = Instant::now();
                send_many(&[client], one, n).await?;
                Ok(rate(n, start.elapsed()))
            }
        },
    )
    .await?;
    conn.client.close().await;
    Ok(vec![CaseResult::new(
        "durable_publish_100_members",
        "msg/s",
        Better::Higher,
        figures,
        "cotald, the same channel with 1 durable member",
        ">= 0.9",
    )])
}

pub(super) async fn catch_up(bench: &Bench, sizes: Sizes) -> anyhow::Result<Vec<CaseResult>> {
    let backlog = sizes.backlog;
    let senders = backlog.div_ceil(PER_SUBJECT);
    let mut publishers = Vec::with_capacity(senders);
    for i in 0..senders {
        let p = bench
            .mint(
                &format!("bench-catch-pub{i}"),
                json!({"allow_publish": [CH_CATCH]}),
            )
            .await?;
        publishers.push(bench.sender(&p).await?);
    }
    let clients: Vec<&Client> = publishers.iter().map(|c| &c.client).collect();
    let returning = bench
        .mint("bench-returning", json!({"subscribe": [CH_CATCH]}))
        .await?;
    join_and_leave(bench, &returning, CH_CATCH).await?;
    let consumer = crate::binding::interval_consumer(&returning.id, CH_CATCH, 1);
    let raw_js = jetstream::new(bench.raw.clone());
    let route = [Routing::channel(&channel(CH_CATCH)?)];
    // The backlog each side reads: published while the member is away.
    let first = std::cell::Cell::new(0u64);
    let away = || async {
        let stream = raw_js.get_stream(names().chat_stream()).await?;
        // The member's session ends once the services see it offline.
        bounded("the member's session to end", async {
            while stream.consumer_info(&consumer).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await?;
        first.set(send_many(&clients, &route, backlog).await?);
        anyhow::Ok(())
    };
    let split = CpuSplit::of(bench, &CATCH_UP_CPU)?;
    let (cpu, away, first, returning) = (&split, &away, &first, &returning);
    let figures = interleaved(
        sizes.runs,
        |warm| async move {
            away().await?;
            let used = cpu.start();
            let start = Instant::now();
            let mut conn = bench.connect(returning, |_| {}).await?;
            let mut ids = HashSet::with_capacity(backlog);
            while ids.len() < backlog {
                let d = next(&mut conn).await?;
                if d.durable && d.channel.as_deref() == Some(CH_CATCH) {
                    ids.insert(d.message.id.clone());
                }
                d.ack().await?;
            }
            let elapsed = start.elapsed();
            conn.client.close().await;
            cpu.record(used, Side::Cotald, backlog, warm);
            Ok(rate(backlog, elapsed))
        },
        |warm| async move {
            away().await?;
            let used = cpu.start();
            let elapsed = raw_catch_up(bench, first.get(), backlog).await?;
            cpu.record(used, Side::Baseline, backlog, warm);
            Ok(rate(backlog, elapsed))
        },
    )
    .await?;
    for p in publishers {
        p.client.close().await;
    }
    let mut result = CaseResult::new(
        "catchup_10k",
        "msg/s",
        Better::Higher,
        figures,
        "a new connection + pull consumer of the same range, fetch 256 + ack",
        ">= 0.9",
    );
    split.report(&mut result);
    Ok(vec![result])
}

/// The names of `catchup_10k`'s CPU figures.
const CATCH_UP_CPU: [[&str; 3]; 2] = [
    [
        "appliance_us_per_entry",
        "broker_us_per_entry",
        "member_us_per_entry",
    ],
    [
        "appliance_us_per_entry_raw",
        "broker_us_per_entry_raw",
        "member_us_per_entry_raw",
    ],
];

/// The raw side of `catchup_10k`: a new connection and a pull consumer of the backlog from
/// `first`, fetched in batches and acked one by one; the time from connect to the last ack.
async fn raw_catch_up(bench: &Bench, first: u64, backlog: usize) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let nats = bench.raw_as(&bench.operator).await?;
    let js = jetstream::new(nats.clone());
    let stream = js.get_stream(names().chat_stream()).await?;
    let name = format!("bench_catch_{}", first);
    let raw = stream
        .create_consumer(pull::Config {
            name: Some(name.clone()),
            filter_subject: names().posts_on(CH_CATCH),
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: first,
            },
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        })
        .await?;
    let mut read = 0;
    while read < backlog {
        let mut batch = raw
            .fetch()
            .max_messages(RAW_BATCH.min(backlog - read))
            .expires(Duration::from_secs(2))
            .messages()
            .await?;
        while let Some(msg) = batch.next().await {
            msg.map_err(|e| anyhow::anyhow!("{e}"))?
                .ack()
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            read += 1;
        }
    }
    nats.flush().await?;
    let elapsed = start.elapsed();
    let _ = stream.delete_consumer(&name).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), nats.drain()).await;
    Ok(elapsed)
}

const CH_REPLAY: &str = "bench-replay";

/// A late joiner's history replay (§7: `replay` on a live channel): from `join` until the
/// backlog is surfaced, vs an ordered consumer of the same range on an open connection.
pub(super) async fn replay(bench: &Bench, sizes: Sizes) -> anyhow::Result<Vec<CaseResult>> {
    let backlog = sizes.backlog;
    set_class(bench, CH_REPLAY, "live").await?;
    publish_history(bench, backlog).await?;
    let joiner = bench
        .mint("bench-joiner", json!({"subscribe": [CH_REPLAY]}))
        .await?;
    let split = CpuSplit::of(bench, &REPLAY_CPU)?;
    let (cpu, joiner) = (&split, &joiner);
    let figures = interleaved(
        sizes.runs,
        |warm| join_with_history(bench, joiner, backlog, (cpu, warm)),
        |warm| ordered_read(bench, backlog, (cpu, warm)),
    )
    .await?;
    let mut result = CaseResult::new(
        "replay_10k",
        "msg/s",
        Better::Higher,
        figures,
        "an ordered consumer of the same range on an open connection",
        ">= 0.9",
    );
    split.report(&mut result);
    Ok(vec![result])
}

/// The names of `replay_10k`'s CPU figures.
const REPLAY_CPU: [[&str; 3]; 2] = [
    [
        "appliance_us_per_msg",
        "broker_us_per_msg",
        "joiner_us_per_msg",
    ],
    [
        "appliance_us_per_msg_raw",
        "broker_us_per_msg_raw",
        "joiner_us_per_msg_raw",
    ],
];

/// The history of `replay_10k`: `backlog` messages on its channel, from as many publishers as
/// the bound per subject asks for.
async fn publish_history(bench: &Bench, backlog: usize) -> anyhow::Result<()> {
    let mut publishers = Vec::new();
    for i in 0..backlog.div_ceil(PER_SUBJECT) {
        let p = bench
            .mint(
                &format!("bench-replay-pub{i}"),
                json!({"allow_publish": [CH_REPLAY]}),
            )
            .await?;
        publishers.push(bench.sender(&p).await?);
    }
    let clients: Vec<&Client> = publishers.iter().map(|c| &c.client).collect();
    send_many(&clients, &[Routing::channel(&channel(CH_REPLAY)?)], backlog).await?;
    for p in publishers {
        p.client.close().await;
    }
    Ok(())
}

/// The cotald side of `replay_10k`: `joiner` joins the channel and surfaces its `backlog` of
/// history; the rate from the join to the last message, and the CPU each side spent in it
/// recorded in `cpu` (the connection's setup and close left out, as the baseline's are).
async fn join_with_history(
    bench: &Bench,
    joiner: &Minted,
    backlog: usize,
    (cpu, warm): (&CpuSplit, bool),
) -> anyhow::Result<f64> {
    // A new connection each run: its dedup window has seen none of the history.
    let mut conn = bench.sender(joiner).await?;
    let client = conn.client.clone();
    let used = cpu.start();
    let start = Instant::now();
    let join = client.join(CH_REPLAY, Replay::AsConfigured);
    let surface = async {
        let mut n = 0;
        while n < backlog {
            if next(&mut conn).await?.historical {
                n += 1;
            }
        }
        anyhow::Ok(())
    };
    let (report, surfaced) = bounded("replay", async { tokio::join!(join, surface) }).await?;
    surfaced?;
    if report?.backfilled < backlog {
        bail!("the join backfilled fewer than {backlog}");
    }
    let elapsed = start.elapsed();
    cpu.record(used, Side::Cotald, backlog, warm);
    conn.client.close().await;
    Ok(rate(backlog, elapsed))
}

/// The raw side of `replay_10k`: an ordered consumer of the channel read to `backlog` on an
/// open connection; the rate from the stream's lookup to the last message, and the CPU each
/// side spent in it recorded in `cpu`.
async fn ordered_read(
    bench: &Bench,
    backlog: usize,
    (cpu, warm): (&CpuSplit, bool),
) -> anyhow::Result<f64> {
    let nats = bench.raw_as(&bench.operator).await?;
    let js = jetstream::new(nats.clone());
    let used = cpu.start();
    let start = Instant::now();
    let stream = js.get_stream(names().chat_stream()).await?;
    let mut messages = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: names().posts_on(CH_REPLAY),
            ..Default::default()
        })
        .await?
        .messages()
        .await?;
    let mut read = 0;
    while read < backlog {
        bounded("an ordered read", messages.next())
            .await?
            .context("the ordered consumer ended")?
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        read += 1;
    }
    let elapsed = start.elapsed();
    cpu.record(used, Side::Baseline, backlog, warm);
    drop(messages);
    let _ = tokio::time::timeout(Duration::from_secs(5), nats.drain()).await;
    Ok(rate(backlog, elapsed))
}

const CH_E2E_DURABLE: &str = "bench-e2e-durable";
const CH_E2E_LIVE: &str = "bench-e2e-live";

/// Publisher to an online member on a durable channel (live copy and durable copy, deduped,
/// the durable one acked) vs the same on a live channel.
pub(super) async fn durable_end_to_end(
    bench: &Bench,
    sizes: Sizes,
) -> anyhow::Result<Vec<CaseResult>> {
    let n = sizes.messages / 2;
    set_class(bench, CH_E2E_LIVE, "live").await?;
    let mut senders = Vec::new();
    for i in 0..n.div_ceil(PER_SUBJECT) {
        let p = bench
            .mint(
                &format!("bench-e2e-pub{i}"),
                json!({"allow_publish": [CH_E2E_DURABLE, CH_E2E_LIVE]}),
            )
            .await?;
        senders.push(bench.sender(&p).await?);
    }
    let clients: Vec<&Client> = senders.iter().map(|c| &c.client).collect();
    let member = bench
        .mint(
            "bench-e2e-member",
            json!({"subscribe": [CH_E2E_DURABLE, CH_E2E_LIVE]}),
        )
        .await?;
    let conn = tokio::sync::Mutex::new(bench.connect(&member, |_| {}).await?);
    for ch in [CH_E2E_DURABLE, CH_E2E_LIVE] {
        let client = conn.lock().await.client.clone();
        bounded("join", client.join(ch, Replay::Off)).await??;
    }
    let end_to_end = |ch: &'static str, warm: bool| {
        let (clients, conn) = (&clients, &conn);
        async move {
            let n = if warm { n / 10 } else { n };
            let route = [Routing::channel(&channel(ch)?)];
            let mut conn = conn.lock().await;
            let start = Instant::now();
            let sending = send_many(clients, &route, n);
            let receiving = async {
                let mut ids = HashSet::with_capacity(n);
                while ids.len() < n {
                    let d = next(&mut conn).await?;
                    if d.channel.as_deref() == Some(ch) {
                        ids.insert(d.message.id.clone());
                    }
                    d.ack().await?;
                }
                anyhow::Ok(())
            };
            // Either side failing ends the measurement with its error (the other is not awaited).
            tokio::try_join!(sending, receiving)?;
            Ok(rate(n, start.elapsed()))
        }
    };
    let figures = interleaved(
        sizes.runs,
        |warm| end_to_end(CH_E2E_DURABLE, warm),
        |warm| end_to_end(CH_E2E_LIVE, warm),
    )
    .await?;
    for c in senders {
        c.client.close().await;
    }
    conn.into_inner().client.close().await;
    Ok(vec![CaseResult::new(
        "durable_end_to_end",
        "msg/s",
        Better::Higher,
        figures,
        "cotald, the same traffic on a live channel",
        "as close to 1 as it goes",
    )])
}

const CH_FAN_DURABLE: &str = "bench-fan-durable";
const CH_FAN_LIVE: &str = "bench-fan-live";
/// The numbers of online members the fan-out case measures.
const FAN_MEMBERS: [usize; 3] = [1, 10, 50];

/// What the fan-out case's members have surfaced: first sightings per channel.
#[derive(Default)]
struct Surfaced {
    durable: std::sync::atomic::AtomicUsize,
    live: std::sync::atomic::AtomicUsize,
    changed: tokio::sync::Notify,
}

impl Surfaced {
    fn of(&self, ch: &str) -> &std::sync::atomic::AtomicUsize {
        if ch == CH_FAN_DURABLE {
            &self.durable
        } else {
            &self.live
        }
    }

    /// Waits until `ch` counts at least `target`.
    async fn reach(&self, ch: &str, target: usize) {
        loop {
            let changed = self.changed.notified();
            if self.of(ch).load(std::sync::atomic::Ordering::Acquire) >= target {
                return;
            }
            changed.await;
        }
    }
}

/// One online member of both fan-out channels: surfaces and acks what it gets, counting each
/// message the first time.
async fn fan_member(mut conn: Connection, surfaced: Arc<Surfaced>, stop: CancellationToken) {
    let mut seen = HashSet::new();
    loop {
        let d = tokio::select! {
            () = stop.cancelled() => break,
            d = conn.deliveries.next() => match d { Some(d) => d, None => break },
        };
        if let Some(ch) = d.channel.clone()
            && seen.insert(d.message.id.clone())
        {
            surfaced
                .of(&ch)
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            surfaced.changed.notify_waiters();
        }
        let _ = d.ack().await;
    }
    conn.client.close().await;
}

/// The `i`th fan-out member, minted, connected and joined to both channels.
async fn fan_member_joined(bench: &Bench, i: usize) -> anyhow::Result<Connection> {
    let m = bench
        .mint(
            &format!("bench-fan-member{i}"),
            json!({"subscribe": [CH_FAN_DURABLE, CH_FAN_LIVE]}),
        )
        .await?;
    let conn = bench.connect(&m, |_| {}).await?;
    for ch in [CH_FAN_DURABLE, CH_FAN_LIVE] {
        bounded("join", conn.client.join(ch, Replay::Off)).await??;
    }
    Ok(conn)
}

/// The trusted reader's consumers on CHAT (`bk_…`).
pub(super) async fn backstop_consumers(
    raw: &async_nats::Client,
) -> anyhow::Result<Vec<jetstream::consumer::Info>> {
    let js = jetstream::new(raw.clone());
    let stream = js.get_stream_no_info(names().chat_stream()).await?;
    let infos: Vec<jetstream::consumer::Info> = stream.consumers().try_collect().await?;
    Ok(infos
        .into_iter()
        .filter(|i| i.name.starts_with("bk_"))
        .collect())
}

/// Pending and unacknowledged entries of the trusted reader's consumers on CHAT: 0 once every
/// durable copy is acknowledged.
async fn backstop_pending(raw: &async_nats::Client) -> anyhow::Result<u64> {
    Ok(backstop_consumers(raw)
        .await?
        .iter()
        .map(|i| i.num_pending + i.num_ack_pending as u64)
        .sum())
}

/// Waits until every durable copy or offer of what `clients` surfaced is acknowledged.
async fn acknowledged(bench: &Bench, clients: &[crate::client::Client]) -> anyhow::Result<()> {
    // A member that follows the feed: every message it handled live has had its offer,
    // acknowledged.
    for client in clients {
        while client.inner.out.settle(Duration::from_secs(1)).await > 0 {}
    }
    // A member on its own consumer: nothing pending or unacknowledged.
    while backstop_pending(&bench.raw).await? > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// What is left unacknowledged, for a wait that did not end: the members with copies still
/// awaiting their settlement, and the trusted reader's consumers with entries pending or
/// unacknowledged (the first few of each named, and how many there are).
async fn unacknowledged(bench: &Bench, clients: &[crate::client::Client]) -> String {
    let mut members = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        let awaiting = client.inner.out.settle(Duration::ZERO).await;
        if awaiting > 0 {
            members.push(format!("member {i}: {awaiting} copies awaiting settlement"));
        }
    }
    let consumers = match backstop_consumers(&bench.raw).await {
        Ok(infos) => infos
            .iter()
            .filter(|i| i.num_pending + i.num_ack_pending as u64 > 0)
            .map(|i| {
                format!(
                    "{}: {} pending, {} unacknowledged, {} delivered, ack floor {}",
                    i.name,
                    i.num_pending,
                    i.num_ack_pending,
                    i.delivered.stream_sequence,
                    i.ack_floor.stream_sequence
                )
            })
            .collect(),
        Err(e) => vec![format!("the reader's consumers unreadable: {e}")],
    };
    let first_few = |mut said: Vec<String>, what: &str| {
        const NAMED: usize = 5;
        let more = said.len().saturating_sub(NAMED);
        said.truncate(NAMED);
        if more > 0 {
            said.push(format!("{more} more {what}"));
        }
        said
    };
    let mut left = first_few(members, "members");
    left.extend(first_few(consumers, "consumers"));
    left.join("; ")
}

/// N members online on a durable channel against the same N on a live one, for N in
/// [`FAN_MEMBERS`]: one sender posts [`Sizes::samples`]/10 messages one at a time (as agents
/// talk); the time until every member surfaced every message (on the durable side also until
/// every durable copy or offer is acknowledged), as msg/s, and the appliance's CPU per message
/// per online member on each side.
pub(super) async fn durable_fanout(bench: &Bench, sizes: Sizes) -> anyhow::Result<Vec<CaseResult>> {
    let n = (sizes.samples / 10).max(20);
    set_class(bench, CH_FAN_LIVE, "live").await?;
    let p = bench
        .mint(
            "bench-fan-pub",
            json!({"allow_publish": [CH_FAN_DURABLE, CH_FAN_LIVE]}),
        )
        .await?;
    let sender = bench.sender(&p).await?;
    let appliance = bench
        .dir
        .read_state()?
        .context("the appliance under test stopped")?
        .pid;
    let surfaced = Arc::new(Surfaced::default());
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    let mut clients = Vec::new();
    let mut results = Vec::new();
    for online in FAN_MEMBERS {
        while tasks.len() < online {
            let conn = fan_member_joined(bench, tasks.len()).await?;
            clients.push(conn.client.clone());
            tasks.push(tokio::spawn(fan_member(
                conn,
                surfaced.clone(),
                stop.clone(),
            )));
        }
        let fan = FanOut {
            bench,
            sender: &sender.client,
            surfaced: &surfaced,
            clients: &clients,
            appliance,
            online,
            n,
            cpu_us: std::sync::Mutex::new([Vec::new(), Vec::new()]),
        };
        let figures = interleaved(
            sizes.runs,
            |warm| fan.measure(CH_FAN_DURABLE, warm),
            |warm| fan.measure(CH_FAN_LIVE, warm),
        )
        .await?;
        results.push(fan.result(figures));
    }
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    sender.client.close().await;
    Ok(results)
}

/// One size of the fan-out case: `online` members, `n` messages a run.
struct FanOut<'a> {
    bench: &'a Bench,
    sender: &'a Client,
    surfaced: &'a Surfaced,
    /// The members' clients.
    clients: &'a [Client],
    /// The pid of the appliance under test, whose CPU time is counted.
    appliance: u32,
    online: usize,
    n: usize,
    /// The appliance's CPU µs per message per member of each run: durable, live.
    cpu_us: std::sync::Mutex<[Vec<f64>; 2]>,
}

impl FanOut<'_> {
    /// One run on `ch`: the rate at which every member surfaced every message (on the durable
    /// channel, every copy or offer acknowledged too); the appliance's CPU recorded.
    async fn measure(&self, ch: &'static str, warm: bool) -> anyhow::Result<f64> {
        let (n, online) = (if warm { self.n / 4 } else { self.n }, self.online);
        let route = Routing::channel(&channel(ch)?);
        let target = self
            .surfaced
            .of(ch)
            .load(std::sync::atomic::Ordering::Acquire)
            + n * online;
        let before = proc_usage(self.appliance).0;
        let start = Instant::now();
        for _ in 0..n {
            bounded("publish", self.sender.send_text(route.clone(), &text())).await??;
        }
        bounded("every member to surface", self.surfaced.reach(ch, target)).await?;
        let took = start.elapsed();
        if ch == CH_FAN_DURABLE {
            let waited = bounded(
                "every durable copy acknowledged",
                acknowledged(self.bench, self.clients),
            )
            .await;
            if let Err(e) = waited {
                bail!("{e}: {}", unacknowledged(self.bench, self.clients).await);
            }
            waited??;
        }
        let cpu = (proc_usage(self.appliance).0 - before) / clock_ticks();
        if !warm && let Ok(mut cpu_us) = self.cpu_us.lock() {
            let side = usize::from(ch == CH_FAN_LIVE);
            cpu_us[side].push(cpu * 1e6 / (n * online) as f64);
        }
        Ok(rate(n, took))
    }

    /// The case's result for this size, with the appliance's CPU per message per member.
    fn result(self, figures: (Vec<f64>, Vec<f64>)) -> CaseResult {
        let name = match self.online {
            1 => "durable_fanout_online_1",
            10 => "durable_fanout_online_10",
            _ => "durable_fanout_online_50",
        };
        let mut result = CaseResult::new(
            name,
            "msg/s",
            Better::Higher,
            figures,
            "cotald, the same members on a live channel",
            "≥ 0.8 at 50 members; appliance CPU per message per member ≤ 5 µs",
        );
        let [durable_cpu, live_cpu] = self.cpu_us.into_inner().unwrap_or_default();
        result
            .extra
            .insert("appliance_us_per_msg_per_member", spread(durable_cpu).1);
        result
            .extra
            .insert("appliance_us_per_msg_per_member_live", spread(live_cpu).1);
        result.extra.insert("messages", self.n as f64);
        result
    }
}
