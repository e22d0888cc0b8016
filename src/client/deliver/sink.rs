//! The sending end of receiving: every copy read from the broker is checked (§5), deduplicated
//! by (sender, `id`) across live, backfill and durable copies (§4, §7), and handed to the
//! application with what acknowledging it means.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use tokio::sync::mpsc;

use super::key::{Digested, Keying, MessageKey};
use super::{
    Ack, Anomaly, BackstopToken, Deliveries, Delivery, Handover, LiveAck, Notice, StreamAck,
};
use crate::binding::frame::accept_delivery;
use crate::protocol::{CotalMessage, DeliveryKind, RejectReason, parse_subject};

/// How many message ids the dedup window remembers.
pub(super) const SEEN_CAPACITY: usize = 65_536;

/// The sending end, shared by every pump.
pub(crate) struct Sink {
    messages: mpsc::Sender<Delivery>,
    notices: mpsc::UnboundedSender<Notice>,
    /// Cancelled when the client is closed: the application's [`Deliveries`] end then, once
    /// what was queued before is taken (the senders live as long as any handle of the client).
    closed: tokio_util::sync::CancellationToken,
    seen: Mutex<Seen>,
    /// The DMs and tasks this session handled (acknowledged by the application).
    handled_direct: std::sync::Arc<Mutex<Seen>>,
    /// What the messages in `seen`, `handled_direct` and `handover` are known by.
    keying: Keying,
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
    roster: super::super::Roster,
    /// How many messages were surfaced.
    surfaced: std::sync::atomic::AtomicU64,
}

/// A window of the last [`SEEN_CAPACITY`] message keys recorded.
#[derive(Default)]
pub(super) struct Seen {
    keys: HashSet<MessageKey, Digested>,
    order: VecDeque<MessageKey>,
}

impl Seen {
    /// Whether `key` is in the window.
    fn contains(&self, key: &MessageKey) -> bool {
        self.keys.contains(key)
    }

    /// Records `key`; false when it was already there.
    pub(super) fn first(&mut self, key: MessageKey) -> bool {
        if !self.keys.insert(key) {
            return false;
        }
        if self.order.len() == SEEN_CAPACITY
            && let Some(old) = self.order.pop_front()
        {
            self.keys.remove(&old);
        }
        self.order.push_back(key);
        true
    }
}

pub(crate) fn channel(
    max_payload: usize,
    own_id: String,
    own_names: &[&str],
    roster: super::super::Roster,
) -> (Sink, Deliveries) {
    let (messages, rx) = mpsc::channel(1024);
    let (notices, notices_rx) = mpsc::unbounded_channel();
    let closed = tokio_util::sync::CancellationToken::new();
    (
        Sink {
            messages,
            notices,
            closed: closed.clone(),
            seen: Mutex::new(Seen::default()),
            handled_direct: std::sync::Arc::default(),
            keying: Keying::default(),
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
            closed,
        },
    )
}

impl Sink {
    /// The client is closed: its [`Deliveries`] end once what is queued is taken.
    pub(crate) fn close(&self) {
        self.closed.cancel();
    }

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
    /// channel has had its durable copy acknowledged; returns how many had not, and how many
    /// mentions of this member were handled before their mention copy came (not waited for:
    /// such a copy is not certain to come, and when it comes after this session the next one
    /// is handed it).
    pub(crate) async fn settle(&self, bound: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + bound;
        let mentions = || {
            self.handover
                .lock()
                .map(|h| h.mentions_pending.len() + h.mentions_untracked)
                .unwrap_or(0)
        };
        loop {
            let settled = self.settled.notified();
            let left = self.handover.lock().map(|h| h.awaiting.len()).unwrap_or(0);
            if left == 0 {
                return mentions();
            }
            if tokio::time::timeout_at(deadline, settled).await.is_err() {
                return left + mentions();
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
        let key = self.keying.key(parsed.sender, id);
        if !self.seen.lock().is_ok_and(|s| s.contains(&key)) {
            return Some(token);
        }
        self.durable_duplicate(key, token);
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
        if accepted.sender() == self.own_id {
            settle(ack);
            return false;
        }
        self.roster
            .know(accepted.sender(), &accepted.message.from.name);
        let key = self.keying.key(accepted.sender(), &accepted.message.id);
        let first = self.seen.lock().map(|mut s| s.first(key)).unwrap_or(true);
        let durable = matches!(ack, Ack::Backstop(_));
        if !first {
            match ack {
                Ack::Backstop(token) => self.durable_duplicate(key, token),
                other => settle(other),
            }
            return false;
        }
        let ack = match ack {
            Ack::None => {
                let route = accepted.route.as_str();
                match self.hands_over(route, &accepted.message, key, historical) {
                    Some((awaits, mention)) => Ack::Live(LiveAck {
                        handover: self.handover.clone(),
                        key,
                        awaits,
                        mention,
                    }),
                    None => Ack::None,
                }
            }
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

    /// Whether a live or history copy of `key` on `channel` is to hand its ack over to a
    /// durable copy of its message (this connection reads durable copies): when this member
    /// holds the channel durably, or the message mentions it (its mention copy may come, §8);
    /// `Some((true, _))` when that copy comes for certain (a live copy on a durable channel:
    /// history may hold what was never owed to this member), `Some((_, true))` when the message
    /// mentions this member. If so, it is recorded as surfaced, not
    /// handled: a copy that comes meanwhile waits for the application to handle it, so that a
    /// copy lost before it was handled (a host that stops) leaves the durable one for the next
    /// session.
    fn hands_over(
        &self,
        channel: &str,
        message: &CotalMessage,
        key: MessageKey,
        historical: bool,
    ) -> Option<(bool, bool)> {
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
        let mentioned = message.mentions.iter().any(|m| {
            self.own_names
                .iter()
                .any(|n| m.trim().eq_ignore_ascii_case(n))
        });
        if !durable && !mentioned {
            return None;
        }
        let recorded = self.handover.lock().is_ok_and(|mut h| {
            h.unhandled.len() < SEEN_CAPACITY && h.unhandled.insert(key, None).is_none()
        });
        recorded.then_some((durable && !historical, mentioned))
    }

    /// The durable copy of a message already surfaced: acknowledged when the application
    /// handled it (or it was not surfaced live on a durable channel), kept until then.
    fn durable_duplicate(&self, key: MessageKey, token: BackstopToken) {
        let mut handover = self.handover.lock().unwrap_or_else(|e| e.into_inner());
        if handover.awaiting.remove(&key) {
            token.ack();
            drop(handover);
            self.settled.notify_waiters();
        } else if let Some(slot) = handover.unhandled.get_mut(&key) {
            *slot = Some(token);
        } else {
            handover.mentions_pending.remove(&key);
            token.ack();
        }
    }

    /// A DM or anycast copy: validated; anomalies terminated; surfaced with its ack handle,
    /// unless this session handled its message already (then acknowledged again, §4).
    pub(super) async fn stream_copy(&self, msg: jetstream::Message) {
        let subject = msg.subject.to_string();
        match accept_delivery(
            &subject,
            msg.headers.as_ref(),
            msg.status,
            &msg.payload,
            self.max_payload,
        ) {
            Ok(a) if a.kind != DeliveryKind::Channel => {
                let key = self.keying.key(a.sender(), &a.message.id);
                if self.handled_direct.lock().is_ok_and(|h| h.contains(&key)) {
                    tracing::debug!(subject, id = a.message.id, "handled already: settled again");
                    if let Err(e) = msg.ack().await {
                        tracing::debug!(subject, error = %e, "cannot settle a copy handled already");
                    }
                    return;
                }
                self.roster.know(a.sender(), &a.message.from.name);
                let ack = StreamAck {
                    message: msg,
                    handled: self.handled_direct.clone(),
                    key,
                };
                self.surface(Delivery {
                    message: a.message,
                    kind: a.kind,
                    historical: false,
                    channel: None,
                    durable: false,
                    ack: Ack::Stream(Box::new(ack)),
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

#[cfg(test)]
mod tests {
    use super::super::Acked;
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
            super::super::super::Roster::default(),
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
    async fn deliveries_end_once_the_client_is_closed_and_what_was_queued_is_taken() {
        let (sink, mut deliveries, subject, payload) = bob_and_a_post(&[]);
        assert!(
            sink.channel_copy(&live_copy(&subject, &payload), false)
                .await
        );
        sink.notice(Notice::Gap {
            channel: "general".to_owned(),
            since: 0,
        });
        sink.close();
        // The sink itself lives on, as it does in a client whose handles are not all dropped.
        let bound = Duration::from_secs(5);
        let taken = tokio::time::timeout(bound, async {
            let first = deliveries.next_event().await;
            let second = deliveries.next_event().await;
            (first, second, deliveries.next_event().await)
        });
        let (first, second, then) = taken.await.expect("the queue is taken, then it ends");
        assert!(
            matches!(first, Some(super::super::Event::Notice(_))),
            "{first:?}"
        );
        assert!(
            matches!(second, Some(super::super::Event::Message(_))),
            "{second:?}"
        );
        assert!(then.is_none(), "{then:?}");
        let ended = tokio::time::timeout(bound, async {
            (deliveries.next().await, deliveries.next_notice().await)
        });
        assert!(matches!(ended.await, Ok((None, None))));
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
    async fn a_mention_handled_before_its_copy_came_is_counted_unsettled_until_the_copy_comes() {
        // Named by its card's name or its credential's, or not at all (carol's post: a copy of
        // it is nothing this member awaits or counts).
        for (mentions, unsettled) in [
            (&["bob"][..], 1),
            (&["BOB-CRED"][..], 1),
            (&["carol"][..], 0),
        ] {
            let (sink, mut deliveries, subject, payload) = bob_and_a_post(mentions);
            let (acks, mut acked) = mpsc::unbounded_channel();
            assert!(
                sink.channel_copy(&live_copy(&subject, &payload), false)
                    .await
            );
            deliveries.next().await.unwrap().ack().await.unwrap();
            // Its mention copy may still come, and after this session the next one gets it.
            let left = sink.settle(Duration::ZERO).await;
            assert_eq!(left, unsettled, "{mentions:?}");
            // It comes after the live copy was handled: acknowledged at once.
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
        let keying = Keying::default();
        let mut seen = Seen::default();
        assert!(seen.first(keying.key("alice", "a")));
        assert!(!seen.first(keying.key("alice", "a")));
        assert!(seen.first(keying.key("bob", "a")), "another sender's id");
        for i in 0..SEEN_CAPACITY {
            seen.first(keying.key("carol", &i.to_string()));
        }
        assert_eq!(seen.keys.len(), SEEN_CAPACITY);
        assert_eq!(seen.order.len(), SEEN_CAPACITY);
        assert!(
            seen.first(keying.key("alice", "a")),
            "evicted once the window is full"
        );
    }
}
