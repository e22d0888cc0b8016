//! A served space on a running broker (§1: one space = one account): its provisioner
//! connection, the idempotent bootstrap of its streams and buckets (§8), the identities minted
//! for it (Appendix B) and the durables pre-created for them.
//!
//! The provisioner connects as the space's `manager` user (allow-all within the account, as
//! Appendix B has it in v0); agents never hold its credentials.

pub mod bootstrap;
pub mod holds;
pub mod identities;
pub mod identity;
mod link;
pub mod members;
pub mod refusals;
pub mod registry;
pub mod snapshot;
pub mod store;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, ErrorCode, stream::ConsumerErrorKind};

use crate::binding::{SpaceNames, streams};
use crate::client::BoxError;
use crate::profile::SpaceConfig;
use crate::provision::SpaceKeys;

pub use bootstrap::{BootstrapError, BootstrapReport, bootstrap};
pub use holds::{Held, Hold, Holds};
pub use identities::Identities;
pub use identity::{MintError, Minted};
pub use link::LinkState;
pub use refusals::Refusals;

use crate::ops::IdentityRecord;
use crate::protocol::{
    CHANNEL_DEFAULTS_KEY, ChannelConfig, ChannelDefaults, ChannelPattern, EffectiveChannelConfig,
    resolve,
};

/// Why a space could not be served.
#[derive(Debug, thiserror::Error)]
pub enum SpaceError {
    /// The provisioner could not connect.
    #[error("space `{space}`: the provisioner cannot connect to {addr}")]
    Connect {
        space: String,
        addr: SocketAddr,
        #[source]
        source: crate::client::DialError,
    },
    /// Bootstrap failed.
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    /// Keys.
    #[error(transparent)]
    Provision(#[from] crate::provision::ProvisionError),
    /// A request argument is invalid.
    #[error("{0}")]
    Invalid(String),
    /// Something of the space could not be read.
    #[error("space `{space}`: cannot read {what}")]
    Read {
        space: String,
        what: &'static str,
        #[source]
        source: BoxError,
    },
    /// The channel registry could not be written.
    #[error("space `{space}`: cannot write {key} in the channel registry")]
    Registry {
        space: String,
        key: String,
        #[source]
        source: BoxError,
    },
    /// A durable could not be created or deleted.
    #[error("space `{space}`: cannot provision durable {durable}")]
    Durable {
        space: String,
        durable: String,
        #[source]
        source: BoxError,
    },
}

/// One served space.
pub struct Space {
    names: SpaceNames,
    config: SpaceConfig,
    account: String,
    /// The provisioner's connection, replaced when it closed for good.
    link: link::Link,
    /// The senders whose DMs are held (the warden holds, the manager refuses, the account JWT
    /// carries it out).
    holds: Holds,
    /// What the space's readers refused of what they read.
    refusals: Refusals,
    /// The highest CHAT frontier read so far ([`Space::chat_frontier`]): it only grows.
    frontier_seen: AtomicU64,
    /// The channel registry as a watch of it holds it, when one does.
    registry: registry::RegistryView,
}

/// A space's provisioner connection, dialed before the space is served: a broker that holds
/// the space's account from an earlier start takes it while it gets ready (startup time).
pub struct Dialed {
    space: String,
    account: String,
    link: link::Link,
}

impl Space {
    /// Connects the space's provisioner over TLS.
    pub async fn connect(
        keys: &SpaceKeys,
        config: SpaceConfig,
        addr: SocketAddr,
        ca: &Path,
    ) -> Result<Self, SpaceError> {
        Ok(Space::over(Space::dial(keys, addr, ca).await?, config))
    }

    /// Dials the space's provisioner over TLS; its account must be known to the broker.
    pub async fn dial(keys: &SpaceKeys, addr: SocketAddr, ca: &Path) -> Result<Dialed, SpaceError> {
        let space = keys.name().to_owned();
        let (creds, name) = provisioner(keys)?;
        let link = link::Link::dial(creds, name, ca.to_owned(), addr)
            .await
            .map_err(|source| SpaceError::Connect {
                space: space.clone(),
                addr,
                source,
            })?;
        Ok(Dialed {
            space,
            account: keys.account_public(),
            link,
        })
    }

    /// Another connection as the space's provisioner, for `purpose`, as
    /// [`Space::dial_another`] makes once the space is served, dialed before it is (startup
    /// time).
    pub async fn dial_another_early(
        keys: &SpaceKeys,
        addr: SocketAddr,
        ca: &Path,
        purpose: &str,
    ) -> Result<async_nats::Client, SpaceError> {
        let (creds, name) = provisioner(keys)?;
        link::dial_other(&creds, &name, ca, addr, purpose)
            .await
            .map_err(|source| SpaceError::Connect {
                space: keys.name().to_owned(),
                addr,
                source,
            })
    }

    /// The space served over a connection dialed for it.
    pub fn over(dialed: Dialed, config: SpaceConfig) -> Space {
        let Dialed {
            space,
            account,
            link,
        } = dialed;
        Space {
            names: SpaceNames::new(&space),
            refusals: Refusals::new(&space),
            config,
            account,
            link,
            holds: Holds::default(),
            frontier_seen: AtomicU64::new(0),
            registry: registry::RegistryView::default(),
        }
    }

    /// The space name.
    pub fn name(&self) -> &str {
        self.names.space()
    }

    /// The senders whose DMs are held.
    pub fn holds(&self) -> &Holds {
        &self.holds
    }

    /// What the space's readers refused of what they read.
    pub fn refusals(&self) -> &Refusals {
        &self.refusals
    }

    /// The space's JetStream names.
    pub fn names(&self) -> &SpaceNames {
        &self.names
    }

    /// The space's profile.
    pub fn config(&self) -> &SpaceConfig {
        &self.config
    }

    /// The account public key.
    pub fn account(&self) -> &str {
        &self.account
    }

    /// The provisioner's connection (the manager user: allow-all within the account): a
    /// cheap handle, taken anew by each service run, since a connection that closed for good
    /// is replaced ([`Space::redial`]).
    pub fn nats(&self) -> async_nats::Client {
        self.link.client()
    }

    /// JetStream over the provisioner's connection.
    pub fn jetstream(&self) -> jetstream::Context {
        self.link.jetstream()
    }

    /// The channel registry as the appliance last saw it (`services::registry` keeps it).
    pub fn registry(&self) -> &registry::RegistryView {
        &self.registry
    }

    /// The key-value bucket `bucket` over the provisioner's connection: a handle opened once
    /// per connection (opening one asks the broker for the bucket's stream info).
    pub async fn key_value(
        &self,
        bucket: &str,
    ) -> Result<jetstream::kv::Store, jetstream::context::KeyValueError> {
        self.link.key_value(bucket).await
    }

    /// Which connection [`Space::nats`] is: it grows each time it is dialed again, so that a
    /// handle made over an older one is made again.
    pub fn link_generation(&self) -> u64 {
        self.link.generation()
    }

    /// Whether the provisioner's connection is up, as its events say.
    pub fn link_state(&self) -> tokio::sync::watch::Receiver<LinkState> {
        self.link.state()
    }

    /// A connection of its own as the provisioner, for `purpose` (the warden's view of every
    /// DM and task published, whose payloads must not delay the shared connection's replies).
    pub async fn dial_another(&self, purpose: &str) -> Result<async_nats::Client, SpaceError> {
        self.link
            .dial_another(purpose)
            .await
            .map_err(|source| SpaceError::Connect {
                space: self.name().to_owned(),
                addr: self.link.addr(),
                source,
            })
    }

    /// Dials the broker again in place of a connection that closed for good.
    pub async fn redial(&self) -> Result<(), SpaceError> {
        self.link
            .redial()
            .await
            .map_err(|source| SpaceError::Connect {
                space: self.name().to_owned(),
                addr: self.link.addr(),
                source,
            })
    }

    /// Creates what is missing, reports drift (§8).
    pub async fn bootstrap(&self) -> Result<BootstrapReport, SpaceError> {
        let report = bootstrap(
            &self.jetstream(),
            &self.names,
            &self.config.retention(),
            &self.config.registry_entries(),
        )
        .await?;
        tracing::info!(
            space = self.name(),
            created = report.created.len(),
            drift = report.drift.len(),
            registry_written = report.registry_written.len(),
            "space bootstrapped"
        );
        Ok(report)
    }

    /// Pre-creates the durables an identity binds: `dm_<id>` for every agent and person (an
    /// admin, the machine operator among them: a person reads the replies of the agents it
    /// speaks to) and `svc_<role>` when it has a role (Appendix B: agents bind, never
    /// create). Idempotent.
    pub async fn provision(&self, record: &IdentityRecord) -> Result<(), SpaceError> {
        if !record.has_inbox() {
            return Ok(());
        }
        self.ensure_consumer(
            self.names.dm_stream(),
            streams::dm_consumer(&self.names, &record.id),
        )
        .await?;
        if let Some(role) = &record.role {
            self.ensure_consumer(
                self.names.task_stream(),
                streams::svc_consumer(&self.names, role),
            )
            .await?;
        }
        Ok(())
    }

    async fn ensure_consumer(
        &self,
        stream: String,
        config: jetstream::consumer::pull::Config,
    ) -> Result<(), SpaceError> {
        let durable = config.durable_name.clone().unwrap_or_default();
        let fail = |e: BoxError| SpaceError::Durable {
            space: self.name().to_owned(),
            durable: durable.clone(),
            source: e,
        };
        // A handle without the stream's info, and the consumer's info as it was got or made:
        // one round trip per durable (a space may have hundreds, made at each start).
        let stream = self
            .jetstream()
            .get_stream_no_info(&stream)
            .await
            .map_err(|e| fail(e.into()))?;
        let consumer = stream
            .get_or_create_consumer(&durable, config.clone())
            .await
            .map_err(|e| fail(e.into()))?;
        // An existing durable is bound by agents as it is: it must be the §8 one.
        let actual = consumer.cached_info().config.clone();
        if actual.filter_subject != config.filter_subject
            || actual.deliver_subject.is_some()
            || actual.ack_policy != config.ack_policy
        {
            return Err(fail(BoxError::from(format!(
                "it exists with filter {:?}, deliver subject {:?}, ack policy {:?}; expected \
                 filter {:?}, pull, explicit ack",
                actual.filter_subject,
                actual.deliver_subject,
                actual.ack_policy,
                config.filter_subject
            ))));
        }
        Ok(())
    }

    /// Undoes [`Space::provision`] for a revoked identity: its `dm_<id>` durable and the DMs
    /// still addressed to it are deleted (a role's `svc_<role>` is shared, and stays).
    pub async fn deprovision(&self, record: &IdentityRecord) -> Result<(), SpaceError> {
        let durable = crate::binding::dm_durable(&record.id);
        let fail = |e: BoxError| SpaceError::Durable {
            space: self.name().to_owned(),
            durable: durable.clone(),
            source: e,
        };
        let stream = self
            .jetstream()
            .get_stream_no_info(self.names.dm_stream())
            .await
            .map_err(|e| fail(e.into()))?;
        if let Err(e) = stream.delete_consumer(&durable).await
            && !matches!(e.kind(), ConsumerErrorKind::JetStream(js)
                if js.error_code() == ErrorCode::CONSUMER_NOT_FOUND)
        {
            return Err(fail(e.into()));
        }
        stream
            .purge()
            .filter(self.names.dms_to(&record.id))
            .await
            .map_err(|e| fail(e.into()))?;
        Ok(())
    }

    /// Writes the config of one concrete channel in the registry (§7), replacing what is
    /// stored; returns what was stored.
    pub async fn set_channel(
        &self,
        channel: &str,
        config: &ChannelConfig,
    ) -> Result<ChannelConfig, SpaceError> {
        let pattern = concrete(channel)?;
        let bucket = self.names.channels_bucket();
        let fail = |e: BoxError| SpaceError::Registry {
            space: self.name().to_owned(),
            key: pattern.as_str().to_owned(),
            source: e,
        };
        let kv = self.key_value(&bucket).await.map_err(|e| fail(e.into()))?;
        let bytes = bytes::Bytes::from(serde_json::to_vec(config).map_err(|e| fail(e.into()))?);
        let revision = kv
            .put(pattern.as_str(), bytes.clone())
            .await
            .map_err(|e| fail(e.into()))?;
        self.registry.apply(pattern.as_str(), revision, Some(bytes));
        tracing::info!(
            space = self.name(),
            channel = pattern.as_str(),
            "channel config written"
        );
        Ok(config.clone())
    }

    /// Removes a concrete channel's config from the registry and, with `purge`, every post
    /// CHAT stores on it. Durable members' backlogs of it empty with the purge; their
    /// memberships stay (the channel may be posted to again).
    pub async fn remove_channel(
        &self,
        channel: &str,
        purge: bool,
    ) -> Result<crate::ops::ChannelRemoved, SpaceError> {
        let pattern = concrete(channel)?;
        let key = pattern.as_str();
        let fail = |e: BoxError| SpaceError::Registry {
            space: self.name().to_owned(),
            key: key.to_owned(),
            source: e,
        };
        let kv = self
            .key_value(&self.names.channels_bucket())
            .await
            .map_err(|e| fail(e.into()))?;
        let config_removed = kv.get(key).await.map_err(|e| fail(e.into()))?.is_some();
        if config_removed {
            kv.purge(key).await.map_err(|e| fail(e.into()))?;
            self.registry.removed(key);
        }
        let purged = match purge {
            true => {
                let chat = self
                    .jetstream()
                    .get_stream_no_info(self.names.chat_stream())
                    .await
                    .map_err(|e| fail(e.into()))?;
                chat.purge()
                    .filter(self.names.posts_on(key))
                    .await
                    .map_err(|e| fail(e.into()))?
                    .purged
            }
            false => 0,
        };
        tracing::info!(
            space = self.name(),
            channel = key,
            config_removed,
            purged,
            "channel removed"
        );
        Ok(crate::ops::ChannelRemoved {
            channel: key.to_owned(),
            config_removed,
            purged,
        })
    }

    /// The CHAT frontier: the stream's last sequence (§7 cursors).
    pub async fn chat_frontier(&self) -> Result<u64, SpaceError> {
        let fail = |e: BoxError| SpaceError::Read {
            space: self.name().to_owned(),
            what: "the CHAT frontier",
            source: e,
        };
        // One `STREAM.INFO`: a looked-up handle would read it twice.
        let stream = self
            .jetstream()
            .get_stream_no_info(self.names.chat_stream())
            .await
            .map_err(|e| fail(e.into()))?;
        let info = stream.get_info().await.map_err(|e| fail(e.into()))?;
        let frontier = info.state.last_sequence;
        self.frontier_seen.fetch_max(frontier, Ordering::AcqRel);
        Ok(frontier)
    }

    /// The CHAT frontier when `cursor` is beyond it (§7: such a join cursor is refused), `None`
    /// when it is within, asking the broker only for a cursor beyond the highest frontier read
    /// before: the stream's last sequence never goes back while it exists (a purge keeps it),
    /// so a cursor at or below one read is within. Mostly a join's cursor is a frontier its
    /// client read a moment ago, at or below one the appliance read for an earlier join.
    pub async fn frontier_below(&self, cursor: u64) -> Result<Option<u64>, SpaceError> {
        if cursor <= self.frontier_seen.load(Ordering::Acquire) {
            return Ok(None);
        }
        let frontier = self.chat_frontier().await?;
        Ok((cursor > frontier).then_some(frontier))
    }

    /// The effective config of a concrete channel (§7): registry value, then `=defaults`, then
    /// the built-in rule, through the one [`crate::protocol::resolve`]. From the registry as a
    /// watch holds it ([`registry`]), else read from the bucket.
    pub async fn effective_config(
        &self,
        channel: &str,
    ) -> Result<EffectiveChannelConfig, SpaceError> {
        let fail = |e: BoxError| SpaceError::Read {
            space: self.name().to_owned(),
            what: "the channel registry",
            source: e,
        };
        let held = (
            self.registry.lookup(CHANNEL_DEFAULTS_KEY),
            self.registry.lookup(channel),
        );
        let (defaults, config) = match held {
            (Some(defaults), Some(config)) => (defaults, config),
            _ => {
                let kv = self
                    .key_value(&self.names.channels_bucket())
                    .await
                    .map_err(|e| fail(e.into()))?;
                let (defaults, config) =
                    tokio::join!(kv.get(CHANNEL_DEFAULTS_KEY), kv.get(channel));
                (
                    defaults.map_err(|e| fail(e.into()))?,
                    config.map_err(|e| fail(e.into()))?,
                )
            }
        };
        let defaults = match defaults {
            Some(b) => Some(ChannelDefaults::from_json(&b).map_err(|e| fail(e.into()))?),
            None => None,
        };
        let config = match config {
            Some(b) => Some(ChannelConfig::from_json(&b).map_err(|e| fail(e.into()))?),
            None => None,
        };
        Ok(resolve(config.as_ref(), defaults.as_ref()))
    }

    /// Closes the provisioner connection (after the space's services stopped).
    pub async fn close(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.nats().drain()).await;
    }
}

/// `channel` as one concrete channel (the registry's key), or why it is not one.
fn concrete(channel: &str) -> Result<ChannelPattern, SpaceError> {
    ChannelPattern::from_policy(channel)
        .ok()
        .filter(ChannelPattern::is_concrete)
        .ok_or_else(|| {
            SpaceError::Invalid(format!(
                "channel {channel:?}: name one concrete channel, segments from [A-Za-z0-9_-]"
            ))
        })
}

/// The space's provisioner user and the name its connection goes by.
fn provisioner(keys: &SpaceKeys) -> Result<(crate::binding::Creds, String), SpaceError> {
    let creds = keys.own_user_creds("manager")?;
    Ok((creds, format!("cotald-manager-{}", keys.name())))
}
