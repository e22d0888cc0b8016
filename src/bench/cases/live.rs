//! Live channels and the shipped profile's default channel: throughput, one at a time, and
//! latency, against raw core NATS on the same broker.

use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream;
use async_nats::jetstream::message::PublishMessage;
use futures_util::StreamExt;
use serde_json::json;

use super::{
    CpuSplit, IN_FLIGHT, Side, channel, interleaved, names, next, payload, rate, raw_publish,
    send_many_in_flight, set_class, text,
};
use crate::bench::{Bench, Better, CaseResult, Sizes, bounded};
use crate::client::{Connection, Replay};
use crate::protocol::{Channel, Routing};

const CH_LIVE: &str = "bench-live";
const CH_DEFAULT: &str = "bench-default";
const CH_RAW: &str = "bench-raw";

/// Which channel a one-publisher, one-subscriber case runs on.
#[derive(Clone, Copy)]
pub(in crate::bench) struct Flavor {
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

pub(in crate::bench) const LIVE: Flavor = Flavor {
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

pub(super) const DEFAULT_PROFILE: Flavor = Flavor {
    ch: CH_DEFAULT,
    class: None,
    names: [
        "default_profile_throughput",
        "default_profile_latency_p50",
        "default_profile_latency_p99",
        "default_profile_serial",
    ],
    goals: [">= 0.9", "<= 1.1", "<= 2.0", ">= 0.95"],
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
pub(in crate::bench) async fn live_throughput(
    bench: &Bench,
    sizes: Sizes,
    flavor: Flavor,
) -> anyhow::Result<Vec<CaseResult>> {
    let (figures, cpu) = live_rate(bench, sizes.runs, sizes.messages, IN_FLIGHT, flavor).await?;
    let mut result = CaseResult::new(
        flavor.names[0],
        "msg/s",
        Better::Higher,
        figures,
        "JetStream publish with Nats-Msg-Id, acks pipelined -> core subscriber",
        flavor.goals[0],
    );
    cpu.report(&mut result);
    Ok(vec![result])
}

/// One send at a time (each awaited until the stream stored it), as agents talk, until the
/// subscriber surfaced them all.
pub(super) async fn live_serial(
    bench: &Bench,
    sizes: Sizes,
    flavor: Flavor,
) -> anyhow::Result<Vec<CaseResult>> {
    let (figures, cpu) = live_rate(bench, sizes.runs, sizes.samples, 1, flavor).await?;
    let mut result = CaseResult::new(
        flavor.names[3],
        "msg/s",
        Better::Higher,
        figures,
        "JetStream publish with Nats-Msg-Id, one at a time -> core subscriber",
        flavor.goals[3],
    );
    cpu.report(&mut result);
    Ok(vec![result])
}

/// The names of the CPU figures of the rate cases.
const RATE_CPU: [[&str; 3]; 2] = [
    [
        "appliance_us_per_msg",
        "broker_us_per_msg",
        "clients_us_per_msg",
    ],
    [
        "appliance_us_per_msg_raw",
        "broker_us_per_msg_raw",
        "clients_us_per_msg_raw",
    ],
];

/// The rates of `n` sends, `in_flight` at a time, each side until its subscriber has them all;
/// with the CPU each side cost per message.
async fn live_rate(
    bench: &Bench,
    runs: usize,
    n: usize,
    in_flight: usize,
    flavor: Flavor,
) -> anyhow::Result<((Vec<f64>, Vec<f64>), CpuSplit)> {
    let tag = if in_flight == 1 { "serial" } else { "tput" };
    let pair = tokio::sync::Mutex::new(LivePair::new(bench, tag, flavor).await?);
    let route = [Routing::channel(&channel(flavor.ch)?)];
    let cpu = CpuSplit::of(bench, &RATE_CPU)?;
    let figures = interleaved(
        runs,
        |warm| {
            let n = if warm { n / 10 } else { n };
            let (pair, route, cpu) = (&pair, &route, &cpu);
            async move {
                let mut pair = pair.lock().await;
                let LivePair {
                    ch,
                    publisher,
                    subscriber,
                    ..
                } = &mut *pair;
                let senders = [&publisher.client];
                let used = cpu.start();
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
                let took = start.elapsed();
                cpu.record(used, Side::Cotald, n, warm);
                Ok(rate(n, took))
            }
        },
        |warm| {
            let n = if warm { n / 10 } else { n };
            let (pair, cpu) = (&pair, &cpu);
            async move {
                let mut pair = pair.lock().await;
                let LivePair {
                    raw_js,
                    raw_subject,
                    raw_payload,
                    raw_sub,
                    ..
                } = &mut *pair;
                let used = cpu.start();
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
                let took = start.elapsed();
                cpu.record(used, Side::Baseline, n, warm);
                Ok(rate(n, took))
            }
        },
    )
    .await?;
    pair.into_inner().close().await;
    Ok((figures, cpu))
}

pub(in crate::bench) async fn live_latency(
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
