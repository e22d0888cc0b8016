//! Presence at scale: a roster converging over simulated heartbeats, and a space of a
//! thousand instances (how long its roster takes to converge, what the appliance and the
//! broker spend holding it).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream;
use futures_util::{StreamExt, TryStreamExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::durable::backstop_consumers;
use super::{IN_FLIGHT, JOIN_CONCURRENCY, clock_ticks, cpu_seconds, names, proc_usage};
use crate::bench::{Bench, Better, CaseResult, Minted, SPACE, Sizes, bounded};
use crate::binding::SpaceNames;
use crate::client::{Connection, Replay};
use crate::protocol::InstanceId;

/// [`Sizes::instances`] simulated instances heartbeat every 2 s (§6) into the space's presence
/// directory, written raw by the operator (one KV put each, as a client's heartbeat is), while a
/// cotald client watches the roster: the time until its roster shows all of them online, then,
/// over [`Sizes::hold`], how often one of them was shown offline while it was beating (a false
/// offline: the goal is none), and the CPU and memory of cotald and its broker meanwhile.
pub(super) async fn presence_converge(
    bench: &Bench,
    sizes: Sizes,
) -> anyhow::Result<Vec<CaseResult>> {
    let (observer, state) = roster_watch(bench).await?;
    let roster = observer.client.roster().clone();
    let (mut converged, mut false_offlines) = (Vec::new(), 0.0);
    let mut usage = Vec::new();
    for _ in 0..sizes.runs {
        let ids: Vec<InstanceId> = (0..sizes.instances)
            .map(|_| InstanceId::from_user_nkey(&nkeys::KeyPair::new_user().public_key()))
            .collect::<Result<_, _>>()?;
        let names: Vec<&str> = ids.iter().map(InstanceId::as_str).collect();
        let online = |roster: &crate::client::Roster| online(roster, &names);
        let stop = tokio_util::sync::CancellationToken::new();
        let measure = async {
            let start = Instant::now();
            all_online(&roster, &names).await?;
            let took = start.elapsed().as_secs_f64() * 1e3;
            let pids = [state.pid, state.broker_pid];
            let (offline, used) = hold(sizes.hold, pids, || ids.len() - online(&roster)).await;
            anyhow::Ok((took, offline, used))
        };
        let measured = async {
            let measured = measure.await;
            stop.cancel();
            measured
        };
        let (beat, measured) = tokio::join!(
            heartbeats(jetstream::new(bench.raw.clone()), &ids, stop.clone()),
            measured
        );
        beat?;
        let (took, offline, used) = measured?;
        converged.push(took);
        false_offlines += offline;
        usage.push(used);
    }
    observer.client.close().await;
    let window = crate::protocol::LIVENESS_WINDOW.as_secs_f64() * 1e3;
    let mut result = CaseResult::new(
        "presence_converge_2000",
        "ms",
        Better::Lower,
        (converged, vec![window; sizes.runs]),
        "one liveness window (§6): the goal, not a measurement",
        "<= 1.0, and no false offline",
    );
    let last = usage.last().copied().unwrap_or_default();
    result.extra.insert("false_offlines", false_offlines);
    last.report(&mut result);
    Ok(vec![result])
}

/// Writes a heartbeat of every id every 2 s until `stop`.
async fn heartbeats(
    js: jetstream::Context,
    ids: &[InstanceId],
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let bucket = names().presence_bucket();
    let mut beat = tokio::time::interval(crate::protocol::HEARTBEAT_INTERVAL);
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            _ = beat.tick() => {}
        }
        let now = crate::protocol::EpochMillis::now();
        futures_util::stream::iter(ids)
            .map(|id| {
                let card = crate::protocol::AgentCard::new(
                    id,
                    format!("sim-{}", &id.as_str()[..8]),
                    crate::protocol::EndpointKind::Agent,
                );
                let (js, bucket, now) = (&js, &bucket, now.clone());
                async move {
                    let record = crate::protocol::Presence::heartbeat(
                        card,
                        crate::protocol::PresenceStatus::Idle,
                        now,
                    )?;
                    let body = serde_json::to_vec(&record)?;
                    js.publish(SpaceNames::kv_subject(bucket, id.as_str()), body.into())
                        .await?
                        .await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .try_collect::<Vec<()>>()
            .await?;
    }
}

/// The channel every instance of the space case is a durable member of.
const CH_SPACE: &str = "bench-space";
/// Instances in the space case.
const SPACE_INSTANCES: usize = 1_000;
/// Of them, cotald clients; the rest are raw connections.
const SPACE_CLIENTS: usize = 10;
/// Connections opened at once.
const SPACE_CONNECTING: usize = 32;

/// `space_1000`: [`SPACE_INSTANCES`] instances in one space, each heartbeating its presence
/// every 2 s (§6) and a durable member of one channel with a session of the trusted reader
/// (§8), as agents of a team are: [`SPACE_CLIENTS`] of them cotald clients, the rest raw
/// connections doing what a client does for that (its own presence put, `durable-join` and
/// `resume` to the manager) and nothing more. Measured: from the first connect until an
/// observer's roster shows every one online (against one liveness window, the goal; how much
/// of it the bench took to connect them all is `connected_ms`), false
/// offlines over [`Sizes::hold`], the appliance's and the broker's CPU and RSS meanwhile, and
/// the trusted reader's consumers on CHAT.
pub(super) async fn space(bench: &Bench, sizes: Sizes) -> anyhow::Result<Vec<CaseResult>> {
    let minted: Vec<Minted> = futures_util::stream::iter(0..SPACE_INSTANCES)
        .map(|i| async move {
            let name = format!("bench-space{i}");
            bench.mint(&name, json!({"subscribe": [CH_SPACE]})).await
        })
        .buffer_unordered(JOIN_CONCURRENCY)
        .try_collect()
        .await?;
    let (observer, state) = roster_watch(bench).await?;
    let roster = observer.client.roster().clone();
    let frontier = jetstream::new(bench.raw.clone())
        .get_stream(names().chat_stream())
        .await?
        .info()
        .await?
        .state
        .last_sequence;
    let stop = CancellationToken::new();
    let pids = [state.pid, state.broker_pid, std::process::id()];
    let cpu_before = pids.map(cpu_seconds);
    let started = Instant::now();
    let (clients, raws) = space_online(bench, &minted, frontier, &stop).await?;
    let connected = started.elapsed().as_secs_f64() * 1e3;
    let cpu_after = pids.map(cpu_seconds);
    let ids: Vec<&str> = minted.iter().map(|m| m.id.as_str()).collect();
    let online = |roster: &crate::client::Roster| online(roster, &ids);
    all_online(&roster, &ids).await?;
    let took = started.elapsed().as_secs_f64() * 1e3;
    let (false_offlines, used) = hold(sizes.hold, [state.pid, state.broker_pid], || {
        ids.len() - online(&roster)
    })
    .await;
    let consumers = backstop_consumers(&bench.raw).await?.len();
    stop.cancel();
    for conn in clients {
        conn.client.close().await;
    }
    for raw in raws {
        let _ = tokio::time::timeout(Duration::from_secs(1), raw.drain()).await;
    }
    observer.client.close().await;
    let window = crate::protocol::LIVENESS_WINDOW.as_secs_f64() * 1e3;
    let mut result = CaseResult::new(
        "space_1000",
        "ms",
        Better::Lower,
        (vec![took], vec![window]),
        "one liveness window (§6), not a measurement",
        "roster <= 3 s, 0 false offline, appliance RSS <= 200 MiB",
    );
    result.extra.insert("instances", ids.len() as f64);
    result.extra.insert("connected_ms", connected);
    // What connecting them cost each side, per instance (ms of CPU): the appliance, its broker,
    // and this process (which holds every instance's connection).
    for (i, name) in [
        "appliance_cpu_ms_per_instance",
        "broker_cpu_ms_per_instance",
        "instances_cpu_ms_per_instance",
    ]
    .into_iter()
    .enumerate()
    {
        let ms = (cpu_after[i] - cpu_before[i]) * 1e3 / ids.len() as f64;
        result.extra.insert(name, ms);
    }
    result.extra.insert("false_offlines", false_offlines);
    result.extra.insert("backstop_consumers", consumers as f64);
    used.report(&mut result);
    Ok(vec![result])
}

/// Every instance of the space case connected: the first [`SPACE_CLIENTS`] as cotald clients
/// joined to [`CH_SPACE`], the rest as [`raw_member`]s.
async fn space_online(
    bench: &Bench,
    minted: &[Minted],
    frontier: u64,
    stop: &CancellationToken,
) -> anyhow::Result<(Vec<Connection>, Vec<async_nats::Client>)> {
    let (clients, raws) = minted.split_at(SPACE_CLIENTS);
    let clients = futures_util::stream::iter(clients)
        .map(|m| async move {
            let conn = bench.connect(m, |_| {}).await?;
            bounded("join", conn.client.join(CH_SPACE, Replay::Off)).await??;
            anyhow::Ok(conn)
        })
        .buffer_unordered(SPACE_CONNECTING)
        .try_collect()
        .await?;
    let raws = futures_util::stream::iter(raws)
        .map(|m| raw_member(bench, m, frontier, stop.clone()))
        .buffer_unordered(SPACE_CONNECTING)
        .try_collect()
        .await?;
    Ok((clients, raws))
}

/// An observer of the space (the machine operator, presence only) whose roster the presence
/// cases watch, and the runtime state that names the appliance's and the broker's pids.
async fn roster_watch(bench: &Bench) -> anyhow::Result<(Connection, crate::datadir::RuntimeState)> {
    let observer = bench
        .connect(&bench.operator, |o| {
            o.receive_backstop = false;
            o.receive_dms = false;
        })
        .await?;
    let state = bench
        .dir
        .read_state()?
        .context("the appliance under test stopped")?;
    Ok((observer, state))
}

/// How many of `ids` the roster shows online.
fn online(roster: &crate::client::Roster, ids: &[&str]) -> usize {
    ids.iter()
        .filter(|id| {
            roster
                .status(id)
                .is_some_and(|s| s != crate::protocol::PresenceStatus::Offline)
        })
        .count()
}

/// Waits (bounded) until the roster shows every one of `ids` online.
async fn all_online(roster: &crate::client::Roster, ids: &[&str]) -> anyhow::Result<()> {
    let waited = bounded("the roster to converge", async {
        while online(roster, ids) < ids.len() {
            let _ = tokio::time::timeout(Duration::from_millis(100), roster.changed()).await;
        }
    })
    .await;
    if let Err(e) = waited {
        bail!("{e}: {} of {} online", online(roster, ids), ids.len());
    }
    Ok(())
}

/// Holds for `span`, counting twice a second the instances a roster shows offline while they
/// beat (`offline()`: each a false offline), and what the appliance and its broker (`pids`)
/// used meanwhile.
async fn hold(span: Duration, pids: [u32; 2], offline: impl Fn() -> usize) -> (f64, ProcessUse) {
    let before = ProcessUse::of(&pids);
    let held = Instant::now();
    let mut false_offlines = 0.0;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    while held.elapsed() < span {
        tick.tick().await;
        false_offlines += offline() as f64;
    }
    let after = ProcessUse::of(&pids);
    (
        false_offlines,
        ProcessUse::between(&before, &after, held.elapsed()),
    )
}

/// One raw instance of the space case: connected with its credential, heartbeating its own
/// presence every 2 s until `stop`, a durable member of [`CH_SPACE`] from `cursor`, with a
/// delivery session of the trusted reader.
async fn raw_member(
    bench: &Bench,
    m: &Minted,
    cursor: u64,
    stop: CancellationToken,
) -> anyhow::Result<async_nats::Client> {
    let raw = bench.raw_as(m).await?;
    let id = InstanceId::from_user_nkey(&m.id)?;
    let name = format!("space-{}", &m.id[..8]);
    let endpoint = crate::protocol::EndpointRef::new(&id, name.clone());
    let subjects = crate::protocol::SpaceSubjects::new(SPACE)?;
    let ctl = subjects.ctl(crate::binding::MANAGER_SERVICE, id.as_str())?;
    let presence = crate::binding::SpaceNames::kv_subject(&names().presence_bucket(), id.as_str());
    let js = jetstream::new(raw.clone());
    let card = crate::protocol::AgentCard::new(&id, name, crate::protocol::EndpointKind::Agent);
    let beat = move |card: crate::protocol::AgentCard| {
        let record = crate::protocol::Presence::heartbeat(
            card,
            crate::protocol::PresenceStatus::Idle,
            crate::protocol::EpochMillis::now(),
        );
        anyhow::Ok(serde_json::to_vec(&record?)?)
    };
    js.publish(presence.clone(), beat(card.clone())?.into())
        .await?
        .await?;
    for request in [
        crate::ops::Request::DurableJoin(crate::ops::DurableJoin {
            channel: CH_SPACE.to_owned(),
            cursor,
        }),
        crate::ops::Request::Resume(crate::ops::Resume {
            session: crate::protocol::new_message_id(),
            offers: false,
            ranges: false,
        }),
    ] {
        let body = serde_json::to_vec(&request.to_control(endpoint.clone()))?;
        let reply = bounded("a manager request", raw.request(ctl.clone(), body.into())).await??;
        let reply: crate::protocol::ControlReply = serde_json::from_slice(&reply.payload)?;
        if !reply.ok {
            bail!("{} refused: {:?}", request.op(), reply.error);
        }
    }
    tokio::spawn(async move {
        let mut every = tokio::time::interval(crate::protocol::HEARTBEAT_INTERVAL);
        every.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = every.tick() => {}
            }
            if let Ok(body) = beat(card.clone()) {
                let _ = js.publish(presence.clone(), body.into()).await;
            }
        }
    });
    Ok(raw)
}

/// CPU time and resident memory of a few processes, from `/proc` (Linux; zeros elsewhere).
#[derive(Debug, Clone, Copy, Default)]
struct ProcessUse {
    cpu_percent: [f64; 2],
    rss_mib: [f64; 2],
}

/// Clock ticks of CPU and resident MiB of each pid.
struct Sample(Vec<(f64, f64)>);

impl ProcessUse {
    fn of(pids: &[u32; 2]) -> Sample {
        Sample(pids.iter().map(|&pid| proc_usage(pid)).collect())
    }

    /// Adds the figures to `result`'s extras: the appliance's (`cotald_…`) and the broker's.
    fn report(&self, result: &mut CaseResult) {
        let extra = &mut result.extra;
        extra.insert("cotald_cpu_percent", self.cpu_percent[0]);
        extra.insert("broker_cpu_percent", self.cpu_percent[1]);
        extra.insert("cotald_rss_mib", self.rss_mib[0]);
        extra.insert("broker_rss_mib", self.rss_mib[1]);
    }

    fn between(before: &Sample, after: &Sample, elapsed: Duration) -> ProcessUse {
        let ticks = clock_ticks();
        let mut usage = ProcessUse::default();
        for i in 0..2 {
            let (cpu0, _) = before.0[i];
            let (cpu1, rss) = after.0[i];
            usage.cpu_percent[i] = (cpu1 - cpu0) / ticks / elapsed.as_secs_f64() * 100.0;
            usage.rss_mib[i] = rss;
        }
        usage
    }
}
