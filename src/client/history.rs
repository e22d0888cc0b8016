//! A channel's history (§7 replay, §8 the pinned `chathist_<id>` consumer): reading it on
//! demand, backfilling a join up to its watermark, the replay marks of live channels, and
//! closing the gap a reconnect leaves in every joined channel.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::Stream;
use futures_util::StreamExt;

use super::join::DurableState;
use super::{Client, ClientError, nats_err};
use crate::binding::chat_history_consumer;
use crate::protocol::{Channel, ChannelPattern, CotalMessage, resolve};

/// The messages of a history read, each awaited until nothing came for [`HISTORY_IDLE`]. One
/// timer serves the whole read and is moved on only when it fires: a timer set and cleared for
/// every message was about a tenth of what the client spent on a history copy.
pub(super) struct IdleRead {
    messages: pull::Stream,
    idle: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl IdleRead {
    fn new(messages: pull::Stream) -> Self {
        IdleRead {
            messages,
            idle: Box::pin(tokio::time::sleep(HISTORY_IDLE)),
        }
    }

    /// The next message; `None` when the read ended or nothing came for [`HISTORY_IDLE`] of
    /// this wait (the time the caller took over the last message does not count: an
    /// application slow to take what was surfaced does not end the read).
    pub(super) async fn next(
        &mut self,
    ) -> Option<Result<async_nats::jetstream::Message, pull::MessagesError>> {
        let since = tokio::time::Instant::now();
        loop {
            tokio::select! {
                biased;
                next = self.messages.next() => return next,
                () = &mut self.idle => {
                    let quiet_until = since + HISTORY_IDLE;
                    if quiet_until <= tokio::time::Instant::now() {
                        return None;
                    }
                    self.idle.as_mut().reset(quiet_until);
                }
            }
        }
    }
}

/// How many messages one pull of a history read asks for; with [`history_batch_bytes`], so a
/// history of large messages is not held whole in memory. A late joiner reads its history
/// through these pulls, and the broker spends less per message the fewer times its delivery
/// to the reader starts anew (`docs/benchmarks.md`: 256 cost it a microsecond per message more
/// than an ordered consumer's 500).
const HISTORY_BATCH: usize = 4096;
/// At most how many bytes one pull of a history read asks for, as a rule.
const HISTORY_BATCH_BYTES: usize = 8 << 20;

/// The bytes one pull of a history read asks for: [`HISTORY_BATCH_BYTES`], or room for four of
/// the largest messages the broker takes when that is more (a message larger than what a pull
/// asks for is never delivered to it, and would be asked for again, forever).
fn history_batch_bytes(max_payload: usize) -> usize {
    HISTORY_BATCH_BYTES.max(max_payload.saturating_mul(4))
}

/// A history read ends when a pull brings nothing for this long.
pub(super) const HISTORY_IDLE: Duration = Duration::from_secs(2);

/// How far before the drop was noticed a reconnect's gap read starts: messages in flight on
/// a dying connection are lost too, and the broker's clock is not ours.
const GAP_MARGIN: Duration = Duration::from_secs(5);

/// The error of a history read of `subject`, its words written only when it fails (a read
/// passes every message through it).
fn fail<E: Into<super::BoxError>>(subject: &str) -> impl FnOnce(E) -> ClientError + '_ {
    move |e| nats_err(format!("history of {subject}"))(e)
}

/// Closes the live gap of reconnects: when the connection comes back, every joined channel is
/// read from shortly before it dropped ([`Client::recover_gap`]).
pub(crate) fn start_gap_recovery(client: &Client) {
    client.inner.background.spawn(recover_gaps(client.clone()));
}

/// Recovers the gap of each reconnect, until the connection is closed for good.
async fn recover_gaps(client: Client) {
    let mut state = client.state();
    let mut dropped_at = None;
    // Told only of changes: up again means it was down meanwhile. A drop this task was not
    // told of apart (it came back at once) happened after it last looked.
    let mut looked_at = time::OffsetDateTime::now_utc();
    while state.changed().await.is_ok() {
        let now = *state.borrow_and_update();
        let seen = time::OffsetDateTime::now_utc();
        match now {
            super::ConnectionState::Reconnecting => {
                dropped_at.get_or_insert(seen);
            }
            super::ConnectionState::Connected => {
                let at = dropped_at.take().unwrap_or(looked_at);
                client.recover_gap(at - GAP_MARGIN).await;
            }
            super::ConnectionState::Disconnected => return,
        }
        looked_at = seen;
    }
}

impl Client {
    /// Up to `limit` of the most recent messages of `channel`, oldest first, our own included:
    /// read through the pinned `chathist_<id>` consumer (so only within the read ACL, §9) and
    /// within the channel's replay window. A channel whose effective `replay` is false has no
    /// readable history (§7): [`ClientError::HistoryClosed`].
    pub async fn history(
        &self,
        channel: &Channel,
        limit: usize,
    ) -> Result<Vec<CotalMessage>, ClientError> {
        let pattern = ChannelPattern::new(channel.as_str())?;
        let effective = self.effective_config(&pattern).await?;
        if !effective.replay {
            return Err(ClientError::HistoryClosed {
                channel: channel.as_str().to_owned(),
            });
        }
        let start = |_frontier: u64| match &effective.replay_window {
            Some(window) => DeliverPolicy::ByStartTime {
                start_time: time::OffsetDateTime::now_utc() - window.duration(),
            },
            None => DeliverPolicy::All,
        };
        self.read_history(&pattern, limit, start).await
    }

    /// Up to `limit` of the most recent messages of every channel the credential reads, oldest
    /// first, leaving out the channels whose effective `replay` is false or whose replay window
    /// they are older than (§7): what an observer shows of the space's past when it opens.
    /// Read from the last `limit` entries of CHAT (every CHAT subject is a channel message).
    pub async fn recent(&self, limit: usize) -> Result<Vec<CotalMessage>, ClientError> {
        let every = ChannelPattern::new(">")?;
        let start = |frontier: u64| DeliverPolicy::ByStartSequence {
            start_sequence: frontier.saturating_sub(limit as u64) + 1,
        };
        let messages = self.read_history(&every, limit, start).await?;
        let registry = self.channel_registry().await?;
        let now = time::OffsetDateTime::now_utc();
        Ok(messages
            .into_iter()
            .filter(|m| {
                let crate::protocol::Routing::Channel(channel) = &m.routing else {
                    return false;
                };
                let effective = resolve(registry.channels.get(channel), registry.defaults.as_ref());
                let sent = m
                    .ts
                    .as_u64()
                    .and_then(|ms| {
                        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
                            .ok()
                    })
                    .unwrap_or(now);
                effective.replay
                    && effective
                        .replay_window
                        .as_ref()
                        .is_none_or(|w| now - w.duration() <= sent)
            })
            .collect())
    }

    /// The pinned single-filter `chathist_<id>` consumer (§8), made afresh to read `subject`
    /// from where `deliver_policy` says; with the stream it reads and its name. The caller holds
    /// the history lock (one history read at a time: they share the consumer). One round trip
    /// before the first pull as a rule: the stream is named, not looked up, and a consumer left
    /// behind by an interrupted read is deleted, and the consumer made again, only when the
    /// create is refused or hands back that one.
    async fn history_consumer(
        &self,
        subject: &str,
        deliver_policy: DeliverPolicy,
    ) -> Result<(Stream<()>, String, PullConsumer), ClientError> {
        let stream = self
            .inner
            .js
            .get_stream_no_info(self.inner.names.chat_stream())
            .await
            .map_err(fail(subject))?;
        let name = chat_history_consumer(self.inner.id.as_str());
        let config = pull::Config {
            name: Some(name.clone()),
            filter_subject: subject.to_owned(),
            ack_policy: AckPolicy::None,
            deliver_policy,
            memory_storage: true,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        };
        // A create may also update the one left behind in place (same start, another filter),
        // keeping its position and the pull requests it was waiting on: one that delivered
        // anything, or holds a request the next messages would go to, is not a fresh read.
        match stream.create_consumer(config.clone()).await {
            Ok(consumer) => {
                let info = consumer.cached_info();
                if info.delivered.consumer_sequence == 0 && info.num_waiting == 0 {
                    return Ok((stream, name, consumer));
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "history consumer refused; deleting the one left behind");
            }
        }
        let _ = stream.delete_consumer(&name).await;
        let consumer = stream
            .create_consumer(config)
            .await
            .map_err(fail(subject))?;
        Ok((stream, name, consumer))
    }

    /// The pinned history consumer made for `subject` from `deliver_policy` (as
    /// [`Client::history_consumer`]) and its messages, pulled pipelined (the next batch is asked
    /// for while this one is surfaced); with the stream, the consumer's name and how many
    /// messages it held when made.
    pub(super) async fn history_messages(
        &self,
        subject: &str,
        deliver_policy: DeliverPolicy,
    ) -> Result<(Stream<()>, String, u64, IdleRead), ClientError> {
        let (stream, name, consumer) = self.history_consumer(subject, deliver_policy).await?;
        let pending = consumer.cached_info().num_pending;
        let max_payload = self.inner.nats.server_info().max_payload;
        let messages = consumer
            .stream()
            .max_messages_per_batch(HISTORY_BATCH)
            .max_bytes_per_batch(history_batch_bytes(max_payload))
            .messages()
            .await
            .map_err(fail(subject))?;
        Ok((stream, name, pending, IdleRead::new(messages)))
    }

    /// Reads up to the last `limit` messages matching `pattern` through the pinned
    /// `chathist_<id>` consumer, starting where `start(frontier)` says.
    async fn read_history(
        &self,
        pattern: &ChannelPattern,
        limit: usize,
        start: impl FnOnce(u64) -> DeliverPolicy,
    ) -> Result<Vec<CotalMessage>, ClientError> {
        let subject = self.inner.subjects.chat_subscription(pattern);
        let _one_at_a_time = self.inner.history.lock().await;
        let frontier = self.chat_frontier().await?;
        let mut kept = std::collections::VecDeque::with_capacity(limit.min(HISTORY_BATCH));
        if frontier == 0 || limit == 0 {
            return Ok(Vec::new());
        }
        let (stream, name, mut pending, mut messages) =
            self.history_messages(&subject, start(frontier)).await?;
        let max_payload = self.inner.nats.server_info().max_payload;
        while pending > 0 {
            let Some(msg) = messages.next().await else {
                break;
            };
            let msg = msg.map_err(fail(&subject))?;
            let Ok(info) = msg.info() else { continue };
            if info.stream_sequence > frontier {
                break;
            }
            pending = info.pending;
            // What fails the receive checks is not shown, as it would not be delivered.
            if let Ok(accepted) = crate::binding::frame::accept_delivery(
                msg.subject.as_str(),
                msg.headers.as_ref(),
                msg.status,
                &msg.payload,
                max_payload,
            ) && accepted.kind == crate::protocol::DeliveryKind::Channel
            {
                if kept.len() == limit {
                    kept.pop_front();
                }
                kept.push_back(accepted.message);
            }
        }
        drop(messages);
        let _ = stream.delete_consumer(&name).await;
        Ok(kept.into())
    }

    /// Reads the channel's history from `start` up to `watermark` through the pinned
    /// single-filter `chathist_<id>` consumer (§8); surfaces what is at or below `historical`
    /// with `historical = true`. One history read runs at a time (they share the consumer).
    pub(super) async fn backfill(
        &self,
        subject: &str,
        watermark: u64,
        deliver_policy: DeliverPolicy,
        historical: u64,
        read_to: u64,
    ) -> Result<usize, ClientError> {
        let _one_at_a_time = self.inner.history.lock().await;
        // Read to the watermark, then once more to the frontier as it is then: a message routed
        // just before our SUB became active may be stored just after the watermark was read.
        // Later messages reach the live subscription; dedup by `id` absorbs any overlap. A pull
        // that brings nothing for [`HISTORY_IDLE`] ends the read, as the frontier said it would.
        let (stream, name, mut pending, mut messages) =
            self.history_messages(subject, deliver_policy).await?;
        let mut surfaced = 0;
        let mut target = watermark;
        let mut extended = false;
        loop {
            if pending == 0 {
                if extended {
                    break;
                }
                extended = true;
                let now = self.chat_frontier().await?;
                if now <= target {
                    break;
                }
                target = now;
                pending = stream
                    .consumer_info(&name)
                    .await
                    .map_err(fail(subject))?
                    .num_pending;
                if pending == 0 {
                    break;
                }
            }
            let Some(msg) = messages.next().await else {
                break;
            };
            let msg = msg.map_err(fail(subject))?;
            let Ok(info) = msg.info() else { continue };
            let (seq, left) = (info.stream_sequence, info.pending);
            if seq <= read_to {
                pending = left;
                continue;
            }
            if seq > target {
                if extended {
                    break;
                }
                extended = true;
                target = self.chat_frontier().await?;
                if seq > target {
                    break;
                }
            }
            if self
                .inner
                .out
                .channel_copy(&msg.message, seq <= historical)
                .await
            {
                surfaced += 1;
            }
            pending = left;
        }
        drop(messages);
        let _ = stream.delete_consumer(&name).await;
        Ok(surfaced)
    }

    /// This identity's replay mark of `channel` (0 when it has none, or it cannot be read:
    /// the replay is then as configured).
    pub(super) async fn replay_mark(&self, channel: &str) -> u64 {
        match self
            .manager::<std::collections::BTreeMap<String, u64>>(&crate::ops::Request::ReplayMarks)
            .await
        {
            Ok(marks) => marks.get(channel).copied().unwrap_or(0),
            Err(e) => {
                tracing::debug!(channel, error = %e, "replay mark not read; replaying as configured");
                0
            }
        }
    }

    /// Tells the appliance that everything surfaced so far on the joined `live` channels that
    /// replay has been read (the caller has handled all it was given): their next session's
    /// replay starts after the CHAT frontier of now. A message stored just before and not
    /// surfaced yet is then not replayed; a `live` channel promises no more (§4).
    pub async fn mark_read(&self) -> Result<(), ClientError> {
        let channels: Vec<String> = self
            .inner
            .joined
            .lock()
            .await
            .iter()
            .filter(|(key, j)| {
                j.pump.is_some()
                    && j.replay
                    && matches!(j.durable, DurableState::NotApplicable)
                    && !key.contains(['*', '>'])
            })
            .map(|(key, _)| key.clone())
            .collect();
        if channels.is_empty() {
            return Ok(());
        }
        let frontier = self.chat_frontier().await?;
        let marked = &self.inner.marked;
        if marked.swap(frontier, std::sync::atomic::Ordering::Relaxed) == frontier {
            return Ok(());
        }
        let marks = channels.into_iter().map(|c| (c, frontier)).collect();
        let request = crate::ops::Request::ReplayMark(crate::ops::ReplayMark { marks })
            .to_control(self.endpoint());
        self.notify(crate::binding::MANAGER_SERVICE, &request).await
    }

    /// After a reconnect: reads each joined channel from `since` to the frontier, so that what
    /// was published while the live subscriptions were down is surfaced (deduplicated with
    /// what did arrive). A channel whose history may not be read reports the gap instead.
    pub(crate) async fn recover_gap(&self, since: time::OffsetDateTime) {
        let channels: Vec<(String, String, bool)> = self
            .inner
            .joined
            .lock()
            .await
            .iter()
            .filter(|(_, j)| j.pump.is_some())
            .map(|(k, j)| (k.clone(), j.subject.clone(), j.replay))
            .collect();
        for (channel, subject, replay) in channels {
            if !replay {
                self.inner.out.notice(super::deliver::Notice::Gap {
                    channel,
                    since: since.unix_timestamp(),
                });
                continue;
            }
            let read = async {
                let frontier = self.chat_frontier().await?;
                self.backfill(
                    &subject,
                    frontier,
                    DeliverPolicy::ByStartTime { start_time: since },
                    0,
                    0,
                )
                .await
            };
            match read.await {
                Ok(n) => tracing::debug!(channel, surfaced = n, "reconnect gap read"),
                Err(e) => {
                    tracing::warn!(channel, error = %e, "reconnect gap not read");
                    self.inner.out.notice(super::deliver::Notice::Gap {
                        channel,
                        since: since.unix_timestamp(),
                    });
                }
            }
        }
    }
}
