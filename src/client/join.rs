//! Joining and leaving channels (§7, §12 items 11–14).
//!
//! The order closes the reference implementation's join gap: subscribe first, confirm the
//! subscription with the broker, *then* read the watermark (the CHAT frontier), backfill up to
//! it through the pinned single-filter history consumer, and deduplicate the overlap by `id`.
//! A message published while joining is therefore either live (it reached the confirmed
//! subscription) or at or below the watermark (backfilled): never lost. §7 lists recording the
//! watermark first; this order keeps the same guarantee without the gap (see
//! `spec/CONFORMANCE.md`).
//!
//! A join is effective only once the broker accepted the subscribe. The broker reports a
//! refusal only as an asynchronous permission-violation event; when the credential restricts
//! subscriptions, a trailing subscribe to a subject it surely cannot read (`_INBOX.…`) is a
//! barrier: the server handles a connection's operations in order, so once the barrier's
//! refusal arrives, every earlier refusal has.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use futures_util::StreamExt;
use tokio::sync::broadcast;

use super::{Client, ClientError, nats_err};
use crate::binding::chat_history_consumer;
use crate::protocol::{
    CHANNEL_DEFAULTS_KEY, ChannelConfig, ChannelDefaults, ChannelPattern, DeliveryClass,
    EffectiveChannelConfig, resolve,
};

/// How long a subscribe may wait for the broker's verdict.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
/// History fetch batch size.
const HISTORY_BATCH: usize = 256;

/// Whether a channel's durable backstop holds for this member (§7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurableState {
    /// The channel is `live`: no backstop is due.
    NotApplicable,
    /// Durable membership was recorded by the provisioner: `joined durable`.
    Established,
    /// `joined live` with the durable backstop unestablished, and why (surfaced, never silent).
    Unavailable(String),
}

/// The outcome of a join.
#[derive(Debug, Clone)]
pub struct JoinReport {
    /// The channel (pattern) joined.
    pub channel: String,
    /// The effective config the join used (§7, one resolution for every path).
    pub effective: EffectiveChannelConfig,
    /// The join watermark (CHAT last sequence once the subscription was confirmed).
    pub watermark: u64,
    /// How many history messages were surfaced.
    pub backfilled: usize,
    /// The durable half.
    pub durable: DurableState,
}

impl JoinReport {
    /// `joined durable` only when both halves hold (§7, §12 item 13).
    pub fn summary(&self) -> String {
        match &self.durable {
            DurableState::Established => format!("joined durable {}", self.channel),
            DurableState::NotApplicable => format!("joined live {}", self.channel),
            DurableState::Unavailable(why) => {
                format!(
                    "joined live {} (durable backstop unavailable: {why})",
                    self.channel
                )
            }
        }
    }
}

/// Why a join or leave failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The channel name is not a valid pattern.
    #[error("invalid channel {channel:?}: {reason}")]
    Invalid { channel: String, reason: String },
    /// The broker refused the subscribe: outside this credential's read ACL.
    #[error("join {channel}: refused by the broker (not within this credential's allowSubscribe)")]
    Refused { channel: String },
    /// Not joined (leave).
    #[error("not joined to {0}")]
    NotJoined(String),
    /// Anything else.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Whether history is read on join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// As the channel's effective config says.
    AsConfigured,
    /// Never (noise control, e.g. `tail --no-history`).
    Off,
}

pub(crate) struct Joined {
    task: tokio::task::JoinHandle<()>,
    durable: DurableState,
}

impl Client {
    /// Joins a channel (or a wildcard pattern within the read ACL).
    pub async fn join(&self, channel: &str, replay: Replay) -> Result<JoinReport, JoinError> {
        let pattern = ChannelPattern::new(channel).map_err(|e| JoinError::Invalid {
            channel: channel.to_owned(),
            reason: e.to_string(),
        })?;
        let key = pattern.as_str().to_owned();
        let mut joined = self.inner.joined.lock().await;
        if joined.contains_key(&key) {
            return Err(JoinError::Invalid {
                channel: key,
                reason: "already joined".into(),
            });
        }
        let subject = self.inner.subjects.chat_subscription(&pattern);
        let mut violations = self.inner.violations.subscribe();
        let mut sub = self
            .inner
            .nats
            .subscribe(subject.clone())
            .await
            .map_err(|e| nats_err("subscribe")(e.to_string()))?;
        if !self.confirm(&subject, &mut violations).await? {
            let _ = sub.unsubscribe().await;
            return Err(JoinError::Refused { channel: key });
        }
        let watermark = self.chat_frontier().await?;

        let inner = self.inner.clone();
        let task = tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                inner
                    .out
                    .channel_copy(msg.subject.as_str(), &msg.payload, false)
                    .await;
            }
        });
        let effective = self.effective_config(&pattern).await;
        let backfilled = if replay == Replay::AsConfigured && effective.replay && watermark > 0 {
            self.backfill(&subject, watermark, &effective).await?
        } else {
            0
        };
        let durable = if effective.delivery_class == DeliveryClass::Durable {
            self.durable_join(&key, watermark).await
        } else {
            DurableState::NotApplicable
        };
        joined.insert(
            key.clone(),
            Joined {
                task,
                durable: durable.clone(),
            },
        );
        drop(joined);
        self.watch_late_refusal(key.clone(), subject);
        Ok(JoinReport {
            channel: key,
            effective,
            watermark,
            backfilled,
            durable,
        })
    }

    /// Leaves a channel: unsubscribes, and on a durable channel asks the provisioner to close
    /// the membership (a hard read boundary for the backstop, §7). Leaving the last channel is
    /// fine.
    pub async fn leave(&self, channel: &str) -> Result<(), JoinError> {
        let mut joined = self.inner.joined.lock().await;
        let Some(entry) = joined.get(channel) else {
            return Err(JoinError::NotJoined(channel.to_owned()));
        };
        if entry.durable == DurableState::Established {
            let mut args = serde_json::Map::new();
            args.insert("channel".into(), channel.into());
            let reply = self.manager("durable-leave", args).await?;
            if !reply.ok {
                return Err(ClientError::Nats {
                    action: format!("durable leave of {channel}"),
                    reason: reply.error.unwrap_or_default(),
                }
                .into());
            }
        }
        if let Some(entry) = joined.remove(channel) {
            entry.task.abort();
        }
        Ok(())
    }

    /// The joined channels.
    pub async fn joined(&self) -> Vec<String> {
        self.inner.joined.lock().await.keys().cloned().collect()
    }

    /// Waits for the broker's verdict on the subscribe to `subject`.
    async fn confirm(
        &self,
        subject: &str,
        violations: &mut broadcast::Receiver<super::Violation>,
    ) -> Result<bool, ClientError> {
        if !self.inner.restricted_subscribe {
            // An unrestricted credential cannot be refused; a round trip proves the SUB is live.
            self.inner
                .js
                .query_account()
                .await
                .map_err(|e| nats_err("confirm subscribe")(e.to_string()))?;
            return Ok(true);
        }
        let barrier = format!("_INBOX.cotal-barrier.{}", crate::protocol::new_message_id());
        let barrier_sub = self
            .inner
            .nats
            .subscribe(barrier.clone())
            .await
            .map_err(|e| nats_err("subscribe")(e.to_string()))?;
        let verdict = tokio::time::timeout(CONFIRM_TIMEOUT, async {
            loop {
                match violations.recv().await {
                    Ok(v) if v.verb == "Subscription" && v.subject == subject => return Ok(false),
                    Ok(v) if v.verb == "Subscription" && v.subject == barrier => return Ok(true),
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => {
                        return Err(nats_err("confirm subscribe")("connection closed".into()));
                    }
                }
            }
        })
        .await;
        drop(barrier_sub);
        verdict.map_err(|_| ClientError::Timeout {
            what: format!("the broker's verdict on subscribing to {subject}"),
            timeout: CONFIRM_TIMEOUT,
        })?
    }

    /// A refusal that arrives after the join drops the channel (§7) and is reported.
    fn watch_late_refusal(&self, channel: String, subject: String) {
        let mut violations = self.inner.violations.subscribe();
        let inner = self.inner.clone();
        let task = tokio::spawn(async move {
            loop {
                match violations.recv().await {
                    Ok(v) if v.verb == "Subscription" && v.subject == subject => {
                        if let Some(entry) = inner.joined.lock().await.remove(&channel) {
                            entry.task.abort();
                        }
                        tracing::warn!(channel, "the broker refused a joined channel; dropped");
                        inner
                            .out
                            .notice(super::deliver::Notice::ChannelDropped { channel });
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                    _ => {}
                }
            }
        });
        self.inner.tasks.lock().map(|mut t| t.push(task)).ok();
    }

    /// The CHAT frontier (last stream sequence).
    async fn chat_frontier(&self) -> Result<u64, ClientError> {
        let mut stream = self
            .inner
            .js
            .get_stream(self.inner.names.chat_stream())
            .await
            .map_err(|e| nats_err("read the CHAT frontier")(e.to_string()))?;
        let info = stream
            .info()
            .await
            .map_err(|e| nats_err("read the CHAT frontier")(e.to_string()))?;
        Ok(info.state.last_sequence)
    }

    /// The effective config of a channel (§7): registry value ?? `=defaults` ?? built-in. A
    /// wildcard pattern has no registry key of its own: the defaults apply.
    pub async fn effective_config(&self, pattern: &ChannelPattern) -> EffectiveChannelConfig {
        let kv = match self
            .inner
            .js
            .get_key_value(self.inner.names.channels_bucket())
            .await
        {
            Ok(kv) => kv,
            Err(e) => {
                tracing::warn!(error = %e, "channel registry unreadable; built-in defaults apply");
                return resolve(None, None);
            }
        };
        let read = async |key: &str| match kv.get(key).await {
            Ok(value) => value,
            Err(e) => {
                tracing::warn!(key, error = %e, "channel registry read failed");
                None
            }
        };
        let defaults = read(CHANNEL_DEFAULTS_KEY)
            .await
            .and_then(|b| ChannelDefaults::from_json(&b).ok());
        let channel = if pattern.is_concrete() {
            read(pattern.as_str())
                .await
                .and_then(|b| ChannelConfig::from_json(&b).ok())
        } else {
            None
        };
        resolve(channel.as_ref(), defaults.as_ref())
    }

    /// Reads the channel's history up to `watermark` through the pinned single-filter
    /// `chathist_<id>` consumer (§8), bounded by `replayWindow`; surfaces `historical = true`.
    async fn backfill(
        &self,
        subject: &str,
        watermark: u64,
        effective: &EffectiveChannelConfig,
    ) -> Result<usize, ClientError> {
        let fail = |e: String| nats_err(format!("history of {subject}"))(e);
        let stream = self
            .inner
            .js
            .get_stream(self.inner.names.chat_stream())
            .await
            .map_err(|e| fail(e.to_string()))?;
        let name = chat_history_consumer(self.inner.id.as_str());
        // A consumer left behind by an interrupted read would refuse the new filter.
        let _ = stream.delete_consumer(&name).await;
        let deliver_policy = match &effective.replay_window {
            Some(window) => DeliverPolicy::ByStartTime {
                start_time: time::OffsetDateTime::now_utc() - window.duration(),
            },
            None => DeliverPolicy::All,
        };
        let consumer = stream
            .create_consumer(pull::Config {
                name: Some(name.clone()),
                filter_subject: subject.to_owned(),
                ack_policy: AckPolicy::None,
                deliver_policy,
                memory_storage: true,
                inactive_threshold: Duration::from_secs(30),
                ..Default::default()
            })
            .await
            .map_err(|e| fail(e.to_string()))?;
        let mut surfaced = 0;
        let mut remaining = consumer.cached_info().num_pending;
        'read: while remaining > 0 {
            let mut batch = consumer
                .fetch()
                .max_messages(HISTORY_BATCH)
                .expires(Duration::from_secs(2))
                .messages()
                .await
                .map_err(|e| fail(e.to_string()))?;
            let mut got = 0;
            while let Some(msg) = batch.next().await {
                let msg = msg.map_err(|e| fail(e.to_string()))?;
                got += 1;
                remaining = remaining.saturating_sub(1);
                let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(u64::MAX);
                if seq > watermark {
                    break 'read;
                }
                self.inner
                    .out
                    .channel_copy(msg.subject.as_str(), &msg.payload, true)
                    .await;
                surfaced += 1;
                if seq == watermark {
                    break 'read;
                }
            }
            if got == 0 {
                break;
            }
        }
        let _ = stream.delete_consumer(&name).await;
        Ok(surfaced)
    }

    /// Asks the provisioner for durable membership with the join cursor (§7).
    async fn durable_join(&self, channel: &str, cursor: u64) -> DurableState {
        let mut args = serde_json::Map::new();
        args.insert("channel".into(), channel.into());
        args.insert("cursor".into(), cursor.into());
        match self.manager("durable-join", args).await {
            Ok(reply) if reply.ok => DurableState::Established,
            Ok(reply) => DurableState::Unavailable(
                reply
                    .error
                    .unwrap_or_else(|| "the provisioner refused".into()),
            ),
            Err(e) => DurableState::Unavailable(e.to_string()),
        }
    }
}
