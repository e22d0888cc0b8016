//! The cases of `cotald bench`, each beside its raw async-nats baseline (module doc of
//! [`super`]). Every payload is the JSON of a message as `Client::send` builds it, with a
//! [`TEXT_LEN`]-byte text, so both sides move the same bytes.

use std::collections::HashSet;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream::{self, consumer::pull, message::PublishMessage};
use futures_util::{StreamExt, TryStreamExt};
use serde_json::json;

use super::{Bench, Better, CaseResult, Minted, SPACE, Sizes, bounded, spread};
use crate::binding::SpaceNames;
use crate::client::{Client, Connection, Delivery, DurableState, Replay};
use crate::protocol::{Channel, CotalMessage, DeliveryKind, InstanceId, Part, Routing};
use tokio_util::sync::CancellationToken;

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

// ---------------------------------------------------------------------------------------------
// Live channels.

const CH_LIVE: &str = "bench-live";
const CH_DEFAULT: &str = "bench-default";
const CH_RAW: &str = "bench-raw";

/// Which channel a one-publisher, one-subscriber case runs on.
#[derive(Clone, Copy)]
pub(super) struct Flavor {
    /// The channel.
    ch: &'static str,
    /// Its class, set through the manager; `None`: as the shipped profile makes it (`local`:
    /// durable), the subscriber a durable member online.
    class: Option<&'static str>,
    /// The case's names: throughput, latency p50, latency p99, serial throughput.
    names: [&'static str; 4],
    /// Their goals, in words.
    goals: [&'static str; 4],
}

pub(super) const LIVE: Flavor = Flavor {
    ch: CH_LIVE,
    class: Some("live"),
    names: [
        "live_throughput",
        "live_latency_p50",
        "live_latency_p99",
        "live_serial",
    ],
    goals: [">= 0.9", "<= 1.2", "<= 2.0", ">= 0.9"],
};

const DEFAULT_PROFILE: Flavor = Flavor {
    ch: CH_DEFAULT,
    class: None,
    names: [
        "default_profile_throughput",
        "default_profile_latency_p50",
        "default_profile_latency_p99",
        "default_profile_serial",
    ],
    goals: [">= 0.85", "<= 1.3", "<= 2.0", ">= 0.9"],
};

/// A channel's publisher and subscriber, and the raw pair beside them.
struct LivePair {
    /// The channel.
    ch: &'static str,
    publisher: Connection,
    subscriber: Connection,
    raw_js: jetstream::Context,
    raw_subject: String,
    raw_payload: bytes::Bytes,
    raw_sub: async_nats::Subscriber,
}

impl LivePair {
    async fn new(bench: &Bench, tag: &str, flavor: Flavor) -> anyhow::Result<LivePair> {
        let ch = flavor.ch;
        if let Some(class) = flavor.class {
            set_class(bench, ch, class).await?;
        }
        set_class(bench, CH_RAW, "live").await?;
        let from = bench
            .mint(
                &format!("bench-{tag}-{ch}-pub"),
                json!({"allow_publish": [ch]}),
            )
            .await?;
        let to = bench
            .mint(&format!("bench-{tag}-{ch}-sub"), json!({"subscribe": [ch]}))
            .await?;
        let publisher = bench.sender(&from).await?;
        let subscriber = bench.connect(&to, |_| {}).await?;
        subscriber.client.join(ch, Replay::Off).await?;
        // The raw side: the operator publishes on its own subject of another live channel; a
        // plain core subscription receives.
        let raw_subject = names().post(&bench.operator.id, CH_RAW);
        let raw_payload = payload(&publisher.client, Routing::channel(&channel(CH_RAW)?))?;
        let receiver = bench.raw_as(&bench.operator).await?;
        let raw_sub = receiver.subscribe(raw_subject.clone()).await?;
        receiver.flush().await?;
        Ok(LivePair {
            ch,
            publisher,
            subscriber,
            raw_js: jetstream::new(bench.raw.clone()),
            raw_subject,
            raw_payload,
            raw_sub,
        })
    }

    async fn close(self) {
        self.publisher.client.close().await;
        self.subscriber.client.close().await;
    }
}

/// [`IN_FLIGHT`] sends at a time, until the subscriber surfaced them all.
pub(super) async fn live_throughput(
    bench: &Bench,
    sizes: Sizes,
    flavor: Flavor,
) -> anyhow::Result<Vec<CaseResult>> {
    let figures = live_rate(bench, sizes.runs, sizes.messages, IN_FLIGHT, flavor).await?;
    Ok(vec![CaseResult::new(
        flavor.names[0],
        "msg/s",
        Better::Higher,
        figures,
        "JetStream publish with Nats-Msg-Id, acks pipelined -> core subscriber",
        flavor.goals[0],
    )])
}

/// One send at a time (each awaited until the stream stored it), as agents talk, until the
/// subscriber surfaced them all.
async fn live_serial(
    bench: &Bench,
    sizes: Sizes,
    flavor: Flavor,
) -> anyhow::Result<Vec<CaseResult>> {
    let figures = live_rate(bench, sizes.runs, sizes.samples, 1, flavor).await?;
    Ok(vec![CaseResult::new(
        flavor.names[3],
        "msg/s",
        Better::Higher,
        figures,
        "JetStream publish with Nats-Msg-Id, one at a time -> core subscriber",
        flavor.goals[3],
    )])
}

/// The rates of `n` sends, `in_flight` at a time, each side until its subscriber has them all.
async fn live_rate(
    bench: &Bench,
    runs: usize,
    n: usize,
    in_flight: usize,
    flavor: Flavor,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let tag = if in_flight == 1 { "serial" } else { "tput" };
    let pair = tokio::sync::Mutex::new(LivePair::new(bench, tag, flavor).await?);
    let route = [Routing::channel(&channel(flavor.ch)?)];
    let figures = interleaved(
        runs,
        |warm| {
            let n = if warm { n / 10 } else { n };
            let pair = &pair;
            let route = &route;
            async move {
                let mut pair = pair.lock().await;
                let LivePair {
                    ch,
                    publisher,
                    subscriber,
                    ..
                } = &mut *pair;
                let senders = [&publisher.client];
                let start = Instant::now();
                let sending = send_many_in_flight(&senders, route, n, in_flight);
                let receiving = async {
                    let mut got = 0;
                    while got < n {
                        let d = next(subscriber).await?;
                        if d.channel.as_deref() == Some(*ch) {
                            got += 1;
                        }
                        d.ack().await?;
                    }
                    anyhow::Ok(())
                };
                // Either side failing ends the measurement with its error (the other is not awaited).
                tokio::try_join!(sending, receiving)?;
                Ok(rate(n, start.elapsed()))
            }
        },
        |warm| {
            let n = if warm { n / 10 } else { n };
            let pair = &pair;
            async move {
                let mut pair = pair.lock().await;
                let LivePair {
                    raw_js,
                    raw_subject,
                    raw_payload,
                    raw_sub,
                    ..
                } = &mut *pair;
                let start = Instant::now();
                let sending = raw_publish(raw_js, raw_subject, raw_payload, n, in_flight, false);
                let receiving = async {
                    for _ in 0..n {
                        bounded("a raw message", raw_sub.next())
                            .await?
                            .context("raw subscription closed")?;
                    }
                    anyhow::Ok(())
                };
                // Either side failing ends the measurement with its error (the other is not awaited).
                tokio::try_join!(sending, receiving)?;
                Ok(rate(n, start.elapsed()))
            }
        },
    )
    .await?;
    pair.into_inner().close().await;
    Ok(figures)
}

pub(super) async fn live_latency(
    bench: &Bench,
    sizes: Sizes,
    flavor: Flavor,
) -> anyhow::Result<Vec<CaseResult>> {
    let samples = sizes.samples;
    let pair = tokio::sync::Mutex::new(LivePair::new(bench, "lat", flavor).await?);
    let ch = channel(flavor.ch)?;
    // Each repetition yields (p50, p99) in µs; the two results share the repetitions.
    let cotald_runs = std::cell::RefCell::new(Vec::new());
    let raw_runs = std::cell::RefCell::new(Vec::new());
    interleaved(
        sizes.runs,
        |warm| {
            let (pair, ch, out) = (&pair, &ch, &cotald_runs);
            async move {
                let n = if warm { samples / 10 } else { samples };
                let lat = cotald_latencies(&mut *pair.lock().await, ch, n).await?;
                if !warm {
                    out.borrow_mut().push(percentiles(lat));
                }
                Ok(0.0)
            }
        },
        |warm| {
            let (pair, out) = (&pair, &raw_runs);
            async move {
                let n = if warm { samples / 10 } else { samples };
                let lat = raw_latencies(&mut *pair.lock().await, n).await?;
                if !warm {
                    out.borrow_mut().push(percentiles(lat));
                }
                Ok(0.0)
            }
        },
    )
    .await?;
    pair.into_inner().close().await;
    let (c, r) = (cotald_runs.into_inner(), raw_runs.into_inner());
    let pick = |runs: &[(f64, f64)], p99: bool| -> Vec<f64> {
        runs.iter().map(|&(a, b)| if p99 { b } else { a }).collect()
    };
    let baseline = "JetStream publish with Nats-Msg-Id -> core subscriber, one at a time";
    Ok(vec![
        CaseResult::new(
            flavor.names[1],
            "µs",
            Better::Lower,
            (pick(&c, false), pick(&r, false)),
            baseline,
            flavor.goals[1],
        ),
        CaseResult::new(
            flavor.names[2],
            "µs",
            Better::Lower,
            (pick(&c, true), pick(&r, true)),
            baseline,
            flavor.goals[2],
        ),
    ])
}

/// `n` messages one at a time through cotald's client: publish to surfaced (and acked).
async fn cotald_latencies(
    pair: &mut LivePair,
    ch: &Channel,
    n: usize,
) -> anyhow::Result<Vec<Duration>> {
    let LivePair {
        publisher,
        subscriber,
        ..
    } = pair;
    let mut lat = Vec::with_capacity(n);
    let text = text();
    for _ in 0..n {
        let start = Instant::now();
        let send = publisher.client.send_text(Routing::channel(ch), &text);
        let surfaced = async {
            let d = next(subscriber).await?;
            let took = start.elapsed();
            d.ack().await?;
            anyhow::Ok(took)
        };
        let (sent, surfaced) = tokio::join!(send, surfaced);
        sent?;
        lat.push(surfaced?);
    }
    Ok(lat)
}

/// `n` messages one at a time, raw: JetStream publish with a message id to core delivery.
async fn raw_latencies(pair: &mut LivePair, n: usize) -> anyhow::Result<Vec<Duration>> {
    let LivePair {
        raw_js,
        raw_subject,
        raw_payload,
        raw_sub,
        ..
    } = pair;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        let message = PublishMessage::build()
            .payload(raw_payload.clone())
            .message_id(format!("{}.{i}", crate::protocol::new_message_id()));
        let send = async {
            raw_js
                .send_publish(raw_subject.clone(), message)
                .await?
                .await?;
            anyhow::Ok(())
        };
        let surfaced = async {
            bounded("a raw message", raw_sub.next())
                .await?
                .context("raw subscription closed")?;
            anyhow::Ok(start.elapsed())
        };
        let (sent, surfaced) = tokio::join!(send, surfaced);
        sent?;
        lat.push(surfaced?);
    }
    Ok(lat)
}

/// p50 and p99 in µs.
fn percentiles(mut lat: Vec<Duration>) -> (f64, f64) {
    lat.sort();
    let at = |q: f64| {
        let i = ((lat.len() as f64 * q).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i].as_secs_f64() * 1e6
    };
    (at(0.50), at(0.99))
}

// ---------------------------------------------------------------------------------------------
// Direct messages.

/// `dm_throughput`: DMs in windows the pair's bound never fills.
const DM_THROUGHPUT: DmPace = DmPace {
    name: "dm_throughput",
    tag: "dm",
    baseline_is: "JetStream publish -> pull consumer, each message acked; both sides 64 in flight, 400 per window",
    goal: ">= 0.8",
    in_flight: DM_IN_FLIGHT,
    window: DM_WINDOW,
};

/// `dm_pipelined_100k`: DMs pipelined with no window to a reader that keeps up; the client
/// absorbs the pair's bound as backpressure, so every send is accepted (a refused one fails
/// the case).
const DM_PIPELINED: DmPace = DmPace {
    name: "dm_pipelined_100k",
    tag: "dmp",
    baseline_is: "JetStream publish -> pull consumer, each message acked; 256 in flight, no window (subjects spread: nothing refuses a raw sender)",
    goal: "0 refused",
    in_flight: IN_FLIGHT,
    window: usize::MAX,
};

/// A DM case: `n` DMs to a reader that acks each, through cotald and raw, paced as `pace`.
async fn dm_case(
    bench: &Bench,
    runs: usize,
    n: usize,
    pace: DmPace,
) -> anyhow::Result<Vec<CaseResult>> {
    let tag = pace.tag;
    let from = bench.mint(&format!("bench-{tag}-from"), json!({})).await?;
    let to = bench.mint(&format!("bench-{tag}-to"), json!({})).await?;
    let raw_target = bench.mint(&format!("bench-{tag}-raw"), json!({})).await?;
    let sender = bench.sender(&from).await?;
    let receiver =
        tokio::sync::Mutex::new(bench.connect(&to, |o| o.receive_backstop = false).await?);
    let route = [Routing::to(&InstanceId::from_user_nkey(&to.id)?)];
    let raw_js = jetstream::new(bench.raw.clone());
    let raw_subject = names().dm(&raw_target.id, &bench.operator.id);
    let raw_payload = payload(
        &sender.client,
        Routing::to(&InstanceId::from_user_nkey(&raw_target.id)?),
    )?;
    let figures = interleaved(
        runs,
        |warm| {
            let n = if warm { n / 10 } else { n };
            let (sender, receiver, route) = (&sender, &receiver, &route);
            async move {
                let mut receiver = receiver.lock().await;
                let senders = [&sender.client];
                let start = Instant::now();
                for chunk in windows(n, pace.window) {
                    let sending = send_many_in_flight(&senders, route, chunk, pace.in_flight);
                    let receiving = async {
                        let mut got = 0;
                        while got < chunk {
                            let d = next(&mut receiver).await?;
                            if d.kind == DeliveryKind::Dm {
                                got += 1;
                            }
                            d.ack().await?;
                        }
                        anyhow::Ok(())
                    };
                    // Either side failing ends the measurement with its error (the other is not awaited).
                    tokio::try_join!(sending, receiving)?;
                }
                Ok(rate(n, start.elapsed()))
            }
        },
        |warm| {
            let n = if warm { n / 10 } else { n };
            let raw = RawDms {
                js: &raw_js,
                subject: &raw_subject,
                payload: &raw_payload,
                filter: names().dms_to(&raw_target.id),
            };
            async move { raw.run(n, pace).await }
        },
    )
    .await?;
    sender.client.close().await;
    receiver.into_inner().client.close().await;
    Ok(vec![CaseResult::new(
        pace.name,
        "msg/s",
        Better::Higher,
        figures,
        pace.baseline_is,
        pace.goal,
    )])
}

/// The raw side of a DM case: the operator publishes to a target of its own, a pull consumer
/// of that target reads and acks.
struct RawDms<'a> {
    js: &'a jetstream::Context,
    subject: &'a str,
    payload: &'a bytes::Bytes,
    filter: String,
}

impl RawDms<'_> {
    /// `n` DMs paced as `pace`; the rate until the last is read and acked.
    async fn run(self, n: usize, pace: DmPace) -> anyhow::Result<f64> {
        // A fresh consumer from the next message on: the earlier runs are not read.
        let stream = self.js.get_stream(names().dm_stream()).await?;
        let name = format!("bench_dm_{}", crate::protocol::new_message_id());
        let consumer = stream
            .create_consumer(pull::Config {
                name: Some(name.clone()),
                filter_subject: self.filter,
                deliver_policy: jetstream::consumer::DeliverPolicy::New,
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                inactive_threshold: Duration::from_secs(60),
                ..Default::default()
            })
            .await?;
        let start = Instant::now();
        let mut messages = consumer.messages().await?;
        for chunk in windows(n, pace.window) {
            let sending = raw_publish(
                self.js,
                self.subject,
                self.payload,
                chunk,
                pace.in_flight,
                true,
            );
            let receiving = async {
                for _ in 0..chunk {
                    let msg = bounded("a raw DM", messages.next())
                        .await?
                        .context("raw consumer closed")?
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    msg.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
                }
                anyhow::Ok(())
            };
            // Either side failing ends the measurement with its error (the other is not awaited).
            tokio::try_join!(sending, receiving)?;
        }
        let elapsed = start.elapsed();
        let _ = stream.delete_consumer(&name).await;
        Ok(rate(n, elapsed))
    }
}

// ---------------------------------------------------------------------------------------------
// Durable channels.

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

async fn durable_publish(bench: &Bench, sizes: Sizes) -> anyhow::Result<Vec<CaseResult>> {
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

async fn catch_up(bench: &Bench, sizes: Sizes) -> anyhow::Result<Vec<CaseResult>> {
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
    let figures = interleaved(
        sizes.runs,
        |_warm| async {
            away().await?;
            let start = Instant::now();
            let mut conn = bench.connect(&returning, |_| {}).await?;
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
            Ok(rate(backlog, elapsed))
        },
        |_warm| async {
            away().await?;
            let elapsed = raw_catch_up(bench, first.get(), backlog).await?;
            Ok(rate(backlog, elapsed))
        },
    )
    .await?;
    for p in publishers {
        p.client.close().await;
    }
    Ok(vec![CaseResult::new(
        "catchup_10k",
        "msg/s",
        Better::Higher,
        figures,
        "a new connection + pull consumer of the same range, fetch 256 + ack",
        ">= 0.8",
    )])
}

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
async fn replay(bench: &Bench, sizes: Sizes) -> anyhow::Result<Vec<CaseResult>> {
    let backlog = sizes.backlog;
    set_class(bench, CH_REPLAY, "live").await?;
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
    let joiner = bench
        .mint("bench-joiner", json!({"subscribe": [CH_REPLAY]}))
        .await?;
    let figures = interleaved(
        sizes.runs,
        |_warm| async {
            // A new connection each run: its dedup window has seen none of the history.
            let mut conn = bench.sender(&joiner).await?;
            let client = conn.client.clone();
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
            let (report, surfaced) =
                bounded("replay", async { tokio::join!(join, surface) }).await?;
            surfaced?;
            if report?.backfilled < backlog {
                bail!("the join backfilled fewer than {backlog}");
            }
            let elapsed = start.elapsed();
            conn.client.close().await;
            Ok(rate(backlog, elapsed))
        },
        |_warm| async {
            let nats = bench.raw_as(&bench.operator).await?;
            let js = jetstream::new(nats.clone());
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
            drop(messages);
            let _ = tokio::time::timeout(Duration::from_secs(5), nats.drain()).await;
            Ok(rate(backlog, elapsed))
        },
    )
    .await?;
    Ok(vec![CaseResult::new(
        "replay_10k",
        "msg/s",
        Better::Higher,
        figures,
        "an ordered consumer of the same range on an open connection",
        ">= 0.8",
    )])
}

const CH_E2E_DURABLE: &str = "bench-e2e-durable";
const CH_E2E_LIVE: &str = "bench-e2e-live";

/// Publisher to an online member on a durable channel (live copy and durable copy, deduped,
/// the durable one acked) vs the same on a live channel.
async fn durable_end_to_end(bench: &Bench, sizes: Sizes) -> anyhow::Result<Vec<CaseResult>> {
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
async fn backstop_consumers(
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

/// N members online on a durable channel against the same N on a live one, for N in
/// [`FAN_MEMBERS`]: one sender posts [`Sizes::samples`]/10 messages one at a time (as agents
/// talk); the time until every member surfaced every message (on the durable side also until
/// every durable copy or offer is acknowledged), as msg/s, and the appliance's CPU per message
/// per online member on each side.
async fn durable_fanout(bench: &Bench, sizes: Sizes) -> anyhow::Result<Vec<CaseResult>> {
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
        let cpu_us = std::sync::Mutex::new([Vec::new(), Vec::new()]);
        let fan = |ch: &'static str, warm: bool| {
            let (sender, surfaced, cpu_us, clients) = (&sender, &surfaced, &cpu_us, &clients);
            async move {
                let n = if warm { n / 4 } else { n };
                let route = Routing::channel(&channel(ch)?);
                let target =
                    surfaced.of(ch).load(std::sync::atomic::Ordering::Acquire) + n * online;
                let before = proc_usage(appliance).0;
                let start = Instant::now();
                for _ in 0..n {
                    bounded("publish", sender.client.send_text(route.clone(), &text())).await??;
                }
                bounded("every member to surface", surfaced.reach(ch, target)).await?;
                let took = start.elapsed();
                if ch == CH_FAN_DURABLE {
                    bounded(
                        "every durable copy acknowledged",
                        acknowledged(bench, clients),
                    )
                    .await??;
                }
                let cpu = (proc_usage(appliance).0 - before) / clock_ticks();
                if !warm && let Ok(mut cpu_us) = cpu_us.lock() {
                    let side = usize::from(ch == CH_FAN_LIVE);
                    cpu_us[side].push(cpu * 1e6 / (n * online) as f64);
                }
                Ok(rate(n, took))
            }
        };
        let figures = interleaved(
            sizes.runs,
            |warm| fan(CH_FAN_DURABLE, warm),
            |warm| fan(CH_FAN_LIVE, warm),
        )
        .await?;
        let name = match online {
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
        let [durable_cpu, live_cpu] = cpu_us.into_inner().unwrap_or_default();
        result
            .extra
            .insert("appliance_us_per_msg_per_member", spread(durable_cpu).1);
        result
            .extra
            .insert("appliance_us_per_msg_per_member_live", spread(live_cpu).1);
        result.extra.insert("messages", n as f64);
        results.push(result);
    }
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    sender.client.close().await;
    Ok(results)
}

// ---------------------------------------------------------------------------------------------
// Presence at scale.

/// [`Sizes::instances`] simulated instances heartbeat every 2 s (§6) into the space's presence
/// directory, written raw by the operator (one KV put each, as a client's heartbeat is), while a
/// cotald client watches the roster: the time until its roster shows all of them online, then,
/// over [`Sizes::hold`], how often one of them was shown offline while it was beating (a false
/// offline: the goal is none), and the CPU and memory of cotald and its broker meanwhile.
async fn presence_converge(bench: &Bench, sizes: Sizes) -> anyhow::Result<Vec<CaseResult>> {
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

// ---------------------------------------------------------------------------------------------
// A space of a thousand.

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
async fn space(bench: &Bench, sizes: Sizes) -> anyhow::Result<Vec<CaseResult>> {
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
    let started = Instant::now();
    let (clients, raws) = space_online(bench, &minted, frontier, &stop).await?;
    let connected = started.elapsed().as_secs_f64() * 1e3;
    let ids: Vec<&str> = minted.iter().map(|m| m.id.as_str()).collect();
    let online = |roster: &crate::client::Roster| online(roster, &ids);
    all_online(&roster, &ids).await?;
    let took = started.elapsed().as_secs_f64() * 1e3;
    let pids = [state.pid, state.broker_pid];
    let (false_offlines, used) = hold(sizes.hold, pids, || ids.len() - online(&roster)).await;
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
        "one liveness window (§6): the goal, not a measurement",
        "roster <= 6 s, 0 false offline, appliance RSS <= 300 MiB",
    );
    result.extra.insert("instances", ids.len() as f64);
    result.extra.insert("connected_ms", connected);
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

/// Clock ticks per second, the unit of [`proc_usage`]'s CPU time.
fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64
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

// ---------------------------------------------------------------------------------------------
// Startup.

/// `cotald up` to ready, cold (a new data dir) and warm (the same one again), against the
/// bundled nats-server alone started on the config cotald rendered, to `/healthz` 200.
pub(super) async fn startup(
    exe: &Path,
    tmp: &Path,
    sizes: Sizes,
) -> anyhow::Result<Vec<CaseResult>> {
    let exe = exe.to_owned();
    let tmp = tmp.to_owned();
    tokio::task::spawn_blocking(move || {
        let (mut cold, mut warm, mut alone) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..sizes.runs {
            let dir = tmp.join(format!("startup{i}"));
            cold.push(startup::time_up(&exe, &dir)?);
            warm.push(startup::time_up(&exe, &dir)?);
            alone.push(startup::time_broker_alone(&dir)?);
        }
        let baseline = "nats-server alone on the config cotald rendered, to /healthz 200";
        anyhow::Ok(vec![
            CaseResult::new(
                "startup_cold",
                "ms",
                Better::Lower,
                (cold, alone.clone()),
                baseline,
                "as low as it goes",
            ),
            CaseResult::new(
                "startup_warm",
                "ms",
                Better::Lower,
                (warm, alone),
                baseline,
                "as low as it goes",
            ),
        ])
    })
    .await?
}

mod startup {
    use std::io::{BufRead, BufReader};
    use std::net::{SocketAddr, TcpStream};
    use std::path::Path;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use anyhow::{Context, bail};

    const TIMEOUT: Duration = Duration::from_secs(60);

    /// Spawns `cotald up`, waits for its ready line, stops it; the time to ready in ms.
    pub(super) fn time_up(exe: &Path, dir: &Path) -> anyhow::Result<f64> {
        let start = Instant::now();
        let mut child = Command::new(exe)
            .args([
                "up",
                "--listen",
                "127.0.0.1:0",
                "--dashboard",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(dir)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().context("stdout")?;
        let ready = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("cotald is ready"));
        let elapsed = start.elapsed();
        // SAFETY: a plain signal to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait()?;
        if !ready {
            bail!("cotald up on {} did not become ready", dir.display());
        }
        Ok(elapsed.as_secs_f64() * 1e3)
    }

    /// Spawns the installed broker of `dir` on the config cotald rendered there, with an HTTP
    /// monitoring port added (cotald asks over the system account instead, which a bare
    /// broker cannot be asked without a client), waits for `/healthz` 200, stops it; the time
    /// in ms.
    pub(super) fn time_broker_alone(dir: &Path) -> anyhow::Result<f64> {
        let broker = std::fs::read_dir(dir.join("bin"))?
            .flatten()
            .map(|e| e.path())
            .find(|p| !p.to_string_lossy().ends_with(".tmp"))
            .context("no installed broker")?;
        let ports_dir = dir.join("run");
        let mut conf = std::fs::read_to_string(dir.join("run/nats-server.conf"))?;
        conf.push_str("http: \"127.0.0.1:-1\"\n");
        let conf_path = dir.join("run/bench-broker.conf");
        std::fs::write(&conf_path, conf)?;
        let start = Instant::now();
        let mut child = Command::new(&broker)
            .arg("-c")
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let suffix = format!("_{}.ports", child.id());
        let result = (|| {
            let monitor = loop {
                if start.elapsed() > TIMEOUT {
                    bail!("nats-server did not write its ports file");
                }
                let found = std::fs::read_dir(&ports_dir)?
                    .flatten()
                    .find(|e| e.file_name().to_string_lossy().ends_with(&suffix));
                if let Some(entry) = found {
                    let ports: serde_json::Value =
                        serde_json::from_slice(&std::fs::read(entry.path())?).unwrap_or_default();
                    if let Some(url) = ports["monitoring"][0].as_str() {
                        let port: u16 = url.rsplit_once(':').context("port")?.1.parse()?;
                        break SocketAddr::from(([127, 0, 0, 1], port));
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            while !healthy(monitor) {
                if start.elapsed() > TIMEOUT {
                    bail!("nats-server never became healthy");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(start.elapsed().as_secs_f64() * 1e3)
        })();
        // SAFETY: a plain signal to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        child.wait()?;
        result
    }

    fn healthy(addr: SocketAddr) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = TcpStream::connect(addr) else {
            return false;
        };
        let _ = s.write_all(b"GET /healthz?js-server-only=true HTTP/1.0\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.starts_with("HTTP/1.1 200") || out.starts_with("HTTP/1.0 200")
    }
}
