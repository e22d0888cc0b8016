//! The cases of `cotald bench`, each beside its raw async-nats baseline (module doc of
//! [`super`]). Every payload is the JSON of a message as `Client::send` builds it, with a
//! [`TEXT_LEN`]-byte text, so both sides move the same bytes.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, message::PublishMessage};
use futures_util::{StreamExt, TryStreamExt};
use serde_json::json;

use super::{Bench, CaseResult, SPACE, Sizes, bounded};
use crate::binding::SpaceNames;
use crate::client::{Client, Connection, Delivery};
use crate::protocol::{Channel, CotalMessage, Part, Routing};

mod dm;
mod durable;
mod live;
mod presence;
mod up;

use dm::{DM_PIPELINED, DM_THROUGHPUT, dm_case};
use durable::{catch_up, durable_end_to_end, durable_fanout, durable_publish, replay};
use live::{DEFAULT_PROFILE, latency_split, live_serial};
pub(super) use live::{LIVE, live_latency, live_throughput};
use presence::{presence_converge, space};
pub(super) use up::startup;

/// The names of the bench's space.
fn names() -> SpaceNames {
    SpaceNames::new(SPACE)
}

/// Text length of every message.
const TEXT_LEN: usize = 256;
/// Publishes in flight in the pipelined cases.
const IN_FLIGHT: usize = 256;
/// DMs in flight: a (target, sender) pair holds a bounded number of messages the target has
/// not read and the warden has not trimmed (`services/warden/`), so a sender keeps fewer in
/// flight.
const DM_IN_FLIGHT: usize = 64;
/// DMs a sender sends before it waits for the receiver to have read them all: a publish is
/// acknowledged when stored, not when read, so without a window a sender outruns its reader
/// until the pair bound refuses it.
const DM_WINDOW: usize = 400;

/// How a DM case sends.
#[derive(Clone, Copy)]
struct DmPace {
    /// Its name, the prefix of its identities, its baseline and goal in words.
    name: &'static str,
    tag: &'static str,
    baseline_is: &'static str,
    goal: &'static str,
    /// Sends in flight.
    in_flight: usize,
    /// Sends before the sender waits for the reader to have read them all.
    window: usize,
}

/// `n` split into windows of at most `window`.
fn windows(n: usize, window: usize) -> impl Iterator<Item = usize> {
    (0..n)
        .step_by(window)
        .map(move |start| window.min(n - start))
}
/// `CHAT_<space>` keeps 1,000 messages per (sender, channel) subject (§8): a backlog larger
/// than that needs more senders.
const PER_SUBJECT: usize = 1_000;
/// Pull batch of the raw catch-up.
const RAW_BATCH: usize = 256;
/// Concurrent member connections while memberships are set up.
const JOIN_CONCURRENCY: usize = 8;

type CaseFuture<'a> = Pin<Box<dyn Future<Output = anyhow::Result<Vec<CaseResult>>> + 'a>>;

/// A case: the result names it produces, and how to run it.
pub(super) struct Case {
    pub(super) names: &'static [&'static str],
    /// A throughput case: measured again with every write synced.
    pub(super) throughput: bool,
    pub(super) run: for<'a> fn(&'a Bench, Sizes) -> CaseFuture<'a>,
}

/// Every case that runs on the shared appliance, in order.
pub(super) const ALL: &[Case] = &[
    Case {
        names: &["live_throughput"],
        throughput: true,
        run: |b, s| Box::pin(live_throughput(b, s, LIVE)),
    },
    Case {
        names: &["live_serial"],
        throughput: false,
        run: |b, s| Box::pin(live_serial(b, s, LIVE)),
    },
    Case {
        names: &["live_latency_p50", "live_latency_p99"],
        throughput: false,
        run: |b, s| Box::pin(live_latency(b, s, LIVE)),
    },
    Case {
        names: &["default_profile_throughput"],
        throughput: true,
        run: |b, s| Box::pin(live_throughput(b, s, DEFAULT_PROFILE)),
    },
    Case {
        names: &["default_profile_serial"],
        throughput: false,
        run: |b, s| Box::pin(live_serial(b, s, DEFAULT_PROFILE)),
    },
    Case {
        names: &["default_profile_latency_p50", "default_profile_latency_p99"],
        throughput: false,
        run: |b, s| Box::pin(live_latency(b, s, DEFAULT_PROFILE)),
    },
    Case {
        names: &["latency_split_sender_p50", "latency_split_member_p50"],
        throughput: false,
        run: |b, s| Box::pin(latency_split(b, s)),
    },
    Case {
        names: &["dm_throughput"],
        throughput: true,
        run: |b, s| Box::pin(dm_case(b, s.runs, s.messages / 2, DM_THROUGHPUT)),
    },
    Case {
        names: &["dm_pipelined_100k"],
        throughput: false,
        run: |b, s| Box::pin(dm_case(b, s.runs, s.dms, DM_PIPELINED)),
    },
    Case {
        names: &["durable_publish_100_members"],
        throughput: true,
        run: |b, s| Box::pin(durable_publish(b, s)),
    },
    Case {
        names: &["catchup_10k"],
        throughput: false,
        run: |b, s| Box::pin(catch_up(b, s)),
    },
    Case {
        names: &["replay_10k"],
        throughput: false,
        run: |b, s| Box::pin(replay(b, s)),
    },
    Case {
        names: &["presence_converge_2000"],
        throughput: false,
        run: |b, s| Box::pin(presence_converge(b, s)),
    },
    Case {
        names: &["space_1000"],
        throughput: false,
        run: |b, s| Box::pin(space(b, s)),
    },
    Case {
        names: &["durable_end_to_end"],
        throughput: false,
        run: |b, s| Box::pin(durable_end_to_end(b, s)),
    },
    Case {
        names: &[
            "durable_fanout_online_1",
            "durable_fanout_online_10",
            "durable_fanout_online_50",
        ],
        throughput: false,
        run: |b, s| Box::pin(durable_fanout(b, s)),
    },
];

fn text() -> String {
    "cotald bench text "
        .chars()
        .cycle()
        .take(TEXT_LEN)
        .collect()
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn channel(name: &str) -> anyhow::Result<Channel> {
    Ok(Channel::new(name)?)
}

/// The raw payload: a message from `from` as `Client::send` builds it.
fn payload(from: &Client, routing: Routing) -> anyhow::Result<bytes::Bytes> {
    let message = CotalMessage::new(SPACE, from.endpoint(), routing, vec![Part::text(text())]);
    Ok(message.to_json()?.into())
}

/// Measures each side `runs` times after one warm-up of each, alternating which goes first.
async fn interleaved<C, B, CF, BF>(
    runs: usize,
    mut cotald: C,
    mut baseline: B,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)>
where
    C: FnMut(bool) -> CF,
    B: FnMut(bool) -> BF,
    CF: Future<Output = anyhow::Result<f64>>,
    BF: Future<Output = anyhow::Result<f64>>,
{
    cotald(true).await?;
    baseline(true).await?;
    let (mut c, mut b) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for run in 0..runs {
        if run % 2 == 0 {
            c.push(cotald(false).await?);
            b.push(baseline(false).await?);
        } else {
            b.push(baseline(false).await?);
            c.push(cotald(false).await?);
        }
    }
    Ok((c, b))
}

/// Sets a channel's delivery class through the manager, as the machine operator.
async fn set_class(bench: &Bench, ch: &str, class: &str) -> anyhow::Result<()> {
    let op = bench
        .connect(&bench.operator, |o| {
            o.receive_backstop = false;
            o.receive_dms = false;
            o.presence = false;
        })
        .await?;
    let request = crate::ops::Request::ChannelsSet(serde_json::from_value(json!({
        "channel": ch,
        "config": {"deliveryClass": class},
    }))?);
    bounded(
        "channels-set",
        op.client.manager::<serde_json::Value>(&request),
    )
    .await??;
    op.client.close().await;
    Ok(())
}

/// `n` sends of the bench text, round robin over `clients` and `routes`, [`IN_FLIGHT`] at a
/// time; returns the lowest stream sequence.
async fn send_many(clients: &[&Client], routes: &[Routing], n: usize) -> anyhow::Result<u64> {
    send_many_in_flight(clients, routes, n, IN_FLIGHT).await
}

/// [`send_many`] with `in_flight` sends at a time.
async fn send_many_in_flight(
    clients: &[&Client],
    routes: &[Routing],
    n: usize,
    in_flight: usize,
) -> anyhow::Result<u64> {
    let text = text();
    let text = &text;
    // Each send is bounded, not the whole: a slow machine takes longer, a stall is named.
    futures_util::stream::iter(0..n)
        .map(|i| {
            let client = clients[i % clients.len()];
            let routing = routes[i % routes.len()].clone();
            // A full DM pair is backpressure the client absorbs (`pair_wait`).
            async move {
                let (_, seq) = bounded("a send", client.send_text(routing, text))
                    .await?
                    .context("publish")?;
                anyhow::Ok(seq)
            }
        })
        .buffer_unordered(in_flight)
        .try_fold(u64::MAX, |low, seq| std::future::ready(Ok(low.min(seq))))
        .await
}

/// `n` raw JetStream publishes of `payload` on `subject`, each with its own `Nats-Msg-Id` (as
/// cotald sends them), `in_flight` at a time, acks awaited. With `spread`, the subject gets a
/// suffix `_<run>_<k>` that changes every half DM pair bound: a raw reader has nobody trimming
/// what it read, and the operator may name any sender.
async fn raw_publish(
    js: &jetstream::Context,
    subject: &str,
    payload: &bytes::Bytes,
    n: usize,
    in_flight: usize,
    spread: bool,
) -> anyhow::Result<()> {
    let per_subject = (crate::binding::streams::DM_MAX_MSGS_PER_PAIR / 2) as usize;
    let prefix = crate::protocol::new_message_id().replace('-', "");
    let prefix = &prefix;
    futures_util::stream::iter(0..n)
        .map(|i| {
            let message = PublishMessage::build()
                .payload(payload.clone())
                .message_id(format!("{prefix}.{i}"));
            let subject = match spread {
                true => format!("{subject}_{prefix}_{}", i / per_subject),
                false => subject.to_owned(),
            };
            async move {
                let publish = async { js.send_publish(subject, message).await?.await };
                bounded("a raw publish", publish)
                    .await?
                    .context("raw publish")?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(in_flight)
        .try_for_each(|_| std::future::ready(Ok(())))
        .await
}

async fn next(conn: &mut Connection) -> anyhow::Result<Delivery> {
    bounded("a delivery", conn.deliveries.next())
        .await?
        .context("the client closed")
}

/// Clock ticks per second, the unit of [`proc_usage`]'s CPU time.
fn clock_ticks() -> f64 {
    rustix::param::clock_ticks_per_second().max(1) as f64
}

/// Which side of a case a figure is of.
#[derive(Clone, Copy)]
pub(super) enum Side {
    /// Through cotald.
    Cotald,
    /// Raw NATS.
    Baseline,
}

/// The CPU time a case's runs cost the appliance, its broker and the bench process (the
/// clients of both sides run in it), per message, on each side: where the difference between
/// the sides is spent.
pub(super) struct CpuSplit {
    /// The appliance's, the broker's and this process's pids.
    pids: [u32; 3],
    /// The figures' names: cotald's side, the baseline's.
    names: &'static [[&'static str; 3]; 2],
    /// µs per message of each measured run: cotald's side, the baseline's.
    runs: std::sync::Mutex<[Vec<[f64; 3]>; 2]>,
}

impl CpuSplit {
    pub(super) fn of(
        bench: &Bench,
        names: &'static [[&'static str; 3]; 2],
    ) -> anyhow::Result<Self> {
        let state = bench
            .dir
            .read_state()?
            .context("the appliance under test stopped")?;
        Ok(CpuSplit {
            pids: [state.pid, state.broker_pid, std::process::id()],
            names,
            runs: Default::default(),
        })
    }

    /// The CPU seconds used so far by each process.
    pub(super) fn start(&self) -> [f64; 3] {
        self.pids.map(cpu_seconds)
    }

    /// Records a run of `messages` on `side` that began at `before` (a warm-up is not
    /// recorded).
    pub(super) fn record(&self, before: [f64; 3], side: Side, messages: usize, warm: bool) {
        if warm {
            return;
        }
        let now = self.start();
        let per_entry = std::array::from_fn(|i| (now[i] - before[i]) * 1e6 / messages as f64);
        if let Ok(mut runs) = self.runs.lock() {
            runs[side as usize].push(per_entry);
        }
    }

    /// The medians, as the result's extra figures.
    pub(super) fn report(&self, result: &mut CaseResult) {
        let runs = self.runs.lock().map(|r| r.clone()).unwrap_or_default();
        for (side, runs) in runs.iter().enumerate() {
            for (i, name) in self.names[side].iter().enumerate() {
                let median = super::spread(runs.iter().map(|r| r[i]).collect()).1;
                result.extra.insert(name, median);
            }
        }
    }
}

/// CPU seconds used so far by the threads of `pid` that are alive (the scheduler's nanosecond
/// count, finer than [`proc_usage`]'s clock ticks); 0 when unreadable.
pub(super) fn cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let ns: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// (utime + stime in clock ticks, VmRSS in MiB) of `pid`; zeros when unreadable.
fn proc_usage(pid: u32) -> (f64, f64) {
    let cpu = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some(utime + stime)
        })
        .unwrap_or(0.0);
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib / 1024.0)
        })
        .unwrap_or(0.0);
    (cpu, rss)
}
