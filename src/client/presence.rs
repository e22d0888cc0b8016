//! Presence (§6): the heartbeat of our own key and the roster of everyone else's.
//!
//! The heartbeat writes only our own key (`card.id`) every 2000 ms and never `offline` while
//! live; [`Client::close`] writes one final `offline`. The roster is a core subscription to the
//! presence bucket's subjects plus a snapshot of every key (no consumer: see `binding/acl.rs`
//! for why agents hold no consumer create on the buckets); it drops records whose key differs
//! from `card.id`, treats delete/purge and stale `ts` (6000 ms) as offline, and is read again
//! after every reconnect (the broker may have restarted). While the connection is down, and
//! until the roster has been read again after a reconnect, it is marked stale instead of
//! declaring every peer offline.
//!
//! A broker that stalls (stopped, or too loaded to route) keeps the connection open while no
//! heartbeat reaches anyone: every peer's `ts` would age past the liveness window together. An
//! endpoint that heartbeats therefore also watches its own record come back through the watch;
//! when it has not for `ECHO_WINDOW` (1.5 heartbeats, shorter than the 3 of the liveness
//! window, so the view turns stale before a live peer could look offline), the view is stale.
//! Once the roster has been read again after an outage, a peer whose last record predates that
//! read keeps its last status for one liveness window: it had no broker to beat to either, and
//! is judged by its first heartbeat after the recovery, not by the outage's length.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use tokio::sync::Notify;

use super::{BoxError, Client, ClientError, ConnectionState, nats_err};
use crate::binding::SpaceNames;
use crate::protocol::{
    AgentCard, AgentSkill, AttentionMode, Channel, ChannelMode, EpochMillis, HEARTBEAT_INTERVAL,
    InstanceId, LIVENESS_WINDOW, Presence, PresenceStatus, accept_presence_record,
    effective_status,
};

/// How many identities known besides presence a roster keeps (past it, it starts over).
const KNOWN_MAX: usize = 4096;
/// The fewest characters of an instance id that [`Roster::resolve`] takes as a prefix of one.
pub const MIN_PREFIX: usize = 8;

/// How long our own heartbeat may go without coming back through the watch before the view is
/// stale: longer than one heartbeat interval, shorter than the liveness window minus one.
const ECHO_WINDOW: std::time::Duration =
    std::time::Duration::from_millis(HEARTBEAT_INTERVAL.as_millis() as u64 * 3 / 2);

/// One peer as last seen.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Its last record.
    pub presence: Presence,
    /// Whether its key was deleted or purged.
    pub removed: bool,
}

impl Peer {
    /// The status to believe now: `offline` if removed or stale (§6).
    pub fn status(&self) -> PresenceStatus {
        if self.removed {
            return PresenceStatus::Offline;
        }
        effective_status(&self.presence, &EpochMillis::now(), LIVENESS_WINDOW)
    }
}

/// The roster: every peer seen in the space's presence directory, and the identities known by
/// name besides (the senders of what this endpoint received, the identities minted on the
/// appliance it runs beside), by which a peer that is away is still addressed.
#[derive(Clone, Default)]
pub struct Roster {
    peers: Arc<Mutex<BTreeMap<String, Peer>>>,
    /// Instance id → name, of identities known without their presence.
    known: Arc<Mutex<BTreeMap<String, String>>>,
    loaded: Arc<AtomicBool>,
    stale: Arc<AtomicBool>,
    /// Our own key and when its record last came back through the watch; `None` when this
    /// endpoint does not heartbeat.
    echo: Arc<Mutex<Option<(String, std::time::Instant)>>>,
    /// When (Unix ms) the roster was last read again after an outage.
    reread_at: Arc<AtomicU64>,
    changed: Arc<Notify>,
    updates: Arc<AtomicU64>,
}

impl Roster {
    /// A copy of every peer.
    pub fn peers(&self) -> BTreeMap<String, Peer> {
        self.peers.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// One peer.
    pub fn peer(&self, id: &str) -> Option<Peer> {
        self.peers.lock().ok()?.get(id).cloned()
    }

    /// The display name of instance `id`, from its presence or as known without it.
    pub fn name_of(&self, id: &str) -> Option<String> {
        self.peer(id)
            .map(|p| p.presence.card.name)
            .or_else(|| self.known.lock().ok()?.get(id).cloned())
    }

    /// True while the connection is down or the roster is being read again, and while our own
    /// heartbeat has not come back for `ECHO_WINDOW`: the view is old, not the peers dead.
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed)
            || self
                .echo
                .lock()
                .ok()
                .and_then(|echo| echo.as_ref().map(|(_, at)| at.elapsed() > ECHO_WINDOW))
                .unwrap_or(false)
    }

    /// Expects our own key `own` to come back through the watch from now on.
    fn expect_echo(&self, own: &str) {
        if let Ok(mut echo) = self.echo.lock() {
            *echo = Some((own.to_owned(), std::time::Instant::now()));
        }
    }

    /// The roster was read in full: whatever it shows is current as of now.
    fn refreshed(&self) {
        if self.loaded.load(Ordering::Acquire) {
            let now = EpochMillis::now().as_u64().unwrap_or_default();
            self.reread_at.store(now, Ordering::Relaxed);
        }
        if let Ok(mut echo) = self.echo.lock()
            && let Some((_, at)) = echo.as_mut()
        {
            *at = std::time::Instant::now();
        }
    }

    /// A peer's status as this view can tell it: derived from `ts` while the view is current;
    /// while it is stale, or for one liveness window after it was read again following an
    /// outage for a peer not heard from since, the last status seen (a stalled connection says
    /// nothing about peers).
    pub fn status(&self, id: &str) -> Option<PresenceStatus> {
        let peer = self.peer(id)?;
        let reread_at = self.reread_at.load(Ordering::Relaxed);
        let now = EpochMillis::now().as_u64().unwrap_or(u64::MAX);
        let unjudged = reread_at > 0
            && now < reread_at.saturating_add(LIVENESS_WINDOW.as_millis() as u64)
            && peer.presence.ts.as_u64().is_some_and(|ts| ts < reread_at);
        Some(if (self.is_stale() || unjudged) && !peer.removed {
            peer.presence.status
        } else {
            peer.status()
        })
    }

    /// How many records the watch has applied (grows with every heartbeat seen).
    pub fn updates(&self) -> u64 {
        self.updates.load(Ordering::Relaxed)
    }

    /// Waits for the next roster change.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Waits until the watch has read every record the directory held when it started, so
    /// that a peer missing from [`Roster::peers`] is absent, not merely not read yet.
    pub async fn loaded(&self) {
        loop {
            let changed = self.changed.notified();
            if self.loaded.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }

    /// The instance `who` names: an instance id as given, the one peer whose card name is
    /// `who`, or else the one peer whose id starts with `who` (a compact view's short id). Peers that are online are preferred over those that are not, so an agent that
    /// restarted with a new credential under the same name is found, not its old record.
    pub fn resolve(&self, who: &str) -> Result<InstanceId, ResolveError> {
        if let Ok(id) = InstanceId::from_user_nkey(who) {
            return Ok(id);
        }
        let named: Vec<(String, PresenceStatus)> = self
            .peers()
            .into_iter()
            .filter(|(_, p)| p.presence.card.name == who)
            .map(|(id, p)| (id, p.status()))
            .collect();
        let online: Vec<(String, PresenceStatus)> = named
            .iter()
            .filter(|(_, s)| *s != PresenceStatus::Offline)
            .cloned()
            .collect();
        let chosen = match (online.as_slice(), named.as_slice()) {
            ([one], _) | ([], [one]) => one.0.clone(),
            ([], []) => {
                let known = self.known();
                let by_name: Vec<(String, PresenceStatus)> = known
                    .iter()
                    .filter(|(_, name)| name.as_str() == who)
                    .map(|(id, _)| (id.clone(), PresenceStatus::Offline))
                    .collect();
                let id = match by_name.as_slice() {
                    [(one, _)] => one.clone(),
                    [] => match self.unique_prefix(who, &known) {
                        Some(id) => id,
                        None => {
                            let mut names: std::collections::BTreeSet<String> = self
                                .peers()
                                .values()
                                .map(|p| p.presence.card.name.clone())
                                .collect();
                            names.extend(known.into_values());
                            return Err(ResolveError::Unknown {
                                name: who.to_owned(),
                                known: names.into_iter().collect(),
                            });
                        }
                    },
                    _ => {
                        return Err(ResolveError::Ambiguous {
                            name: who.to_owned(),
                            candidates: by_name,
                        });
                    }
                };
                return InstanceId::from_user_nkey(&id).map_err(|_| ResolveError::Unknown {
                    name: who.to_owned(),
                    known: Default::default(),
                });
            }
            _ => {
                return Err(ResolveError::Ambiguous {
                    name: who.to_owned(),
                    candidates: named,
                });
            }
        };
        InstanceId::from_user_nkey(&chosen).map_err(|_| ResolveError::Unknown {
            name: who.to_owned(),
            known: Default::default(),
        })
    }

    /// The one peer or known identity whose id starts with `prefix` (at least [`MIN_PREFIX`]
    /// characters), as a compact view shows ids.
    fn unique_prefix(&self, prefix: &str, known: &BTreeMap<String, String>) -> Option<String> {
        if prefix.len() < MIN_PREFIX {
            return None;
        }
        let mut ids: std::collections::BTreeSet<String> = self.peers().into_keys().collect();
        ids.extend(known.keys().cloned());
        let mut matching = ids.into_iter().filter(|id| id.starts_with(prefix));
        let one = matching.next()?;
        matching.next().is_none().then_some(one)
    }

    /// Records that the identity `id` goes by `name` (a sender whose message was accepted: its
    /// id is the subject's, §5; or an identity minted on the appliance), so that it can be
    /// addressed by name while it is away. At most `KNOWN_MAX` (4,096) are kept.
    pub fn know(&self, id: &str, name: &str) {
        if let Ok(mut known) = self.known.lock() {
            if known.get(id).is_some_and(|n| n == name) {
                return;
            }
            if known.len() >= KNOWN_MAX && !known.contains_key(id) {
                known.clear();
            }
            known.insert(id.to_owned(), name.to_owned());
        }
    }

    /// The identities known besides presence: id → name.
    fn known(&self) -> BTreeMap<String, String> {
        self.known.lock().map(|k| k.clone()).unwrap_or_default()
    }

    fn mark_loaded(&self) {
        if !self.loaded.swap(true, Ordering::AcqRel) {
            self.changed.notify_waiters();
        }
    }

    fn apply(&self, key: &str, peer: Option<Peer>) {
        if let Ok(mut echo) = self.echo.lock()
            && let Some((own, at)) = echo.as_mut()
            && own == key
        {
            *at = std::time::Instant::now();
        }
        if let Ok(mut peers) = self.peers.lock() {
            match peer {
                Some(p) => {
                    peers.insert(key.to_owned(), p);
                }
                None => {
                    if let Some(p) = peers.get_mut(key) {
                        p.removed = true;
                    }
                }
            }
        }
        self.updates.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
    }
}

/// Why a name does not pick out one instance.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// Nobody in the roster has this name.
    #[error("nobody named `{name}` is in the space's roster{}", known_names(known))]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names the roster knows.
        known: std::collections::BTreeSet<String>,
    },
    /// Several instances have this name and none of them alone is online.
    #[error(
        "`{name}` names {} instances; give the id of the one you mean: {}",
        candidates.len(),
        candidates.iter().map(|(id, s)| format!("{id} ({})", s.as_str())).collect::<Vec<_>>().join(", ")
    )]
    Ambiguous {
        /// The name asked for.
        name: String,
        /// Each instance with that name, and its status.
        candidates: Vec<(String, PresenceStatus)>,
    },
}

fn known_names(known: &std::collections::BTreeSet<String>) -> String {
    if known.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = known.iter().map(String::as_str).collect();
        format!(" (known: {})", names.join(", "))
    }
}

/// What this endpoint declares about itself besides its card (§6).
#[derive(Debug, Clone)]
pub struct Declared {
    /// The declared status (never `offline` while connected).
    pub status: PresenceStatus,
    /// What it is doing, in a few words.
    pub activity: Option<String>,
    /// The global attention mode; `None` means open.
    pub attention: Option<AttentionMode>,
    /// Per-channel attention overrides.
    pub channel_modes: BTreeMap<String, ChannelMode>,
}

impl Default for Declared {
    fn default() -> Self {
        Declared {
            status: PresenceStatus::Idle,
            activity: None,
            attention: None,
            channel_modes: BTreeMap::new(),
        }
    }
}

impl Client {
    /// Sets the presence status (never `offline` while connected) and activity; publishes now.
    pub async fn set_status(
        &self,
        status: PresenceStatus,
        activity: Option<String>,
    ) -> Result<(), ClientError> {
        if status == PresenceStatus::Offline {
            return Err(crate::protocol::PresenceError::OfflineHeartbeat.into());
        }
        self.declare(|d| {
            d.status = status;
            d.activity = activity;
        })
        .await
    }

    /// Sets the global attention mode (advisory, §6); publishes now.
    pub async fn set_attention(&self, attention: Option<AttentionMode>) -> Result<(), ClientError> {
        self.declare(|d| d.attention = attention).await
    }

    /// Sets (or with `None` clears) a per-channel attention override (advisory, §6).
    pub async fn set_channel_mode(
        &self,
        channel: &Channel,
        mode: Option<ChannelMode>,
    ) -> Result<(), ClientError> {
        let key = channel.as_str().to_owned();
        self.declare(|d| match mode {
            Some(m) => {
                d.channel_modes.insert(key, m);
            }
            None => {
                d.channel_modes.remove(&key);
            }
        })
        .await
    }

    /// What this endpoint currently declares (status, activity, attention, channel modes).
    pub fn declared(&self) -> Declared {
        snapshot(&self.inner.declared)
    }

    /// This endpoint's card as it is announced.
    pub fn card(&self) -> AgentCard {
        snapshot(&self.inner.card)
    }

    /// Changes the descriptive half of the card (§6: description, tags, skills); publishes now.
    /// The id, name, kind and role are the credential's and stay as they are.
    pub async fn set_persona(
        &self,
        description: Option<String>,
        tags: Vec<String>,
        skills: Vec<AgentSkill>,
    ) -> Result<(), ClientError> {
        {
            let mut card = self.inner.card.lock().unwrap_or_else(|e| e.into_inner());
            card.description = description;
            card.tags = tags;
            card.skills = skills;
        }
        heartbeat(self).await
    }

    async fn declare(&self, change: impl FnOnce(&mut Declared)) -> Result<(), ClientError> {
        change(
            &mut self
                .inner
                .declared
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        heartbeat(self).await
    }
}

/// A copy of a value behind a lock (a poisoned lock still holds a usable value).
fn snapshot<T: Clone>(m: &Mutex<T>) -> T {
    m.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Writes our own presence key once.
async fn heartbeat(client: &Client) -> Result<(), ClientError> {
    let card = snapshot(&client.inner.card);
    let declared = snapshot(&client.inner.declared);
    let mut record = Presence::heartbeat(card, declared.status, EpochMillis::now())?;
    record.activity = declared.activity;
    record.attention = declared.attention;
    record.channel_modes = declared.channel_modes;
    put(client, &record).await
}

async fn put(client: &Client, record: &Presence) -> Result<(), ClientError> {
    let subject = SpaceNames::kv_subject(&client.inner.names.presence_bucket(), record.key());
    let body = serde_json::to_vec(record).map_err(|source| ClientError::Json {
        what: "presence",
        source,
    })?;
    let ack = client
        .inner
        .js
        .publish(subject, body.into())
        .await
        .map_err(nats_err("presence heartbeat"))?;
    ack.await.map_err(nats_err("presence heartbeat"))?;
    Ok(())
}

/// The single final `offline` record of a graceful close (§6).
pub(crate) async fn publish_offline(client: &Client) {
    let card = snapshot(&client.inner.card);
    let record = Presence::final_offline(card, EpochMillis::now());
    if let Err(e) = put(client, &record).await {
        tracing::debug!(error = %e, "final offline presence not written");
    }
}

/// Watches the roster and, when `announce`, publishes the first heartbeat (so a bad grant
/// fails the connect) and keeps beating.
pub(crate) async fn start(client: &Client, announce: bool) -> Result<(), ClientError> {
    client.inner.background.spawn(watch(client.clone()));
    if !announce {
        return Ok(());
    }
    client.inner.roster.expect_echo(client.id().as_str());
    heartbeat(client).await?;
    client.inner.background.spawn(keep_beating(client.clone()));
    Ok(())
}

/// A heartbeat every [`HEARTBEAT_INTERVAL`] after the first, until the client stops.
async fn keep_beating(client: Client) {
    let mut next = tokio::time::Instant::now() + HEARTBEAT_INTERVAL;
    loop {
        tokio::time::sleep_until(next).await;
        next += HEARTBEAT_INTERVAL;
        if let Err(e) = heartbeat(&client).await {
            tracing::debug!(error = %e, "heartbeat failed; retrying on the next beat");
        }
    }
}

/// Watches the presence bucket; rebinds after every reconnect or failure. The live half is a
/// core subscription to the bucket's subjects, taken before the snapshot so that nothing written
/// in between is missed; the snapshot reads the last record of every key. Neither leaves a
/// consumer in the broker, so no other agent can exhaust what the roster needs.
async fn watch(client: Client) {
    let bucket = client.inner.names.presence_bucket();
    let roster = client.inner.roster.clone();
    let mut state = client.state();
    loop {
        let bound = async {
            let updates = client
                .inner
                .nats
                .subscribe(SpaceNames::kv_subject(&bucket, ">"))
                .await?;
            // The SUB is in effect at the broker before the snapshot is read.
            client.inner.nats.flush().await?;
            snapshot_roster(&client, &roster, &bucket).await?;
            Ok::<_, BoxError>(updates)
        };
        match bound.await {
            Ok(mut updates) => {
                roster.refreshed();
                roster.stale.store(false, Ordering::Relaxed);
                roster.mark_loaded();
                roster.changed.notify_waiters();
                loop {
                    tokio::select! {
                        next = updates.next() => match next {
                            Some(msg) => apply(
                                &roster,
                                &bucket,
                                msg.subject.as_str(),
                                msg.headers.as_ref(),
                                &msg.payload,
                            ),
                            None => break,
                        },
                        changed = state.changed() => {
                            if changed.is_err() {
                                return;
                            }
                            // Down, or (a drop this watch did not see) already back: either way
                            // the view is old until the roster has been read again.
                            roster.stale.store(true, Ordering::Relaxed);
                            roster.changed.notify_waiters();
                            if *state.borrow_and_update() == ConnectionState::Connected {
                                // Reconnected: the broker may have restarted; read it again.
                                break;
                            }
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "roster not read"),
        }
        // Wait until connected before reading again.
        while *state.borrow() != ConnectionState::Connected {
            if state.changed().await.is_err() {
                return;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Reads the last record of every presence key (`STREAM.INFO` lists the keys,
/// `STREAM.MSG.GET` reads each).
async fn snapshot_roster(client: &Client, roster: &Roster, bucket: &str) -> Result<(), BoxError> {
    let stream = client
        .inner
        .js
        .get_stream_no_info(SpaceNames::kv_stream(bucket))
        .await?;
    let mut keys = stream
        .info_with_subjects(SpaceNames::kv_subject(bucket, ">"))
        .await?;
    let mut subjects = Vec::new();
    while let Some(key) = keys.next().await {
        subjects.push(key?.0);
    }
    for subject in subjects {
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(msg) => apply(
                roster,
                bucket,
                msg.subject.as_str(),
                Some(&msg.headers),
                &msg.payload,
            ),
            // Expired between the listing and the read: nothing to show.
            Err(e) => tracing::debug!(subject, error = %e, "presence key not read"),
        }
    }
    Ok(())
}

fn apply(
    roster: &Roster,
    bucket: &str,
    subject: &str,
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
) {
    let prefix = SpaceNames::kv_subject(bucket, "");
    let Some(key) = subject.strip_prefix(&prefix) else {
        return;
    };
    let operation = headers
        .and_then(|h| h.get("KV-Operation"))
        .map(|v| v.as_str().to_owned());
    if matches!(operation.as_deref(), Some("DEL") | Some("PURGE")) {
        roster.apply(key, None);
        return;
    }
    match accept_presence_record(key, payload) {
        Ok(presence) => roster.apply(
            key,
            Some(Peer {
                presence,
                removed: false,
            }),
        ),
        Err(e) => tracing::debug!(key, error = %e, "presence record dropped"),
    }
}
