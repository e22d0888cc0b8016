//! A pump: reads one consumer of one member's session and hands the authorized entries over as
//! copies (§8), re-authorizing each against the member's current read ACL and membership
//! interval first (§9 item 5). A pump of a member that takes offers hands its interval over to
//! the channel's feed once it has caught up ([`super::follow`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{Consumer, pull};
use async_nats::jetstream::{self, AckKind};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::follow::{self, Feeds};
use super::range::{Granted, Grants};
use super::session::{Held, Session};
use super::{Acl, BATCH, Backstop, HANDOFF_TIMEOUT, LINGER, token_seq};
use crate::binding::backlog::Backlog;
use crate::binding::backstop_inbox;
use crate::binding::frame::header_rejection;
use crate::ops::{COPY_SUBJECT, CopyBatch};
use crate::protocol::{
    Channel, Rejection, SubjectKind, accept_delivery, is_covered, parse_subject,
};
use crate::space::members::{Interval, Members};
use crate::space::{Identities, Space};

/// What one consumer of a member reads.
#[derive(Debug, Clone)]
pub(super) enum Source {
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

/// Reads one consumer of one member's session and hands authorized copies over.
pub(super) struct Pump {
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
    /// The session's grants when the member reads its backlogs itself ([`super::range`]).
    grants: Option<Arc<Grants>>,
    /// The highest sequence this pump took (handed over, or handled as not due).
    taken: AtomicU64,
    /// Set when copies could not be sent (they were nak'ed, for the consumer to deliver
    /// again): the interval then stays on its consumer for the session.
    unsent: AtomicBool,
}

impl Pump {
    /// The pump of `member`'s `consumer`, which reads `source`, in `session`; `run` is the
    /// reader's token and tracker.
    pub(super) fn new(
        backstop: &Backstop,
        member: &str,
        consumer: String,
        source: Source,
        session: &Session,
        run: (CancellationToken, TaskTracker),
    ) -> Self {
        let space = &backstop.space;
        Pump {
            space: space.clone(),
            identities: backstop.identities.clone(),
            members: backstop.members.clone(),
            member: member.to_owned(),
            stream: match source {
                Source::Chat { .. } => space.names().chat_stream(),
                Source::Mention => space.names().backstop_stream(),
            },
            consumer,
            source,
            max_payload: space.nats().server_info().max_payload,
            held: session.held.clone(),
            inbox: backstop_inbox(member),
            session: session.offers.then(|| session.name.clone()),
            feeds: backstop.feeds.clone(),
            run,
            grants: session.ranges.then(|| session.grants.clone()),
            taken: AtomicU64::new(0),
            unsent: AtomicBool::new(false),
        }
    }

    /// The consumer's messages; bound again shortly after a failure (the broker restarting, or
    /// the connection being dialed again), so the member's delivery goes on. `None` once the
    /// consumer is gone (parked, drained, or the identity revoked) or the pump is cancelled.
    /// With them, what the consumer held when it was bound. `made` is the consumer as it was
    /// just made, its info in hand: the first bind asks the broker nothing more.
    async fn messages(
        &self,
        token: &CancellationToken,
        made: &mut Option<Consumer<pull::Config>>,
    ) -> Option<(pull::Stream, Backlog)> {
        loop {
            let found = match made.take() {
                Some(made) => Ok(made),
                None => {
                    self.space
                        .jetstream()
                        .get_consumer_from_stream::<pull::Config, _, _>(
                            &self.consumer,
                            &self.stream,
                        )
                        .await
                }
            };
            let bound = match found {
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
    /// told ([`crate::ops::CAUGHT_UP`]), after those copies. `made` is the consumer as the
    /// session's start made it.
    pub(super) async fn run(self, token: CancellationToken, made: Consumer<pull::Config>) {
        let mut made = Some(made);
        let mut acl = Acl::unread();
        if !self.grant_range(&token, &mut acl, &mut made).await {
            return;
        }
        // What the consumer held when the session started, until the member is told.
        let mut owed: Option<Backlog> = None;
        let every = follow::CHECKPOINT_EVERY;
        let mut checkpoint = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let mut saved = 0;
        let mut told = self.session.is_none();
        while !token.is_cancelled() {
            let Some((messages, at_bind)) = self.messages(&token, &mut made).await else {
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
                    _ = checkpoint.tick() => {
                        self.checkpoint(&mut saved).await;
                        continue;
                    }
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

    /// Saves the consumer's ack floor as the interval's position when it moved past `saved`
    /// (what a broker restart would otherwise take with the consumer, see
    /// [`super::consumers`]); asks the broker only while entries taken are not all acknowledged.
    async fn checkpoint(&self, saved: &mut u64) {
        let Source::Chat { channel, interval } = &self.source else {
            return;
        };
        if self.taken.load(Ordering::Acquire) <= *saved {
            return;
        }
        let Ok(consumer) = self
            .space
            .jetstream()
            .get_consumer_from_stream::<pull::Config, _, _>(&self.consumer, &self.stream)
            .await
        else {
            return;
        };
        let floor = consumer.cached_info().ack_floor.stream_sequence;
        if floor > *saved {
            self.feeds
                .save(&self.member, channel, interval.generation, floor)
                .await;
            *saved = floor;
        }
    }

    /// For a member that reads ranges ([`super::range`]): the backlog of this open interval,
    /// when it is more than a batch, granted as one range; the member's progress is saved as
    /// the interval's position as it comes. Once the range is handled (or declined, or left
    /// without progress for [`HANDOFF_TIMEOUT`]) the consumer is made again from that position,
    /// for what came since. False when the session ended meanwhile.
    /// `made` is the consumer as it was just made: one whose backlog is less than a batch is
    /// not granted and stays for the first bind; otherwise the grant asks the broker afresh,
    /// and so does the bind after it.
    async fn grant_range(
        &self,
        token: &CancellationToken,
        acl: &mut Acl,
        made: &mut Option<Consumer<pull::Config>>,
    ) -> bool {
        let (Some(grants), Source::Chat { channel, .. }) = (&self.grants, &self.source) else {
            return true;
        };
        let Some(open) = self.current_interval().filter(|i| i.leave_cursor.is_none()) else {
            return true;
        };
        acl.refresh(&self.identities, &self.member);
        let covered = Channel::new(channel).is_ok_and(|c| is_covered(&acl.read, &c));
        if acl.record.is_none() || !covered {
            return true;
        }
        let small = |c: &Consumer<pull::Config>| c.cached_info().num_pending < BATCH as u64;
        if made.as_ref().is_some_and(small) {
            return true;
        }
        *made = None;
        let Ok(stream) = self.space.jetstream().get_stream(&self.stream).await else {
            return true;
        };
        let Ok(info) = stream.consumer_info(&self.consumer).await else {
            return true;
        };
        // Only a consumer with nothing in flight: its ack floor is where the range starts.
        let after = info.ack_floor.stream_sequence;
        let count = info.num_pending;
        if info.num_ack_pending > 0
            || info.delivered.stream_sequence != after
            || count < BATCH as u64
        {
            return true;
        }
        let (grant, progress) = grants.open(after, count);
        let subject = self.space.names().posts_on(channel);
        // The stream's last entry as it was just before the consumer was asked: the range ends
        // there (what came between is delivered from the consumer after it).
        let last = stream.cached_info().state.last_sequence;
        let range = crate::ops::Range {
            subject: &subject,
            after,
            last,
            count,
            grant,
        };
        let sent = self.tell(crate::ops::RANGE, range.to_body()).await;
        let stood = match sent {
            Ok(()) => {
                self.await_range(channel, &open, count, progress, token)
                    .await
            }
            Err(e) => {
                tracing::debug!(member = self.member, error = %e, "range not granted");
                None
            }
        };
        grants.close(grant);
        let Some(position) = stood else {
            return false;
        };
        if position > after {
            self.taken.fetch_max(position, Ordering::AcqRel);
            // Made again from the position: what it would deliver up to it is handled.
            let mut from = open.clone();
            from.delivered = from.delivered.max(position);
            let config =
                super::consumers::interval_config(&self.space, &self.member, channel, &from);
            let _ = stream.delete_consumer(&self.consumer).await;
            if let Err(e) = stream.create_consumer(config).await {
                tracing::debug!(member = self.member, error = %e, "consumer not made again; made at the next session");
            }
        }
        !token.is_cancelled()
    }

    /// Waits for the member's progress on a range of `count` entries, saving its position as
    /// it comes; the position it reached once the range is handled, declined or left without
    /// progress, `None` if the session ended first (its position saved too).
    async fn await_range(
        &self,
        channel: &str,
        interval: &Interval,
        count: u64,
        mut progress: tokio::sync::watch::Receiver<Granted>,
        token: &CancellationToken,
    ) -> Option<u64> {
        let mut saved = progress.borrow().position;
        let save = |position: u64| {
            self.feeds
                .save(&self.member, channel, interval.generation, position)
        };
        loop {
            let ended = tokio::select! {
                () = token.cancelled() => true,
                changed = progress.changed() => changed.is_err(),
                () = tokio::time::sleep(HANDOFF_TIMEOUT) => {
                    tracing::debug!(member = self.member, channel, "a range left without progress: its entries go as copies");
                    return Some(saved);
                }
            };
            let now = *progress.borrow_and_update();
            if now.position > saved {
                save(now.position).await;
                saved = now.position;
            }
            if ended {
                return None;
            }
            if now.declined || now.handled >= count {
                return Some(saved);
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
        let body = crate::ops::caught_up_body(session, &self.consumer);
        if let Err(e) = self.tell(crate::ops::CAUGHT_UP, body).await {
            tracing::debug!(member = self.member, error = %e, "caught-up not sent");
        }
    }

    /// Sends the member a message of `kind` ([`crate::ops::BATCH_KIND`]) on its backstop inbox.
    async fn tell(
        &self,
        kind: &'static str,
        body: String,
    ) -> Result<(), async_nats::client::PublishError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(crate::ops::BATCH_KIND, kind);
        self.space
            .nats()
            .publish_with_headers(self.inbox.clone(), headers, body.into())
            .await
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
        let Some((stream, info)) = self.consumer_now().await else {
            return false;
        };
        if info.num_pending > follow::HAND_OVER_PENDING || self.unsent.load(Ordering::Acquire) {
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

    /// This pump's consumer as the broker has it now, with its stream's handle (one
    /// `CONSUMER.INFO`); `None` when the broker cannot say.
    async fn consumer_now(
        &self,
    ) -> Option<(jetstream::stream::Stream<()>, jetstream::consumer::Info)> {
        let stream = self
            .space
            .jetstream()
            .get_stream_no_info(&self.stream)
            .await
            .ok()?;
        let info = stream.consumer_info(&self.consumer).await.ok()?;
        Some((stream, info))
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
        let Some((stream, info)) = self.consumer_now().await else {
            return Flow::Continue;
        };
        let floor = info.ack_floor.stream_sequence;
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

/// Whether a consumer lookup failed because the consumer does not exist.
fn is_not_found(e: &jetstream::stream::ConsumerError) -> bool {
    matches!(e.kind(), jetstream::stream::ConsumerErrorKind::JetStream(js)
        if js.error_code() == jetstream::ErrorCode::CONSUMER_NOT_FOUND)
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
