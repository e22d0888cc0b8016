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
//! The backfill, the history reads and the gap a reconnect leaves are in `history`.
//!
//! A join is effective only once the broker accepted the subscribe. The credential's subscribe
//! grants ride in its JWT, which the client holds: a channel they do not cover is refused here,
//! before any SUB is sent (the broker would refuse it the same way, and log a violation for the
//! operator to wonder about). A channel they cover is subscribed, and a round trip after the
//! SUB proves the broker registered it (the server handles a connection's operations in
//! order). A refusal the grants did not foresee still arrives, as an asynchronous
//! permission-violation event: it is looked for when the round trip returns, and later by the
//! late-refusal watch, which drops the channel (§7, §12 item 13).

use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use futures_util::StreamExt;
use tokio::sync::broadcast;

use super::{Client, ClientError, nats_err};
use crate::ops;
use crate::protocol::{
    CHANNEL_DEFAULTS_KEY, ChannelConfig, ChannelDefaults, ChannelPattern, DeliveryClass,
    EffectiveChannelConfig, resolve,
};

/// How long a subscribe may wait for the broker's verdict.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// How many history messages were surfaced (none when a durable member resumed: its
    /// backlog comes from the backstop instead).
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
    #[error("invalid channel {channel:?}")]
    Invalid {
        /// The name given.
        channel: String,
        /// Why it is not a channel.
        #[source]
        source: crate::protocol::ChannelError,
    },
    /// Already joined, or a join of it is under way.
    #[error("already joined (or joining) {0}")]
    AlreadyJoined(String),
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

/// The channel registry as stored (§7).
#[derive(Debug, Clone, Default)]
pub struct ChannelRegistry {
    /// The space defaults (`=defaults`), if set.
    pub defaults: Option<ChannelDefaults>,
    /// Every concrete channel with a config of its own.
    pub channels: std::collections::BTreeMap<String, ChannelConfig>,
}

/// Whether history is read on join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// As the channel's effective config says.
    AsConfigured,
    /// As configured, except that what this identity read before is not replayed again (a new
    /// session of an agent that read it before: `cotald mcp`). A member of a durable channel
    /// it never left resumes: its backlog comes from the backstop after what it acknowledged.
    /// On a `live` channel the history read starts after the identity's replay mark, which
    /// the appliance keeps ([`Client::mark_read`]).
    Resume,
    /// Never (noise control, e.g. `tail --no-history`).
    Off,
}

/// Aborts a task when dropped: a join that fails or is cancelled leaves nothing running.
pub(super) struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl AbortOnDrop {
    fn new(task: tokio::task::JoinHandle<()>) -> Self {
        AbortOnDrop(Some(task))
    }

    /// Lets the task run on (it is finishing by itself).
    fn detach(mut self) {
        self.0.take();
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// A joined channel (or, with no pump yet, a join in progress).
pub(crate) struct Joined {
    pub(super) pump: Option<AbortOnDrop>,
    pub(super) watcher: Option<AbortOnDrop>,
    pub(super) durable: DurableState,
    /// The live subscription's subject.
    pub(super) subject: String,
    /// Whether the channel's history may be read (effective replay, §7).
    pub(super) replay: bool,
}

/// Removes an unfinished join's reservation if the join fails or its future is dropped.
struct Reservation {
    inner: Option<std::sync::Arc<super::Inner>>,
    key: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            let key = std::mem::take(&mut self.key);
            let background = &inner.background;
            let inner = inner.clone();
            background.spawn(async move {
                let mut joined = inner.joined.lock().await;
                if joined.get(&key).is_some_and(|j| j.pump.is_none()) {
                    joined.remove(&key);
                }
            });
        }
    }
}

impl Client {
    /// Joins a channel (or a wildcard pattern within the read ACL). History is surfaced while
    /// this runs: drain [`super::Deliveries`] concurrently.
    pub async fn join(&self, channel: &str, replay: Replay) -> Result<JoinReport, JoinError> {
        let pattern = ChannelPattern::new(channel).map_err(|source| JoinError::Invalid {
            channel: channel.to_owned(),
            source,
        })?;
        let key = pattern.as_str().to_owned();
        let mut reservation = self.reserve(&key).await?;
        let subject = self.inner.subjects.chat_subscription(&pattern);
        let (mut sub, violations, watermark) = self.subscribe_confirmed(&key, &subject).await?;
        let inner = self.inner.clone();
        let pump = AbortOnDrop::new(tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                inner.out.channel_copy(&msg, false).await;
            }
        }));
        let effective = self.effective_config(&pattern).await?;
        // A member coming back to a durable channel it never left resumes: its backlog comes
        // from the backstop after what it acknowledged, so the history it read before is not
        // surfaced again (an agent restarted by its host pays for nothing it has seen).
        let resumes = replay == Replay::Resume
            && effective.replay
            && watermark > 0
            && effective.delivery_class == DeliveryClass::Durable
            && pattern.is_concrete()
            && self.open_membership(&key).await;
        let backfilled = if !resumes && replay != Replay::Off && effective.replay && watermark > 0 {
            // A live channel read before: only what came after the mark.
            let read_to = match replay == Replay::Resume
                && effective.delivery_class == DeliveryClass::Live
                && pattern.is_concrete()
            {
                true => self.replay_mark(&key).await,
                false => 0,
            };
            let start = match (&effective.replay_window, read_to) {
                (Some(window), _) => DeliverPolicy::ByStartTime {
                    start_time: time::OffsetDateTime::now_utc() - window.duration(),
                },
                (None, 0) => DeliverPolicy::All,
                (None, mark) => DeliverPolicy::ByStartSequence {
                    start_sequence: mark + 1,
                },
            };
            self.backfill(&subject, watermark, start, watermark, read_to)
                .await?
        } else {
            0
        };
        let durable = match effective.delivery_class {
            DeliveryClass::Live => DurableState::NotApplicable,
            DeliveryClass::Durable if !pattern.is_concrete() => DurableState::Unavailable(
                "durable membership is per concrete channel; join each one to get a backstop"
                    .into(),
            ),
            DeliveryClass::Durable => self.durable_join(&key, watermark).await,
        };
        let watcher = self.watch_late_refusal(key.clone(), subject.clone(), violations);
        {
            let mut joined = self.inner.joined.lock().await;
            joined.insert(
                key.clone(),
                Joined {
                    pump: Some(pump),
                    watcher: Some(watcher),
                    durable: durable.clone(),
                    subject,
                    replay: effective.replay,
                },
            );
        }
        reservation.inner = None;
        Ok(JoinReport {
            channel: key,
            effective,
            watermark,
            backfilled,
            durable,
        })
    }

    /// Holds `key`'s place among the joined channels while it is being joined; a second join
    /// of it meanwhile is refused.
    async fn reserve(&self, key: &str) -> Result<Reservation, JoinError> {
        let mut joined = self.inner.joined.lock().await;
        if joined.contains_key(key) {
            return Err(JoinError::AlreadyJoined(key.to_owned()));
        }
        joined.insert(
            key.to_owned(),
            Joined {
                pump: None,
                watcher: None,
                durable: DurableState::NotApplicable,
                subject: String::new(),
                replay: false,
            },
        );
        Ok(Reservation {
            inner: Some(self.inner.clone()),
            key: key.to_owned(),
        })
    }

    /// Subscribes to `subject` and waits for the broker's verdict on it; the violations feed,
    /// subscribed before the SUB is sent so that no verdict, early or late, is missed, is
    /// returned for the late-refusal watch, with the CHAT frontier read once the SUB was
    /// active (the join's watermark).
    async fn subscribe_confirmed(
        &self,
        key: &str,
        subject: &str,
    ) -> Result<
        (
            async_nats::Subscriber,
            broadcast::Receiver<super::Violation>,
            u64,
        ),
        JoinError,
    > {
        if !self.inner.grants.may_subscribe(subject) {
            return Err(JoinError::Refused {
                channel: key.to_owned(),
            });
        }
        let mut violations = self.inner.violations.subscribe();
        let mut sub = self
            .inner
            .nats
            .subscribe(subject.to_owned())
            .await
            .map_err(nats_err("subscribe"))?;
        match self.confirm(subject, &mut violations).await {
            Ok(Some(frontier)) => Ok((sub, violations, frontier)),
            Ok(None) => {
                let _ = sub.unsubscribe().await;
                Err(JoinError::Refused {
                    channel: key.to_owned(),
                })
            }
            Err(e) => {
                let _ = sub.unsubscribe().await;
                Err(e.into())
            }
        }
    }

    /// Leaves a channel: on a durable channel first asks the provisioner to close the
    /// membership (a hard read boundary for the backstop), then unsubscribes (no privileged step
    /// needed, §7). When the first step fails the channel stays joined and the error is
    /// returned: the leave can be tried again. Leaving the last channel is fine.
    pub async fn leave(&self, channel: &str) -> Result<(), JoinError> {
        let key = ChannelPattern::new(channel)
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|_| channel.to_owned());
        let durable = match self.inner.joined.lock().await.get(&key) {
            Some(j) if j.pump.is_some() => j.durable.clone(),
            _ => return Err(JoinError::NotJoined(key)),
        };
        // The durable membership ends first: a leave the manager did not record (it was
        // restarting) leaves the channel joined here too, so that the caller can try again,
        // rather than a member that believes it left while its copies keep coming (§7).
        if durable == DurableState::Established {
            self.durable_leave(&key).await?;
        }
        let entry = self.inner.joined.lock().await.remove(&key);
        drop(entry);
        Ok(())
    }

    /// The joined channels.
    pub async fn joined(&self) -> Vec<String> {
        self.inner
            .joined
            .lock()
            .await
            .iter()
            .filter(|(_, j)| j.pump.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Ends the durable membership of `channel` (§7), whether or not this client joined it
    /// live: the leave cursor is the CHAT frontier now; nothing later is kept for this member.
    pub async fn durable_leave(&self, channel: &str) -> Result<ops::Membership, ClientError> {
        self.inner.out.durable_member(channel, false);
        self.manager(&ops::Request::DurableLeave(ops::DurableLeave {
            channel: channel.to_owned(),
        }))
        .await
    }

    /// Waits for the broker's verdict on the subscribe to `subject`, which the grants cover: a
    /// round trip proves the SUB is registered, and a refusal the grants did not foresee that
    /// arrived by then is the verdict (`None`). The round trip is the read of the CHAT
    /// frontier the join needs next, its watermark: read after the SUB, as it must be.
    async fn confirm(
        &self,
        subject: &str,
        violations: &mut broadcast::Receiver<super::Violation>,
    ) -> Result<Option<u64>, ClientError> {
        let frontier = tokio::time::timeout(CONFIRM_TIMEOUT, self.chat_frontier())
            .await
            .map_err(|_| ClientError::Timeout {
                what: format!("the broker's verdict on subscribing to {subject}"),
                timeout: CONFIRM_TIMEOUT,
            })??;
        loop {
            match violations.try_recv() {
                Ok(v) if v.verb == "Subscription" && v.subject == subject => return Ok(None),
                Ok(_) => {}
                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    return Err(nats_err("confirm subscribe")(
                        "permission events were dropped; the broker's verdict is unknown, \
                         retry the join",
                    ));
                }
                Err(_) => return Ok(Some(frontier)),
            }
        }
    }

    /// A refusal that arrives after the join drops the channel (§7), closes its durable
    /// membership, and is reported.
    fn watch_late_refusal(
        &self,
        channel: String,
        subject: String,
        mut violations: broadcast::Receiver<super::Violation>,
    ) -> AbortOnDrop {
        let client = self.clone();
        AbortOnDrop::new(tokio::spawn(async move {
            loop {
                match violations.recv().await {
                    Ok(v) if v.verb == "Subscription" && v.subject == subject => break,
                    Err(broadcast::error::RecvError::Closed) => return,
                    _ => {}
                }
            }
            let entry = client.inner.joined.lock().await.remove(&channel);
            let Some(mut entry) = entry else { return };
            // This task is the entry's watcher: do not abort ourselves while finishing.
            if let Some(me) = entry.watcher.take() {
                me.detach();
            }
            let durable = entry.durable.clone();
            drop(entry);
            tracing::warn!(channel, "the broker refused a joined channel; dropped");
            if durable == DurableState::Established
                && let Err(e) = client.durable_leave(&channel).await
            {
                tracing::warn!(channel, error = %e, "durable membership of a refused channel not closed");
            }
            client
                .inner
                .out
                .notice(super::deliver::Notice::ChannelDropped { channel });
        }))
    }

    /// The CHAT frontier (last stream sequence).
    pub(super) async fn chat_frontier(&self) -> Result<u64, ClientError> {
        super::transient::retried("the CHAT frontier", &self.inner.state, || {
            self.read_chat_frontier()
        })
        .await
    }

    /// One `STREAM.INFO` (a looked-up stream handle would read it twice).
    async fn read_chat_frontier(&self) -> Result<u64, ClientError> {
        let info = self
            .inner
            .js
            .get_stream_no_info(self.inner.names.chat_stream())
            .await
            .map_err(nats_err("read the CHAT frontier"))?
            .get_info()
            .await
            .map_err(nats_err("read the CHAT frontier"))?;
        Ok(info.state.last_sequence)
    }

    /// The effective config of a channel (§7): registry value ?? `=defaults` ?? built-in. A
    /// wildcard pattern has no registry key of its own: the defaults apply.
    pub async fn effective_config(
        &self,
        pattern: &ChannelPattern,
    ) -> Result<EffectiveChannelConfig, ClientError> {
        super::transient::retried("the channel registry", &self.inner.state, || {
            self.read_effective_config(pattern)
        })
        .await
    }

    async fn read_effective_config(
        &self,
        pattern: &ChannelPattern,
    ) -> Result<EffectiveChannelConfig, ClientError> {
        // An unreadable registry is an error, never a guess (§12 item 11).
        fn unreadable<E: Into<super::BoxError>>(key: &str) -> impl FnOnce(E) -> ClientError {
            nats_err(format!("read {key} in the channel registry"))
        }
        let kv = self.registry_bucket().await?;
        let read = async |key: &str| kv.get(key).await.map_err(unreadable(key));
        let defaults = async {
            match read(CHANNEL_DEFAULTS_KEY).await? {
                Some(b) => ChannelDefaults::from_json(&b)
                    .map(Some)
                    .map_err(unreadable(CHANNEL_DEFAULTS_KEY)),
                None => Ok(None),
            }
        };
        // A wildcard has no registry key of its own: the space defaults apply to it.
        let channel = async {
            if !pattern.is_concrete() {
                return Ok(None);
            }
            match read(pattern.as_str()).await? {
                Some(b) => ChannelConfig::from_json(&b)
                    .map(Some)
                    .map_err(unreadable(pattern.as_str())),
                None => Ok(None),
            }
        };
        let (defaults, channel) = tokio::try_join!(defaults, channel)?;
        Ok(resolve(channel.as_ref(), defaults.as_ref()))
    }

    /// The channel registry as stored (§7): the space defaults and every concrete channel's
    /// config, with its description and instructions. An unreadable entry is an error.
    pub async fn channel_registry(&self) -> Result<ChannelRegistry, ClientError> {
        super::transient::retried("the channel registry", &self.inner.state, || {
            self.read_channel_registry()
        })
        .await
    }

    async fn read_channel_registry(&self) -> Result<ChannelRegistry, ClientError> {
        let bucket = self.inner.names.channels_bucket();
        let kv = self.registry_bucket().await?;
        // The keys from the stream's subjects (`STREAM.INFO`, which every profile holds): a
        // key watch would need an unnamed consumer, which no profile may create.
        let prefix = crate::binding::SpaceNames::kv_subject(&bucket, "");
        let stream = self
            .inner
            .js
            .get_stream_no_info(crate::binding::SpaceNames::kv_stream(&bucket))
            .await
            .map_err(nats_err("list the channel registry"))?;
        let mut subjects = stream
            .info_with_subjects(format!("{prefix}>"))
            .await
            .map_err(nats_err("list the channel registry"))?;
        let mut keys = Vec::new();
        while let Some(subject) = subjects.next().await {
            let (subject, _) = subject.map_err(nats_err("list the channel registry"))?;
            if let Some(key) = subject.strip_prefix(&prefix) {
                keys.push(key.to_owned());
            }
        }
        let mut registry = ChannelRegistry::default();
        for key in keys {
            let unreadable = nats_err(format!("read {key} in the channel registry"));
            let Some(bytes) = kv.get(&key).await.map_err(unreadable)? else {
                continue;
            };
            let unreadable = nats_err(format!("read {key} in the channel registry"));
            if key == CHANNEL_DEFAULTS_KEY {
                registry.defaults = Some(ChannelDefaults::from_json(&bytes).map_err(unreadable)?);
            } else {
                let config = ChannelConfig::from_json(&bytes).map_err(unreadable)?;
                registry.channels.insert(key, config);
            }
        }
        Ok(registry)
    }

    /// Whether this identity holds an open durable membership of `channel` (a failed lookup
    /// says no: the history is then replayed, which costs duplicates, never a message).
    async fn open_membership(&self, channel: &str) -> bool {
        self.manager::<Vec<ops::Membership>>(&ops::Request::Memberships)
            .await
            .is_ok_and(|ms| {
                ms.iter()
                    .any(|m| m.channel == channel && m.leave_cursor.is_none())
            })
    }

    /// Asks the provisioner for durable membership with the join cursor (§7).
    async fn durable_join(&self, channel: &str, cursor: u64) -> DurableState {
        let request = ops::Request::DurableJoin(ops::DurableJoin {
            channel: channel.to_owned(),
            cursor,
        });
        match self.manager::<ops::Membership>(&request).await {
            Ok(_) => {
                self.inner.out.durable_member(channel, true);
                DurableState::Established
            }
            Err(ClientError::Refused { error, .. }) => DurableState::Unavailable(error),
            Err(e) => DurableState::Unavailable(crate::ops::error_text(&e)),
        }
    }
}
