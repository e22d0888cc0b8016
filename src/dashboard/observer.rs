//! One space as the dashboard sees it: a client connected with the appliance's **observer**
//! identity of that space (Appendix B: chat and CHAT history, presence, the channel registry;
//! no DM, no application publish), joined to every channel (`>`) without replay, and the last
//! [`FEED_KEEP`] channel messages: read from CHAT history when it starts (within each
//! channel's replay rule, §7), then as they arrive. Pages render from it; event streams
//! subscribe to it.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast;

use super::SpaceAccess;
use crate::binding::SpaceNames;
use crate::client::{Client, Connection, Replay};
use crate::protocol::{CotalMessage, Routing};
use crate::services::ServiceError;
use crate::services::membership::MembershipEntry;

/// How many messages the feed keeps (and shows on load).
pub const FEED_KEEP: usize = 500;
/// How many arrivals an event stream may fall behind before it is told it lagged.
const LIVE_BACKLOG: usize = 1024;
/// How long the roster may take to load at start.
const ROSTER_LOAD: Duration = Duration::from_secs(5);

/// A message of the feed.
#[derive(Debug)]
pub struct FeedItem {
    /// Its place in this dashboard's feed (grows by one per message; the SSE event id).
    pub seq: u64,
    /// The channel.
    pub channel: String,
    /// The message.
    pub message: CotalMessage,
}

#[derive(Default)]
struct Feed {
    items: VecDeque<Arc<FeedItem>>,
    next_seq: u64,
}

impl Feed {
    fn push(&mut self, message: CotalMessage) -> Option<Arc<FeedItem>> {
        let Routing::Channel(channel) = &message.routing else {
            return None;
        };
        self.next_seq += 1;
        let item = Arc::new(FeedItem {
            seq: self.next_seq,
            channel: channel.clone(),
            message,
        });
        if self.items.len() == FEED_KEEP {
            self.items.pop_front();
        }
        self.items.push_back(item.clone());
        Some(item)
    }
}

/// A space, observed.
pub struct Observer {
    /// The space.
    pub space: String,
    /// The observer's client.
    pub client: Client,
    /// The machine operator's client: what a person at the dashboard sends goes out with it.
    pub voice: Client,
    feed: Arc<Mutex<Feed>>,
    live: broadcast::Sender<Arc<FeedItem>>,
    pump: tokio::task::JoinHandle<()>,
}

impl Observer {
    /// Connects as the observer, joins every channel, reads the recent history.
    pub async fn start(access: SpaceAccess) -> Result<Self, ServiceError> {
        let space = access.name.as_str();
        let options = access.connect;
        let at = |what: &str| format!("space `{space}`: {what}");
        let Connection {
            client,
            mut deliveries,
        } = Client::connect(options)
            .await
            .map_err(|e| ServiceError::new(at("connecting as the observer"), e))?;
        let prepared = async {
            client
                .join(">", Replay::Off)
                .await
                .map_err(|e| ServiceError::new(at("joining every channel"), e))?;
            let recent = client
                .recent(FEED_KEEP)
                .await
                .map_err(|e| ServiceError::new(at("reading the recent history"), e))?;
            let _ = tokio::time::timeout(ROSTER_LOAD, client.roster().loaded()).await;
            Ok::<_, ServiceError>(recent)
        };
        let recent = match prepared.await {
            Ok(recent) => recent,
            Err(e) => {
                client.close().await;
                return Err(e);
            }
        };
        let voice = match Client::connect(access.voice).await {
            Ok(Connection { client, .. }) => client,
            Err(e) => {
                client.close().await;
                return Err(ServiceError::new(
                    at("connecting as the machine operator"),
                    e,
                ));
            }
        };
        let mut feed = Feed::default();
        // What the history read returned may arrive live as well (it was joined first).
        let seen: HashSet<String> = recent.iter().map(|m| m.id.clone()).collect();
        for message in recent {
            feed.push(message);
        }
        let feed = Arc::new(Mutex::new(feed));
        let (live, _) = broadcast::channel(LIVE_BACKLOG);
        let pump = {
            let feed = feed.clone();
            let live = live.clone();
            tokio::spawn(async move {
                while let Some(event) = deliveries.next_event().await {
                    let crate::client::deliver::Event::Message(delivery) = event else {
                        continue;
                    };
                    if seen.contains(&delivery.message.id) {
                        continue;
                    }
                    let mut feed = feed.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(item) = feed.push(delivery.message) {
                        let _ = live.send(item);
                    }
                }
            })
        };
        Ok(Observer {
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
    pub async fn memberships(&self, ids: &[&str]) -> BTreeMap<String, MembershipEntry> {
        let bucket = SpaceNames::new(&self.space).membership_bucket();
        let stream = match self
            .client
            .inner
            .js
            .get_stream(SpaceNames::kv_stream(&bucket))
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
    pub fn follow(&self, after: u64) -> (Vec<Arc<FeedItem>>, broadcast::Receiver<Arc<FeedItem>>) {
        let feed = self.feed.lock().unwrap_or_else(|e| e.into_inner());
        let kept = feed
            .items
            .iter()
            .filter(|i| i.seq > after)
            .cloned()
            .collect();
        (kept, self.live.subscribe())
    }

    /// The kept messages.
    pub fn kept(&self) -> Vec<Arc<FeedItem>> {
        self.follow(0).0
    }

    /// Stops the pump and closes the connection.
    pub async fn close(self) {
        self.pump.abort();
        self.client.close().await;
        self.voice.close().await;
    }
}
