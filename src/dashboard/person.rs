//! The person at the dashboard and their direct messages, both ways (§4 unicast).
//!
//! What a person types at the dashboard goes out as the machine operator (its "voice",
//! unrestricted in the space), and an agent answers the sender of what it got: its DM to the
//! operator waits in the operator's `dm_<id>`, which `cotald tail --dm` reads. The dashboard
//! shows those conversations without consuming them: the last [`KEEP`] DMs to and from the
//! person, read from the DM stream when the dashboard starts, then as they arrive on the
//! voice's own subscriptions. Each is checked as a delivery (§5) before it is kept.
//!
//! What the person sends from the dashboard is remembered with its receipt (where it went,
//! said on the page the form returns to) and its stream sequence, by which the direct page
//! asks whether each DM was read (`read` on `ctl.manager`, from the recipient's ack floor).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures_util::StreamExt;

use crate::binding::frame::accept_delivery;
use crate::client::Client;
use crate::protocol::{CotalMessage, DeliveryKind, InstanceId, Routing};
use crate::services::ServiceError;

/// How many DMs to and from the person are kept, and how many sends remembered.
pub(super) const KEEP: usize = 200;

/// How many of the newest DMs the person sent the direct page asks about.
const READ_ASKED: usize = 20;

/// One DM to or from the person.
#[derive(Debug)]
pub(super) struct DirectItem {
    /// Whether it was sent to the person (else by the person).
    pub incoming: bool,
    /// The other side: its instance id.
    pub peer: String,
    /// The message.
    pub message: CotalMessage,
    /// Its stream sequence, when known (read from the stream, or sent from the dashboard).
    pub sequence: Option<u64>,
}

/// What the person sent from the dashboard.
#[derive(Debug, Clone)]
pub(super) struct Sent {
    /// The message's id.
    pub id: String,
    /// Its stream sequence.
    pub sequence: u64,
    /// Where it went, in words (the receipt at sending).
    pub receipt: String,
}

/// The person's DMs.
pub(super) struct Person {
    /// The person's instance id.
    pub id: String,
    kept: Arc<Mutex<Kept>>,
    pump: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Kept {
    items: VecDeque<Arc<DirectItem>>,
    /// (sender, id) of every kept message: a DM read from history and seen live is kept once.
    seen: HashSet<(String, String)>,
    /// What the person sent from the dashboard, oldest first.
    sent: VecDeque<Sent>,
    /// What the direct page says of the DMs the person sent that their recipient read, by
    /// id (asked no more).
    read: HashMap<String, String>,
}

impl Kept {
    /// Keeps a DM, once; returns whether it was new.
    fn keep(
        &mut self,
        me: &str,
        subject: &str,
        msg: &async_nats::Message,
        sequence: Option<u64>,
        max: usize,
    ) -> bool {
        let Ok(accepted) =
            accept_delivery(subject, msg.headers.as_ref(), msg.status, &msg.payload, max)
        else {
            return false;
        };
        if accepted.kind != DeliveryKind::Dm {
            return false;
        }
        let key = (accepted.sender().to_owned(), accepted.message.id.clone());
        if !self.seen.insert(key) {
            return false;
        }
        // `inst.<target>.<sender>`: the route is the target.
        let incoming = accepted.route == me;
        let peer = match incoming {
            true => accepted.sender().to_owned(),
            false => accepted.route,
        };
        if self.items.len() == KEEP
            && let Some(old) = self.items.pop_front()
        {
            self.seen
                .remove(&(old.message.from.id.clone(), old.message.id.clone()));
        }
        self.items.push_back(Arc::new(DirectItem {
            incoming,
            peer,
            message: accepted.message,
            sequence,
        }));
        true
    }
}

impl Person {
    /// Follows the DMs to and from `voice`'s identity: subscribed first, then the history
    /// read, so that none falls between.
    pub(super) async fn start(voice: &Client) -> Result<Self, ServiceError> {
        let at = |what: &str| format!("space `{}`: the person's DMs: {what}", voice.space());
        let me = voice.inner.id.as_str().to_owned();
        let names = &voice.inner.names;
        let subjects = [names.dms_to(&me), names.dms_from(&me)];
        let mut live = Vec::new();
        for subject in &subjects {
            live.push(
                voice
                    .inner
                    .nats
                    .subscribe(subject.clone())
                    .await
                    .map_err(|e| ServiceError::new(at("subscribing"), e))?,
            );
        }
        let max = voice.inner.nats.server_info().max_payload;
        let kept = Arc::new(Mutex::new(Kept::default()));
        let history = async {
            let stream = voice.inner.js.get_stream_no_info(names.dm_stream()).await?;
            let consumer = stream
                .create_consumer(pull::OrderedConfig {
                    filter_subjects: subjects.to_vec(),
                    deliver_policy: DeliverPolicy::All,
                    ..Default::default()
                })
                .await?;
            let mut pending = consumer.cached_info().num_pending;
            let mut messages = consumer.messages().await?;
            while pending > 0 {
                let Some(Ok(msg)) = messages.next().await else {
                    break;
                };
                let info = msg.info().ok();
                pending = info.as_ref().map_or(0, |i| i.pending);
                let sequence = info.map(|i| i.stream_sequence);
                let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
                k.keep(&me, msg.subject.as_str(), &msg.message, sequence, max);
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        };
        history
            .await
            .map_err(|e| ServiceError::new(at("reading the history"), e))?;
        let pump = tokio::spawn(follow(
            futures_util::stream::select_all(live),
            kept.clone(),
            me.clone(),
            max,
        ));
        Ok(Person { id: me, kept, pump })
    }

    /// How many DMs to the person wait unread in its `dm_<id>` (not yet acknowledged by a
    /// reader such as `cotald tail --dm`); `None` when the broker cannot say.
    pub(super) async fn unread(&self, voice: &Client) -> Option<u64> {
        let names = &voice.inner.names;
        let stream = voice
            .inner
            .js
            .get_stream_no_info(names.dm_stream())
            .await
            .ok()?;
        let info = stream
            .consumer_info(crate::binding::dm_durable(&self.id))
            .await
            .ok()?;
        Some(info.num_pending + info.num_ack_pending as u64)
    }

    /// Remembers what the person sent from the dashboard.
    pub(super) fn sent(&self, sent: Sent) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.sent.len() == KEEP {
            kept.sent.pop_front();
        }
        kept.sent.push_back(sent);
    }

    /// The receipt of what the person sent with `id` from the dashboard, if remembered.
    pub(super) fn receipt(&self, id: &str) -> Option<String> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.sent
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.receipt.clone())
    }

    /// Whether each of the newest DMs the person sent (at most [`READ_ASKED`]) was read, in
    /// words, by message id; a DM whose stream sequence is unknown (seen only live, sent
    /// elsewhere) is left out. A DM once read is not asked about again.
    pub(super) async fn read_states(&self, voice: &Client) -> HashMap<String, String> {
        let asked: Vec<(String, String, u64)> = {
            let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            let sequence_of = |d: &DirectItem| {
                d.sequence.or_else(|| {
                    kept.sent
                        .iter()
                        .find(|s| s.id == d.message.id)
                        .map(|s| s.sequence)
                })
            };
            kept.items
                .iter()
                .rev()
                .filter(|d| !d.incoming)
                .filter_map(|d| Some((d.message.id.clone(), d.peer.clone(), sequence_of(d)?)))
                .take(READ_ASKED)
                .collect()
        };
        // Asked together: a page renders in one round trip, not one per DM.
        let asks = asked.into_iter().map(|(id, peer, sequence)| async move {
            if let Some(words) = self.read(&id) {
                return Some((id, words));
            }
            let target = peer.parse::<InstanceId>().ok()?;
            let words = match voice.read_receipt(&Routing::to(&target), sequence).await {
                Ok(r) if r.state == Some(crate::ops::receipt::ReadState::Read) => {
                    let words = r.words();
                    let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
                    if kept.read.len() >= 4 * KEEP {
                        kept.read.clear();
                    }
                    kept.read.insert(id.clone(), words.clone());
                    words
                }
                Ok(r) => r.words(),
                Err(e) => format!(
                    "whether it was read is unknown: {}",
                    crate::ops::error_text(&e)
                ),
            };
            Some((id, words))
        });
        futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// What the direct page says of a DM its recipient read (asked no more).
    fn read(&self, id: &str) -> Option<String> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.read.get(id).cloned()
    }

    /// The kept DMs, oldest first.
    pub(super) fn kept(&self) -> Vec<Arc<DirectItem>> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.items.iter().cloned().collect()
    }
}

impl Drop for Person {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

/// Keeps every DM to or from the person as it arrives, until the subscriptions end.
async fn follow(
    mut live: futures_util::stream::SelectAll<async_nats::Subscriber>,
    kept: Arc<Mutex<Kept>>,
    me: String,
    max: usize,
) {
    while let Some(msg) = live.next().await {
        let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
        k.keep(&me, msg.subject.as_str(), &msg, None, max);
    }
}
