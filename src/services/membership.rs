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

use std::collections::{BTreeMap, BTreeSet};
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
/// account, asked over `reader` (a [`BrokerView`] connection).
pub async fn live_subscriptions(
    space: &Space,
    reader: &async_nats::Client,
) -> Result<BTreeMap<String, BTreeSet<String>>, ServiceError> {
    #[derive(Deserialize)]
    struct Reply {
        data: Option<Connz>,
        error: Option<serde_json::Value>,
    }
    #[derive(Deserialize)]
    struct Connz {
        #[serde(default)]
        connections: Vec<Conn>,
    }
    #[derive(Deserialize)]
    struct Conn {
        #[serde(default)]
        authorized_user: String,
        #[serde(default)]
        subscriptions_list: Vec<String>,
    }
    let subject = crate::binding::system::account_connz(space.account());
    let body = serde_json::json!({"subscriptions": true, "auth": true, "limit": CONNZ_LIMIT});
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
    let chat = space.names().any_sender_prefix();
    let mut live: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for conn in reply.data.map(|d| d.connections).unwrap_or_default() {
        if InstanceId::from_user_nkey(&conn.authorized_user).is_err() {
            continue;
        }
        let patterns = conn
            .subscriptions_list
            .iter()
            .filter_map(|s| s.strip_prefix(&chat))
            .map(str::to_owned);
        live.entry(conn.authorized_user)
            .or_default()
            .extend(patterns);
    }
    Ok(live)
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
    ) -> Result<(), ServiceError> {
        let mut now = Written::new();
        for (id, patterns) in live_subscriptions(&self.space, reader).await? {
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
        // The broker view is dialed while the feed's own entries are listed: each is a few
        // round trips, and neither needs the other (at start it was dialed already).
        let dialed = self.dialed.lock().ok().and_then(|mut d| d.take());
        let reader = async {
            match dialed {
                Some(reader) => Ok(reader),
                None => self.view.connect(self.space.name(), "membership").await,
            }
        };
        let (reader, listed) = tokio::join!(reader, self.written_before());
        let (reader, (kv, mut written)) = (reader?, listed?);
        let account = self.space.account();
        let mut events = futures_util::stream::select(
            reader
                .subscribe(crate::binding::system::account_connects(account))
                .await
                .map_err(ServiceError::at("subscribing to connect events"))?,
            reader
                .subscribe(crate::binding::system::account_disconnects(account))
                .await
                .map_err(ServiceError::at("subscribing to disconnect events"))?,
        );
        let changed = self.members.changed();
        let mut poll = tokio::time::interval(POLL);
        poll.tick().await;
        let mut first = true;
        loop {
            let registry = changed.notified();
            tokio::pin!(registry);
            registry.as_mut().enable();
            self.refresh(&reader, &kv, &mut written).await?;
            if first {
                ctx.report(Health::Running);
                first = false;
            }
            tokio::select! {
                () = ctx.cancelled() => break,
                _ = events.next() => {}
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
            while let Some(Some(_)) = events.next().now_or_never() {}
        }
        let _ = reader.drain().await;
        Ok(())
    }
}
