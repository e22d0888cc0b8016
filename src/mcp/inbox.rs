//! The inbox: everything the endpoint receives waits here until the agent reads it with
//! `cotal_inbox`, in arrival order.
//!
//! The rule is the one `cotald tail` keeps (§8: acked once handled): a copy is acknowledged
//! when, and only when, `cotal_inbox` returned it to the agent. A DM, anycast or durable copy
//! that was not returned stays unacknowledged, so it is delivered again if this server
//! restarts; while it waits, its JetStream `ack_wait` is renewed (an in-progress ack) so that
//! the broker does not hand a second copy to a slow reader. Nothing that needs an ack is ever
//! dropped; the broker bounds how many such copies are in flight (each durable's
//! `max_ack_pending`).
//!
//! Live channel copies carry no ack and are not kept by the broker for us, so they are the one
//! thing that can overflow: past [`LIVE_CAPACITY`] waiting live copies, the oldest is dropped
//! and counted per channel, and the next `cotal_inbox` reports the count (the channel's
//! history, `cotal_history`, still has them where the channel keeps history).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, Notify};

use super::wake::Reason;
use crate::client::deliver::Event;
use crate::client::{Deliveries, Delivery, Notice};

/// How many live channel copies may wait before the oldest is dropped (and reported).
pub const LIVE_CAPACITY: usize = 2000;

/// How many notices are kept between two reads (later ones are counted, not kept).
const NOTICE_CAPACITY: usize = 100;

/// How often waiting DM and anycast copies get their `ack_wait` renewed: well within the
/// durables' 60 s.
const RENEW_EVERY: Duration = Duration::from_secs(20);

/// One waiting copy.
struct Waiting {
    delivery: Delivery,
    /// Whether a peek showed it (a `wait` does not wake for it again).
    shown: bool,
    /// Why it wakes the agent, if it does.
    wake: Option<Reason>,
    /// Whether a wake announced it (or a peek showed it).
    announced: bool,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Waiting>,
    /// Live channel copies among `waiting`.
    live: usize,
    /// Live copies dropped since the last read, per channel.
    overflow: BTreeMap<String, u64>,
    /// Notices since the last read.
    notices: Vec<String>,
    /// Notices not kept since the last read.
    notices_dropped: u64,
    /// How many of `notices` a peek showed.
    notices_shown: usize,
    /// Whether the client is gone (nothing more will arrive).
    closed: bool,
    /// How many messages the client surfaced have been taken in (see [`Inbox::reached`]).
    taken_in: u64,
    /// How many times the agent read (or peeked at) the inbox.
    reads: u64,
}

impl State {
    /// Whether something is here that the agent has not seen: a copy or notice no peek showed.
    fn news(&self) -> bool {
        self.closed
            || self.notices.len() > self.notices_shown
            || self.waiting.iter().any(|w| !w.shown)
    }
}

/// What a read takes out of the inbox.
pub struct Taken {
    /// The copies, oldest first.
    pub deliveries: Vec<Delivery>,
    /// How many copies still wait.
    pub remaining: usize,
    /// Live copies dropped since the last read, per channel.
    pub overflow: BTreeMap<String, u64>,
    /// What happened besides messages since the last read.
    pub notices: Vec<String>,
}

/// Called for every copy as it arrives (e.g. to notify the MCP host); says why the copy wakes
/// the agent, if it does.
pub type OnArrival = Box<dyn Fn(&Delivery) -> Option<Reason> + Send + Sync>;

/// The waiting copies and notices, fed by the client's [`Deliveries`].
pub struct Inbox {
    state: Mutex<State>,
    arrived: Notify,
}

impl Inbox {
    /// Starts draining `deliveries` into a new inbox; `on_arrival` sees each copy first.
    pub fn start(deliveries: Deliveries, on_arrival: OnArrival) -> Arc<Inbox> {
        let inbox = Arc::new(Inbox {
            state: Mutex::new(State::default()),
            arrived: Notify::new(),
        });
        tokio::spawn(pump(inbox.clone(), deliveries, on_arrival));
        tokio::spawn(renew(Arc::downgrade(&inbox)));
        inbox
    }

    /// How many copies wait.
    pub async fn waiting(&self) -> usize {
        self.state.lock().await.waiting.len()
    }

    /// Records something to report at the next read.
    pub async fn notice(&self, text: String) {
        push_notice(&mut *self.state.lock().await, text);
        self.arrived.notify_waiters();
    }

    /// Waits up to `wait` for something the agent has not seen: a copy or notice that no peek
    /// showed (what a peek showed does not end a wait again).
    pub async fn wait(&self, wait: Duration) {
        let _ = tokio::time::timeout(wait, self.until(State::news)).await;
    }

    /// Waits until the inbox has taken in the first `surfaced` messages the client surfaced
    /// ([`crate::client::Client::surfaced`]): everything surfaced before that count was read.
    pub async fn reached(&self, surfaced: u64) {
        self.until(|s| s.closed || s.taken_in >= surfaced).await;
    }

    /// Why each waiting copy that wakes the agent does, oldest first (nothing is marked).
    pub async fn waking(&self) -> Vec<Reason> {
        let state = self.state.lock().await;
        state
            .waiting
            .iter()
            .filter_map(|w| w.wake.clone())
            .collect()
    }

    /// Resolves at the next change: an arrival, a notice, a read.
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.arrived.notified()
    }

    /// Decides under one lock whether to announce what wakes the agent: `due` gets how many
    /// waking copies no wake announced yet, how many wait in all, and how many reads there
    /// were. When it says yes, every waiting waking copy is marked announced and returned, with
    /// the read count.
    pub async fn announce(
        &self,
        due: impl FnOnce(usize, usize, u64) -> bool,
    ) -> Option<(Vec<Reason>, u64)> {
        let mut state = self.state.lock().await;
        let waking = state.waiting.iter().filter(|w| w.wake.is_some());
        let unannounced = waking.clone().filter(|w| !w.announced).count();
        let unread = waking.count();
        if !due(unannounced, unread, state.reads) {
            return None;
        }
        let reasons = state
            .waiting
            .iter_mut()
            .filter_map(|w| {
                w.announced = true;
                w.wake.clone()
            })
            .collect();
        Some((reasons, state.reads))
    }

    async fn until(&self, done: impl Fn(&State) -> bool) {
        loop {
            let arrived = self.arrived.notified();
            if done(&*self.state.lock().await) {
                return;
            }
            arrived.await;
        }
    }

    /// Takes up to `limit` copies (oldest first), with the overflow and notices since the last
    /// read. The caller acknowledges what it returns.
    pub async fn take(&self, limit: usize) -> Taken {
        let mut state = self.state.lock().await;
        let n = limit.min(state.waiting.len());
        let deliveries: Vec<Delivery> = state.waiting.drain(..n).map(|w| w.delivery).collect();
        state.live -= deliveries.iter().filter(|d| !d.needs_ack()).count();
        let mut notices = std::mem::take(&mut state.notices);
        state.notices_shown = 0;
        state.reads += 1;
        self.arrived.notify_waiters();
        let dropped = std::mem::take(&mut state.notices_dropped);
        if dropped > 0 {
            notices.push(format!("{dropped} more notices were not kept"));
        }
        Taken {
            deliveries,
            remaining: state.waiting.len(),
            overflow: std::mem::take(&mut state.overflow),
            notices,
        }
    }

    /// Looks at up to `limit` copies (oldest first) and the notices, without taking or
    /// acknowledging anything; also says how many copies wait.
    pub async fn peek<T>(
        &self,
        limit: usize,
        view: impl Fn(&Delivery) -> T,
    ) -> (Vec<T>, Vec<String>, usize) {
        let mut state = self.state.lock().await;
        let seen = state
            .waiting
            .iter_mut()
            .take(limit)
            .map(|w| {
                w.shown = true;
                w.announced = true;
                view(&w.delivery)
            })
            .collect();
        state.notices_shown = state.notices.len();
        state.reads += 1;
        self.arrived.notify_waiters();
        (seen, state.notices.clone(), state.waiting.len())
    }

    /// At the end of the session: hands every waiting DM and anycast copy back to the broker
    /// (a nak), so that the next session gets it at once instead of after its `ack_wait`.
    /// Nothing is acknowledged; durable copies go back to the trusted reader by themselves.
    pub async fn release(&self) {
        let waiting = std::mem::take(&mut self.state.lock().await.waiting);
        for w in waiting {
            let id = w.delivery.message.id.clone();
            if let Err(e) = w.delivery.nak().await {
                tracing::debug!(id, error = %e, "not handed back; redelivered after ack_wait");
            }
        }
    }
}

fn push_notice(state: &mut State, text: String) {
    if state.notices.len() < NOTICE_CAPACITY {
        state.notices.push(text);
    } else {
        state.notices_dropped += 1;
    }
}

/// Moves every copy and notice from the client into the inbox until the client is gone.
async fn pump(inbox: Arc<Inbox>, mut deliveries: Deliveries, on_arrival: OnArrival) {
    while let Some(event) = deliveries.next_event().await {
        match event {
            Event::Message(delivery) => {
                let wake = on_arrival(&delivery);
                let mut state = inbox.state.lock().await;
                admit(&mut state, *delivery, wake);
                state.taken_in += 1;
            }
            Event::Notice(notice) => {
                let mut state = inbox.state.lock().await;
                push_notice(&mut state, describe(&notice));
            }
        }
        inbox.arrived.notify_waiters();
    }
    inbox.state.lock().await.closed = true;
    inbox.arrived.notify_waiters();
}

/// Queues a copy. A redelivered DM or anycast copy of a message that already waits takes the
/// place of the earlier one (its ack handle is the current one). Past [`LIVE_CAPACITY`], the
/// oldest live copy is dropped and counted.
fn admit(state: &mut State, delivery: Delivery, wake: Option<Reason>) {
    if delivery.needs_ack()
        && let Some(earlier) = state.waiting.iter_mut().find(|w| {
            w.delivery.needs_ack()
                && w.delivery.kind == delivery.kind
                && w.delivery.message.id == delivery.message.id
                && w.delivery.message.from.id == delivery.message.from.id
        })
    {
        // Delivered again unacknowledged: announced again (a wake may have been missed).
        earlier.delivery = delivery;
        earlier.announced = false;
        return;
    }
    if !delivery.needs_ack() {
        state.live += 1;
    }
    state.waiting.push_back(Waiting {
        delivery,
        shown: false,
        wake,
        announced: false,
    });
    if state.live > LIVE_CAPACITY
        && let Some(at) = state.waiting.iter().position(|w| !w.delivery.needs_ack())
        && let Some(dropped) = state.waiting.remove(at)
    {
        state.live -= 1;
        let channel = dropped.delivery.channel.unwrap_or_default();
        *state.overflow.entry(channel).or_default() += 1;
    }
}

/// Renews the `ack_wait` of every waiting DM and anycast copy until the inbox is gone.
async fn renew(inbox: std::sync::Weak<Inbox>) {
    loop {
        tokio::time::sleep(RENEW_EVERY).await;
        let Some(inbox) = inbox.upgrade() else { return };
        let state = inbox.state.lock().await;
        for w in state.waiting.iter().filter(|w| w.delivery.needs_ack()) {
            if let Err(e) = w.delivery.in_progress().await {
                tracing::debug!(id = %w.delivery.message.id, error = %e, "ack_wait not renewed");
            }
        }
    }
}

/// A notice in words an agent can act on.
fn describe(notice: &Notice) -> String {
    match notice {
        Notice::Rejected(a) => format!(
            "a message on {} was rejected ({}): {}",
            a.subject,
            a.reason.as_str(),
            a.detail
        ),
        Notice::ChannelDropped { channel } => format!(
            "the broker refused #{channel} (outside your read permissions now): it was left"
        ),
        Notice::Gap { channel, .. } => format!(
            "#{channel}: the connection dropped and the channel's history may not be read, so \
             live messages of that moment may be missing"
        ),
        Notice::ConsumerLost { durable, reason } => {
            format!("{durable}: {reason}; reading it again")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Channel, EndpointRef, InstanceId, Part, Routing};

    fn live(from: &InstanceId, n: usize) -> Delivery {
        let general = Channel::new("general").unwrap();
        let message = crate::protocol::CotalMessage::new(
            "main",
            EndpointRef::new(from, "alice"),
            Routing::channel(&general),
            vec![Part::text(n.to_string())],
        );
        Delivery::live(message, "general")
    }

    #[tokio::test]
    async fn past_the_bound_the_oldest_live_copies_go_and_are_reported_once() {
        let inbox = Inbox {
            state: Mutex::new(State::default()),
            arrived: Notify::new(),
        };
        let from = InstanceId::from_user_nkey(&nkeys::KeyPair::new_user().public_key()).unwrap();
        {
            let mut state = inbox.state.lock().await;
            for n in 0..LIVE_CAPACITY + 3 {
                admit(&mut state, live(&from, n), None);
            }
        }
        assert_eq!(inbox.waiting().await, LIVE_CAPACITY);
        let taken = inbox.take(1).await;
        let first = crate::mcp::tools::text_of(&taken.deliveries[0].message.parts);
        assert_eq!(first, "3", "the three oldest were dropped");
        assert_eq!(taken.overflow.get("general"), Some(&3));
        assert_eq!(taken.remaining, LIVE_CAPACITY - 1);
        let next = inbox.take(1).await;
        assert!(next.overflow.is_empty(), "reported once");
    }
}
