//! Receiving (§4, §5, §8). Every copy is validated by `protocol::accept_delivery`: the subject
//! must parse, `from.id` must equal the subject sender, the payload must be UTF-8 JSON of the
//! message shape; the delivery kind comes from the subject only. Rejected JetStream copies are
//! terminated (never redelivered) and reported; the live copy is never acked.
//!
//! Channel copies (live, backfill, and the durable backstop's) are one logical delivery: they
//! are deduplicated by (sender, `id`). The durable copy owns the ack (§4): it is surfaced with
//! an ack handle, and when its message was already surfaced (live or backfill) it is
//! acknowledged once the application handled that copy. DM and anycast copies come from their
//! own consumers and are handed to the application with an explicit ack handle: acked only
//! once handled, nak on a transient failure. At-least-once (§4) may deliver such a copy again
//! after it was handled (its ack lost when the broker stopped uncleanly, or the message stored
//! twice): a copy of a message this session handled is acknowledged and not surfaced again;
//! one never handled (a nak, an `ack_wait` run out) is.
//!
//! Here: what the application is handed and how it acknowledges it; `sink` checks,
//! deduplicates and hands over every copy; `pull` reads the DM and anycast durables.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use tokio::sync::mpsc;

use self::key::{Digested, MessageKey};
use self::sink::Seen;
use super::{ClientError, nats_err};
use crate::protocol::{CotalMessage, DeliveryKind, RejectReason};

mod key;
mod pull;
mod sink;

pub(crate) use pull::bind;
pub(crate) use sink::{Sink, channel};

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
    Stream(Box<StreamAck>),
    /// Durable copies: the trusted reader's token, acknowledged through `ctl.manager`.
    Backstop(BackstopToken),
    /// A live or backfill copy on a channel this member holds durably, or one that mentions
    /// it: its ack lets the durable copy of the same message be acknowledged (the application
    /// handled it), never sooner.
    Live(LiveAck),
}

/// A DM's or anycast copy's JetStream message, and the record of the messages this session
/// handled, which acknowledging it adds its message to.
pub(crate) struct StreamAck {
    message: jetstream::Message,
    handled: std::sync::Arc<Mutex<Seen>>,
    key: MessageKey,
}

impl StreamAck {
    /// The application handled the message: recorded whether or not the ack then reaches the
    /// broker (a copy delivered again is settled, not surfaced), and acknowledged.
    async fn ack(self, confirmed: bool) -> Result<(), ClientError> {
        if let Ok(mut handled) = self.handled.lock() {
            handled.first(self.key);
        }
        let acked = match confirmed {
            true => self.message.double_ack().await,
            false => self.message.ack().await,
        };
        acked.map_err(nats_err("ack"))
    }
}

/// What the ack of a live or backfill copy settles: the durable copy of the same message (of a
/// durable channel this member holds, or the mention copy of a post that names it).
pub(crate) struct LiveAck {
    handover: std::sync::Arc<Mutex<Handover>>,
    key: MessageKey,
    /// Whether a durable copy comes for certain (a durable channel's, of a live copy): handled
    /// before it came, it is awaited as the session closes. A mention copy is not certain (the
    /// router copies only to the one instance a name designates), nor one of history: handled
    /// first, it is settled when it comes, with nothing waiting for it.
    awaits: bool,
    /// The message mentions this member: handled before its mention copy came, it is counted
    /// as the session closes among what the next session may be handed again.
    mention: bool,
}

/// Live and backfill copies and their durable copies (on durable channels, and the mention
/// copies of posts that name this member): a durable copy is acknowledged once the application
/// handled the copy of its message surfaced first, so a message surfaced but never handled is
/// delivered again to the next session, and one handled is not.
#[derive(Default)]
struct Handover {
    /// Surfaced (live or as history), not handled yet; with the durable copy's token once it came.
    unhandled: std::collections::HashMap<MessageKey, Option<BackstopToken>, Digested>,
    /// Handled, the durable copy not come yet.
    awaiting: HashSet<MessageKey, Digested>,
    /// Mentions of this member handled from a live or history copy, their mention copy not
    /// come yet: it may never come (it is not certain), and it may come after this session.
    mentions_pending: HashSet<MessageKey, Digested>,
    /// Such mentions not kept in `mentions_pending`, which holds at most `SEEN_CAPACITY`.
    mentions_untracked: usize,
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

    /// Confirms the message was handled, so that it is not delivered again. For a live or
    /// backfill copy nothing is sent, but a durable copy owed to this member of the same
    /// message (on a channel it holds durably, or a mention's copy) is acknowledged with it,
    /// never sooner: an application that leaves such copies unacknowledged gets their message
    /// again in its next session. Nothing waits for the broker's confirmation: a DM or anycast
    /// ack is sent on the connection, a durable copy's is batched with others for the trusted
    /// reader. An acknowledgement lost to a broken connection means the copy is delivered
    /// again (after `ack_wait`, or on the next connection), which at-least-once allows (§4);
    /// waiting for a confirmation of every ack would cost a round trip per message and
    /// guarantee nothing more.
    pub async fn ack(self) -> Result<(), ClientError> {
        match self.ack {
            Ack::Stream(s) => s.ack(false).await,
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
                    Some(None) if live.mention => {
                        if handover.mentions_pending.len() < sink::SEEN_CAPACITY {
                            handover.mentions_pending.insert(live.key);
                        } else {
                            handover.mentions_untracked += 1;
                        }
                    }
                    Some(None) | None => {}
                }
                Ok(())
            }
            Ack::None => Ok(()),
        }
    }

    /// As [`Delivery::ack`], waiting for the broker to confirm a DM's or anycast copy's ack (a
    /// round trip): an error then means the broker may deliver the copy again (in this
    /// session it is then settled without being surfaced; a later session gets it). A durable
    /// copy's ack is batched, and confirmed only as the session closes (see
    /// [`super::Settled`]).
    pub async fn ack_confirmed(self) -> Result<(), ClientError> {
        match self.ack {
            Ack::Stream(s) => s.ack(true).await,
            _ => self.ack().await,
        }
    }

    /// Tells the broker this copy is still being held (JetStream's in-progress ack): its
    /// `ack_wait` starts again, so an application that holds a copy longer than `ack_wait`
    /// before handling it is not handed a second copy. A no-op for live, backfill and durable
    /// copies (the trusted reader extends a held durable copy by itself).
    pub async fn in_progress(&self) -> Result<(), ClientError> {
        match &self.ack {
            Ack::Stream(s) => s
                .message
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
            Ack::Stream(s) => s
                .message
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

/// The receiving end: messages and notices. Each ends (`None`) once the client is closed
/// ([`super::Client::close`]) and what was queued before is taken, or once every handle of the
/// client is dropped.
pub struct Deliveries {
    messages: mpsc::Receiver<Delivery>,
    notices: mpsc::UnboundedReceiver<Notice>,
    closed: tokio_util::sync::CancellationToken,
}

impl Deliveries {
    /// The next message; `None` once the client is closed or gone.
    pub async fn next(&mut self) -> Option<Delivery> {
        tokio::select! {
            biased;
            m = self.messages.recv() => m,
            () = self.closed.cancelled() => self.messages.try_recv().ok(),
        }
    }

    /// The next notice; `None` once the client is closed or gone.
    pub async fn next_notice(&mut self) -> Option<Notice> {
        tokio::select! {
            biased;
            n = self.notices.recv() => n,
            () = self.closed.cancelled() => self.notices.try_recv().ok(),
        }
    }

    /// A notice, if one is waiting.
    pub fn try_notice(&mut self) -> Option<Notice> {
        self.notices.try_recv().ok()
    }

    /// The next message or notice, whichever comes first; `None` once the client is closed or
    /// gone.
    pub async fn next_event(&mut self) -> Option<Event> {
        tokio::select! {
            biased;
            Some(n) = self.notices.recv() => Some(Event::Notice(n)),
            m = self.messages.recv() => m.map(|m| Event::Message(Box::new(m))),
            () = self.closed.cancelled() => self
                .notices
                .try_recv()
                .map(Event::Notice)
                .or_else(|_| self.messages.try_recv().map(|m| Event::Message(Box::new(m))))
                .ok(),
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
