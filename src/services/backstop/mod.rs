//! The trusted backstop reader (§8, §9 item 5): the durable half of a `durable` channel, and
//! the delivery of `@mention` copies.
//!
//! **No write amplification, no cost for the absent.** A message on a durable channel is stored
//! once, in `CHAT_<space>`, which keeps it within its retention (§4 "within retention"). A
//! member's backlog is not a copy but a position: each membership interval (§7:
//! `joinCursor < seq ≤ leaveCursor`) records in the members registry how far it was delivered
//! (`delivered`). Only while the member has a session does this reader hold a pull consumer
//! for the interval (`bk_<member>_<generation>_<channel hash>`), filtered to the channel and
//! starting after that position; when the session ends, the consumer's ack floor is saved as
//! the new position and the consumer deleted. nats-server touches every matching consumer on
//! each store and each eviction, so a consumer per *absent* member would make every publish
//! cost more with each member (measured in `docs/benchmarks.md`); with consumers only for the
//! members that are connected, absent members cost the broker nothing. A crash leaves the
//! consumers in place (their positions are newer than the saved ones); the reader parks them at
//! its next start. The only copies written are `@mention` copies on live channels, stored once
//! per target in `INBOX_<space>` and read through `bkm_<member>`.
//!
//! **Re-authorized per message.** Before content leaves the broker, each entry is checked
//! against the member's *current* read ACL (the identity record the appliance minted, §9 item
//! 6) and its membership interval; a post-leave entry, an entry of a channel dropped from the
//! ACL, the member's own message, or one of a revoked identity is acknowledged and never sent.
//!
//! **At-least-once handoff.** An authorized entry is sent to the member's own
//! `_INBOX_<id>.backstop` ([`crate::binding::backstop_inbox`]) with the original payload, its chat
//! subject and a token, together with every other entry already received ([`CopyBatch`]: a
//! catch-up costs the broker one message per batch on the way out, not one per entry); the
//! stored entry is acknowledged only when the member acks that token
//! (`backstop-ack` on `ctl.manager`). While the member holds it, the entry's `ack_wait` is
//! extended, up to [`HANDOFF_TIMEOUT`], after which it is handed over again; when the member's
//! session ends (it asked to `resume` again, or its presence went stale) every unacknowledged
//! entry is nak'ed, so the next session gets it at once; a crash of the appliance leaves it
//! pending in JetStream, redelivered after `ack_wait`.
//!
//! **Only for members that are there.** Nothing is pulled for a member without a session: a
//! session starts with the member's `resume` and ends when its heartbeats stop.
//!
//! **One read for the members that follow.** A pump that has caught up waits `LINGER`
//! before it reads on, so a member online on a busy channel gets its durable copies (the net
//! under the live copies it already surfaced) a batch at a time. A member that takes offers
//! (`resume` with `offers`) then leaves its consumer and follows the channel's feed
//! (`follow.rs`): one read of the channel for every such member, with offers in place of
//! copies, so what an online member costs does not grow with every message.

mod follow;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::{self, AckKind};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::follow::{Demoted, Feeds, Stopped};
use super::presence::PresenceView;
use super::{Context, Health, Service, ServiceError};
use crate::binding::backlog::Backlog;
use crate::binding::frame::header_rejection;
use crate::binding::{backstop_inbox, interval_consumer, mention_consumer};
use crate::ops::status::MemberDelivery;
use crate::ops::{COPY_SUBJECT, CopyBatch, IdentityRecord};
use crate::protocol::{
    Channel, ChannelPattern, Rejection, SubjectKind, accept_delivery, is_covered, parse_subject,
};
use crate::space::members::{Interval, Members};
use crate::space::{Identities, Space};

/// How long a handed-over copy may stay unacknowledged before JetStream redelivers it (the
/// reader extends it while the member's session lasts).
pub const ACK_WAIT: Duration = Duration::from_secs(10);
/// Copies in flight per consumer (the consumer's `max_ack_pending`).
pub const WINDOW: i64 = 512;
/// How often held copies get their `ack_wait` extended.
const PROGRESS_EVERY: Duration = Duration::from_secs(3);
/// How long a member may hold a copy unacknowledged before it is handed over again (the copy
/// may have been lost on the way: the handoff is a plain publish to the member's inbox).
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(30);
/// How often sessions are checked against presence.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Pull batch size.
const BATCH: usize = 256;
/// How many intervals of members away `delivery` counts the backlog of (each costs the broker
/// a consumer made and deleted); past it, the backlog is unknown.
const COUNTED_AWAY: usize = 64;
/// How long a pump that has caught up waits before it takes what arrived meanwhile. A member
/// with a session is online and surfaces each message from its live copy; its durable copy is
/// the net under that, and read one message at a time it cost the appliance a pull, a handoff
/// and two acks per message per online member. Waiting lets the copies of a fraction of a
/// second go out in one batch (`docs/benchmarks.md`, *The default path at team scale*). A
/// catch-up is not slowed: a pump waits only when the broker says nothing is pending after the
/// last entry it got.
const LINGER: Duration = Duration::from_millis(200);

/// Why the reader could not do something for a member.
#[derive(Debug, thiserror::Error)]
pub enum BackstopError {
    /// The reader is not running (the appliance is starting or stopping).
    #[error("the backstop reader is not running")]
    NotRunning,
    /// A JetStream operation failed.
    #[error("backstop: {action} {consumer}")]
    JetStream {
        /// What was being done.
        action: &'static str,
        /// The consumer.
        consumer: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The stream sequence a token names, when it is of one of `kinds`: `c` a channel copy from a
/// member's consumer, `f` an entry of a channel's feed, `m` a mention copy.
fn token_seq(token: &str, kinds: &[char]) -> Option<u64> {
    token.strip_prefix(kinds)?.parse().ok()
}

/// What waits for one member away, over its channels.
struct Waiting {
    count: u64,
    oldest: Option<time::OffsetDateTime>,
    /// Whether every channel of it could be counted.
    known: bool,
}

impl Default for Waiting {
    fn default() -> Self {
        Waiting {
            count: 0,
            oldest: None,
            known: true,
        }
    }
}

impl Waiting {
    /// Adds one channel's count (`None`: it could not be counted).
    fn add(&mut self, channel: Option<(u64, Option<time::OffsetDateTime>)>) {
        match channel {
            Some((count, oldest)) => {
                self.count += count;
                self.oldest = match (self.oldest, oldest) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            None => self.known = false,
        }
    }
}

/// Whether a consumer lookup failed because the consumer does not exist.
fn is_not_found(e: &jetstream::stream::ConsumerError) -> bool {
    matches!(e.kind(), jetstream::stream::ConsumerErrorKind::JetStream(js)
        if js.error_code() == jetstream::ErrorCode::CONSUMER_NOT_FOUND)
}

/// What one consumer of a member reads.
#[derive(Debug, Clone)]
enum Source {
    /// A durable channel's messages in CHAT within one membership interval (tokens `c<seq>`).
    Chat {
        /// The channel.
        channel: String,
        /// The interval.
        interval: Interval,
    },
    /// The member's mention copies in the backstop store (tokens `m<seq>`).
    Mention,
}

/// Copies on their way to the member, and the stored entries they stand for.
#[derive(Default)]
struct Batch {
    copies: CopyBatch,
    entries: Vec<(String, jetstream::Message)>,
}

/// A copy handed to the member and not acknowledged yet.
struct Held {
    message: jetstream::Message,
    /// When it was handed over.
    handed: Instant,
    /// When its `ack_wait` was last extended.
    since: Instant,
}

/// One member's delivery session.
struct Session {
    name: String,
    /// Whether the member takes offers, so that it may follow its channels' feeds.
    offers: bool,
    token: CancellationToken,
    started: Instant,
    held: Arc<Mutex<HashMap<String, Held>>>,
    /// Consumer name → its pump.
    pumps: Mutex<HashMap<String, PumpHandle>>,
    /// Whether the member keeps up.
    progress: Mutex<Progress>,
}

/// Whether a member keeps up with its copies: when it last acknowledged one, and when it last
/// had none waiting. A member that has copies waiting and acknowledged none of them since the
/// later of the two is stuck for that long (the age of its oldest pending copy, counted while
/// it was connected).
struct Progress {
    acked: Instant,
    clear: Instant,
}

impl Progress {
    fn new() -> Self {
        let now = Instant::now();
        Progress {
            acked: now,
            clear: now,
        }
    }

    /// How long the member has had `waiting` copies without acknowledging any.
    fn stuck_for(&mut self, waiting: usize, now: Instant) -> Duration {
        if waiting == 0 {
            self.clear = now;
        }
        now.duration_since(self.acked.max(self.clear))
    }
}

/// A running pump as its session sees it.
struct PumpHandle {
    token: CancellationToken,
    /// (channel, generation) of an interval's pump; `None` for the mention pump.
    interval: Option<(String, u64)>,
}

/// The trusted reader of one space.
pub struct Backstop {
    space: Arc<Space>,
    identities: Arc<Identities>,
    members: Arc<Members>,
    presence: Arc<PresenceView>,
    sessions: tokio::sync::Mutex<HashMap<String, Arc<Session>>>,
    /// Set while running: the token sessions hang under, the tracker their pumps run on.
    running: Mutex<Option<(CancellationToken, TaskTracker)>>,
    /// The channels' feeds, for members that follow.
    feeds: Arc<Feeds>,
    /// Followers that went back to their consumers (taken by `run`).
    demoted: Mutex<Option<mpsc::UnboundedReceiver<Demoted>>>,
}

impl Backstop {
    /// The reader of `space`.
    pub fn new(
        space: Arc<Space>,
        identities: Arc<Identities>,
        members: Arc<Members>,
        presence: Arc<PresenceView>,
    ) -> Self {
        let (demote, demoted) = mpsc::unbounded_channel();
        let feeds = Feeds::new(space.clone(), identities.clone(), members.clone(), demote);
        Backstop {
            space,
            identities,
            members,
            presence,
            sessions: Default::default(),
            running: Mutex::new(None),
            feeds: Arc::new(feeds),
            demoted: Mutex::new(Some(demoted)),
        }
    }

    /// Creates (or finds) the consumer of one membership interval, from the member's saved
    /// position on: it exists only while the member has a session (see the module doc).
    async fn ensure_interval(
        &self,
        channel: &str,
        member: &str,
        interval: &Interval,
    ) -> Result<(), BackstopError> {
        let name = interval_consumer(member, channel, interval.generation);
        let config = pull::Config {
            durable_name: Some(name.clone()),
            filter_subject: self.space.names().posts_on(channel),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: interval.join_cursor.max(interval.delivered) + 1,
            },
            ack_policy: AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            max_ack_pending: WINDOW,
            ..Default::default()
        };
        self.ensure(self.space.names().chat_stream(), config).await
    }

    async fn ensure_mentions(&self, member: &str) -> Result<(), BackstopError> {
        let config = pull::Config {
            durable_name: Some(mention_consumer(member)),
            filter_subject: self.space.names().mentions_of(member),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            max_ack_pending: WINDOW,
            ..Default::default()
        };
        self.ensure(self.space.names().backstop_stream(), config)
            .await
    }

    async fn ensure(&self, stream: String, config: pull::Config) -> Result<(), BackstopError> {
        let name = config.durable_name.clone().unwrap_or_default();
        let fail = |action, e: Box<dyn std::error::Error + Send + Sync>| BackstopError::JetStream {
            action,
            consumer: name.clone(),
            source: e,
        };
        let stream = self
            .space
            .jetstream()
            .get_stream(&stream)
            .await
            .map_err(|e| fail("opening the stream of", e.into()))?;
        stream
            .get_or_create_consumer(&name, config.clone())
            .await
            .map_err(|e| fail("creating", e.into()))?;
        Ok(())
    }

    /// `CHAT_<space>`, where the intervals' consumers live (`None` when it cannot be reached;
    /// the callers then leave things as they are, to be done again later).
    async fn chat(&self) -> Option<jetstream::stream::Stream> {
        self.space
            .jetstream()
            .get_stream(self.space.names().chat_stream())
            .await
            .ok()
    }

    /// Deletes one interval's consumer (its backlog was delivered, or the identity is gone).
    pub async fn delete_interval(&self, member: &str, channel: &str, generation: u64) {
        let name = interval_consumer(member, channel, generation);
        self.feeds.unfollow(member, channel);
        self.stop_pump(member, &name).await;
        if let Some(stream) = self.chat().await {
            let _ = stream.delete_consumer(&name).await;
        }
    }

    /// Whether a just-closed interval has nothing left to deliver: nothing handed over
    /// unacknowledged and nothing undelivered (its leave cursor is the frontier of the moment,
    /// so anything pending is newer, and the interval is kept to be safe).
    pub async fn drained_at_leave(&self, member: &str, channel: &str, interval: &Interval) -> bool {
        let name = interval_consumer(member, channel, interval.generation);
        // A follower's interval goes back to its consumer, which keeps the leave boundary.
        if let Some(stopped) = self.feeds.unfollow(member, channel) {
            self.save(member, &stopped).await;
            self.restart_pump(member, None, channel, stopped.generation)
                .await;
        }
        let Some(stream) = self.chat().await else {
            return false;
        };
        match stream.consumer_info(&name).await {
            Ok(info) => info.num_ack_pending == 0 && info.num_pending == 0,
            Err(_) => false,
        }
    }

    /// `resume`: starts a new delivery session for `member` named `session`, ending the
    /// previous one (whose unacknowledged copies are delivered again); returns the consumers
    /// whose backlog the session hands over.
    pub async fn resume(
        &self,
        member: &str,
        session: &str,
        offers: bool,
    ) -> Result<Vec<String>, BackstopError> {
        let (root, tracker) = self
            .running
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .ok_or(BackstopError::NotRunning)?;
        self.ensure_mentions(member).await?;
        let fresh = Arc::new(Session {
            name: session.to_owned(),
            offers,
            token: root.child_token(),
            started: Instant::now(),
            held: Arc::default(),
            pumps: Mutex::default(),
            progress: Mutex::new(Progress::new()),
        });
        let old = self
            .sessions
            .lock()
            .await
            .insert(member.to_owned(), fresh.clone());
        if let Some(old) = old {
            self.end_session(member, &old).await;
        }
        let consumers = self.start_pumps(member, &fresh).await;
        // Held copies get their `ack_wait` extended while the session lasts.
        let held = fresh.held.clone();
        let token = fresh.token.clone();
        tracker.spawn(async move {
            let mut tick = tokio::time::interval(PROGRESS_EVERY);
            loop {
                tokio::select! {
                    () = token.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let (expired, due): (Vec<Held>, Vec<jetstream::Message>) = held
                    .lock()
                    .map(|mut h| {
                        let expired: Vec<String> = h
                            .iter()
                            .filter(|(_, e)| e.handed.elapsed() >= HANDOFF_TIMEOUT)
                            .map(|(token, _)| token.clone())
                            .collect();
                        let expired = expired.iter().filter_map(|t| h.remove(t)).collect();
                        let due = h
                            .values_mut()
                            .filter(|e| e.since.elapsed() >= PROGRESS_EVERY)
                            .map(|e| {
                                e.since = Instant::now();
                                e.message.clone()
                            })
                            .collect();
                        (expired, due)
                    })
                    .unwrap_or_default();
                for h in expired {
                    let _ = h.message.ack_with(AckKind::Nak(None)).await;
                }
                for m in due {
                    let _ = m.ack_with(AckKind::Progress).await;
                }
            }
        });
        tracing::debug!(
            space = self.space.name(),
            member,
            session,
            "backstop session started"
        );
        Ok(consumers)
    }

    /// Starts a pump for every consumer of `member` that has none in `session`; returns the
    /// consumers it started.
    async fn start_pumps(&self, member: &str, session: &Arc<Session>) -> Vec<String> {
        let mut started = Vec::new();
        let Some(run) = self.running.lock().ok().and_then(|r| r.clone()) else {
            return started;
        };
        let mut wanted = vec![(mention_consumer(member), Source::Mention)];
        for record in self.members.of(member) {
            for interval in &record.intervals {
                wanted.push((
                    interval_consumer(member, &record.channel, interval.generation),
                    Source::Chat {
                        channel: record.channel.clone(),
                        interval: interval.clone(),
                    },
                ));
            }
        }
        for (consumer, source) in wanted {
            let interval = match &source {
                Source::Chat { channel, interval } => Some((channel.clone(), interval.generation)),
                Source::Mention => None,
            };
            let token = {
                let Ok(mut pumps) = session.pumps.lock() else {
                    continue;
                };
                if pumps.contains_key(&consumer) {
                    continue;
                }
                let token = session.token.child_token();
                pumps.insert(
                    consumer.clone(),
                    PumpHandle {
                        token: token.clone(),
                        interval,
                    },
                );
                token
            };
            if let Source::Chat { channel, interval } = &source
                && let Err(e) = self.ensure_interval(channel, member, interval).await
            {
                tracing::warn!(member, channel, error = %e, "backstop consumer not created; retried at the next session");
                continue;
            }
            let pump = Pump {
                space: self.space.clone(),
                identities: self.identities.clone(),
                members: self.members.clone(),
                member: member.to_owned(),
                stream: match source {
                    Source::Chat { .. } => self.space.names().chat_stream(),
                    Source::Mention => self.space.names().backstop_stream(),
                },
                consumer,
                source,
                max_payload: self.space.nats().server_info().max_payload,
                held: session.held.clone(),
                inbox: backstop_inbox(member),
                session: session.offers.then(|| session.name.clone()),
                feeds: self.feeds.clone(),
                run: run.clone(),
                taken: AtomicU64::new(0),
                unsent: AtomicBool::new(false),
            };
            started.push(pump.consumer.clone());
            run.1.spawn(async move { pump.run(token).await });
        }
        started
    }

    async fn stop_pump(&self, member: &str, consumer: &str) {
        if let Some(session) = self.sessions.lock().await.get(member)
            && let Ok(mut pumps) = session.pumps.lock()
            && let Some(pump) = pumps.remove(consumer)
        {
            pump.token.cancel();
        }
    }

    /// The member's memberships changed: pump the consumers of new intervals.
    pub async fn memberships_changed(&self, member: &str) {
        let session = self.sessions.lock().await.get(member).cloned();
        if let Some(session) = session {
            self.start_pumps(member, &session).await;
        }
    }

    /// Makes the consumer of one of `member`'s intervals again, from its saved position, and
    /// pumps it (a follower that stopped following while its session goes on). With
    /// `session`, only if that session is still the member's.
    async fn restart_pump(
        &self,
        member: &str,
        session: Option<&str>,
        channel: &str,
        generation: u64,
    ) {
        let Some(current) = self.sessions.lock().await.get(member).cloned() else {
            return;
        };
        if session.is_some_and(|s| s != current.name) || current.token.is_cancelled() {
            return;
        }
        let consumer = interval_consumer(member, channel, generation);
        if let Ok(mut pumps) = current.pumps.lock()
            && let Some(pump) = pumps.remove(&consumer)
        {
            pump.token.cancel();
        }
        self.start_pumps(member, &current).await;
    }

    /// Saves where a follower stood.
    async fn save(&self, member: &str, stopped: &Stopped) {
        self.feeds
            .save(
                member,
                &stopped.channel,
                stopped.generation,
                stopped.position,
            )
            .await;
    }

    /// `backstop-want`: the member asks for the content of offers it has not surfaced.
    pub async fn want(&self, member: &str, tokens: &[String]) {
        let seqs: Vec<u64> = tokens.iter().filter_map(|t| token_seq(t, &['f'])).collect();
        self.feeds.want(member, &seqs).await;
    }

    /// `backstop-ack`: the member handled these copies; their stored entries are acknowledged.
    pub async fn ack(&self, member: &str, tokens: &[String]) {
        // An offer's token, or a copy's that a pump handed over before its member went on to
        // follow the feed.
        let offered: Vec<u64> = tokens
            .iter()
            .filter_map(|t| token_seq(t, &['f', 'c']))
            .collect();
        if !offered.is_empty() {
            self.feeds.confirm(member, &offered);
        }
        let Some(session) = self.sessions.lock().await.get(member).cloned() else {
            return;
        };
        if let Ok(mut progress) = session.progress.lock() {
            progress.acked = Instant::now();
        }
        let done: Vec<Held> = session
            .held
            .lock()
            .map(|mut h| tokens.iter().filter_map(|t| h.remove(t)).collect())
            .unwrap_or_default();
        for h in done {
            if let Err(e) = h.message.ack().await {
                tracing::debug!(member, error = %e, "backstop ack not sent; the entry will be redelivered");
            }
        }
    }

    /// Ends `member`'s session and deletes every consumer it has (a revoked identity): its
    /// backlog is gone from the store.
    pub async fn forget(&self, member: &str) {
        if let Some(session) = self.sessions.lock().await.remove(member) {
            self.end_session(member, &session).await;
        }
        self.feeds.unfollow_all(member);
        for record in self.members.of(member) {
            for interval in &record.intervals {
                self.delete_interval(member, &record.channel, interval.generation)
                    .await;
            }
        }
        if let Ok(stream) = self
            .space
            .jetstream()
            .get_stream(self.space.names().backstop_stream())
            .await
        {
            let _ = stream.delete_consumer(&mention_consumer(member)).await;
            let _ = stream
                .purge()
                .filter(self.space.names().mentions_of(member))
                .await;
        }
    }

    /// Ends a session: its pumps stop, every held copy is nak'ed for the next session, and each
    /// interval's position is saved and its consumer deleted (an absent member costs the broker
    /// nothing).
    async fn end_session(&self, member: &str, session: &Session) {
        session.token.cancel();
        for stopped in self.feeds.unfollow_all(member) {
            self.save(member, &stopped).await;
        }
        let held: Vec<Held> = session
            .held
            .lock()
            .map(|mut h| h.drain().map(|(_, v)| v).collect())
            .unwrap_or_default();
        for h in held {
            let _ = h.message.ack_with(AckKind::Nak(None)).await;
        }
        let intervals: Vec<(String, u64)> = session
            .pumps
            .lock()
            .map(|mut p| p.drain().filter_map(|(_, pump)| pump.interval).collect())
            .unwrap_or_default();
        for (channel, generation) in intervals {
            self.park(member, &channel, generation).await;
        }
    }

    /// Saves an interval's position (its consumer's ack floor: every entry up to it is
    /// handled) in the members registry, then deletes the consumer. A failure to save only
    /// means entries are handed over again (at least once).
    async fn park(&self, member: &str, channel: &str, generation: u64) {
        let name = interval_consumer(member, channel, generation);
        let Some(stream) = self.chat().await else {
            return;
        };
        let Ok(info) = stream.consumer_info(&name).await else {
            return;
        };
        let floor = info.ack_floor.stream_sequence;
        self.feeds.save(member, channel, generation, floor).await;
        let _ = stream.delete_consumer(&name).await;
    }

    /// The sessions as they are now.
    async fn sessions(&self) -> Vec<(String, Arc<Session>)> {
        let sessions = self.sessions.lock().await;
        sessions
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Ends the sessions of members whose heartbeats stopped (or who said `offline`).
    async fn sweep(&self) {
        let sessions = self.sessions().await;
        for (member, session) in sessions {
            let live = match self.presence.get(&member) {
                Some(heard) if heard.at >= session.started => heard.is_live(),
                // Not heard since the session began: give it one liveness window.
                _ => session.started.elapsed() <= crate::protocol::LIVENESS_WINDOW,
            };
            if !live {
                let mut sessions = self.sessions.lock().await;
                if sessions
                    .get(&member)
                    .is_some_and(|s| Arc::ptr_eq(s, &session))
                {
                    sessions.remove(&member);
                    drop(sessions);
                    self.end_session(&member, &session).await;
                    tracing::debug!(
                        space = self.space.name(),
                        member,
                        session = session.name,
                        "backstop session ended: the member is gone"
                    );
                }
            }
        }
    }

    /// How delivery goes for every durable member (`cotald status`): for one with a session
    /// (online), what waits for its acknowledgement and for how long; for one away, what its
    /// channels stored since its position, and when the oldest of it was stored.
    pub async fn delivery(&self) -> Vec<MemberDelivery> {
        let mut members = self.online().await;
        let online: std::collections::HashSet<String> =
            members.iter().map(|m| m.id.clone()).collect();
        let mut away: std::collections::BTreeMap<String, Waiting> = Default::default();
        let mut asked = 0;
        for record in self.members.all() {
            let Some(interval) = record.open().filter(|_| !online.contains(&record.member)) else {
                continue;
            };
            let waiting = away.entry(record.member.clone()).or_default();
            asked += 1;
            match (asked <= COUNTED_AWAY).then_some(()) {
                Some(()) => waiting.add(self.waiting(&record.channel, interval).await),
                None => waiting.add(None),
            }
        }
        let now = time::OffsetDateTime::now_utc();
        members.extend(away.into_iter().map(|(member, waiting)| {
            let (backlog, oldest) = match waiting.known {
                true => (Some(waiting.count), waiting.oldest),
                false => (None, None),
            };
            MemberDelivery {
                name: self.identities.get(&member).map(|r| r.name),
                id: member,
                online: false,
                unacknowledged: 0,
                waiting_secs: 0,
                stalled: false,
                backlog,
                oldest_pending_secs: oldest.map(|at| (now - at).whole_seconds().max(0) as u64),
            }
        }));
        members.sort_by(|a, b| a.id.cmp(&b.id));
        members
    }

    /// How many messages `channel` stored after a member's position in `interval`, and when the
    /// oldest of them was: a consumer made for the question, read for one entry's headers and
    /// deleted. `None` when the broker could not say.
    async fn waiting(
        &self,
        channel: &str,
        interval: &Interval,
    ) -> Option<(u64, Option<time::OffsetDateTime>)> {
        let stream = self.chat().await?;
        let consumer = stream
            .create_consumer(pull::Config {
                filter_subject: self.space.names().posts_on(channel),
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: interval.join_cursor.max(interval.delivered) + 1,
                },
                ack_policy: AckPolicy::None,
                headers_only: true,
                inactive_threshold: Duration::from_secs(5),
                ..Default::default()
            })
            .await
            .ok()?;
        let count = consumer.cached_info().num_pending;
        let oldest = match count {
            0 => None,
            _ => {
                let mut first = consumer
                    .fetch()
                    .max_messages(1)
                    .expires(Duration::from_secs(1))
                    .messages()
                    .await
                    .ok()?;
                first
                    .next()
                    .await
                    .and_then(Result::ok)
                    .and_then(|m| m.info().ok().map(|i| i.published))
            }
        };
        let _ = stream.delete_consumer(&consumer.cached_info().name).await;
        Some((count, oldest))
    }

    /// The members with a session (online): what waits for their acknowledgement and for how
    /// long.
    async fn online(&self) -> Vec<MemberDelivery> {
        let sessions = self.sessions().await;
        let stall_after = self.stall_after();
        let now = Instant::now();
        let mut members: Vec<MemberDelivery> = sessions
            .into_iter()
            .map(|(member, session)| {
                // An entry a pump handed over before its member went on to follow the feed
                // is held and offered both: counted once, by its sequence.
                let mut entries: std::collections::BTreeSet<u64> =
                    self.feeds.unconfirmed(&member).into_iter().collect();
                let mut mentions = 0;
                if let Ok(held) = session.held.lock() {
                    for token in held.keys() {
                        match token_seq(token, &['c']) {
                            Some(seq) => {
                                entries.insert(seq);
                            }
                            None => mentions += 1,
                        }
                    }
                }
                let waiting = entries.len() + mentions;
                let stuck = session
                    .progress
                    .lock()
                    .map(|mut p| p.stuck_for(waiting, now))
                    .unwrap_or_default();
                let waiting_for = if waiting == 0 { Duration::ZERO } else { stuck };
                MemberDelivery {
                    name: self.identities.get(&member).map(|r| r.name),
                    id: member,
                    online: true,
                    unacknowledged: waiting as u64,
                    waiting_secs: waiting_for.as_secs(),
                    stalled: waiting_for >= stall_after,
                    backlog: None,
                    oldest_pending_secs: None,
                }
            })
            .collect();
        members.sort_by(|a, b| a.id.cmp(&b.id));
        members
    }

    /// After how long without an acknowledgement an online member counts as stalled.
    pub fn stall_after(&self) -> Duration {
        self.space.config().delivery.stall_after.duration()
    }

    /// Reports the reader degraded while any online member is stalled, naming them; running
    /// again once none is.
    async fn report_stalls(&self, ctx: &Context) {
        let stalled: Vec<String> = self
            .online()
            .await
            .into_iter()
            .filter(|m| m.stalled)
            .map(|m| m.stall())
            .collect();
        ctx.report(match stalled.is_empty() {
            true => Health::Running,
            false => Health::Degraded(format!("delivery stalled: {}", stalled.join("; "))),
        });
    }
}

impl Service for Backstop {
    fn name(&self) -> &'static str {
        "backstop"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        // Consumers left by a crash belong to sessions that are gone: park them, so that only
        // members who come back (and `resume`) have one.
        for record in self.members.all() {
            for interval in &record.intervals {
                self.park(&record.member, &record.channel, interval.generation)
                    .await;
            }
        }
        let tracker = TaskTracker::new();
        if let Ok(mut running) = self.running.lock() {
            *running = Some((ctx.token().clone(), tracker.clone()));
        }
        ctx.report(Health::Running);
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        let mut demoted = self.demoted.lock().ok().and_then(|mut d| d.take());
        loop {
            tokio::select! {
                () = ctx.cancelled() => break,
                _ = sweep.tick() => {
                    self.sweep().await;
                    self.report_stalls(&ctx).await;
                }
                Some(d) = async { demoted.as_mut()?.recv().await } => {
                    self.restart_pump(&d.member, Some(&d.session), &d.channel, d.generation).await;
                }
            }
        }
        if let Ok(mut slot) = self.demoted.lock() {
            *slot = demoted;
        }
        if let Ok(mut running) = self.running.lock() {
            *running = None;
        }
        let sessions: Vec<(String, Arc<Session>)> = self.sessions.lock().await.drain().collect();
        for (member, s) in sessions {
            self.end_session(&member, &s).await;
        }
        tracker.close();
        tracker.wait().await;
        Ok(())
    }
}

/// Reads one consumer of one member's session and hands authorized copies over.
struct Pump {
    space: Arc<Space>,
    identities: Arc<Identities>,
    members: Arc<Members>,
    member: String,
    consumer: String,
    stream: String,
    source: Source,
    max_payload: usize,
    held: Arc<Mutex<HashMap<String, Held>>>,
    inbox: String,
    /// The session's name when the member takes offers: the pump may then hand its interval
    /// over to the channel's feed once it has caught up.
    session: Option<String>,
    feeds: Arc<Feeds>,
    /// The reader's token and tracker, for a feed the pump starts.
    run: (CancellationToken, TaskTracker),
    /// The highest sequence this pump took (handed over, or handled as not due).
    taken: AtomicU64,
    /// Set when copies could not be sent (they were nak'ed, for the consumer to deliver
    /// again): the interval then stays on its consumer for the session.
    unsent: AtomicBool,
}

/// The member's identity and parsed read ACL, re-read whenever the identities changed.
struct Acl {
    version: u64,
    record: Option<IdentityRecord>,
    read: Vec<ChannelPattern>,
}

impl Acl {
    /// Not read yet: the first [`Acl::refresh`] reads it.
    fn unread() -> Self {
        Acl {
            version: u64::MAX,
            record: None,
            read: Vec::new(),
        }
    }

    fn refresh(&mut self, identities: &Identities, member: &str) {
        let version = identities.version();
        if self.version != version {
            self.version = version;
            self.record = identities.get(member);
            self.read = self
                .record
                .as_ref()
                .map(IdentityRecord::read_acl)
                .unwrap_or_default();
        }
    }
}

impl Pump {
    /// The consumer's messages; bound again shortly after a failure (the broker restarting, or
    /// the connection being dialed again), so the member's delivery goes on. `None` once the
    /// consumer is gone (parked, drained, or the identity revoked) or the pump is cancelled.
    /// With them, what the consumer held when it was bound.
    async fn messages(&self, token: &CancellationToken) -> Option<(pull::Stream, Backlog)> {
        loop {
            let bound = match self
                .space
                .jetstream()
                .get_consumer_from_stream::<pull::Config, _, _>(&self.consumer, &self.stream)
                .await
            {
                Ok(consumer) => {
                    let backlog = Backlog::at(consumer.cached_info());
                    consumer
                        .stream()
                        .max_messages_per_batch(BATCH)
                        .heartbeat(Duration::from_secs(5))
                        .messages()
                        .await
                        .map(|m| (m, backlog))
                        .map_err(|e| e.to_string())
                }
                Err(e) if is_not_found(&e) => {
                    tracing::debug!(consumer = self.consumer, error = %e, "backstop consumer gone");
                    return None;
                }
                Err(e) => Err(e.to_string()),
            };
            match bound {
                Ok(messages) => return Some(messages),
                Err(e) => {
                    tracing::debug!(
                        consumer = self.consumer,
                        error = e,
                        "backstop consumer not bound; retrying"
                    );
                    tokio::select! {
                        () = token.cancelled() => return None,
                        () = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                }
            }
        }
    }

    /// Hands the consumer's entries over until the session ends or the consumer is done. Once
    /// what it held at the first bind has been handed over (or a window of it), the member is
    /// told ([`crate::ops::CAUGHT_UP`]), after those copies.
    async fn run(self, token: CancellationToken) {
        let mut acl = Acl::unread();
        // What the consumer held when the session started, until the member is told.
        let mut owed: Option<Backlog> = None;
        let mut told = self.session.is_none();
        while !token.is_cancelled() {
            let Some((messages, at_bind)) = self.messages(&token).await else {
                self.tell_caught_up(&mut told).await;
                return;
            };
            if !told && owed.is_none() {
                if at_bind.is_done() {
                    self.tell_caught_up(&mut told).await;
                }
                owed = Some(at_bind);
            }
            // Every entry already received goes out in one batch (at most [`BATCH`]).
            let mut ready = messages.ready_chunks(BATCH);
            loop {
                let next = tokio::select! {
                    () = token.cancelled() => return,
                    next = ready.next() => next,
                };
                let Some(entries) = next else { break };
                // Caught up: the broker says nothing more is pending after the last entry.
                let caught_up = entries
                    .last()
                    .and_then(|e| e.as_ref().ok())
                    .and_then(|m| m.info().ok())
                    .is_some_and(|info| info.pending == 0);
                let mut batch = Batch::default();
                let mut finished = false;
                let mut last_owed = false;
                // A leave recorded while the pump runs is a boundary at once.
                let current = self.current_interval();
                for entry in entries {
                    last_owed |= owed.as_mut().is_some_and(Backlog::took_one);
                    finished = match entry {
                        Ok(msg) => {
                            let flow = self.handle(msg, &mut acl, current.as_ref(), &mut batch);
                            flow.await == Flow::Finished
                        }
                        Err(e) => {
                            tracing::debug!(consumer = self.consumer, error = %e, "backstop pull error");
                            matches!(e.kind(), pull::MessagesErrorKind::ConsumerDeleted)
                        }
                    };
                    // The interval is drained (or its consumer gone): what follows is past it.
                    if finished {
                        break;
                    }
                }
                self.hand_over(batch).await;
                if last_owed || finished {
                    self.tell_caught_up(&mut told).await;
                }
                if finished {
                    return;
                }
                // Caught up: the member is following live, so its durable copies are a safety
                // net that can wait to be read in a batch (see LINGER), or follow the feed.
                if caught_up {
                    tokio::select! {
                        () = token.cancelled() => return,
                        () = tokio::time::sleep(LINGER) => {}
                    }
                    if self.follow(&token).await {
                        self.tell_caught_up(&mut told).await;
                        return;
                    }
                }
            }
        }
    }

    /// Tells the member, once, that what this consumer held when the session started has been
    /// handed over. Lost on the way, the member's application answers later, never wrongly: it
    /// then says the backlog is still on its way.
    async fn tell_caught_up(&self, told: &mut bool) {
        let Some(session) = self.session.as_deref().filter(|_| !*told) else {
            return;
        };
        *told = true;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(crate::ops::BATCH_KIND, crate::ops::CAUGHT_UP);
        let body = crate::ops::caught_up_body(session, &self.consumer);
        let sent = self
            .space
            .nats()
            .publish_with_headers(self.inbox.clone(), headers, body.into())
            .await;
        if let Err(e) = sent {
            tracing::debug!(member = self.member, error = %e, "caught-up not sent");
        }
    }

    /// The interval this pump reads, as the registry has it now (a leave sets its cursor while
    /// the pump runs); `None` for the mention pump, or once the interval is gone.
    fn current_interval(&self) -> Option<Interval> {
        let Source::Chat { channel, interval } = &self.source else {
            return None;
        };
        self.members
            .interval(&self.member, channel, interval.generation)
    }

    /// Hands a caught-up open interval over to its channel's feed when the member takes
    /// offers: its position (the consumer's ack floor) saved, its consumer deleted. The copies
    /// it handed over and the member has not acknowledged are confirmed by the member's acks
    /// of them, or handed over again by the feed. True when it did.
    async fn follow(&self, token: &CancellationToken) -> bool {
        let (Some(session), Source::Chat { channel, .. }) = (&self.session, &self.source) else {
            return false;
        };
        // A closed interval is drained by its consumer, which keeps the leave boundary.
        let open = self.current_interval().filter(|i| i.leave_cursor.is_none());
        let Some(open) = open else { return false };
        let Ok(stream) = self.space.jetstream().get_stream(&self.stream).await else {
            return false;
        };
        let Ok(info) = stream.consumer_info(&self.consumer).await else {
            return false;
        };
        if info.num_pending > 0 || self.unsent.load(Ordering::Acquire) {
            return false;
        }
        let position = info
            .ack_floor
            .stream_sequence
            .max(open.join_cursor)
            .max(open.delivered);
        // What this pump handed over and the member has not acknowledged yet stays with the
        // member's acks of those copies: the feed waits for them, and offers only what comes
        // after what the pump took.
        let held: Vec<u64> = self
            .held
            .lock()
            .map(|h| {
                h.iter()
                    .filter(|(_, held)| {
                        held.message
                            .info()
                            .is_ok_and(|i| i.consumer == self.consumer)
                    })
                    .filter_map(|(token, _)| token_seq(token, &['c']))
                    .filter(|seq| *seq > position)
                    .collect()
            })
            .unwrap_or_default();
        let handoff = follow::Handoff {
            generation: open.generation,
            position,
            taken: self.taken.load(Ordering::Acquire).max(position),
            held,
        };
        let run = (&self.run.0, &self.run.1);
        let (member, generation) = (self.member.as_str(), open.generation);
        if !self
            .feeds
            .follow(member, session, channel, &handoff, self.inbox.clone(), run)
        {
            return false;
        }
        self.feeds.save(member, channel, generation, position).await;
        let _ = stream.delete_consumer(&self.consumer).await;
        // The session ended meanwhile: its end may have come before this follower did.
        if token.is_cancelled()
            && let Some(stopped) = self.feeds.unfollow(member, channel)
        {
            self.feeds
                .save(member, channel, generation, stopped.position)
                .await;
        }
        tracing::debug!(member, channel, position, "following the channel's feed");
        true
    }

    /// Authorizes one entry and adds it to `batch`, or acknowledges it away.
    async fn handle(
        &self,
        msg: jetstream::Message,
        acl: &mut Acl,
        current: Option<&Interval>,
        batch: &mut Batch,
    ) -> Flow {
        let Ok(info) = msg.info() else {
            let _ = msg.ack_with(AckKind::Term).await;
            return Flow::Continue;
        };
        let seq = info.stream_sequence;
        self.taken.fetch_max(seq, Ordering::AcqRel);
        let subject = match self.source {
            Source::Chat { .. } => msg.subject.as_str().to_owned(),
            Source::Mention => match msg.headers.as_ref().and_then(|h| h.get(COPY_SUBJECT)) {
                Some(s) => s.as_str().to_owned(),
                None => {
                    let _ = msg.ack_with(AckKind::Term).await;
                    return Flow::Continue;
                }
            },
        };
        acl.refresh(&self.identities, &self.member);
        // A chat entry's header block is its publisher's; a mention copy's is the router's.
        let header = match self.source {
            Source::Chat { .. } => header_rejection(msg.headers.as_ref(), msg.status),
            Source::Mention => None,
        };
        let verdict = self.authorize(&subject, header, &msg.payload, seq, acl, current);
        match verdict {
            Verdict::Deliver => {}
            Verdict::Refused(rejection) => {
                self.space
                    .refusals()
                    .refuse("backstop", &subject, &rejection);
                let _ = msg.ack().await;
                return Flow::Continue;
            }
            Verdict::Skip(why) => {
                tracing::trace!(
                    member = self.member,
                    seq,
                    why,
                    "backstop entry not delivered"
                );
                let _ = msg.ack().await;
                return Flow::Continue;
            }
            Verdict::PastLeave => {
                // Confirmed, so that the floor read next includes it.
                let _ = msg.double_ack().await;
                return self.finish_if_drained(current).await;
            }
        }
        let token = match self.source {
            Source::Chat { .. } => format!("c{seq}"),
            Source::Mention => format!("m{seq}"),
        };
        let framed = CopyBatch::framed_len(&subject, &token, &msg.payload);
        if framed > self.max_payload {
            // A message of the broker's maximum size published without headers is stored, but
            // its copy (subject and token beside it) cannot be sent: handing it over would
            // fail and redeliver forever, so it is acknowledged away like any anomaly.
            tracing::warn!(
                member = self.member,
                seq,
                bytes = msg.payload.len(),
                "a durable copy too large to hand over: not delivered"
            );
            let _ = msg.ack().await;
            return Flow::Continue;
        }
        // A copy that would not fit beside the others goes out in a batch of its own.
        if !batch.copies.is_empty() && batch.copies.len() + framed > self.max_payload {
            self.hand_over(std::mem::take(batch)).await;
        }
        batch.copies.push(&subject, &token, &msg.payload);
        batch.entries.push((token, msg));
        Flow::Continue
    }

    /// Sends a batch to the member's inbox; its entries are held until the member acks them,
    /// or nak'ed for redelivery when the batch could not be sent.
    async fn hand_over(&self, batch: Batch) {
        if batch.entries.is_empty() {
            return;
        }
        let sent = self
            .space
            .nats()
            .publish(self.inbox.clone(), batch.copies.into_body().into())
            .await;
        match sent {
            Ok(()) => {
                if let Ok(mut held) = self.held.lock() {
                    let now = Instant::now();
                    for (token, message) in batch.entries {
                        let (handed, since) = (now, now);
                        held.insert(
                            token,
                            Held {
                                message,
                                handed,
                                since,
                            },
                        );
                    }
                }
            }
            Err(e) => {
                self.unsent.store(true, Ordering::Release);
                tracing::debug!(member = self.member, error = %e, "backstop copies not sent");
                for (_, message) in batch.entries {
                    let _ = message.ack_with(AckKind::Nak(None)).await;
                }
            }
        }
    }

    /// The re-authorization of §9 item 5: membership interval, current read ACL, and the
    /// receive checks of §5 (an anomaly is terminated here, never handed over).
    fn authorize(
        &self,
        subject: &str,
        header: Option<Rejection>,
        payload: &[u8],
        seq: u64,
        acl: &Acl,
        current: Option<&Interval>,
    ) -> Verdict {
        if acl.record.is_none() {
            return Verdict::Skip("the identity is revoked");
        }
        let Ok(parsed) = parse_subject(subject) else {
            return Verdict::Skip("malformed subject");
        };
        if parsed.kind != SubjectKind::Chat {
            return Verdict::Skip("not a chat subject");
        }
        if parsed.sender == self.member {
            return Verdict::Skip("the member's own message");
        }
        if let Source::Chat { .. } = &self.source {
            let Some(interval) = current else {
                return Verdict::Skip("the membership interval is gone");
            };
            if !interval.contains(seq) {
                return if seq <= interval.join_cursor {
                    Verdict::Skip("before the join cursor")
                } else {
                    Verdict::PastLeave
                };
            }
        }
        if !Channel::new(parsed.rest).is_ok_and(|c| is_covered(&acl.read, &c)) {
            return Verdict::Skip("outside the member's current read ACL");
        }
        if let Some(rejection) = header {
            return Verdict::Refused(rejection);
        }
        if let Err(rejection) = accept_delivery(subject, payload, self.max_payload) {
            return Verdict::Refused(rejection);
        }
        Verdict::Deliver
    }

    /// After an entry past the leave cursor: once every entry up to it is acknowledged, the
    /// interval is done; its consumer is deleted and it leaves the member's record.
    async fn finish_if_drained(&self, current: Option<&Interval>) -> Flow {
        let (Source::Chat { channel, .. }, Some(interval)) = (&self.source, current) else {
            return Flow::Continue;
        };
        let Some(leave) = interval.leave_cursor else {
            return Flow::Continue;
        };
        let Ok(stream) = self.space.jetstream().get_stream(&self.stream).await else {
            return Flow::Continue;
        };
        let floor = match stream.consumer_info(&self.consumer).await {
            Ok(info) => info.ack_floor.stream_sequence,
            Err(_) => return Flow::Continue,
        };
        if floor < leave {
            return Flow::Continue;
        }
        let generation = interval.generation;
        let removed = self
            .members
            .remove_interval(&self.member, channel, generation)
            .await;
        if let Err(e) = removed {
            tracing::warn!(member = self.member, channel, error = %e, "drained interval not removed");
            return Flow::Continue;
        }
        let _ = stream.delete_consumer(&self.consumer).await;
        tracing::debug!(
            member = self.member,
            channel,
            generation,
            "durable interval delivered"
        );
        Flow::Finished
    }
}

#[derive(Debug)]
enum Verdict {
    Deliver,
    Skip(&'static str),
    /// A permanent anomaly (§5): acknowledged away, never handed over.
    Refused(Rejection),
    PastLeave,
}

#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Finished,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_a_sequence_of_its_kind_only() {
        assert_eq!(token_seq("c12", &['c']), Some(12));
        assert_eq!(token_seq("f12", &['f', 'c']), Some(12));
        assert_eq!(token_seq("f12", &['c']), None);
        assert_eq!(token_seq("m3", &['f', 'c']), None);
        assert_eq!(token_seq("c", &['c']), None);
        assert_eq!(token_seq("c1x", &['c']), None);
    }
}
