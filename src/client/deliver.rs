//! Receiving (§4, §5, §8). Every copy is validated by `protocol::accept_delivery`: the subject
//! must parse, `from.id` must equal the subject sender, the payload must be UTF-8 JSON of the
//! message shape; the delivery kind comes from the subject only. Rejected JetStream copies are
//! terminated (never redelivered) and reported; the live copy is never acked.
//!
//! Channel copies (live, backfill, and the durable backstop's) are one logical delivery: they
//! are deduplicated by (sender, `id`). The durable copy owns the ack (§4): it is surfaced with
//! an ack handle, and when its message was already surfaced (live or backfill) it is
//! acknowledged at once. DM and anycast copies come from their own consumers and are handed to
//! the application with an explicit ack handle: acked only once handled, nak on a transient
//! failure.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::{Client, ClientError, nats_err};
use crate::binding::frame::accept_delivery;
use crate::protocol::{CotalMessage, DeliveryKind, RejectReason, parse_subject};

/// How many DM or anycast copies are pulled ahead of the application.
const PULL_BATCH: usize = 64;

/// How many message ids the dedup window remembers.
const SEEN_CAPACITY: usize = 65_536;

/// How long receiving stops later, at most, for the durable copies of what was surfaced live
/// on a durable channel: acknowledged as duplicates, they are not handed to the next session.
pub(crate) const SETTLE: Duration = Duration::from_secs(2);

/// One surfaced message.
pub struct Delivery {
    /// The message.
    pub message: CotalMessage,
    /// How it was addressed to us, from the subject (§4).
    pub kind: DeliveryKind,
    /// A history backfill copy (§7). A copy owed to this member of the same message (its
    /// durable backlog, a mention's copy) is not surfaced again (§7: a message surfaces once);
    /// it is acknowledged once this one is.
    pub historical: bool,
    /// The channel, for channel deliveries (the subject's tokens 4+).
    pub channel: Option<String>,
    /// A durable backstop copy (§4 `durable`, §8 trusted reader): at-least-once, acked.
    pub durable: bool,
    /// What acknowledging this copy means.
    ack: Ack,
}

/// How a surfaced copy is acknowledged.
enum Ack {
    /// Live and backfill copies: nothing to acknowledge.
    None,
    /// DM and anycast copies: the JetStream message.
    Stream(Box<jetstream::Message>),
    /// Durable copies: the trusted reader's token, acknowledged through `ctl.manager`.
    Backstop(BackstopToken),
    /// A live copy on a channel this member holds durably: its ack lets the durable copy of
    /// the same message be acknowledged (the application handled it), never sooner.
    Live(LiveAck),
}

/// What the ack of a live copy settles: the durable copy of the same message (of a durable
/// channel this member holds, or the mention copy of a post that names it).
pub(crate) struct LiveAck {
    handover: std::sync::Arc<Mutex<Handover>>,
    key: String,
    /// Whether a durable copy comes for certain (a durable channel's): handled before it came,
    /// it is awaited as the session closes. A mention copy is not certain (the router copies
    /// only to the one instance a name designates): handled first, it is settled when it
    /// comes, with nothing waiting for it.
    awaits: bool,
}

/// Live copies and their durable copies (on durable channels, and the mention copies of posts
/// that name this member): a durable copy is acknowledged once the application handled the
/// live copy of its message, so a message surfaced live but never handled is delivered again
/// to the next session, and one handled is not.
#[derive(Default)]
struct Handover {
    /// Surfaced live, not handled yet; with the durable copy's token once it came.
    unhandled: std::collections::HashMap<String, Option<BackstopToken>>,
    /// Handled, the durable copy not come yet.
    awaiting: HashSet<String>,
}

/// What a durable copy's acknowledgement settles, and where acknowledgements are batched.
pub(crate) struct BackstopToken {
    settles: Settles,
    acks: mpsc::UnboundedSender<Acked>,
}

/// What the ack batcher is handed: a token, or a range with news of its progress, whose token
/// the batcher takes when it sends (so a range's progress goes once per batch, however many of
/// its entries were handled meanwhile).
pub(crate) enum Acked {
    /// A copy's or an offer's token, or a range declined.
    Token(String),
    /// A range whose progress moved since its last token.
    Range(std::sync::Arc<super::range::RangeRead>),
}

/// What acknowledging a durable copy tells the trusted reader.
enum Settles {
    /// A copy the reader handed over, or an offer: its token.
    Copy(String),
    /// An entry of a range this member reads itself: its stream sequence.
    Range(std::sync::Arc<super::range::RangeRead>, u64),
}

impl BackstopToken {
    /// The token of a copy or an offer.
    pub(crate) fn copy(token: &str, acks: &mpsc::UnboundedSender<Acked>) -> Self {
        BackstopToken {
            settles: Settles::Copy(token.to_owned()),
            acks: acks.clone(),
        }
    }

    /// An entry of a range this member reads ([`super::range`]).
    pub(crate) fn range(
        read: std::sync::Arc<super::range::RangeRead>,
        seq: u64,
        acks: &mpsc::UnboundedSender<Acked>,
    ) -> Self {
        BackstopToken {
            settles: Settles::Range(read, seq),
            acks: acks.clone(),
        }
    }

    /// The token to ask the content of an offer with.
    pub(crate) fn into_offer(self) -> Option<String> {
        match self.settles {
            Settles::Copy(token) => Some(token),
            Settles::Range(..) => None,
        }
    }

    fn ack(self) {
        let acked = match self.settles {
            Settles::Copy(token) => Some(Acked::Token(token)),
            Settles::Range(read, seq) => read.handled(seq).then_some(Acked::Range(read)),
        };
        // The batcher is gone only once the client is closed: the copy is then delivered again
        // to the next connection, which at-least-once allows.
        if let Some(acked) = acked {
            let _ = self.acks.send(acked);
        }
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("id", &self.message.id)
            .field("kind", &self.kind)
            .field("historical", &self.historical)
            .field("channel", &self.channel)
            .field("durable", &self.durable)
            .field("needs_ack", &self.needs_ack())
            .finish()
    }
}

impl Delivery {
    /// Whether this copy is at-least-once and waits for [`Delivery::ack`].
    pub fn needs_ack(&self) -> bool {
        !matches!(self.ack, Ack::None | Ack::Live(_))
    }

    /// Confirms the message was handled, so that it is not delivered again. A no-op for live
    /// and backfill copies. Nothing waits for the broker's confirmation: a DM or anycast ack
    /// is sent on the connection, a durable copy's is batched with others for the trusted
    /// reader. An acknowledgement lost to a broken connection means the copy is delivered
    /// again (after `ack_wait`, or on the next connection), which at-least-once allows (§4);
    /// waiting for a confirmation of every ack would cost a round trip per message and
    /// guarantee nothing more.
    pub async fn ack(self) -> Result<(), ClientError> {
        match self.ack {
            Ack::Stream(m) => m.ack().await.map_err(nats_err("ack")),
            Ack::Backstop(token) => {
                token.ack();
                Ok(())
            }
            Ack::Live(live) => {
                let mut handover = live.handover.lock().unwrap_or_else(|e| e.into_inner());
                match handover.unhandled.remove(&live.key) {
                    Some(Some(token)) => token.ack(),
                    Some(None) if live.awaits => {
                        handover.awaiting.insert(live.key);
                    }
                    Some(None) | None => {}
                }
                Ok(())
            }
            Ack::None => Ok(()),
        }
    }

    /// As [`Delivery::ack`], waiting for the broker to confirm a DM's or anycast copy's ack (a
    /// round trip): an error then means the copy may come again. A durable copy's ack is
    /// batched, and confirmed only as the session closes (see [`super::Settled`]).
    pub async fn ack_confirmed(self) -> Result<(), ClientError> {
        match self.ack {
            Ack::Stream(m) => m.double_ack().await.map_err(nats_err("ack")),
            _ => self.ack().await,
        }
    }

    /// Tells the broker this copy is still being held (JetStream's in-progress ack): its
    /// `ack_wait` starts again, so an application that holds a copy longer than `ack_wait`
    /// before handling it is not handed a second copy. A no-op for live, backfill and durable
    /// copies (the trusted reader extends a held durable copy by itself).
    pub async fn in_progress(&self) -> Result<(), ClientError> {
        match &self.ack {
            Ack::Stream(m) => m
                .ack_with(AckKind::Progress)
                .await
                .map_err(nats_err("in-progress ack")),
            Ack::Backstop(_) | Ack::Live(_) | Ack::None => Ok(()),
        }
    }

    /// Asks for redelivery (a transient failure). A no-op for live and backfill copies; a
    /// durable copy left unacknowledged is handed over again by the trusted reader after its
    /// handoff timeout, or at the next connection.
    pub async fn nak(self) -> Result<(), ClientError> {
        match self.ack {
            Ack::Stream(m) => m
                .ack_with(AckKind::Nak(None))
                .await
                .map_err(nats_err("nak")),
            Ack::Backstop(_) | Ack::Live(_) | Ack::None => Ok(()),
        }
    }
}

#[cfg(test)]
impl Delivery {
    /// A live channel copy, for tests of what consumes deliveries.
    pub(crate) fn live(message: CotalMessage, channel: &str) -> Delivery {
        Delivery {
            message,
            kind: DeliveryKind::Channel,
            historical: false,
            channel: Some(channel.to_owned()),
            durable: false,
            ack: Ack::None,
        }
    }

    /// A DM, for tests of what consumes deliveries (nothing to acknowledge).
    pub(crate) fn dm(message: CotalMessage) -> Delivery {
        Delivery {
            message,
            kind: DeliveryKind::Dm,
            historical: false,
            channel: None,
            durable: false,
            ack: Ack::None,
        }
    }
}

/// A message that was not surfaced, and why (§5 rejection reasons).
#[derive(Debug, Clone)]
pub struct Anomaly {
    /// The delivering subject.
    pub subject: String,
    /// The advisory reason token.
    pub reason: RejectReason,
    /// What exactly was wrong.
    pub detail: String,
}

/// Something the application should know about besides messages.
#[derive(Debug, Clone)]
pub enum Notice {
    /// A message was rejected (and, if it was a JetStream copy, terminated).
    Rejected(Anomaly),
    /// The broker refused a joined channel's subscription after the join (§7): it was dropped.
    ChannelDropped {
        /// The channel.
        channel: String,
    },
    /// Live messages published on a joined channel while the connection was down (since the
    /// Unix second `since`) may be missed: the channel's history may not be read to recover
    /// them (§7 `replay = false`), or the read failed.
    Gap {
        /// The channel.
        channel: String,
        /// Roughly when the connection dropped (Unix seconds).
        since: i64,
    },
    /// The DM or anycast consumer failed; the client rebinds it.
    ConsumerLost {
        /// The durable.
        durable: String,
        /// Why.
        reason: String,
    },
}

/// The receiving end: messages and notices.
pub struct Deliveries {
    messages: mpsc::Receiver<Delivery>,
    notices: mpsc::UnboundedReceiver<Notice>,
}

impl Deliveries {
    /// The next message; `None` once the client is gone.
    pub async fn next(&mut self) -> Option<Delivery> {
        self.messages.recv().await
    }

    /// The next notice.
    pub async fn next_notice(&mut self) -> Option<Notice> {
        self.notices.recv().await
    }

    /// A notice, if one is waiting.
    pub fn try_notice(&mut self) -> Option<Notice> {
        self.notices.try_recv().ok()
    }

    /// The next message or notice, whichever comes first; `None` once the client is gone.
    pub async fn next_event(&mut self) -> Option<Event> {
        tokio::select! {
            Some(n) = self.notices.recv() => Some(Event::Notice(n)),
            m = self.messages.recv() => m.map(|m| Event::Message(Box::new(m))),
        }
    }
}

/// A message or a notice.
#[derive(Debug)]
pub enum Event {
    /// A surfaced message.
    Message(Box<Delivery>),
    /// Something else to know.
    Notice(Notice),
}

/// The sending end, shared by every pump.
pub(crate) struct Sink {
    messages: mpsc::Sender<Delivery>,
    notices: mpsc::UnboundedSender<Notice>,
    seen: Mutex<Seen>,
    max_payload: usize,
    own_id: String,
    /// The names a mention of this member is written with (lower case, §5): its card's and
    /// its credential's.
    own_names: Vec<String>,
    /// Whether durable copies reach this connection (the backstop inbox is read).
    durable_copies: std::sync::atomic::AtomicBool,
    /// The channels this member holds a durable membership of.
    durable_channels: Mutex<HashSet<String>>,
    /// Live copies surfaced on those channels, and their durable copies.
    handover: std::sync::Arc<Mutex<Handover>>,
    /// Told when a handled message's durable copy is acknowledged.
    settled: std::sync::Arc<tokio::sync::Notify>,
    /// Learns the name of each sender whose message is surfaced (to address it while away).
    roster: super::Roster,
    /// How many messages were surfaced.
    surfaced: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Seen {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl Seen {
    /// Records `id`; false when it was already there.
    fn first(&mut self, id: &str) -> bool {
        if self.ids.contains(id) {
            return false;
        }
        if self.order.len() == SEEN_CAPACITY
            && let Some(old) = self.order.pop_front()
        {
            self.ids.remove(&old);
        }
        self.ids.insert(id.to_owned());
        self.order.push_back(id.to_owned());
        true
    }
}

pub(crate) fn channel(
    max_payload: usize,
    own_id: String,
    own_names: &[&str],
    roster: super::Roster,
) -> (Sink, Deliveries) {
    let (messages, rx) = mpsc::channel(1024);
    let (notices, notices_rx) = mpsc::unbounded_channel();
    (
        Sink {
            messages,
            notices,
            seen: Mutex::new(Seen::default()),
            max_payload,
            own_id,
            own_names: crate::protocol::normalize_mentions(own_names),
            durable_copies: std::sync::atomic::AtomicBool::new(false),
            durable_channels: Mutex::default(),
            handover: std::sync::Arc::default(),
            settled: std::sync::Arc::default(),
            roster,
            surfaced: Default::default(),
        },
        Deliveries {
            messages: rx,
            notices: notices_rx,
        },
    )
}

impl Sink {
    pub(crate) fn notice(&self, notice: Notice) {
        let _ = self.notices.send(notice);
    }

    /// Records that durable copies reach this connection: only then is a message surfaced
    /// live on a durable channel awaited in its durable copy.
    pub(crate) fn receiving_durable_copies(&self) {
        self.durable_copies
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Records that this member holds (or no longer holds) a durable membership of `channel`.
    pub(crate) fn durable_member(&self, channel: &str, member: bool) {
        if let Ok(mut channels) = self.durable_channels.lock() {
            match member {
                true => channels.insert(channel.to_owned()),
                false => channels.remove(channel),
            };
        }
    }

    /// Waits, at most `bound`, until every message handled from its live copy on a durable
    /// channel has had its durable copy acknowledged; returns how many had not.
    pub(crate) async fn settle(&self, bound: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let settled = self.settled.notified();
            let left = self.handover.lock().map(|h| h.awaiting.len()).unwrap_or(0);
            if left == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                return left;
            }
        }
    }

    fn reject(&self, subject: &str, reason: RejectReason, detail: String) {
        tracing::warn!(
            subject,
            reason = reason.as_str(),
            detail,
            "message rejected"
        );
        self.notice(Notice::Rejected(Anomaly {
            subject: subject.to_owned(),
            reason,
            detail,
        }));
    }

    /// A channel copy read from the broker (live, or backfill): its header block judged, then
    /// as [`Sink::channel_delivery`].
    pub(crate) async fn channel_copy(&self, msg: &async_nats::Message, historical: bool) -> bool {
        let frame = Frame {
            headers: msg.headers.as_ref(),
            status: msg.status,
        };
        self.channel_delivery(
            msg.subject.as_str(),
            frame,
            &msg.payload,
            historical,
            Ack::None,
        )
        .await
    }

    /// A durable copy from the trusted reader (§8): surfaced with its ack handle; acknowledged
    /// at once when it is not surfaced (an anomaly, the own echo, or a message already
    /// surfaced live or from history).
    pub(crate) async fn durable_copy(
        &self,
        subject: &str,
        payload: &[u8],
        token: BackstopToken,
    ) -> bool {
        // The trusted reader judged the frame it read; the copy carries the body alone.
        let frame = Frame::default();
        self.channel_delivery(subject, frame, payload, false, Ack::Backstop(token))
            .await
    }

    /// An entry of a range this member reads itself ([`super::range`]): checked like any
    /// channel copy (its header block too), surfaced as durable with its ack handle, settled at
    /// once when it is not surfaced.
    pub(crate) async fn range_copy(&self, msg: &async_nats::Message, token: BackstopToken) -> bool {
        let frame = Frame {
            headers: msg.headers.as_ref(),
            status: msg.status,
        };
        let ack = Ack::Backstop(token);
        self.channel_delivery(msg.subject.as_str(), frame, &msg.payload, false, ack)
            .await
    }

    /// An offered durable entry (subject, `id`, no content): when this member surfaced the
    /// message already (or it is its own), the token is settled as a duplicate copy's would be
    /// and `None` returned; otherwise the token comes back, for its content to be asked for.
    pub(crate) fn offered(
        &self,
        subject: &str,
        id: &str,
        token: BackstopToken,
    ) -> Option<BackstopToken> {
        let Ok(parsed) = parse_subject(subject) else {
            // The reader validated it; the copy asked for is checked in full.
            return Some(token);
        };
        if parsed.sender == self.own_id {
            token.ack();
            return None;
        }
        let key = format!("{} {id}", parsed.sender);
        if !self.seen.lock().is_ok_and(|s| s.ids.contains(&key)) {
            return Some(token);
        }
        self.durable_duplicate(&key, token);
        None
    }

    /// A channel copy: validated, own echo dropped, deduplicated by (sender, `id`): every copy
    /// of one logical message has the same sender, and keying on the sender too keeps one peer
    /// from suppressing another's messages by reusing their ids. Returns whether it was
    /// surfaced; a copy that is not surfaced is acknowledged.
    async fn channel_delivery(
        &self,
        subject: &str,
        frame: Frame<'_>,
        payload: &[u8],
        historical: bool,
        ack: Ack,
    ) -> bool {
        let settle = |ack: Ack| {
            if let Ack::Backstop(token) = ack {
                token.ack();
            }
        };
        let accepted = match accept_delivery(
            subject,
            frame.headers,
            frame.status,
            payload,
            self.max_payload,
        ) {
            Ok(a) if a.kind == DeliveryKind::Channel => a,
            Ok(a) => {
                self.reject(
                    subject,
                    RejectReason::MalformedSubject,
                    format!("a {:?} subject on a channel subscription", a.kind),
                );
                settle(ack);
                return false;
            }
            Err(r) => {
                self.reject(subject, r.reason(), r.to_string());
                settle(ack);
                return false;
            }
        };
        if accepted.sender == self.own_id {
            settle(ack);
            return false;
        }
        self.roster
            .know(&accepted.sender, &accepted.message.from.name);
        let key = format!("{} {}", accepted.sender, accepted.message.id);
        let first = self.seen.lock().map(|mut s| s.first(&key)).unwrap_or(true);
        let durable = matches!(ack, Ack::Backstop(_));
        if !first {
            match ack {
                Ack::Backstop(token) => self.durable_duplicate(&key, token),
                other => settle(other),
            }
            return false;
        }
        let ack = match ack {
            // A history copy hands its ack over as a live one does, but nothing awaits a
            // durable copy of it: history may hold what was never owed to this member.
            Ack::None => match self.hands_over(accepted.route.as_str(), &accepted.message, &key) {
                Some(awaits) => Ack::Live(LiveAck {
                    handover: self.handover.clone(),
                    key,
                    awaits: awaits && !historical,
                }),
                None => Ack::None,
            },
            other => other,
        };
        self.surface(Delivery {
            message: accepted.message,
            kind: DeliveryKind::Channel,
            historical,
            channel: Some(accepted.route),
            durable,
            ack,
        })
        .await
    }

    /// Hands a message to the application, counted; false when the application is gone.
    async fn surface(&self, delivery: Delivery) -> bool {
        let sent = self.messages.send(delivery).await.is_ok();
        if sent {
            self.surfaced
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        sent
    }

    /// How many messages were surfaced.
    pub(crate) fn surfaced(&self) -> u64 {
        self.surfaced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether a live copy of `key` on `channel` is to hand its ack over to a durable copy of
    /// its message (this connection reads durable copies): when this member holds the channel
    /// durably (`Some(true)`: that copy comes for certain), or the message mentions it
    /// (`Some(false)`: its mention copy may come, §8). If so, it is recorded as surfaced, not
    /// handled: a copy that comes meanwhile waits for the application to handle it, so that a
    /// live copy lost before it was handled (a host that stops) leaves the durable one for the
    /// next session.
    fn hands_over(&self, channel: &str, message: &CotalMessage, key: &str) -> Option<bool> {
        if !self
            .durable_copies
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return None;
        }
        let durable = self
            .durable_channels
            .lock()
            .is_ok_and(|c| c.contains(channel));
        let mentioned = || {
            message.mentions.iter().any(|m| {
                self.own_names
                    .iter()
                    .any(|n| m.trim().eq_ignore_ascii_case(n))
            })
        };
        if !durable && !mentioned() {
            return None;
        }
        let recorded = self.handover.lock().is_ok_and(|mut h| {
            h.unhandled.len() < SEEN_CAPACITY && h.unhandled.insert(key.to_owned(), None).is_none()
        });
        recorded.then_some(durable)
    }

    /// The durable copy of a message already surfaced: acknowledged when the application
    /// handled it (or it was not surfaced live on a durable channel), kept until then.
    fn durable_duplicate(&self, key: &str, token: BackstopToken) {
        let mut handover = self.handover.lock().unwrap_or_else(|e| e.into_inner());
        if handover.awaiting.remove(key) {
            token.ack();
            drop(handover);
            self.settled.notify_waiters();
        } else if let Some(slot) = handover.unhandled.get_mut(key) {
            *slot = Some(token);
        } else {
            token.ack();
        }
    }

    /// A DM or anycast copy: validated; anomalies terminated; surfaced with its ack handle.
    async fn stream_copy(&self, msg: jetstream::Message) {
        let subject = msg.subject.to_string();
        match accept_delivery(
            &subject,
            msg.headers.as_ref(),
            msg.status,
            &msg.payload,
            self.max_payload,
        ) {
            Ok(a) if a.kind != DeliveryKind::Channel => {
                self.roster.know(&a.sender, &a.message.from.name);
                self.surface(Delivery {
                    message: a.message,
                    kind: a.kind,
                    historical: false,
                    channel: None,
                    durable: false,
                    ack: Ack::Stream(Box::new(msg)),
                })
                .await;
            }
            outcome => {
                let (reason, detail) = match outcome {
                    Err(r) => (r.reason(), r.to_string()),
                    Ok(_) => (
                        RejectReason::MalformedSubject,
                        "a chat subject on a DM or task consumer".into(),
                    ),
                };
                if let Err(e) = msg.ack_with(AckKind::Term).await {
                    tracing::warn!(subject, error = %e, "cannot terminate a rejected message");
                }
                self.reject(&subject, reason, detail);
            }
        }
    }
}

/// The header block a copy was read with, when it was read from the broker.
#[derive(Default, Clone, Copy)]
struct Frame<'a> {
    headers: Option<&'a async_nats::HeaderMap>,
    status: Option<async_nats::StatusCode>,
}

/// Binds a pre-created pull durable (`CONSUMER.INFO` only, never create: Appendix B) and
/// pumps it into the sink until the client closes, rebinding after failures. What it held
/// when bound (`what`, in words) is on its way until it has been surfaced.
pub(crate) async fn bind(
    client: &Client,
    stream: &str,
    durable: &str,
    what: &'static str,
) -> Result<(), ClientError> {
    let js = &client.inner.js;
    let consumer = super::transient::retried(durable, &client.inner.state, || {
        js.get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(durable, stream)
    })
    .await
    .map_err(|e| ClientError::Bind {
        durable: durable.to_owned(),
        stream: stream.to_owned(),
        source: e.into(),
    })?;
    let backlog = crate::binding::backlog::Backlog::at(consumer.cached_info());
    if !backlog.is_done() {
        client.inner.catch_up.register(durable, what);
    }
    let (stream, durable) = (stream.to_owned(), durable.to_owned());
    client.inner.background.spawn(pull(
        client.inner.clone(),
        consumer,
        backlog,
        stream,
        durable,
    ));
    Ok(())
}

/// Pulls `durable`'s copies into the client's deliveries, counting down the `backlog` found
/// at bind; rebinds when the consumer goes away or the stream ends (a broker restart).
async fn pull(
    inner: std::sync::Arc<super::Inner>,
    mut consumer: jetstream::consumer::PullConsumer,
    mut backlog: crate::binding::backlog::Backlog,
    stream: String,
    durable: String,
) {
    loop {
        // A small prefetch: every pulled copy's `ack_wait` runs while it waits for the
        // application, so pulling far ahead of it would only provoke redeliveries.
        match consumer
            .stream()
            .max_messages_per_batch(PULL_BATCH)
            .messages()
            .await
        {
            Ok(mut messages) => {
                while let Some(next) = messages.next().await {
                    match next {
                        Ok(msg) => {
                            let last = backlog.took_one();
                            inner.out.stream_copy(msg).await;
                            if last {
                                inner.catch_up.done(&durable);
                            }
                        }
                        Err(e) => {
                            tracing::debug!(durable, error = %e, "pull stream error");
                            if matches!(
                                e.kind(),
                                jetstream::consumer::pull::MessagesErrorKind::ConsumerDeleted
                            ) {
                                break;
                            }
                        }
                    }
                }
            }
            Err(e) => inner.out.notice(Notice::ConsumerLost {
                durable: durable.clone(),
                reason: e.to_string(),
            }),
        }
        // The consumer went away or the stream ended (e.g. a broker restart): rebind.
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(c) = inner
            .js
            .get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(&durable, &stream)
            .await
        {
            consumer = c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Channel, EndpointRef, InstanceId, Part, Routing};

    /// A sink of the member `bob` that reads durable copies, and a live copy of a post on the
    /// live channel `general` mentioning `mentions`: its subject and its payload.
    fn bob_and_a_post(mentions: &[&str]) -> (Sink, Deliveries, String, bytes::Bytes) {
        let bob = InstanceId::from_user_nkey(&nkeys::KeyPair::new_user().public_key()).unwrap();
        let alice = InstanceId::from_user_nkey(&nkeys::KeyPair::new_user().public_key()).unwrap();
        let (sink, deliveries) = channel(
            1 << 20,
            bob.as_str().to_owned(),
            &["Bob", "bob-cred"],
            super::super::Roster::default(),
        );
        sink.receiving_durable_copies();
        let general = Channel::new("general").unwrap();
        let message = CotalMessage::new(
            "main",
            EndpointRef::new(&alice, "alice"),
            Routing::channel(&general),
            vec![Part::text("hello")],
        )
        .with_mentions(mentions);
        let subject = crate::binding::SpaceNames::new("main").post(alice.as_str(), "general");
        (sink, deliveries, subject, message.to_json().unwrap().into())
    }

    fn live_copy(subject: &str, payload: &bytes::Bytes) -> async_nats::Message {
        async_nats::Message {
            subject: subject.into(),
            reply: None,
            payload: payload.clone(),
            headers: None,
            status: None,
            description: None,
            length: payload.len(),
        }
    }

    #[tokio::test]
    async fn a_mention_copy_waits_until_the_live_copy_it_duplicates_is_handled() {
        let (sink, mut deliveries, subject, payload) = bob_and_a_post(&["bob"]);
        let (acks, mut acked) = mpsc::unbounded_channel();
        assert!(
            sink.channel_copy(&live_copy(&subject, &payload), false)
                .await
        );
        let live = deliveries.next().await.unwrap();
        let token = BackstopToken::copy("m7", &acks);
        assert!(!sink.durable_copy(&subject, &payload, token).await);
        assert!(
            acked.try_recv().is_err(),
            "the mention copy is not acknowledged while its live copy is unhandled"
        );
        live.ack().await.unwrap();
        assert!(matches!(acked.try_recv(), Ok(Acked::Token(t)) if t == "m7"));
        // Nothing else comes for certain: closing waits for nothing.
        assert_eq!(sink.settle(Duration::ZERO).await, 0);
    }

    #[tokio::test]
    async fn a_mention_copy_after_its_handled_live_copy_or_of_an_unmentioned_post_is_acknowledged_at_once()
     {
        for mentions in [&["BOB-CRED"][..], &["carol"][..]] {
            let (sink, mut deliveries, subject, payload) = bob_and_a_post(mentions);
            let (acks, mut acked) = mpsc::unbounded_channel();
            assert!(
                sink.channel_copy(&live_copy(&subject, &payload), false)
                    .await
            );
            deliveries.next().await.unwrap().ack().await.unwrap();
            let token = BackstopToken::copy("m8", &acks);
            assert!(!sink.durable_copy(&subject, &payload, token).await);
            assert!(
                matches!(acked.try_recv(), Ok(Acked::Token(t)) if t == "m8"),
                "{mentions:?}"
            );
            assert_eq!(sink.settle(Duration::ZERO).await, 0, "{mentions:?}");
        }
    }

    #[tokio::test]
    async fn a_copy_owed_of_a_message_shown_as_history_waits_until_the_history_copy_is_handled() {
        let (sink, mut deliveries, subject, payload) = bob_and_a_post(&["bob"]);
        let (acks, mut acked) = mpsc::unbounded_channel();
        assert!(
            sink.channel_copy(&live_copy(&subject, &payload), true)
                .await
        );
        let history = deliveries.next().await.unwrap();
        assert!(history.historical);
        let token = BackstopToken::copy("m9", &acks);
        assert!(
            !sink.durable_copy(&subject, &payload, token).await,
            "a message surfaces once"
        );
        assert!(
            acked.try_recv().is_err(),
            "the owed copy is not acknowledged while the history copy is unhandled"
        );
        history.ack().await.unwrap();
        assert!(matches!(acked.try_recv(), Ok(Acked::Token(t)) if t == "m9"));
        // History may hold what was never owed: closing waits for nothing.
        assert_eq!(sink.settle(Duration::ZERO).await, 0);
    }

    #[test]
    fn seen_window_is_bounded_and_remembers_recent_ids() {
        let mut seen = Seen::default();
        assert!(seen.first("a"));
        assert!(!seen.first("a"));
        for i in 0..SEEN_CAPACITY {
            seen.first(&i.to_string());
        }
        assert_eq!(seen.ids.len(), SEEN_CAPACITY);
        assert!(seen.first("a"), "evicted once the window is full");
    }
}
