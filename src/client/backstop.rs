//! Receiving the durable backstop (§4 `durable`, §8 trusted reader, §12 item 12).
//!
//! The appliance's trusted reader hands durable copies to this member on its own inbox,
//! `_INBOX_<id>.backstop` ([`crate::binding::backstop_inbox`]), in batches
//! ([`crate::ops::CopyBatch`]): each with the original payload, the chat subject it was
//! published on and a token. The copy is validated like any channel copy (the subject
//! names the sender, §5), deduplicated with the live and backfill copies, and surfaced with an
//! ack handle; the stored entry is acknowledged only once the application acks the copy
//! (`backstop-ack` on `ctl.manager`, batched). Anything not acknowledged is handed over again.
//!
//! A member that keeps up follows its channel (`resume` with `offers`): the reader then offers
//! entries without their content ([`crate::ops::OfferBatch`]), and the member acknowledges the
//! token of each it surfaced already (once the application handled it, as for a duplicate
//! copy) and asks for the content of the rest (`backstop-want`), which comes as a copy.
//!
//! Delivery runs in sessions: the client asks for one (`resume`) when it connects and again
//! after every reconnect, so a backlog that built up while it was away starts flowing at once,
//! and copies that were in flight when the connection dropped are handed over again.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use super::deliver::{Acked, BackstopToken};
use super::{Client, ClientError, ConnectionState, nats_err};
use crate::binding::MANAGER_SERVICE;
use crate::ops::{self, BackstopAck, BackstopWant, Request, Resume, Resumed};

/// Most tokens acknowledged by one `backstop-ack`.
const ACK_BATCH: usize = 512;
/// The longest wait between two `resume` attempts while no manager answers.
const RESUME_RETRY_MAX: Duration = Duration::from_secs(5);

/// Whether this credential can be a durable member: it may ask the manager and read its inbox.
pub(crate) fn granted(client: &Client, grants: &crate::binding::UserPermissions) -> bool {
    let id = client.inner.id.as_str();
    client
        .inner
        .subjects
        .ctl(MANAGER_SERVICE, id)
        .is_ok_and(|ctl| grants.may_publish(&ctl))
        && grants.may_subscribe(&crate::binding::backstop_inbox(id))
}

/// Subscribes to the backstop inbox and starts the three tasks of durable delivery: the
/// receiver, the ack batcher, and the session keeper (`resume` now and after reconnects).
pub(crate) async fn start(client: &Client) -> Result<(), ClientError> {
    let inner = &client.inner;
    let copies = inner
        .nats
        .subscribe(crate::binding::backstop_inbox(inner.id.as_str()))
        .await
        .map_err(nats_err("subscribe to the backstop inbox"))?;
    inner.out.receiving_durable_copies();
    inner.catch_up.register(FIRST_SESSION, BACKLOG);
    let first = Arc::new(Mutex::new(FirstSession::default()));
    let (acks, batch) = mpsc::unbounded_channel::<Acked>();
    inner
        .background
        .spawn(receive(client.clone(), copies, acks, first.clone()));
    let stop = CancellationToken::new();
    // The batcher ends on its own token, after sending its last acks (`Client::stop_receiving`).
    let batcher = tokio::spawn(send_acks(client.clone(), batch, stop.clone()));
    inner.background.spawn(keep_sessions(client.clone(), first));
    if let Ok(mut slot) = inner.ack_batcher.lock() {
        *slot = Some((stop, batcher));
    }
    Ok(())
}

/// Surfaces each copy of the backstop inbox, takes offers, and records what the first
/// session's consumers say they handed over.
async fn receive(
    client: Client,
    mut copies: async_nats::Subscriber,
    acks: mpsc::UnboundedSender<Acked>,
    first: Arc<Mutex<FirstSession>>,
) {
    while let Some(msg) = copies.next().await {
        let kind = msg.headers.as_ref().and_then(|h| h.get(ops::BATCH_KIND));
        match kind.map(|k| k.as_str()) {
            Some(ops::OFFERS) => {
                take_offers(&client, &msg.payload, &acks).await;
                continue;
            }
            Some(ops::RANGE) => {
                match ops::Range::parse(&msg.payload) {
                    Some(range) => super::range::start(&client, range, &acks),
                    // Its entries are handed over as copies once the grant times out.
                    None => tracing::warn!("a durable range that does not parse: dropped"),
                }
                continue;
            }
            Some(ops::CAUGHT_UP) => {
                if let Some((session, consumer)) = ops::caught_up(&msg.payload) {
                    first.lock().await.reported(&client, session, consumer);
                }
                continue;
            }
            _ => {}
        }
        let batch = match ops::copies(&msg.payload) {
            Ok(batch) => batch,
            Err(e) => {
                // Its copies are handed over again once the handoff times out.
                tracing::warn!(error = %e, "durable copies dropped");
                continue;
            }
        };
        for copy in batch {
            let token = BackstopToken::copy(copy.token, &acks);
            client
                .inner
                .out
                .durable_copy(copy.subject, copy.payload, token)
                .await;
        }
    }
}

/// Sends the handled copies' tokens in batches (`backstop-ack`); when `stop` says so, the last
/// ones as a request, answered once the reader has them. Returns whether every token sent was
/// confirmed that way: batches are published without a reply, so when any went out since the
/// last confirmation, the last request is made even with no token left (it confirms the
/// batches before it, which the reader received first).
async fn send_acks(
    client: Client,
    mut batch: mpsc::UnboundedReceiver<Acked>,
    stop: CancellationToken,
) -> bool {
    let mut acked = Vec::with_capacity(ACK_BATCH);
    let mut ranges = RangesDue::default();
    let mut unconfirmed = false;
    loop {
        tokio::select! {
            n = batch.recv_many(&mut acked, ACK_BATCH) => if n == 0 { return !unconfirmed },
            () = tokio::time::sleep_until(ranges.flush_at), if ranges.waiting() => {}
            () = stop.cancelled() => break,
        }
        let tokens = ranges.tokens(acked.drain(..), false);
        if tokens.is_empty() {
            continue;
        }
        let request = Request::BackstopAck(BackstopAck { tokens }).to_control(client.endpoint());
        unconfirmed = true;
        if let Err(e) = client.notify(MANAGER_SERVICE, &request).await {
            // Unacknowledged copies are handed over again: at-least-once holds.
            tracing::debug!(error = %e, "backstop acks not sent");
        }
    }
    while let Ok(token) = batch.try_recv() {
        acked.push(token);
    }
    let tokens = ranges.tokens(acked.drain(..), true);
    if tokens.is_empty() && !unconfirmed {
        return true;
    }
    let request = Request::BackstopAck(BackstopAck { tokens });
    match client.manager::<serde_json::Value>(&request).await {
        Ok(_) => true,
        Err(e) => {
            tracing::debug!(error = %e, "the last backstop acks not confirmed");
            false
        }
    }
}

/// How often the progress of a range being read goes to the reader: each token costs the
/// appliance a request and a save of the position, and a range has news at every entry its
/// application handles. A range that is done goes at once.
const RANGE_PROGRESS_EVERY: Duration = Duration::from_millis(50);

/// The ranges with progress the reader has not been told yet ([`super::range`]).
struct RangesDue {
    waiting: Vec<Arc<super::range::RangeRead>>,
    flush_at: tokio::time::Instant,
}

impl Default for RangesDue {
    fn default() -> Self {
        RangesDue {
            waiting: Vec::new(),
            flush_at: tokio::time::Instant::now(),
        }
    }
}

impl RangesDue {
    fn waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The tokens to send for what was handed to the batcher: copies' tokens at once, each
    /// range's progress as it is now when it is done, when [`RANGE_PROGRESS_EVERY`] has passed
    /// since the last, or at the `last` batch.
    fn tokens(&mut self, acked: impl Iterator<Item = Acked>, last: bool) -> Vec<String> {
        let mut tokens = Vec::new();
        for a in acked {
            match a {
                Acked::Token(token) => tokens.push(token),
                Acked::Range(read) if read.done() => tokens.extend(read.take()),
                Acked::Range(read) => self.waiting.push(read),
            }
        }
        let now = tokio::time::Instant::now();
        if last || now >= self.flush_at {
            tokens.extend(self.waiting.drain(..).filter_map(|r| r.take()));
            self.flush_at = now + RANGE_PROGRESS_EVERY;
        }
        tokens
    }
}

/// Asks for a delivery session now and again after every reconnect.
async fn keep_sessions(client: Client, first: Arc<Mutex<FirstSession>>) {
    let mut state = client.state();
    state.borrow_and_update();
    resume(&client, &mut state, Some(&first)).await;
    while state.changed().await.is_ok() {
        let now = *state.borrow_and_update();
        let first = (!first.lock().await.started).then_some(&*first);
        // Told only of changes: up again means it was down meanwhile, however briefly.
        if now == ConnectionState::Connected {
            resume(&client, &mut state, first).await;
        }
    }
}

/// Offers: each one surfaced already is acknowledged as a duplicate copy would be; the content
/// of the others is asked for.
async fn take_offers(client: &Client, body: &[u8], acks: &mpsc::UnboundedSender<Acked>) {
    let offers = match ops::offers(body) {
        Ok(offers) => offers,
        Err(e) => {
            // Handed over as copies once the handoff times out.
            tracing::warn!(error = %e, "durable offers dropped");
            return;
        }
    };
    let mut wanted = Vec::new();
    for offer in offers {
        let token = BackstopToken::copy(offer.token, acks);
        if let Some(token) = client.inner.out.offered(offer.subject, offer.id, token) {
            wanted.extend(token.into_offer());
        }
    }
    if wanted.is_empty() {
        return;
    }
    let request =
        Request::BackstopWant(BackstopWant { tokens: wanted }).to_control(client.endpoint());
    if let Err(e) = client.notify(MANAGER_SERVICE, &request).await {
        // Handed over as copies once the handoff times out.
        tracing::debug!(error = %e, "backstop want not sent");
    }
}

/// The catch-up key of the first delivery session, until its reply names its consumers.
const FIRST_SESSION: &str = "backstop";
/// What the backstop's backlog is, in words.
const BACKLOG: &str = "durable channel backlog";

/// The first delivery session since connecting: its backlog is the one found at connect.
#[derive(Default)]
struct FirstSession {
    /// Its name, once asked for.
    name: Option<String>,
    /// Whether the manager started it.
    started: bool,
    /// The consumers that said they handed over their backlog.
    reported: std::collections::HashSet<String>,
}

impl FirstSession {
    /// A consumer of `session` handed over what it held.
    fn reported(&mut self, client: &Client, session: &str, consumer: &str) {
        if self.name.as_deref() == Some(session) {
            self.reported.insert(consumer.to_owned());
            client.inner.catch_up.done(&catch_up_key(consumer));
        }
    }

    /// The manager started it with `consumers`: the backlog is on its way from those that
    /// have not reported yet.
    fn started(&mut self, client: &Client, consumers: &[String]) {
        self.started = true;
        for consumer in consumers.iter().filter(|c| !self.reported.contains(*c)) {
            client
                .inner
                .catch_up
                .register(&catch_up_key(consumer), BACKLOG);
        }
        client.inner.catch_up.done(FIRST_SESSION);
    }
}

fn catch_up_key(consumer: &str) -> String {
    format!("{FIRST_SESSION}/{consumer}")
}

/// Asks for a new delivery session until the manager answers (it may still be starting after
/// a restart of the appliance), or the connection drops first (its return asks again). A
/// refusal is final: this identity has no backstop here. `first` while the first session has
/// not started.
async fn resume(
    client: &Client,
    state: &mut tokio::sync::watch::Receiver<ConnectionState>,
    first: Option<&Mutex<FirstSession>>,
) {
    let mut wait = Duration::from_millis(100);
    let session = crate::protocol::new_message_id();
    if let Some(first) = first {
        let mut first = first.lock().await;
        first.name = Some(session.clone());
        first.reported.clear();
    }
    loop {
        let request = Request::Resume(Resume {
            session: session.clone(),
            offers: true,
            ranges: true,
        });
        match client.manager::<Resumed>(&request).await {
            Ok(resumed) => {
                tracing::debug!(
                    session = resumed.session,
                    memberships = resumed.memberships.len(),
                    "backstop session started"
                );
                if let Some(first) = first {
                    first.lock().await.started(client, &resumed.consumers);
                }
                return;
            }
            Err(ClientError::Refused { error, .. }) => {
                tracing::info!(error, "no durable backstop for this identity");
                if let Some(first) = first {
                    first.lock().await.started(client, &[]);
                }
                return;
            }
            Err(e) => tracing::debug!(error = %e, "backstop session not started yet"),
        }
        if *state.borrow_and_update() != ConnectionState::Connected {
            return;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RESUME_RETRY_MAX);
    }
}
