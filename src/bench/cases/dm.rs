//! Direct messages: windows the pair's bound never fills, and a pipelined burst the client
//! absorbs as backpressure, against a raw JetStream pull consumer.

use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream;
use async_nats::jetstream::consumer::pull;
use futures_util::StreamExt;
use serde_json::json;

use super::{
    DM_IN_FLIGHT, DM_WINDOW, DmPace, IN_FLIGHT, interleaved, names, next, payload, rate,
    raw_publish, send_many_in_flight, windows,
};
use crate::bench::{Bench, Better, CaseResult, bounded};
use crate::protocol::{DeliveryKind, InstanceId, Routing};

/// `dm_throughput`: DMs in windows the pair's bound never fills.
pub(super) const DM_THROUGHPUT: DmPace = DmPace {
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
pub(super) const DM_PIPELINED: DmPace = DmPace {
    name: "dm_pipelined_100k",
    tag: "dmp",
    baseline_is: "JetStream publish -> pull consumer, each message acked; 256 in flight, no window (subjects spread: nothing refuses a raw sender)",
    goal: "0 refused",
    in_flight: IN_FLIGHT,
    window: usize::MAX,
};

/// A DM case: `n` DMs to a reader that acks each, through cotald and raw, paced as `pace`.
pub(super) async fn dm_case(
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
            let (sender, receiver, route, to, from) = (&sender, &receiver, &route, &to, &from);
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
                    // Either side failing ends the measurement with its error (the other is not
                    // awaited), with what the broker holds of the pair at that moment.
                    if let Err(e) = tokio::try_join!(sending, receiving) {
                        let pair = pair_state(bench, &to.id, &from.id).await;
                        return Err(e.context(pair));
                    }
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

/// What the broker holds of the DM pair `sender` → `target`: the target's reader (`dm_<target>`)
/// and how many of the pair's DMs are stored, to tell a reader that stopped reading from a pair
/// left untrimmed after it was read.
async fn pair_state(bench: &Bench, target: &str, sender: &str) -> String {
    let js = jetstream::new(bench.raw.clone());
    let Ok(stream) = js.get_stream(names().dm_stream()).await else {
        return "the DM stream could not be read".into();
    };
    let reader = match stream
        .consumer_info(crate::binding::dm_durable(target))
        .await
    {
        Ok(info) => format!(
            "the reader's ack floor at stream sequence {}, {} delivered to it unacknowledged, {} \
             not delivered yet, {} pull requests waiting",
            info.ack_floor.stream_sequence,
            info.num_ack_pending,
            info.num_pending,
            info.num_waiting
        ),
        Err(e) => format!("the reader's consumer unreadable ({e})"),
    };
    let subject = names().dm(target, sender);
    let stored: u64 = match stream.info_with_subjects(&subject).await {
        Ok(subjects) => {
            subjects
                .filter_map(|s| async move { s.ok().map(|(_, n)| n as u64) })
                .fold(0, |a, n| async move { a + n })
                .await
        }
        Err(_) => 0,
    };
    let last = stream.cached_info().state.last_sequence;
    format!("{reader}; the pair holds {stored} DMs, DM's last sequence {last}")
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
