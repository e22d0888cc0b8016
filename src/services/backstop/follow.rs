//! Members that follow (§8): one read of a durable channel for all of its members that have
//! caught up, and offers instead of copies.
//!
//! A member with a session is online: it surfaces each message of a durable channel from its
//! live copy, and the durable copy is the net under that. Read through the member's own
//! consumer, the net cost the broker one delivery per message per online member, and the
//! appliance a check, a handoff and two acks for each (`docs/benchmarks.md`, *The default
//! path at team scale*). So once a member's consumer has caught up, the member *follows* the
//! channel's [`Feed`] instead, and its consumer is deleted:
//!
//! - **One read per channel, headers only.** The feed reads the channel once, through an
//!   ordered consumer that delivers subject and headers without the payload, for every
//!   follower: what an offer needs is the sender (from the subject, §3) and the message's
//!   `Nats-Msg-Id` (which publishers set to its `id`, §8). Content is fetched by sequence only
//!   for what a member asks for, and validated then (§5 receive checks; an anomaly is handed
//!   to no one and counts as handled, as on a member's own consumer).
//! - **Re-authorized per member, per entry** (§9 item 5), as on the member's own consumer:
//!   against its *current* identity record and read ACL, and its membership interval (a
//!   post-leave entry is not due); and again before any content leaves for it.
//! - **Offers, not copies.** A follower is offered the entries due to it as subject, token and
//!   message `id` ([`OfferBatch`]), a batch every [`super::LINGER`]. It acknowledges the token
//!   of what it surfaced already (as it acks a duplicate copy: once the application handled
//!   it) and asks for the content of the rest (`backstop-want`), which is handed over as a copy
//!   with the same token. Nothing is confirmed for it that it did not confirm.
//! - **Positions, not acks.** A follower's position is the highest sequence such that every
//!   entry up to it was confirmed by the member or was not due. It is saved in the members
//!   registry (`delivered`) every [`CHECKPOINT_EVERY`] and when the follower stops following;
//!   its consumer is made again from there: when its session ends and it comes back, when it
//!   leaves the channel, or when it falls behind (more than [`MAX_OUTSTANDING`] offers
//!   unconfirmed, or the feed would have to hold more than [`MAX_BUFFER`] entries for it).
//!   An unconfirmed offer is handed over again as a copy after [`super::HANDOFF_TIMEOUT`]. A
//!   crash of the appliance forgets at most the confirmations since the last save: those
//!   entries are delivered again, so at-least-once holds.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream;
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use async_nats::jetstream::stream::DirectGetErrorKind;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Acl, BATCH, HANDOFF_TIMEOUT, LINGER, WINDOW};
use crate::binding::frame::accept_delivery;
use crate::ops::{BATCH_KIND, CopyBatch, OFFERS, OfferBatch};
use crate::protocol::{Channel, DeliveryKind, SubjectKind, is_covered, parse_subject};
use crate::space::members::{Interval, Members};
use crate::space::{Identities, Space};

/// A follower with this many offers sent and unconfirmed goes back to its own consumer (the
/// window its consumer would have had). What arrived since the last offers is not counted: a
/// burst is offered at the next flush, and a member that keeps up confirms it well before the
/// one after.
const MAX_OUTSTANDING: usize = WINDOW as usize;
/// The most entries a feed holds for its slowest follower before that follower goes back to
/// its own consumer: a burst of 40,000 msg/s over one [`LINGER`] (a few MiB of subjects and
/// ids); a follower that does not confirm stops at [`MAX_OUTSTANDING`] long before.
const MAX_BUFFER: usize = 16 * WINDOW as usize;
/// How often a follower's position is saved while it moves.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);

/// A follower that stopped following while its session goes on: its consumer is to be made
/// again from its saved position.
#[derive(Debug)]
pub(super) struct Demoted {
    pub member: String,
    pub session: String,
    pub channel: String,
    pub generation: u64,
}

/// Where a member's consumer stood when the member went on to follow its channel.
pub(super) struct Handoff {
    /// The interval's generation.
    pub generation: u64,
    /// Every entry up to this one is handled (the consumer's ack floor).
    pub position: u64,
    /// The highest entry the consumer's pump took: what comes after it is offered.
    pub taken: u64,
    /// Entries after `position` the pump handed over as copies, not acknowledged yet.
    pub held: Vec<u64>,
}

/// Where a member stood when it stopped following a channel.
pub(super) struct Stopped {
    pub channel: String,
    pub generation: u64,
    pub position: u64,
}

/// The feeds of one space, by channel.
pub(super) struct Feeds {
    space: Arc<Space>,
    identities: Arc<Identities>,
    members: Arc<Members>,
    feeds: Mutex<HashMap<String, Arc<Feed>>>,
    demoted: mpsc::UnboundedSender<Demoted>,
}

/// One channel's feed.
struct Feed {
    channel: String,
    name: Channel,
    token: CancellationToken,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Entries read and not yet passed by every follower's position, in order.
    buffer: VecDeque<Entry>,
    /// Every entry of the channel from this sequence on is in the buffer or still to be read.
    covered_from: u64,
    followers: HashMap<String, Follower>,
    /// Set when the feed stopped: no follower may join it any more.
    closed: bool,
}

impl State {
    /// The slowest followers, beside those already `stopping`, for which the feed would hold
    /// more than [`MAX_BUFFER`] entries: they go back to their consumers rather than the feed
    /// holding without bound what they have not confirmed.
    fn behind(&self, stopping: &[(String, bool)]) -> Vec<String> {
        let mut positions: Vec<(u64, &String)> = self
            .followers
            .iter()
            .filter(|(m, _)| !stopping.iter().any(|(s, _)| s == *m))
            .map(|(m, f)| (f.position(), m))
            .collect();
        positions.sort();
        positions
            .into_iter()
            .take_while(|(position, _)| {
                self.buffer.len() - self.buffer.partition_point(|e| e.seq <= *position) > MAX_BUFFER
            })
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Lets go of the entries every follower passed.
    fn trim(&mut self) {
        let floor = self
            .followers
            .values()
            .map(Follower::position)
            .min()
            .unwrap_or(u64::MAX);
        let passed = self.buffer.partition_point(|e| e.seq <= floor);
        if let Some(last) = self.buffer.drain(..passed).next_back() {
            self.covered_from = self.covered_from.max(last.seq + 1);
        }
    }
}

/// One entry as read: its subject and headers, not its content.
struct Entry {
    seq: u64,
    subject: String,
    /// The sender of a chat subject (§3); `None` makes the entry due to no one.
    sender: Option<String>,
    /// Its `Nats-Msg-Id`, what it is offered by; without one it is handed over as a copy.
    id: Option<String>,
}

/// One member following the feed.
struct Follower {
    session: String,
    generation: u64,
    inbox: String,
    acl: Acl,
    /// Whether the read ACL covers the channel, for `acl`'s version.
    covered: bool,
    /// The interval as last read from the registry; `None` once it is gone.
    interval: Option<Interval>,
    /// The registry's version it was read at.
    read_at: u64,
    /// Every entry up to this one was offered or was not due.
    processed: u64,
    /// Offered and not confirmed: sequence → when it was last sent.
    outstanding: BTreeMap<u64, Instant>,
    /// Due and not offered yet.
    fresh: Vec<u64>,
    /// The position last saved in the registry.
    saved: u64,
}

impl Follower {
    /// Offers sent and not confirmed: what arrived since the last offers is not counted.
    fn unconfirmed(&self) -> usize {
        self.outstanding.len().saturating_sub(self.fresh.len())
    }

    /// Every entry up to this sequence is confirmed or was not due.
    fn position(&self) -> u64 {
        self.outstanding
            .keys()
            .next()
            .map_or(self.processed, |first| first - 1)
    }

    /// Re-reads the member's identity and interval, when they changed.
    fn refresh(
        &mut self,
        identities: &Identities,
        members: &Members,
        member: &str,
        channel: &Channel,
    ) {
        let acl = self.acl.version;
        self.acl.refresh(identities, member);
        if self.acl.version != acl {
            self.covered = is_covered(&self.acl.read, channel);
        }
        let version = members.version();
        if version != self.read_at {
            self.read_at = version;
            self.interval = members.interval(member, channel.as_str(), self.generation);
        }
    }

    /// Whether `entry` is due to `member` now (§9 item 5): a valid message of someone else,
    /// inside the interval, on a channel the current read ACL covers.
    fn due(&self, member: &str, entry: &Entry) -> bool {
        let Some(sender) = &entry.sender else {
            return false;
        };
        self.acl.record.is_some()
            && self.covered
            && sender != member
            && self
                .interval
                .as_ref()
                .is_some_and(|i| i.contains(entry.seq))
    }
}

/// Entries to hand over to one member as copies: (member, its inbox, (sequence, subject)s).
type Carry = (String, String, Vec<(u64, String)>);

/// What a pass over the followers leaves to do once the feed's lock is released.
#[derive(Default)]
struct Outbox {
    /// (inbox, offers).
    offers: Vec<(String, Vec<u8>)>,
    /// Entries to hand over as copies.
    carry: Vec<Carry>,
    /// (member, generation, position) to save.
    saves: Vec<(String, u64, u64)>,
    /// Followers that stop: (member, session, generation, position).
    demote: Vec<(String, String, u64, u64)>,
}

impl Feeds {
    pub(super) fn new(
        space: Arc<Space>,
        identities: Arc<Identities>,
        members: Arc<Members>,
        demoted: mpsc::UnboundedSender<Demoted>,
    ) -> Self {
        Feeds {
            space,
            identities,
            members,
            feeds: Mutex::default(),
            demoted,
        }
    }

    /// Makes `member` (session `session`) follow `channel` where its consumer stood; false
    /// when the channel's feed is already past it (the member stays on its own consumer).
    pub(super) fn follow(
        self: &Arc<Self>,
        member: &str,
        session: &str,
        channel: &str,
        handoff: &Handoff,
        inbox: String,
        run: (&CancellationToken, &TaskTracker),
    ) -> bool {
        let position = handoff.position;
        let (Ok(name), Ok(mut feeds)) = (Channel::new(channel), self.feeds.lock()) else {
            return false;
        };
        let open = feeds
            .get(channel)
            .filter(|f| f.state.lock().is_ok_and(|s| !s.closed))
            .cloned();
        let (feed, created) = match open {
            Some(feed) => (feed, false),
            None => {
                let feed = Arc::new(Feed {
                    channel: channel.to_owned(),
                    name,
                    token: run.0.child_token(),
                    state: Mutex::new(State {
                        covered_from: position + 1,
                        ..State::default()
                    }),
                });
                feeds.insert(channel.to_owned(), feed.clone());
                (feed, true)
            }
        };
        // The follower is in before the feed's task runs, and a feed that closed meanwhile is
        // not joined (it is closed under the same lock).
        let Ok(mut state) = feed.state.lock() else {
            return false;
        };
        if state.closed || position + 1 < state.covered_from {
            return false;
        }
        let now = Instant::now();
        let mut follower = Follower {
            session: session.to_owned(),
            generation: handoff.generation,
            inbox,
            acl: Acl::unread(),
            covered: false,
            interval: None,
            read_at: u64::MAX,
            processed: handoff.taken,
            outstanding: handoff.held.iter().map(|seq| (*seq, now)).collect(),
            fresh: Vec::new(),
            saved: position,
        };
        follower.refresh(&self.identities, &self.members, member, &feed.name);
        for entry in state.buffer.iter().filter(|e| e.seq > handoff.taken) {
            consider(&mut follower, member, entry, now);
        }
        state.followers.insert(member.to_owned(), follower);
        drop(state);
        drop(feeds);
        if created {
            let feeds = self.clone();
            run.1
                .spawn(async move { feeds.read(feed, position + 1).await });
        }
        true
    }

    /// Stops `member` following `channel`; where it stood, if it did.
    pub(super) fn unfollow(&self, member: &str, channel: &str) -> Option<Stopped> {
        let feed = self.feeds.lock().ok()?.get(channel).cloned()?;
        let follower = feed.state.lock().ok()?.followers.remove(member)?;
        Some(Stopped {
            channel: channel.to_owned(),
            generation: follower.generation,
            position: follower.position(),
        })
    }

    /// Stops `member` following every channel; where it stood in each.
    pub(super) fn unfollow_all(&self, member: &str) -> Vec<Stopped> {
        let channels: Vec<String> = self
            .feeds
            .lock()
            .map(|f| f.keys().cloned().collect())
            .unwrap_or_default();
        channels
            .iter()
            .filter_map(|c| self.unfollow(member, c))
            .collect()
    }

    fn each(&self) -> Vec<Arc<Feed>> {
        self.feeds
            .lock()
            .map(|f| f.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The entries offered to `member` and not confirmed yet, over every channel it follows.
    pub(super) fn unconfirmed(&self, member: &str) -> Vec<u64> {
        self.each()
            .iter()
            .filter_map(|feed| {
                let state = feed.state.lock().ok()?;
                let follower = state.followers.get(member)?;
                Some(
                    follower
                        .outstanding
                        .keys()
                        .filter(|seq| !follower.fresh.contains(seq))
                        .copied()
                        .collect::<Vec<u64>>(),
                )
            })
            .flatten()
            .collect()
    }

    /// The member confirmed these offers (`backstop-ack` of their tokens).
    pub(super) fn confirm(&self, member: &str, seqs: &[u64]) {
        for feed in self.each() {
            if let Ok(mut state) = feed.state.lock()
                && let Some(follower) = state.followers.get_mut(member)
            {
                for seq in seqs {
                    follower.outstanding.remove(seq);
                }
            }
        }
    }

    /// The member asks for the content of these offers: those still due to it are handed over
    /// as copies.
    pub(super) async fn want(&self, member: &str, seqs: &[u64]) {
        let mut carry = Vec::new();
        for feed in self.each() {
            let Ok(mut state) = feed.state.lock() else {
                continue;
            };
            let state = &mut *state;
            let Some(follower) = state.followers.get_mut(member) else {
                continue;
            };
            follower.refresh(&self.identities, &self.members, member, &feed.name);
            let asked = seqs
                .iter()
                .copied()
                .filter(|s| follower.outstanding.contains_key(s))
                .collect();
            let items = still_due(follower, member, &state.buffer, asked);
            carry.push((member.to_owned(), follower.inbox.clone(), items));
        }
        for c in carry {
            self.hand_over(c).await;
        }
    }

    /// Hands entries over to a member as copies: each fetched by sequence and checked as a
    /// delivery (§5) first; one that fails the checks, or is too large to hand over, is handled
    /// for the member (as its own consumer acknowledges an anomaly away).
    async fn hand_over(&self, (member, inbox, items): Carry) {
        if items.is_empty() {
            return;
        }
        let Ok(stream) = self
            .space
            .jetstream()
            .get_stream_no_info(self.space.names().chat_stream())
            .await
        else {
            return;
        };
        let max_payload = self.space.nats().server_info().max_payload;
        let mut handled = Vec::new();
        let mut batches = Vec::new();
        let mut batch = CopyBatch::default();
        for (seq, subject) in items {
            let stored = match stream.direct_get(seq).await {
                Ok(stored) => stored,
                // Evicted by the channel's retention: nothing is left to hand over (§4
                // "within retention").
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => {
                    handled.push(seq);
                    continue;
                }
                // Handed over again after the handoff timeout.
                Err(_) => continue,
            };
            let token = format!("f{seq}");
            let framed = CopyBatch::framed_len(&subject, &token, &stored.payload);
            let checked = accept_delivery(
                &subject,
                Some(&stored.headers),
                None,
                &stored.payload,
                max_payload,
            );
            let valid = match checked {
                Ok(a) => a.kind == DeliveryKind::Channel,
                Err(rejection) => {
                    self.space
                        .refusals()
                        .refuse("backstop", &subject, &rejection);
                    false
                }
            };
            if !valid || framed > max_payload {
                handled.push(seq);
                continue;
            }
            if !batch.is_empty() && batch.len() + framed > max_payload {
                batches.push(std::mem::take(&mut batch));
            }
            batch.push(&subject, &token, &stored.payload);
        }
        if !handled.is_empty() {
            tracing::debug!(
                member,
                ?handled,
                "entries not handed over: anomalies (§5) or too large"
            );
            self.confirm(&member, &handled);
        }
        batches.push(batch);
        for batch in batches.into_iter().filter(|b| !b.is_empty()) {
            if let Err(e) = self
                .space
                .nats()
                .publish(inbox.clone(), batch.into_body().into())
                .await
            {
                // Handed over again after the handoff timeout.
                tracing::debug!(member, error = %e, "copies not sent");
            }
        }
    }

    async fn open(&self, channel: &str, start: u64) -> Result<pull::Ordered, String> {
        let names = self.space.names();
        self.space
            .jetstream()
            .get_stream(names.chat_stream())
            .await
            .map_err(|e| e.to_string())?
            .create_consumer(pull::OrderedConfig {
                filter_subject: names.posts_on(channel),
                headers_only: true,
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: start,
                },
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?
            .messages()
            .await
            .map_err(|e| e.to_string())
    }

    /// The feed's task: reads the channel from `start`, offers every [`LINGER`], and stops when
    /// no one follows any more (or the reader stops).
    async fn read(self: Arc<Self>, feed: Arc<Feed>, start: u64) {
        let messages = match self.open(&feed.channel, start).await {
            Ok(m) => Some(m),
            Err(error) => {
                tracing::warn!(
                    channel = feed.channel,
                    error,
                    "feed not opened: its followers go back to their consumers"
                );
                None
            }
        };
        if let Some(messages) = messages {
            let mut ready = messages.ready_chunks(BATCH);
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + LINGER, LINGER);
            let mut checkpoint = Instant::now();
            loop {
                tokio::select! {
                    () = feed.token.cancelled() => break,
                    next = ready.next() => match next {
                        Some(chunk) => self.take(&feed, chunk),
                        None => break,
                    },
                    _ = tick.tick() => {
                        let save = checkpoint.elapsed() >= CHECKPOINT_EVERY;
                        if save {
                            checkpoint = Instant::now();
                        }
                        if !self.flush(&feed, save).await {
                            return;
                        }
                    }
                }
            }
        }
        // Stopped with followers: each goes back to its own consumer from where it stood.
        let outbox = {
            let Ok(mut state) = feed.state.lock() else {
                return;
            };
            state.closed = true;
            let mut outbox = Outbox::default();
            for (member, f) in state.followers.drain() {
                let position = f.position();
                outbox
                    .demote
                    .push((member, f.session, f.generation, position));
            }
            outbox
        };
        self.deliver(&feed, outbox).await;
    }

    /// Takes a chunk of entries (subjects and headers): each considered for every follower.
    fn take(&self, feed: &Feed, chunk: Vec<Result<jetstream::Message, pull::OrderedError>>) {
        let Ok(mut state) = feed.state.lock() else {
            return;
        };
        let state = &mut *state;
        for (member, follower) in state.followers.iter_mut() {
            follower.refresh(&self.identities, &self.members, member, &feed.name);
        }
        let now = Instant::now();
        for msg in chunk {
            let msg = match msg {
                Ok(msg) => msg,
                Err(e) => {
                    tracing::debug!(channel = feed.channel, error = %e, "feed read error");
                    continue;
                }
            };
            let Ok(info) = msg.info() else { continue };
            let seq = info.stream_sequence;
            let subject = msg.subject.as_str();
            let sender = parse_subject(subject)
                .ok()
                .filter(|p| p.kind == SubjectKind::Chat)
                .map(|p| p.sender.to_owned());
            let id = msg
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .map(|id| id.as_str().to_owned());
            let entry = Entry {
                seq,
                subject: subject.to_owned(),
                sender,
                id,
            };
            for (member, follower) in state.followers.iter_mut() {
                consider(follower, member, &entry, now);
            }
            state.buffer.push_back(entry);
        }
    }

    /// Every [`LINGER`]: offers what is fresh, hands over again what waited too long, saves
    /// positions that moved (when `save`), lets go of entries every follower passed, and
    /// stops followers that fell behind or left. False when no one follows any more.
    async fn flush(&self, feed: &Feed, save: bool) -> bool {
        let max_payload = self.space.nats().server_info().max_payload;
        let (outbox, alive) = {
            let Ok(mut state) = feed.state.lock() else {
                return false;
            };
            let state = &mut *state;
            let mut outbox = Outbox::default();
            let mut stopping = Vec::new();
            for (member, follower) in state.followers.iter_mut() {
                follower.refresh(&self.identities, &self.members, member, &feed.name);
                match &follower.interval {
                    // Gone (delivered, or the identity forgotten): nothing to save.
                    None => {
                        stopping.push((member.clone(), false));
                        continue;
                    }
                    // Left: the leave boundary is kept by its consumer, from where it stood.
                    Some(i) if i.leave_cursor.is_some() => {
                        stopping.push((member.clone(), true));
                        continue;
                    }
                    Some(_) => {}
                }
                let unconfirmed = follower.unconfirmed();
                if unconfirmed > MAX_OUTSTANDING {
                    tracing::debug!(
                        member,
                        channel = feed.channel,
                        unconfirmed,
                        "a follower that does not confirm goes back to its consumer"
                    );
                    stopping.push((member.clone(), true));
                    continue;
                }
                offer(follower, member, &state.buffer, max_payload, &mut outbox);
                let position = follower.position();
                if save && position > follower.saved {
                    follower.saved = position;
                    outbox
                        .saves
                        .push((member.clone(), follower.generation, position));
                }
            }
            let behind = state.behind(&stopping);
            if !behind.is_empty() {
                tracing::debug!(
                    channel = feed.channel,
                    ?behind,
                    "followers behind go back to their consumers"
                );
            }
            stopping.extend(behind.into_iter().map(|m| (m, true)));
            for (member, restart) in stopping {
                if let Some(f) = state.followers.remove(&member) {
                    let position = f.position();
                    match restart {
                        true => outbox
                            .demote
                            .push((member, f.session, f.generation, position)),
                        false => tracing::debug!(
                            member,
                            channel = feed.channel,
                            "follower's interval is gone"
                        ),
                    }
                }
            }
            state.trim();
            let alive = !state.followers.is_empty();
            if !alive {
                state.closed = true;
            }
            (outbox, alive)
        };
        if !alive
            && let Ok(mut feeds) = self.feeds.lock()
            && feeds
                .get(&feed.channel)
                .is_some_and(|f| std::ptr::eq(Arc::as_ptr(f), feed))
        {
            feeds.remove(&feed.channel);
        }
        self.deliver(feed, outbox).await;
        alive
    }

    /// Sends, saves and demotes what a pass left to do.
    async fn deliver(&self, feed: &Feed, outbox: Outbox) {
        for (inbox, body) in outbox.offers {
            let mut headers = HeaderMap::new();
            headers.insert(BATCH_KIND, OFFERS);
            let sent = self
                .space
                .nats()
                .publish_with_headers(inbox, headers, body.into())
                .await;
            if let Err(e) = sent {
                // Handed over as copies after the handoff timeout.
                tracing::debug!(channel = feed.channel, error = %e, "offers not sent");
            }
        }
        for carry in outbox.carry {
            self.hand_over(carry).await;
        }
        for (member, generation, position) in outbox.saves {
            self.save(&member, &feed.channel, generation, position)
                .await;
        }
        for (member, session, generation, position) in outbox.demote {
            self.save(&member, &feed.channel, generation, position)
                .await;
            let _ = self.demoted.send(Demoted {
                member,
                session,
                channel: feed.channel.clone(),
                generation,
            });
        }
    }

    /// Saves a member's position in one interval as its `delivered` (a follower's, or a parked
    /// consumer's ack floor); a failure only means entries are handed over again.
    pub(super) async fn save(&self, member: &str, channel: &str, generation: u64, position: u64) {
        let saved = self
            .members
            .update(member, channel, |stored| {
                stored.map(|mut r| {
                    for i in r
                        .intervals
                        .iter_mut()
                        .filter(|i| i.generation == generation)
                    {
                        i.delivered = i.delivered.max(position);
                    }
                    r
                })
            })
            .await;
        if let Err(e) = saved {
            tracing::warn!(member, channel, error = %e, "backstop position not saved; entries will be handed over again");
        }
    }
}

/// Considers one entry for one follower: due ones wait to be offered.
fn consider(follower: &mut Follower, member: &str, entry: &Entry, now: Instant) {
    if entry.seq <= follower.processed {
        return;
    }
    follower.processed = entry.seq;
    if follower.due(member, entry) {
        follower.fresh.push(entry.seq);
        follower.outstanding.insert(entry.seq, now);
    }
}

/// Fills `outbox` with the follower's fresh offers, and the entries to hand over as copies:
/// those without an id the offers can carry, and offers that waited too long.
fn offer(
    follower: &mut Follower,
    member: &str,
    buffer: &VecDeque<Entry>,
    max_payload: usize,
    outbox: &mut Outbox,
) {
    let now = Instant::now();
    let mut carried = Vec::new();
    let mut batch = OfferBatch::default();
    for seq in std::mem::take(&mut follower.fresh) {
        let Some(entry) = find(buffer, seq) else {
            continue;
        };
        let token = format!("f{seq}");
        let id = entry.id.as_deref().unwrap_or_default();
        if batch.len() + entry.subject.len() + token.len() + id.len() + 3 > max_payload {
            let full = std::mem::take(&mut batch).into_body();
            outbox.offers.push((follower.inbox.clone(), full));
        }
        if !batch.push(&entry.subject, &token, id) {
            carried.push(seq);
        }
    }
    if !batch.is_empty() {
        outbox
            .offers
            .push((follower.inbox.clone(), batch.into_body()));
    }
    carried.extend(
        follower
            .outstanding
            .iter()
            .filter(|(_, sent)| now.duration_since(**sent) >= HANDOFF_TIMEOUT)
            .map(|(seq, _)| *seq),
    );
    if !carried.is_empty() {
        let items = still_due(follower, member, buffer, carried);
        outbox
            .carry
            .push((member.to_owned(), follower.inbox.clone(), items));
    }
}

/// The entries of `seqs` still due to the follower, as (sequence, subject), each marked as
/// sent now (sent again only after [`HANDOFF_TIMEOUT`]). One no longer due is handled for it
/// (as its own consumer acknowledged such an entry away).
fn still_due(
    follower: &mut Follower,
    member: &str,
    buffer: &VecDeque<Entry>,
    seqs: Vec<u64>,
) -> Vec<(u64, String)> {
    let now = Instant::now();
    let mut out = Vec::new();
    for seq in seqs {
        match find(buffer, seq).filter(|e| follower.due(member, e)) {
            Some(entry) => {
                follower.outstanding.insert(seq, now);
                out.push((seq, entry.subject.clone()));
            }
            None => {
                follower.outstanding.remove(&seq);
            }
        }
    }
    out
}

/// The buffered entry of sequence `seq`.
fn find(buffer: &VecDeque<Entry>, seq: u64) -> Option<&Entry> {
    buffer
        .binary_search_by_key(&seq, |e| e.seq)
        .ok()
        .and_then(|i| buffer.get(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_not_offered_yet_is_not_counted_as_unconfirmed() {
        let mut follower = Follower {
            session: "s".into(),
            generation: 1,
            inbox: "_INBOX_x.backstop".into(),
            acl: Acl::unread(),
            covered: true,
            interval: None,
            read_at: 0,
            processed: 0,
            outstanding: BTreeMap::new(),
            fresh: Vec::new(),
            saved: 0,
        };
        let now = Instant::now();
        // A burst of four windows arrived since the last offers: due, not offered yet.
        for seq in 1..=4 * WINDOW as u64 {
            follower.processed = seq;
            follower.fresh.push(seq);
            follower.outstanding.insert(seq, now);
        }
        assert_eq!(follower.unconfirmed(), 0);
        assert_eq!(follower.position(), 0);
        // Offered and never confirmed: that member goes back to its consumer.
        follower.fresh.clear();
        assert!(follower.unconfirmed() > MAX_OUTSTANDING);
        // Confirmed up to the last: its position is the last entry.
        follower.outstanding.clear();
        assert_eq!(follower.position(), 4 * WINDOW as u64);
    }
}
