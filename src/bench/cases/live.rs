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
const CH_SPLIT_SENDER: &str = "bench-split-sender";
const CH_SPLIT_MEMBER: &str = "bench-split-member";

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
    raw: RawPair,
}

/// The raw side: the operator publishes on its own subject of another live channel; a plain
/// core subscription receives.
struct RawPair {
    js: jetstream::Context,
    subject: String,
    /// A message as cotald's client builds it.
    payload: bytes::Bytes,
    sub: async_nats::Subscriber,
}

impl RawPair {
    /// The pair, its payload a message from `shape`.
    async fn new(bench: &Bench, shape: &crate::client::Client) -> anyhow::Result<RawPair> {
        set_class(bench, CH_RAW, "live").await?;
        let subject = names().post(&bench.operator.id, CH_RAW);
        let payload = payload(shape, Routing::channel(&channel(CH_RAW)?))?;
        let receiver = bench.raw_as(&bench.operator).await?;
        let sub = receiver.subscribe(subject.clone()).await?;
        receiver.flush().await?;
        Ok(RawPair {
            js: jetstream::new(bench.raw.clone()),
            subject,
            payload,
            sub,
        })
    }
}

impl LivePair {
    async fn new(bench: &Bench, tag: &str, flavor: Flavor) -> anyhow::Result<LivePair> {
        let ch = flavor.ch;
        if let Some(class) = flavor.class {
            set_class(bench, ch, class).await?;
        }
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
        let raw = RawPair::new(bench, &publisher.client).await?;
        Ok(LivePair {
            ch,
            publisher,
            subscriber,
            raw,
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
                let RawPair {
                    js,
                    subject,
                    payload,
                    sub,
                } = &mut pair.raw;
                let used = cpu.start();
                let start = Instant::now();
                let sending = raw_publish(js, subject, payload, n, in_flight, false);
                let receiving = async {
                    for _ in 0..n {
                        raw_next(sub).await?;
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
                let mut pair = pair.lock().await;
                let LivePair {
                    publisher,
                    subscriber,
                    ..
                } = &mut *pair;
                let reader = Reader::Member(subscriber);
                let lat = sent_latencies(&publisher.client, ch, reader, n).await?;
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
                let lat = raw_latencies(&mut pair.lock().await.raw, n).await?;
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

/// What has each message of a one-at-a-time run: cotald's member, or a raw core subscriber.
enum Reader<'a> {
    Member(&'a mut Connection),
    Raw(&'a mut async_nats::Subscriber),
}

impl Reader<'_> {
    /// The next message; the member's delivery, to be acknowledged once the clock is read.
    async fn next(&mut self) -> anyhow::Result<Option<crate::client::Delivery>> {
        match self {
            Reader::Member(member) => Ok(Some(next(member).await?)),
            Reader::Raw(sub) => {
                raw_next(sub).await?;
                Ok(None)
            }
        }
    }
}

/// The next message of a raw core subscription.
async fn raw_next(sub: &mut async_nats::Subscriber) -> anyhow::Result<async_nats::Message> {
    bounded("a raw message", sub.next())
        .await?
        .context("raw subscription closed")
}

/// `n` messages sent one at a time by cotald's client `sender` on `ch`, each until `reader`
/// has it.
async fn sent_latencies(
    sender: &crate::client::Client,
    ch: &Channel,
    mut reader: Reader<'_>,
    n: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut lat = Vec::with_capacity(n);
    let text = text();
    for _ in 0..n {
        let start = Instant::now();
        let send = sender.send_text(Routing::channel(ch), &text);
        let surfaced = async {
            let d = reader.next().await?;
            let took = start.elapsed();
            if let Some(d) = d {
                d.ack().await?;
            }
            anyhow::Ok(took)
        };
        let (sent, surfaced) = tokio::join!(send, surfaced);
        sent?;
        lat.push(surfaced?);
    }
    Ok(lat)
}

/// `n` messages one at a time, raw: JetStream publish with a message id to core delivery.
async fn raw_latencies(raw: &mut RawPair, n: usize) -> anyhow::Result<Vec<Duration>> {
    let RawPair {
        js,
        subject,
        payload,
        sub,
    } = raw;
    let made = || Ok(payload.clone());
    raw_js_latencies(js, subject, made, Reader::Raw(sub), n).await
}

/// `n` raw JetStream publishes on `subject` one at a time, each with its own message id and
/// the payload `next_payload` makes (before the clock starts), each until `reader` has it.
async fn raw_js_latencies(
    js: &jetstream::Context,
    subject: &str,
    mut next_payload: impl FnMut() -> anyhow::Result<bytes::Bytes>,
    mut reader: Reader<'_>,
    n: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let payload = next_payload()?;
        let start = Instant::now();
        let message = PublishMessage::build()
            .payload(payload)
            .message_id(format!("{}.{i}", crate::protocol::new_message_id()));
        let send = async {
            js.send_publish(subject.to_owned(), message).await?.await?;
            anyhow::Ok(())
        };
        let surfaced = async {
            let d = reader.next().await?;
            let took = start.elapsed();
            if let Some(d) = d {
                d.ack().await?;
            }
            anyhow::Ok(took)
        };
        let (sent, surfaced) = tokio::join!(send, surfaced);
        sent?;
        lat.push(surfaced?);
    }
    Ok(lat)
}

/// `latency_split`: which half of the one-at-a-time path the latency case's gap lies in.
/// Each arm has a live channel of its own, and one side of the path through cotald's client
/// ([`SenderArm`], [`MemberArm`]). The baseline of both is the latency case's raw pair,
/// measured interleaved with each arm.
pub(in crate::bench) async fn latency_split(
    bench: &Bench,
    sizes: Sizes,
) -> anyhow::Result<Vec<CaseResult>> {
    let sender = tokio::sync::Mutex::new(SenderArm::new(bench).await?);
    let member = tokio::sync::Mutex::new(MemberArm::new(bench).await?);
    let raw =
        tokio::sync::Mutex::new(RawPair::new(bench, &member.lock().await.shape.client).await?);
    let n = |warm: bool| match warm {
        true => sizes.samples / 10,
        false => sizes.samples,
    };
    let baseline = |warm: bool| {
        let raw = &raw;
        async move { Ok(p50(raw_latencies(&mut *raw.lock().await, n(warm)).await?)) }
    };
    let sender_arm = |warm: bool| {
        let sender = &sender;
        async move { sender.lock().await.p50(n(warm)).await }
    };
    let member_arm = |warm: bool| {
        let member = &member;
        async move { member.lock().await.p50(n(warm)).await }
    };
    let sent = interleaved(sizes.runs, sender_arm, baseline).await?;
    let read = interleaved(sizes.runs, member_arm, baseline).await?;
    sender.into_inner().sender.client.close().await;
    member.into_inner().close().await;
    let baseline = "JetStream publish with Nats-Msg-Id -> core subscriber, one at a time";
    Ok(vec![
        CaseResult::new(
            "latency_split_sender_p50",
            "µs",
            Better::Lower,
            sent,
            baseline,
            "none: cotald's sender, a raw reader",
        ),
        CaseResult::new(
            "latency_split_member_p50",
            "µs",
            Better::Lower,
            read,
            baseline,
            "none: a raw publisher, cotald's member",
        ),
    ])
}

/// A live channel `ch` of one arm's own, and the credentials of its publisher and its reader,
/// named `bench-split-<role>`.
async fn arm_channel(
    bench: &Bench,
    ch: &str,
    roles: [&str; 2],
) -> anyhow::Result<[crate::bench::Minted; 2]> {
    set_class(bench, ch, "live").await?;
    let from = json!({"allow_publish": [ch]});
    let from = bench
        .mint(&format!("bench-split-{}", roles[0]), from)
        .await?;
    let to = json!({"subscribe": [ch]});
    let to = bench.mint(&format!("bench-split-{}", roles[1]), to).await?;
    Ok([from, to])
}

/// cotald's sender on a live channel of its own, read by a raw core subscriber with a
/// member's credential and the wildcard subscription a member makes.
struct SenderArm {
    sender: Connection,
    ch: Channel,
    read: async_nats::Subscriber,
}

impl SenderArm {
    async fn new(bench: &Bench) -> anyhow::Result<SenderArm> {
        let [from, to] = arm_channel(bench, CH_SPLIT_SENDER, ["sender", "reader"]).await?;
        let reader = bench.raw_as(&to).await?;
        let read = reader.subscribe(names().posts_on(CH_SPLIT_SENDER)).await?;
        reader.flush().await?;
        Ok(SenderArm {
            sender: bench.sender(&from).await?,
            ch: channel(CH_SPLIT_SENDER)?,
            read,
        })
    }

    /// The p50 of `n` messages one at a time.
    async fn p50(&mut self, n: usize) -> anyhow::Result<f64> {
        let reader = Reader::Raw(&mut self.read);
        Ok(p50(sent_latencies(
            &self.sender.client,
            &self.ch,
            reader,
            n,
        )
        .await?))
    }
}

/// Raw JetStream publishes on a live channel of its own, with a sender's credential, each a
/// new message of the shape cotald's client builds with its own message id; read by cotald's
/// member.
struct MemberArm {
    /// The sender's client, whose messages are built as it would build them.
    shape: Connection,
    publisher: jetstream::Context,
    subject: String,
    member: Connection,
}

impl MemberArm {
    async fn new(bench: &Bench) -> anyhow::Result<MemberArm> {
        let [from, to] = arm_channel(bench, CH_SPLIT_MEMBER, ["publisher", "member"]).await?;
        let member = bench.connect(&to, |_| {}).await?;
        member.client.join(CH_SPLIT_MEMBER, Replay::Off).await?;
        Ok(MemberArm {
            shape: bench.sender(&from).await?,
            publisher: jetstream::new(bench.raw_as(&from).await?),
            subject: names().post(&from.id, CH_SPLIT_MEMBER),
            member,
        })
    }

    /// The p50 of `n` messages one at a time.
    async fn p50(&mut self, n: usize) -> anyhow::Result<f64> {
        let routing = Routing::channel(&channel(CH_SPLIT_MEMBER)?);
        let made = || payload(&self.shape.client, routing.clone());
        let reader = Reader::Member(&mut self.member);
        Ok(p50(raw_js_latencies(
            &self.publisher,
            &self.subject,
            made,
            reader,
            n,
        )
        .await?))
    }

    async fn close(self) {
        self.shape.client.close().await;
        self.member.client.close().await;
    }
}

/// The p50 of `lat` in µs.
fn p50(lat: Vec<Duration>) -> f64 {
    percentiles(lat).0
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
