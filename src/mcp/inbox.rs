//! The inbox: everything the endpoint receives waits here until the agent reads it with
//! `cotal_inbox`, one bounded page at a time.
//!
//! A page returns what is addressed to the agent first (DMs and role tasks, then mentions,
//! then the rest of its channels), in arrival order within each, up to a byte budget the
//! caller sets: an agent reads the DM that needs it even behind a flood of channel traffic,
//! and no answer grows past what a host puts in an agent's context. A message too large for a
//! page comes in pieces of its text over consecutive reads, and is acknowledged with its last.
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

/// The longest notice kept, in characters (a notice may quote what a sender wrote).
const NOTICE_CHARS: usize = 300;

/// How often waiting DM and anycast copies get their `ack_wait` renewed: well within the
/// durables' 60 s.
const RENEW_EVERY: Duration = Duration::from_secs(20);

/// Which waiting copies a page returns first: what is addressed to the agent before what it
/// overhears.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Precedence {
    /// A DM or a task for the agent's role.
    Direct,
    /// A channel message that mentions the agent.
    Mention,
    /// Any other channel message.
    Ambient,
}

impl Precedence {
    /// The precedence of `d` for the agent named `me` (lower case, as mentions are, §5).
    fn of(d: &Delivery, me: &str) -> Precedence {
        if d.kind != crate::protocol::DeliveryKind::Channel {
            Precedence::Direct
        } else if d.message.mentions.iter().any(|m| m == me) {
            Precedence::Mention
        } else {
            Precedence::Ambient
        }
    }
}

/// How many copies wait beyond a page, by precedence.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct Left {
    /// DMs and tasks for your role.
    pub direct: usize,
    /// Channel messages that mention you.
    pub mentions: usize,
    /// Other channel messages.
    pub channel: usize,
}

/// A copy as a page shows it: the view, its size in the answer, and, when only part of its
/// text fits, the byte where the shown part stops.
pub struct Fitted<T> {
    /// What the answer carries for it.
    pub view: T,
    /// Its bytes in the answer.
    pub bytes: usize,
    /// `Some(end)` when the text was cut at byte `end` (the rest comes on the next page).
    pub text_to: Option<usize>,
}

/// One waiting copy.
struct Waiting {
    delivery: Delivery,
    /// What a page returns it before.
    precedence: Precedence,
    /// How much of its text earlier pages returned (bytes): it comes in pieces.
    text_from: usize,
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

    /// The bytes the notices and the overflow take in an answer.
    fn envelope(&self) -> usize {
        super::page::json_len(&self.notices) + super::page::json_len(&self.overflow) + 64
    }

    /// What waits, by precedence, leaving out the copies at `taken`.
    fn left(&self, taken: &[usize]) -> Left {
        let mut left = Left::default();
        for (i, w) in self.waiting.iter().enumerate() {
            if taken.contains(&i) {
                continue;
            }
            match w.precedence {
                Precedence::Direct => left.direct += 1,
                Precedence::Mention => left.mentions += 1,
                Precedence::Ambient => left.channel += 1,
            }
        }
        left
    }
}

/// Chooses a page: waiting copies in precedence, then arrival order, while they fit in
/// `budget` bytes, at most `limit`. It stops at the first copy that does not fit (nothing
/// of lower precedence overtakes it); a copy whose text had to be cut goes alone, as the
/// page's only copy. Returns the chosen copies' indices with how each is shown.
fn choose<T>(
    waiting: &VecDeque<Waiting>,
    limit: usize,
    budget: usize,
    fit: &impl Fn(&Delivery, usize, usize) -> Option<Fitted<T>>,
) -> Vec<(usize, Fitted<T>)> {
    let mut order: Vec<usize> = (0..waiting.len()).collect();
    order.sort_by_key(|&i| waiting[i].precedence);
    let mut used = 0;
    let mut chosen = Vec::new();
    for i in order {
        if chosen.len() == limit {
            break;
        }
        let w = &waiting[i];
        let Some(fitted) = fit(&w.delivery, w.text_from, budget.saturating_sub(used)) else {
            break;
        };
        let cut = fitted.text_to.is_some();
        if cut && !chosen.is_empty() {
            break;
        }
        used += fitted.bytes;
        chosen.push((i, fitted));
        if cut {
            break;
        }
    }
    chosen
}

/// What a read takes out of the inbox.
pub struct Taken<T> {
    /// How the page shows its copies, in page order.
    pub views: Vec<T>,
    /// The copies the page returned whole (to acknowledge); a copy returned in part stays.
    pub deliveries: Vec<Delivery>,
    /// How many copies still wait.
    pub remaining: usize,
    /// Of those, how many by precedence.
    pub left: Left,
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
    /// The agent's name, lower case: what its mentions say.
    me: String,
}

impl Inbox {
    /// Starts draining `deliveries` into a new inbox for the agent named `me`; `on_arrival`
    /// sees each copy first.
    pub fn start(deliveries: Deliveries, me: String, on_arrival: OnArrival) -> Arc<Inbox> {
        let inbox = Arc::new(Inbox {
            state: Mutex::new(State::default()),
            arrived: Notify::new(),
            me,
        });
        tokio::spawn(pump(inbox.clone(), deliveries, on_arrival));
        tokio::spawn(renew(Arc::downgrade(&inbox)));
        inbox
    }

    /// How many copies wait.
    pub async fn waiting(&self) -> usize {
        self.state.lock().await.waiting.len()
    }

    /// When the oldest waiting copy was sent (its `ts`, epoch milliseconds).
    pub async fn oldest_sent(&self) -> Option<f64> {
        let state = self.state.lock().await;
        state
            .waiting
            .iter()
            .filter_map(|w| w.delivery.message.ts.as_f64())
            .min_by(f64::total_cmp)
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

    /// Takes a page (chosen by `choose`: at most `limit` copies in `budget` bytes less what the
    /// notices and overflow take, each shown by `fit(copy, text_from, room)`), with the overflow and notices since the last read. The
    /// caller acknowledges the copies returned whole; one returned in part stays, and the next
    /// page goes on from where its text was cut.
    pub async fn take<T>(
        &self,
        limit: usize,
        budget: usize,
        fit: impl Fn(&Delivery, usize, usize) -> Option<Fitted<T>>,
    ) -> Taken<T> {
        let mut state = self.state.lock().await;
        let budget = budget.saturating_sub(state.envelope());
        let chosen = choose(&state.waiting, limit, budget, &fit);
        let mut whole = Vec::new();
        let mut views = Vec::with_capacity(chosen.len());
        for (i, fitted) in chosen {
            match fitted.text_to {
                Some(to) => state.waiting[i].text_from = to,
                None => whole.push(i),
            }
            views.push(fitted.view);
        }
        let left = state.left(&whole);
        whole.sort_unstable();
        let mut deliveries: Vec<Delivery> = whole
            .iter()
            .rev()
            .filter_map(|&i| state.waiting.remove(i))
            .map(|w| w.delivery)
            .collect();
        deliveries.reverse();
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
            views,
            deliveries,
            remaining: state.waiting.len(),
            left,
            overflow: std::mem::take(&mut state.overflow),
            notices,
        }
    }

    /// Looks at the page [`Inbox::take`] would return, and the notices, without taking or
    /// acknowledging anything; also says what waits beyond it, in all and by precedence.
    pub async fn peek<T>(
        &self,
        limit: usize,
        budget: usize,
        fit: impl Fn(&Delivery, usize, usize) -> Option<Fitted<T>>,
    ) -> (Vec<T>, Vec<String>, usize, Left) {
        let mut state = self.state.lock().await;
        let budget = budget.saturating_sub(state.envelope());
        let chosen = choose(&state.waiting, limit, budget, &fit);
        let shown: Vec<usize> = chosen.iter().map(|(i, _)| *i).collect();
        for &i in &shown {
            let w = &mut state.waiting[i];
            w.shown = true;
            w.announced = true;
        }
        state.notices_shown = state.notices.len();
        state.reads += 1;
        self.arrived.notify_waiters();
        let left = state.left(&shown);
        let remaining = state.waiting.len() - shown.len();
        let views = chosen.into_iter().map(|(_, f)| f.view).collect();
        (views, state.notices.clone(), remaining, left)
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

fn push_notice(state: &mut State, mut text: String) {
    if let Some((cut, _)) = text.char_indices().nth(NOTICE_CHARS) {
        text.truncate(cut);
        text.push('…');
    }
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
                let precedence = Precedence::of(&delivery, &inbox.me);
                let mut state = inbox.state.lock().await;
                admit(&mut state, *delivery, precedence, wake);
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
fn admit(state: &mut State, delivery: Delivery, precedence: Precedence, wake: Option<Reason>) {
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
        precedence,
        text_from: 0,
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

    fn message(from: &InstanceId, routing: Routing, text: &str) -> crate::protocol::CotalMessage {
        crate::protocol::CotalMessage::new(
            "main",
            EndpointRef::new(from, "alice"),
            routing,
            vec![Part::text(text)],
        )
    }

    fn live(from: &InstanceId, text: &str) -> Delivery {
        let general = Channel::new("general").unwrap();
        Delivery::live(message(from, Routing::channel(&general), text), "general")
    }

    fn inbox() -> Inbox {
        Inbox {
            state: Mutex::new(State::default()),
            arrived: Notify::new(),
            me: "bob".to_owned(),
        }
    }

    fn sender() -> InstanceId {
        InstanceId::from_user_nkey(&nkeys::KeyPair::new_user().public_key()).unwrap()
    }

    /// Shows a copy's text from `from`, one byte per byte, cut to the room.
    fn text_fit(d: &Delivery, from: usize, room: usize) -> Option<Fitted<String>> {
        let text = crate::mcp::tools::text_of(&d.message.parts);
        let rest = &text[from..];
        if rest.len() <= room {
            return Some(Fitted {
                view: rest.to_owned(),
                bytes: rest.len(),
                text_to: None,
            });
        }
        (room > 0).then(|| Fitted {
            view: rest[..room].to_owned(),
            bytes: room,
            text_to: Some(from + room),
        })
    }

    /// A budget that leaves `n` bytes for copies (an empty envelope takes the rest).
    fn room(n: usize) -> usize {
        n + State::default().envelope()
    }

    async fn add(inbox: &Inbox, d: Delivery) {
        let precedence = Precedence::of(&d, &inbox.me);
        admit(&mut *inbox.state.lock().await, d, precedence, None);
    }

    #[tokio::test]
    async fn past_the_bound_the_oldest_live_copies_go_and_are_reported_once() {
        let inbox = inbox();
        let from = sender();
        for n in 0..LIVE_CAPACITY + 3 {
            add(&inbox, live(&from, &n.to_string())).await;
        }
        assert_eq!(inbox.waiting().await, LIVE_CAPACITY);
        let taken = inbox.take(1, usize::MAX, text_fit).await;
        assert_eq!(taken.views, ["3"], "the three oldest were dropped");
        assert_eq!(taken.overflow.get("general"), Some(&3));
        assert_eq!(taken.remaining, LIVE_CAPACITY - 1);
        let next = inbox.take(1, usize::MAX, text_fit).await;
        assert!(next.overflow.is_empty(), "reported once");
    }

    #[tokio::test]
    async fn a_page_returns_what_is_addressed_first_within_its_budget() {
        let inbox = inbox();
        let from = sender();
        let general = Channel::new("general").unwrap();
        add(&inbox, live(&from, "chatter 1")).await;
        let mut mention = message(&from, Routing::channel(&general), "bob, look");
        mention.mentions = vec!["bob".to_owned()];
        add(&inbox, Delivery::live(mention, "general")).await;
        add(&inbox, live(&from, "chatter 2")).await;
        let dm = message(&from, Routing::to(&sender()), "a DM");
        add(&inbox, Delivery::dm(dm)).await;

        // Peeked, then taken: the DM, the mention, then the channel in arrival order.
        let (views, _, remaining, left) = inbox.peek(10, room(14), text_fit).await;
        assert_eq!(views, ["a DM", "bob, look"]);
        assert_eq!(remaining, 2);
        assert_eq!((left.direct, left.mentions, left.channel), (0, 0, 2));
        let taken = inbox.take(10, room(14), text_fit).await;
        assert_eq!(taken.views, ["a DM", "bob, look"]);
        assert_eq!(taken.deliveries.len(), 2);
        let taken = inbox.take(10, room(100), text_fit).await;
        assert_eq!(taken.views, ["chatter 1", "chatter 2"]);
        assert_eq!(taken.remaining, 0);
    }

    #[tokio::test]
    async fn a_message_larger_than_a_page_comes_in_pieces_and_goes_with_the_last() {
        let inbox = inbox();
        let from = sender();
        add(&inbox, live(&from, "0123456789")).await;
        add(&inbox, live(&from, "after")).await;
        let first = inbox.take(10, room(4), text_fit).await;
        assert_eq!(first.views, ["0123"], "a cut copy goes alone");
        assert!(first.deliveries.is_empty(), "nothing acknowledged yet");
        assert_eq!(first.remaining, 2);
        let second = inbox.take(10, room(4), text_fit).await;
        assert_eq!(second.views, ["4567"]);
        let last = inbox.take(10, room(7), text_fit).await;
        assert_eq!(last.views, ["89", "after"]);
        assert_eq!(last.deliveries.len(), 2);
    }
}
