//! The derived channel-membership feed `cotal_membership_<space>` (§8): for each instance
//! (key = its id), `{live, durable, observedAt}`: the channel patterns its connections are
//! subscribed to now, as the broker sees them, and its open durable memberships (the members
//! registry). It lets an observer show silent readers and live-channel membership without a
//! broker-admin credential.
//!
//! **Display only.** Nothing in the appliance reads it: delivery and authorization use the
//! broker's `sub.allow` and the members registry (§8 "MUST NOT be an input").
//!
//! **Scoped.** The broker's view comes from a SYS-account user minted for this one connection
//! with the grants of [`crate::binding::acl::membership_daemon`]: it may ask for this space
//! account's connections (`$SYS.REQ.ACCOUNT.<account>.CONNZ`) and hear their connect and
//! disconnect events, nothing else. The feed is written by the space's provisioner connection;
//! agents cannot write it (Appendix B grants no publish on the bucket).
//!
//! **When.** At start, on every connect/disconnect event of the account, on every change of
//! the members registry, and every [`POLL`] (subscriptions change without an event). An
//! entry is written only when its `live` or `durable` set changed; an instance with neither is
//! deleted.
//!
//! **Cheap for the broker.** A `CONNZ` that names each connection's user makes the broker
//! decode and verify every connection's JWT; the feed asks for one only at its first refresh
//! and when a connection is listed whose user it has not heard of. Otherwise it names the
//! connections itself, from the connect and disconnect events it hears anyway
//! (`ConnectionUsers`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv::Store;
use futures_util::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};

use super::{Context, Health, Service, ServiceError};
use crate::binding::Creds;
use crate::client::nats_options;
use crate::protocol::{EpochMillis, InstanceId};
use crate::space::Space;
use crate::space::members::Members;

/// What a failed write of the feed was doing.
const WRITING: &str = "writing the membership feed";

/// How often the feed is refreshed without an event.
pub const POLL: Duration = Duration::from_secs(10);
/// Events arriving within this window are handled by one refresh.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// The most connections one CONNZ answer lists.
const CONNZ_LIMIT: usize = 100_000;

/// One instance's entry in the feed (§8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MembershipEntry {
    /// Channel patterns of its live subscriptions (wildcards kept, §8).
    pub live: Vec<String>,
    /// Channels it is a durable member of.
    pub durable: Vec<String>,
    /// When this was observed (epoch ms).
    pub observed_at: u64,
}

/// How the feed reaches the broker's connection view.
#[derive(Clone)]
pub struct BrokerView {
    /// The SYS-account user with [`crate::binding::acl::membership_daemon`] grants for this
    /// space's account.
    pub creds: Creds,
    /// The CA to trust.
    pub ca: PathBuf,
    /// Where the broker listens.
    pub addr: SocketAddr,
}

impl BrokerView {
    /// Connects to the system account with this view's credential, as `purpose` of `space`.
    pub async fn connect(
        &self,
        space: &str,
        purpose: &str,
    ) -> Result<async_nats::Client, ServiceError> {
        let id = self
            .creds
            .public_key()
            .map_err(ServiceError::at("the broker view's credential"))?;
        nats_options(
            &self.creds,
            format!("cotald-{purpose}-{space}"),
            Some(&self.ca),
            true,
        )
        .map_err(ServiceError::at("the broker view's credential"))?
        .custom_inbox_prefix(crate::binding::system::inbox_prefix(&id))
        .connect(format!("tls://{}", self.addr))
        .await
        .map_err(ServiceError::at(
            "connecting to the broker's system account",
        ))
    }
}

/// The live channel patterns per instance of `space`, from the broker's connections of its
/// account, asked over `reader` (a [`BrokerView`] connection), each connection's user named
/// by the broker.
pub async fn live_subscriptions(
    space: &Space,
    reader: &async_nats::Client,
) -> Result<BTreeMap<String, BTreeSet<String>>, ServiceError> {
    let listed = connz(space, reader, NAMED).await?;
    let users = listed.connections.iter().map(|c| &c.authorized_user);
    Ok(live_of(space, users.zip(&listed.connections)))
}

/// A `CONNZ` that lists every connection with its subscriptions, and (`named`) its user.
/// Naming costs the broker an ed25519 verification per connection listed: it decodes each
/// connection's JWT, which a burst of a thousand connects asking once per debounce made about
/// 13 % of the broker's CPU while they connected (`space_1000`, `docs/benchmarks.md`).
#[derive(Clone, Copy)]
struct Named(bool);
const NAMED: Named = Named(true);
const UNNAMED: Named = Named(false);

/// One server's answer to `CONNZ`.
#[derive(Deserialize)]
struct Connz {
    #[serde(default)]
    server_id: String,
    #[serde(default)]
    connections: Vec<Conn>,
}

/// A connection listed by `CONNZ`.
#[derive(Deserialize)]
struct Conn {
    cid: u64,
    #[serde(default)]
    authorized_user: String,
    #[serde(default)]
    subscriptions_list: Vec<String>,
}

/// Asks for the connections of `space`'s account.
async fn connz(
    space: &Space,
    reader: &async_nats::Client,
    Named(named): Named,
) -> Result<Connz, ServiceError> {
    #[derive(Deserialize)]
    struct Reply {
        data: Option<Connz>,
        error: Option<serde_json::Value>,
    }
    let subject = crate::binding::system::account_connz(space.account());
    let body = serde_json::json!({"subscriptions": true, "auth": named, "limit": CONNZ_LIMIT});
    let reply = reader
        .request(subject, body.to_string().into())
        .await
        .map_err(ServiceError::at(
            "asking the broker for the account's connections",
        ))?;
    let reply: Reply = serde_json::from_slice(&reply.payload)
        .map_err(ServiceError::at("reading the broker's connection list"))?;
    if let Some(error) = reply.error {
        return Err(ServiceError::msg(format!(
            "the broker refused the connection list: {error}"
        )));
    }
    reply
        .data
        .ok_or_else(|| ServiceError::msg("the broker's connection list said nothing"))
}

/// The live channel patterns per instance, from connections and the user of each.
fn live_of<'a>(
    space: &Space,
    connections: impl Iterator<Item = (&'a String, &'a Conn)>,
) -> BTreeMap<String, BTreeSet<String>> {
    let chat = space.names().any_sender_prefix();
    let mut live: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (user, conn) in connections {
        if InstanceId::from_user_nkey(user).is_err() {
            continue;
        }
        let patterns = conn
            .subscriptions_list
            .iter()
            .filter_map(|s| s.strip_prefix(&chat))
            .map(str::to_owned);
        live.entry(user.clone()).or_default().extend(patterns);
    }
    live
}

/// The user of each connection of the account, by server and connection id: learned from the
/// connect and disconnect events the feed hears anyway, so that its refreshes can ask for an
/// unnamed `CONNZ`. A connection's connect event leaves the server before the answer of a
/// `CONNZ` that lists it, but in the moment between its authentication and its event, so a
/// connection listed without a known user is rare: the refresh then asks for a named `CONNZ`
/// and learns every user from it.
#[derive(Default)]
struct ConnectionUsers(HashMap<String, HashMap<u64, String>>);

impl ConnectionUsers {
    /// Takes a connect or disconnect event of the account; anything else is ignored.
    fn hear(&mut self, event: &async_nats::Message) {
        #[derive(Deserialize)]
        struct Event {
            server: EventServer,
            client: EventClient,
        }
        #[derive(Deserialize)]
        struct EventServer {
            id: String,
        }
        #[derive(Deserialize)]
        struct EventClient {
            id: u64,
            #[serde(default)]
            user: String,
        }
        let connected = event.subject.as_str().ends_with(".CONNECT");
        let Ok(event) = serde_json::from_slice::<Event>(&event.payload) else {
            return;
        };
        let server = self.0.entry(event.server.id).or_default();
        if connected {
            server.insert(event.client.id, event.client.user);
        } else {
            server.remove(&event.client.id);
        }
    }

    /// Whether no connection is known (nothing was named yet).
    fn is_empty(&self) -> bool {
        self.0.values().all(HashMap::is_empty)
    }

    /// The connections of `listed` with their users, when every one is known.
    fn name<'a>(&self, listed: &'a Connz) -> Option<Vec<(&String, &'a Conn)>> {
        let server = self.0.get(&listed.server_id)?;
        listed
            .connections
            .iter()
            .map(|c| Some((server.get(&c.cid)?, c)))
            .collect()
    }

    /// Forgets the connections of `listed`'s server that are gone though no disconnect event
    /// said so (one lost): connection ids only grow, so one below the highest listed that is
    /// not listed has ended.
    fn forget_gone(&mut self, listed: &Connz) {
        let Some(server) = self.0.get_mut(&listed.server_id) else {
            return;
        };
        let ids: HashSet<u64> = listed.connections.iter().map(|c| c.cid).collect();
        let highest = ids.iter().max().copied().unwrap_or(0);
        server.retain(|cid, _| *cid > highest || ids.contains(cid));
    }

    /// Learns every user a named `CONNZ` lists.
    fn learn(&mut self, named: &Connz) {
        self.forget_gone(named);
        let server = self.0.entry(named.server_id.clone()).or_default();
        for c in &named.connections {
            server.insert(c.cid, c.authorized_user.clone());
        }
    }
}

/// The account's connect and disconnect events.
type Events = futures_util::stream::Select<async_nats::Subscriber, async_nats::Subscriber>;

/// Takes every event already received.
fn hear_pending(users: &mut ConnectionUsers, events: &mut Events) {
    while let Some(Some(event)) = events.next().now_or_never() {
        users.hear(&event);
    }
}

/// What the feed says of each instance it has an entry for: its live and durable sets.
type Written = BTreeMap<String, (Vec<String>, Vec<String>)>;

/// The feed writer of one space.
pub struct MembershipFeed {
    space: Arc<Space>,
    members: Arc<Members>,
    view: BrokerView,
    /// The view's connection when it was dialed while the broker got ready; taken by the
    /// first run (a run after a failure dials again).
    dialed: std::sync::Mutex<Option<async_nats::Client>>,
}

impl MembershipFeed {
    /// The feed of `space`.
    pub fn new(
        space: Arc<Space>,
        members: Arc<Members>,
        view: BrokerView,
        dialed: Option<async_nats::Client>,
    ) -> Self {
        MembershipFeed {
            space,
            members,
            view,
            dialed: std::sync::Mutex::new(dialed),
        }
    }

    /// One refresh: what the feed should say now, written where it differs from `written`.
    async fn refresh(
        &self,
        reader: &async_nats::Client,
        kv: &Store,
        written: &mut Written,
        heard: (&mut ConnectionUsers, &mut Events),
    ) -> Result<(), ServiceError> {
        let live = self.live_now(reader, heard).await?;
        self.write(kv, written, live).await
    }

    /// What the feed should say, given the live channel patterns per instance `live`, written
    /// where it differs from `written`.
    async fn write(
        &self,
        kv: &Store,
        written: &mut Written,
        live: BTreeMap<String, BTreeSet<String>>,
    ) -> Result<(), ServiceError> {
        let mut now = Written::new();
        for (id, patterns) in live {
            if !patterns.is_empty() {
                now.entry(id).or_default().0 = patterns.into_iter().collect();
            }
        }
        for record in self.members.all() {
            if record.open().is_some() {
                now.entry(record.member.clone())
                    .or_default()
                    .1
                    .push(record.channel.clone());
            }
        }
        let observed_at = EpochMillis::now().as_u64().unwrap_or_default();
        // Every entry that changed is written at once, each under its own key (a first
        // refresh rewrites all that an earlier run left).
        let mut writes = Vec::new();
        for (id, (live, durable)) in &now {
            if written.get(id) == Some(&(live.clone(), durable.clone())) {
                continue;
            }
            let entry = MembershipEntry {
                live: live.clone(),
                durable: durable.clone(),
                observed_at,
            };
            let value =
                serde_json::to_vec(&entry).map_err(ServiceError::at("encoding an entry"))?;
            let write = kv.put(id, value.into());
            writes.push(
                write
                    .map(|r| r.map(drop).map_err(ServiceError::at(WRITING)))
                    .boxed(),
            );
        }
        for id in written.keys().filter(|id| !now.contains_key(*id)) {
            writes.push(
                kv.delete(id)
                    .map(|r| r.map_err(ServiceError::at(WRITING)))
                    .boxed(),
            );
        }
        futures_util::future::try_join_all(writes).await?;
        *written = now;
        Ok(())
    }

    /// The live channel patterns per instance: an unnamed `CONNZ` whose connections are named
    /// from the events heard (those heard meanwhile taken first), else (the first refresh, or a
    /// connection listed before its event came) a named one, which `users` learns from.
    async fn live_now(
        &self,
        reader: &async_nats::Client,
        (users, events): (&mut ConnectionUsers, &mut Events),
    ) -> Result<BTreeMap<String, BTreeSet<String>>, ServiceError> {
        if !users.is_empty() {
            let listed = connz(&self.space, reader, UNNAMED).await?;
            // Forgotten before the events that came with the answer are taken: a connection
            // whose event came after the server listed the others is not forgotten by it.
            users.forget_gone(&listed);
            hear_pending(users, events);
            if let Some(named) = users.name(&listed) {
                return Ok(live_of(&self.space, named.into_iter()));
            }
            tracing::debug!(
                space = self.space.name(),
                "a connection listed before its connect event came: asking for a named list"
            );
        }
        let named = connz(&self.space, reader, NAMED).await?;
        users.learn(&named);
        let connections = named.connections.iter();
        Ok(live_of(
            &self.space,
            connections.map(|c| (&c.authorized_user, c)),
        ))
    }

    /// The connect and disconnect events of the space's account, heard over `reader`.
    async fn events(&self, reader: &async_nats::Client) -> Result<Events, ServiceError> {
        let account = self.space.account();
        Ok(futures_util::stream::select(
            reader
                .subscribe(crate::binding::system::account_connects(account))
                .await
                .map_err(ServiceError::at("subscribing to connect events"))?,
            reader
                .subscribe(crate::binding::system::account_disconnects(account))
                .await
                .map_err(ServiceError::at("subscribing to disconnect events"))?,
        ))
    }

    /// The feed's bucket, and the entries an earlier run left in it: compared like any other,
    /// as unknown values, so each is rewritten or deleted at the first refresh.
    async fn written_before(&self) -> Result<(Store, Written), ServiceError> {
        let kv = self
            .space
            .jetstream()
            .get_key_value(self.space.names().membership_bucket())
            .await
            .map_err(ServiceError::at("opening the membership feed"))?;
        let mut written = Written::new();
        let mut keys = kv
            .keys()
            .await
            .map_err(ServiceError::at("listing the membership feed"))?;
        while let Some(key) = keys.next().await {
            let key = key.map_err(ServiceError::at("listing the membership feed"))?;
            written.insert(key, (vec!["?".into()], Vec::new()));
        }
        Ok((kv, written))
    }
}

impl Service for MembershipFeed {
    fn name(&self) -> &'static str {
        "membership"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        // The broker's connections are first listed while the feed's own entries are: each is
        // a few round trips, and neither needs the other (the broker view was dialed already
        // at start). The events are subscribed to before the listing is asked for, on the
        // same connection: a connect or disconnect after it is heard.
        let dialed = self.dialed.lock().ok().and_then(|mut d| d.take());
        let mut users = ConnectionUsers::default();
        // A change of the members registry during a refresh makes another: each refresh is
        // preceded by a registration for the next change.
        let changed = self.members.changed();
        let mut registry = Box::pin(changed.notified());
        registry.as_mut().enable();
        let first_listing = async {
            let reader = match dialed {
                Some(reader) => reader,
                None => self.view.connect(self.space.name(), "membership").await?,
            };
            let mut events = self.events(&reader).await?;
            let live = self.live_now(&reader, (&mut users, &mut events)).await?;
            Ok::<_, ServiceError>((reader, events, live))
        };
        let (first, listed) = tokio::join!(first_listing, self.written_before());
        let ((reader, mut events, live), (kv, mut written)) = (first?, listed?);
        self.write(&kv, &mut written, live).await?;
        ctx.report(Health::Running);
        let mut poll = tokio::time::interval(POLL);
        poll.tick().await;
        loop {
            tokio::select! {
                () = ctx.cancelled() => break,
                Some(event) = events.next() => users.hear(&event),
                () = &mut registry => {}
                _ = poll.tick() => {}
            }
            // A burst of connects is one refresh: every event that came meanwhile is taken
            // with it. (Taking one event per refresh made a burst of a thousand connects a
            // thousand CONNZ requests, each one an ed25519 verification per connection in the
            // broker: measured by `space_1000`, `docs/benchmarks.md`.)
            tokio::select! {
                () = ctx.cancelled() => break,
                () = tokio::time::sleep(DEBOUNCE) => {}
            }
            hear_pending(&mut users, &mut events);
            registry = Box::pin(changed.notified());
            registry.as_mut().enable();
            self.refresh(&reader, &kv, &mut written, (&mut users, &mut events))
                .await?;
        }
        let _ = reader.drain().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, server: &str, cid: u64, user: &str) -> async_nats::Message {
        let payload = serde_json::json!({
            "type": format!("io.nats.server.advisory.v1.client_{}", kind.to_lowercase()),
            "server": {"name": "n", "id": server},
            "client": {"id": cid, "user": user, "acc": "A"},
        });
        async_nats::Message {
            subject: format!("$SYS.ACCOUNT.A.{kind}").into(),
            reply: None,
            payload: payload.to_string().into(),
            headers: None,
            status: None,
            description: None,
            length: 0,
        }
    }

    fn listed(server: &str, cids: &[u64]) -> Connz {
        Connz {
            server_id: server.into(),
            connections: cids
                .iter()
                .map(|&cid| Conn {
                    cid,
                    authorized_user: String::new(),
                    subscriptions_list: Vec::new(),
                })
                .collect(),
        }
    }

    fn names(users: &ConnectionUsers, connz: &Connz) -> Option<Vec<String>> {
        let named = users.name(connz)?;
        Some(named.into_iter().map(|(u, _)| u.clone()).collect())
    }

    #[test]
    fn connections_are_named_from_their_events_until_they_disconnect() {
        let mut users = ConnectionUsers::default();
        users.hear(&event("CONNECT", "S1", 5, "UA"));
        users.hear(&event("CONNECT", "S1", 7, "UB"));
        users.hear(&event("CONNECT", "S2", 5, "UC"));
        assert_eq!(
            names(&users, &listed("S1", &[5, 7])),
            Some(vec!["UA".into(), "UB".into()])
        );
        assert_eq!(names(&users, &listed("S2", &[5])), Some(vec!["UC".into()]));
        users.hear(&event("DISCONNECT", "S1", 5, "UA"));
        assert_eq!(
            names(&users, &listed("S1", &[5, 7])),
            None,
            "a connection whose user is not known asks for a named list"
        );
        let mut garbage = event("CONNECT", "S1", 9, "UD");
        garbage.payload = "{not json".into();
        users.hear(&garbage);
        assert_eq!(names(&users, &listed("S1", &[9])), None);
    }

    #[test]
    fn a_connection_gone_without_its_event_is_forgotten_and_a_later_one_is_kept() {
        let mut users = ConnectionUsers::default();
        for (cid, user) in [(3, "UA"), (4, "UB"), (9, "UC")] {
            users.hear(&event("CONNECT", "S1", cid, user));
        }
        users.hear(&event("CONNECT", "S2", 1, "UD"));
        // 3 ended unheard; 9 connected after the server listed the others.
        users.forget_gone(&listed("S1", &[4, 6]));
        let known: BTreeSet<_> = users
            .0
            .iter()
            .flat_map(|(server, cids)| cids.keys().map(|cid| (server.clone(), *cid)))
            .collect();
        let expected: BTreeSet<_> = [("S1", 4), ("S1", 9), ("S2", 1)]
            .map(|(s, c)| (s.to_owned(), c))
            .into();
        assert_eq!(known, expected);
        let mut named = listed("S1", &[4, 6]);
        named.connections[1].authorized_user = "UE".into();
        users.learn(&named);
        assert_eq!(users.0["S1"].get(&6).map(String::as_str), Some("UE"));
    }
}
