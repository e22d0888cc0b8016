//! One space as the dashboard sees it: a client connected with the appliance's **observer**
//! identity of that space (Appendix B: chat and CHAT history, presence, the channel registry;
//! no DM, no application publish), subscribed to every channel's live subject, and the last
//! [`FEED_KEEP`] channel messages: read from CHAT history when it starts (within each
//! channel's replay rule, §7), then as they arrive. Pages render from it; event streams
//! subscribe to it.
//!
//! An arrival is kept as it came (subject and payload) and checked like any delivery (§5) only
//! when something shows it: a page, or an event stream that is open when it arrives. A space
//! busy with agents and watched by nobody costs the appliance a copy per message, not a parse.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::broadcast;

use super::SpaceAccess;
use crate::binding::SpaceNames;
use crate::binding::frame::header_rejection;
use crate::client::{Client, Connection};
use crate::protocol::{ChannelPattern, CotalMessage, DeliveryKind, Routing, accept_delivery};
use crate::services::ServiceError;
use crate::services::membership::MembershipEntry;

/// How many messages the feed keeps (and shows on load).
pub(super) const FEED_KEEP: usize = 500;
/// How many arrivals an event stream may fall behind before it is told it lagged.
const LIVE_BACKLOG: usize = 1024;
/// How long the roster may take to load at start.
const ROSTER_LOAD: Duration = Duration::from_secs(5);

/// A message of the feed.
#[derive(Debug)]
pub(super) struct FeedItem {
    /// Its place in this dashboard's feed (grows by one per message; the SSE event id).
    pub seq: u64,
    /// The channel.
    pub channel: String,
    /// The message.
    pub message: CotalMessage,
}

/// A kept message: as read from history, or as it arrived until something shows it.
enum Kept {
    Raw {
        seq: u64,
        subject: String,
        payload: bytes::Bytes,
    },
    /// Checked: `None` when it is not to be shown (an anomaly, or a message the history read
    /// returned as well).
    Checked(Option<Arc<FeedItem>>),
}

struct Feed {
    items: VecDeque<Kept>,
    next_seq: u64,
    /// The `id`s the history read returned: their live copies are not shown again.
    from_history: HashSet<String>,
    max_payload: usize,
}

impl Feed {
    fn new(max_payload: usize) -> Self {
        Feed {
            items: VecDeque::new(),
            next_seq: 0,
            from_history: HashSet::new(),
            max_payload,
        }
    }

    fn keep(&mut self, kept: Kept) {
        if self.items.len() == FEED_KEEP {
            self.items.pop_front();
        }
        self.items.push_back(kept);
    }

    fn item(&mut self, message: CotalMessage) -> Option<Arc<FeedItem>> {
        let Routing::Channel(channel) = &message.routing else {
            return None;
        };
        self.next_seq += 1;
        Some(Arc::new(FeedItem {
            seq: self.next_seq,
            channel: channel.clone(),
            message,
        }))
    }

    /// A message of the history read.
    fn push(&mut self, message: CotalMessage) {
        self.from_history.insert(message.id.clone());
        let item = self.item(message);
        self.keep(Kept::Checked(item));
    }

    /// A live arrival, kept as it came; checked at once (and returned) when `show` is set.
    fn arrive(
        &mut self,
        subject: String,
        payload: bytes::Bytes,
        show: bool,
    ) -> Option<Arc<FeedItem>> {
        self.next_seq += 1;
        let seq = self.next_seq;
        let item = match show {
            true => self.check(seq, &subject, &payload),
            false => {
                self.keep(Kept::Raw {
                    seq,
                    subject,
                    payload,
                });
                return None;
            }
        };
        self.keep(Kept::Checked(item.clone()));
        item
    }

    /// The receive checks of a channel delivery (§5), and the history's duplicates left out.
    fn check(&self, seq: u64, subject: &str, payload: &[u8]) -> Option<Arc<FeedItem>> {
        let accepted = match accept_delivery(subject, payload, self.max_payload) {
            Ok(a) if a.kind == DeliveryKind::Channel => a,
            Ok(_) => return None,
            Err(e) => {
                tracing::debug!(subject, error = %e, "a message not shown on the dashboard");
                return None;
            }
        };
        if self.from_history.contains(&accepted.message.id) {
            return None;
        }
        Some(Arc::new(FeedItem {
            seq,
            channel: accepted.route,
            message: accepted.message,
        }))
    }

    /// Every kept message to be shown, each checked once.
    fn shown(&mut self) -> Vec<Arc<FeedItem>> {
        for i in 0..self.items.len() {
            if let Kept::Raw {
                seq,
                subject,
                payload,
            } = &self.items[i]
            {
                let checked = self.check(*seq, subject, payload);
                self.items[i] = Kept::Checked(checked);
            }
        }
        self.items
            .iter()
            .filter_map(|k| match k {
                Kept::Checked(item) => item.clone(),
                Kept::Raw { .. } => None,
            })
            .collect()
    }
}

/// A space, observed.
pub(super) struct Observer {
    /// The space.
    pub space: String,
    /// The observer's client.
    pub client: Client,
    /// The machine operator's client: what a person at the dashboard sends goes out with it.
    pub voice: Client,
    /// The identities minted for the space.
    pub identities: Arc<crate::space::Identities>,
    /// The DMs to and from the person (the voice's identity).
    pub person: super::person::Person,
    feed: Arc<Mutex<Feed>>,
    live: broadcast::Sender<Arc<FeedItem>>,
    pump: tokio::task::JoinHandle<()>,
}

/// What the observer's feed starts from: every channel's live subject subscribed (read raw:
/// see the module doc), then the recent history; the roster waited for, within
/// [`ROSTER_LOAD`].
async fn prepare(
    client: &Client,
    space: &str,
) -> Result<(async_nats::Subscriber, Vec<CotalMessage>), ServiceError> {
    let at = |what: &str| format!("space `{space}`: {what}");
    let every = ChannelPattern::new(">").expect("`>` is a channel pattern");
    let subject = client.inner.subjects.chat_subscription(&every);
    let subscribed = async {
        let live = client.inner.nats.subscribe(subject).await?;
        client.inner.nats.flush().await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(live)
    };
    let live = subscribed
        .await
        .map_err(|e| ServiceError::new(at("subscribing to every channel"), e))?;
    let recent = client
        .recent(FEED_KEEP)
        .await
        .map_err(|e| ServiceError::new(at("reading the recent history"), e))?;
    let _ = tokio::time::timeout(ROSTER_LOAD, client.roster().loaded()).await;
    Ok((live, recent))
}

impl Observer {
    /// Connects as the observer, joins every channel, reads the recent history; connects the
    /// person's voice meanwhile (the two take a connection's setup each, at once rather than
    /// one after the other).
    pub(super) async fn start(access: SpaceAccess) -> Result<Self, ServiceError> {
        let space = access.name.as_str();
        let at = |what: &str| format!("space `{space}`: {what}");
        let observing = async {
            let Connection { client, deliveries } = Client::connect(access.connect)
                .await
                .map_err(|e| ServiceError::new(at("connecting as the observer"), e))?;
            match prepare(&client, space).await {
                Ok(prepared) => Ok((client, deliveries, prepared)),
                Err(e) => {
                    client.close().await;
                    Err(e)
                }
            }
        };
        let speaking = async {
            let Connection { client: voice, .. } = Client::connect(access.voice)
                .await
                .map_err(|e| ServiceError::new(at("connecting as the machine operator"), e))?;
            match super::person::Person::start(&voice).await {
                Ok(person) => Ok((voice, person)),
                Err(e) => {
                    voice.close().await;
                    Err(e)
                }
            }
        };
        let (client, deliveries, (live_copies, recent), voice, person) =
            match tokio::join!(observing, speaking) {
                (Ok((client, deliveries, prepared)), Ok((voice, person))) => {
                    (client, deliveries, prepared, voice, person)
                }
                (observing, speaking) => {
                    let mut first = None;
                    match observing {
                        Ok((client, ..)) => {
                            client.close().await;
                        }
                        Err(e) => first = Some(e),
                    }
                    match speaking {
                        Ok((voice, _)) => {
                            voice.close().await;
                        }
                        Err(e) => first = first.or(Some(e)),
                    }
                    return Err(first.expect("one of the two failed"));
                }
            };
        let mut feed = Feed::new(client.inner.nats.server_info().max_payload);
        // What the history read returned may arrive live as well (it was subscribed first).
        for message in recent {
            feed.push(message);
        }
        let feed = Arc::new(Mutex::new(feed));
        let (live, _) = broadcast::channel(LIVE_BACKLOG);
        let pump = tokio::spawn(follow(live_copies, deliveries, feed.clone(), live.clone()));
        Ok(Observer {
            identities: access.identities.clone(),
            person,
            space: space.to_owned(),
            client,
            voice,
            feed,
            live,
            pump,
        })
    }

    /// The membership feed's entries of `ids` (§8: live subscriptions and durable
    /// memberships, display only), read key by key with `STREAM.MSG.GET`; an instance without
    /// an entry, or a feed that cannot be read, is left out: the roster shows what presence
    /// says either way.
    pub(super) async fn memberships(&self, ids: &[&str]) -> BTreeMap<String, MembershipEntry> {
        let bucket = SpaceNames::new(&self.space).membership_bucket();
        let stream = match self
            .client
            .inner
            .js
            .get_stream_no_info(SpaceNames::kv_stream(&bucket))
            .await
        {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(space = self.space, error = %e, "membership feed not read");
                return BTreeMap::new();
            }
        };
        let mut entries = BTreeMap::new();
        for id in ids {
            let subject = crate::binding::SpaceNames::kv_subject(&bucket, id);
            let Ok(msg) = stream.get_last_raw_message_by_subject(&subject).await else {
                continue;
            };
            // A deleted entry is an empty value: nothing to show.
            if let Ok(entry) = serde_json::from_slice(&msg.payload) {
                entries.insert((*id).to_owned(), entry);
            }
        }
        entries
    }

    /// The kept messages after feed position `after`, and the arrivals from then on: taken
    /// together, so that none is missed and none is seen twice.
    pub(super) fn follow(
        &self,
        after: u64,
    ) -> (Vec<Arc<FeedItem>>, broadcast::Receiver<Arc<FeedItem>>) {
        let mut feed = self.feed.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = feed.shown();
        kept.retain(|i| i.seq > after);
        (kept, self.live.subscribe())
    }

    /// The kept messages.
    pub(super) fn kept(&self) -> Vec<Arc<FeedItem>> {
        self.follow(0).0
    }

    /// Stops the pump and closes the connection.
    pub(super) async fn close(self) {
        self.pump.abort();
        self.client.close().await;
        self.voice.close().await;
    }
}

/// The observer's pump: every live copy of every channel kept in the feed (and passed on to
/// the open event streams), until the subscription or the client ends.
async fn follow(
    mut live_copies: async_nats::Subscriber,
    mut deliveries: crate::client::Deliveries,
    feed: Arc<Mutex<Feed>>,
    live: broadcast::Sender<Arc<FeedItem>>,
) {
    loop {
        tokio::select! {
            copy = live_copies.next() => {
                let Some(copy) = copy else { return };
                // A frame whose header block is refused is not shown (the space's readers log
                // and count it).
                if let Some(why) = header_rejection(copy.headers.as_ref(), copy.status) {
                    tracing::debug!(subject = %copy.subject, error = %why,
                        "a message not shown on the dashboard");
                    continue;
                }
                let mut feed = feed.lock().unwrap_or_else(|e| e.into_inner());
                // Checked now only for an event stream that is open.
                let show = live.receiver_count() > 0;
                let subject = copy.subject.to_string();
                if let Some(item) = feed.arrive(subject, copy.payload, show) {
                    let _ = live.send(item);
                }
            }
            // The client's notices (roster and the like) are not shown from here.
            event = deliveries.next_event() => if event.is_none() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(sender: &str, id: &str, channel: &str) -> (String, bytes::Bytes) {
        let payload = serde_json::json!({
            "id": id, "ts": 1, "space": "main",
            "from": {"id": sender, "name": "alice"},
            "channel": channel, "parts": [{"kind": "text", "text": "hi"}]
        });
        (
            format!("cotal.main.chat.{sender}.{channel}"),
            serde_json::to_vec(&payload).unwrap().into(),
        )
    }

    #[test]
    fn an_arrival_is_checked_when_shown_and_anomalies_and_history_duplicates_stay_out() {
        let alice = nkeys::KeyPair::new_user().public_key();
        let bob = nkeys::KeyPair::new_user().public_key();
        let mut feed = Feed::new(1 << 20);
        let (subject, payload) = chat(&alice, "m1", "team");
        let historical = accept_delivery(&subject, &payload, 1 << 20).unwrap();
        feed.push(historical.message);
        // Its live copy, a valid arrival, and one whose `from.id` is not its subject's sender.
        assert!(feed.arrive(subject, payload, false).is_none());
        let (subject, payload) = chat(&alice, "m2", "team");
        assert!(feed.arrive(subject, payload, false).is_none());
        let (_, forged) = chat(&alice, "m3", "team");
        assert!(
            feed.arrive(format!("cotal.main.chat.{bob}.team"), forged, false)
                .is_none()
        );
        assert!(matches!(feed.items[2], Kept::Raw { .. }), "not parsed yet");
        let shown: Vec<(u64, String)> = feed
            .shown()
            .iter()
            .map(|i| (i.seq, i.message.id.clone()))
            .collect();
        assert_eq!(shown, [(1, "m1".to_owned()), (3, "m2".to_owned())]);
        // Shown at once to an open stream, checked the same way.
        let (subject, payload) = chat(&alice, "m4", "team");
        let item = feed.arrive(subject, payload, true).expect("shown");
        assert_eq!((item.seq, item.channel.as_str()), (5, "team"));
        let (_, forged) = chat(&alice, "m5", "team");
        assert!(
            feed.arrive(format!("cotal.main.chat.{bob}.team"), forged, true)
                .is_none()
        );
        assert_eq!(feed.shown().len(), 3);
    }

    #[test]
    fn the_feed_keeps_the_last_messages() {
        let alice = nkeys::KeyPair::new_user().public_key();
        let mut feed = Feed::new(1 << 20);
        for i in 0..FEED_KEEP + 10 {
            let (subject, payload) = chat(&alice, &format!("m{i}"), "team");
            feed.arrive(subject, payload, false);
        }
        let shown = feed.shown();
        assert_eq!(shown.len(), FEED_KEEP);
        assert_eq!(shown[0].message.id, "m10");
    }
}
