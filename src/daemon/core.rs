//! Phase 6: what the running appliance's operations share ([`Core`]), made once the
//! broker is ready (the appliance's system connection), and each space served on it: its
//! account pushed (`$SYS.REQ.CLAIMS.UPDATE`), its provisioner connected, its streams and
//! buckets bootstrapped (§8), its minted identities provisioned, its services started
//! ([`super::space_services`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::accounts::{Accounts, Push, SpaceAccount};
use super::served::{Served, ServedSpaces};
use super::space_services::{ServiceConnections, SpaceServices, Started};
use super::state::StateFile;
use super::{
    CLUSTER_FORMING, DaemonError, Prepared, ReadyInfo, SERVICES_DEADLINE, backup, budget, join_link,
};
use crate::backoff::Backoff;
use crate::datadir::{DataDir, LastServed, RuntimeState, UnservedSpace};
use crate::files::FileError;
use crate::ops::{CredentialProfile, IdentityRecord, SpaceInfo};
use crate::profile::SpaceConfig;
use crate::protocol::JoinLink;
use crate::provision::{KeyStore, SpaceKeys};
use crate::services::ServiceSet;
use crate::services::identity_sync;
use crate::services::membership::BrokerView;
use crate::services::warden;
use crate::space::{Dialed, Identities, Space};
use crate::supervisor::monitor::Monitor;
use crate::supervisor::{BrokerStatus, local_addr};

/// This node in a cluster.
pub(super) struct ClusterNode {
    /// Its server name (the lease names its holder by it).
    pub(super) name: String,
    /// Replicas of every space's streams and buckets.
    pub(super) replicas: usize,
}

/// What the running appliance's operations share: what it was made with, and the parts that
/// own what changes while it runs (the account pushes, the served spaces and their storage,
/// the runtime state file).
pub(super) struct Core {
    pub(super) dir: DataDir,
    pub(super) keys: Arc<KeyStore>,
    pub(super) ca_cert: PathBuf,
    /// Where the appliance itself dials the broker.
    pub(super) local: SocketAddr,
    /// The host:port join links name.
    pub(super) link_host: String,
    /// Asks the broker about itself (health, figures) over the system account.
    pub(super) monitor: Monitor,
    /// Signs and pushes each space's account JWT.
    pub(super) accounts: Arc<Accounts>,
    pub(super) spaces: Arc<ServedSpaces>,
    pub(super) state: Arc<StateFile>,
    /// Cancels every service of the appliance.
    pub(super) root: CancellationToken,
    /// Cancelled when an operator asks the appliance to stop (`cotald down`).
    pub(super) stop: CancellationToken,
    /// When this node is one of a cluster.
    pub(super) cluster: Option<ClusterNode>,
    /// The profile's text, as a backup carries it.
    pub(super) profile_text: String,
    /// Where spaces added while running are handed to the dashboard, once it is served.
    pub(super) dashboard:
        std::sync::OnceLock<tokio::sync::watch::Sender<Vec<crate::dashboard::SpaceAccess>>>,
}

impl Core {
    /// What the appliance's operations share once the broker is ready (its system connection
    /// is the monitor's), and the spaces phase 6 serves ([`Core::serve_all`]).
    pub(super) fn new(
        prepared: Prepared,
        status: &BrokerStatus,
        monitor: Monitor,
        dialed: BTreeMap<String, DialedEarly>,
    ) -> (Arc<Core>, ToServe) {
        let Prepared {
            dir,
            spaces,
            profile_spaces,
            store_limit,
            unserved,
            hostnames,
            ca_cert,
            keys,
            broker_version,
            replicas,
            node,
            profile_text,
            certificate: _, // renewed by the appliance's own service
        } = prepared;
        let local = local_addr(status.client);
        let keys = Arc::new(keys);
        let cluster = replicas.map(|replicas| ClusterNode {
            name: node,
            replicas,
        });
        let core = Arc::new(Core {
            state: Arc::new(StateFile::new(
                dir.clone(),
                starting_state(status, broker_version),
            )),
            accounts: Arc::new(Accounts::new(
                monitor.system().clone(),
                keys.clone(),
                cluster.is_some(),
                dir.resolver(),
            )),
            dir,
            keys,
            ca_cert,
            local,
            link_host: link_host(status.client, &hostnames),
            monitor,
            spaces: Arc::new(ServedSpaces::new(budget::grantable(store_limit))),
            root: CancellationToken::new(),
            stop: CancellationToken::new(),
            cluster,
            profile_text,
            dashboard: std::sync::OnceLock::new(),
        });
        let (first, rest): (Vec<_>, Vec<_>) = spaces
            .into_iter()
            .partition(|(name, _)| profile_spaces.contains(name));
        let spaces = first.into_iter().chain(rest).collect();
        let to_serve = ToServe {
            spaces,
            unserved,
            dialed,
        };
        (core, to_serve)
    }

    /// Serves each space in turn. Spaces fail alone: one that cannot be served is reported,
    /// the others are served; with none served, the first failure is returned.
    pub(super) async fn serve_all(self: &Arc<Self>, to_serve: ToServe) -> Result<(), DaemonError> {
        let ToServe {
            spaces,
            mut unserved,
            mut dialed,
        } = to_serve;
        for space in &unserved {
            tracing::error!(
                space = space.name,
                reason = space.reason,
                "space not served"
            );
        }
        let mut first_error = None;
        for (name, config) in spaces {
            if let Err(e) = self.serve_space(&name, config, dialed.remove(&name)).await {
                let reason = crate::ops::error_text(&e);
                tracing::error!(space = name, reason, "space not served");
                unserved.push(UnservedSpace { name, reason });
                first_error.get_or_insert(e);
            }
        }
        let served = self.spaces.len().await;
        if served == 0
            && let Some(e) = first_error
        {
            // Nothing to serve: say why rather than run empty.
            return Err(e);
        }
        self.state.update(|state| state.unserved = unserved);
        self.record_served().await?;
        tracing::info!(spaces = served, "phase: spaces served");
        Ok(())
    }

    /// Pushes a served space's account if it changed (a mint, a revoke).
    pub(super) async fn push_served(
        &self,
        keys: &SpaceKeys,
        served: &Served,
    ) -> Result<(), DaemonError> {
        self.accounts
            .push(
                keys,
                served.space.config(),
                &served.identities,
                Some(&served.space),
                Push::IfChanged,
            )
            .await?;
        Ok(())
    }

    /// Pushes a space's account, connects its provisioner (unless `dialed` while the broker
    /// got ready), bootstraps it, provisions its minted identities and starts its services;
    /// then serves it.
    pub(super) async fn serve_space(
        self: &Arc<Self>,
        name: &str,
        mut config: SpaceConfig,
        dialed: Option<DialedEarly>,
    ) -> Result<SpaceInfo, DaemonError> {
        let wanted = config.jetstream.max_file_store;
        let granted = self.spaces.grant(name, wanted)?;
        if granted < wanted {
            tracing::warn!(
                space = name,
                wanted = crate::profile::human_size(wanted.max(0) as u64),
                granted = crate::profile::human_size(granted.max(0) as u64),
                "the space's JetStream quota is cut to what is left of the disk's budget"
            );
        }
        config.jetstream.max_file_store = granted;
        config.replicas = self.replicas();
        let served = self.serve_granted(name, config, dialed).await;
        if served.is_err() {
            self.spaces.release(name);
        }
        served
    }

    /// Replicas of every space's streams and buckets: 1 on a single node.
    pub(super) fn replicas(&self) -> usize {
        self.cluster.as_ref().map_or(1, |c| c.replicas)
    }

    /// [`Core::serve_space`] once its storage is granted.
    async fn serve_granted(
        self: &Arc<Self>,
        name: &str,
        config: SpaceConfig,
        dialed: Option<DialedEarly>,
    ) -> Result<SpaceInfo, DaemonError> {
        let keys = self.keys.ensure_space(name)?;
        let (link, connections) = match dialed {
            Some(DialedEarly { link, services }) => (Some(link), services),
            None => (None, ServiceConnections::default()),
        };
        let identities = Arc::new(Identities::load(&self.dir, name));
        let early = self.learn_identities(&keys, &config, &identities).await;
        self.accounts
            .push(&keys, &config, &identities, None, Push::IfChanged)
            .await?;
        crate::files::private_dir(&self.dir.space(name))?;
        let creds = keys.own_user_creds(crate::ops::OPERATOR)?;
        // The machine operator's credential is written (and synced) while the space is
        // connected and bootstrapped; the space is served once it is.
        let (path, text) = (self.dir.operator_creds(name), creds.render());
        let writing = path.clone();
        let creds_written = tokio::task::spawn_blocking(move || {
            crate::files::write_atomic(&writing, text.as_bytes(), 0o600)
        });
        identities.insert_builtin(operator_record(name, creds.public_key()?));
        let space = match (early, link) {
            (Some(space), _) => Arc::new(space),
            (None, Some(link)) => Arc::new(Space::over(link, config)),
            (None, None) => {
                Arc::new(Space::connect(&keys, config, self.local, &self.ca_cert).await?)
            }
        };
        let services = ServiceSet::new(name, &self.root);
        let started = self.start_space(&space, &identities, &services, connections);
        let written = async {
            match creds_written.await {
                Ok(written) => Ok(written?),
                Err(e) => Err(FileError::at(&path, "writing")(std::io::Error::other(e)).into()),
            }
        };
        let Started { manager, lease } = match tokio::try_join!(started, written) {
            Ok((started, ())) => started,
            Err(e) => {
                super::dashboard::space_withdrawn(self, name);
                services.shutdown(SERVICES_DEADLINE).await;
                space.close().await;
                return Err(e);
            }
        };
        let info = self.space_info(&space)?;
        let served = Served {
            space,
            identities,
            manager,
            services,
            lease,
            changing: tokio::sync::Mutex::new(()),
        };
        self.spaces.insert(name, served).await;
        self.state.update(|state| {
            if !state.spaces.iter().any(|s| s == name) {
                state.spaces.push(name.to_owned());
                state.spaces.sort();
            }
        });
        Ok(info)
    }

    /// Bootstraps a connected space, makes its identities' durables and starts its services
    /// in `services`.
    async fn start_space(
        &self,
        space: &Arc<Space>,
        identities: &Arc<Identities>,
        services: &ServiceSet,
        connections: ServiceConnections,
    ) -> Result<Started, DaemonError> {
        let name = space.name();
        backup::restore_pending(&self.dir, self.replicas(), space).await?;
        self.bootstrap(space).await?;
        let account = SpaceAccount::new(
            self.accounts.clone(),
            self.keys.space(name)?,
            space,
            identities.clone(),
        );
        let cluster = self.cluster.as_ref().map(|c| (c.name.as_str(), c.replicas));
        let view = self.broker_view(space)?;
        let presence = Arc::new(crate::services::presence::PresenceView::default());
        let (watching, watched) = SpaceServices::watch(space, presence.clone(), services);
        let open = SpaceServices::open(space, identities, presence, view, connections);
        // The identities' durables are made while the watches start and the members registry
        // is read (none needs another); the durables and the registry before a leased service
        // runs, the watches before the reader and the router (`SpaceServices::start`). The
        // dashboard's observer and the operator's voice may connect once the durables are
        // there (the voice reads its DMs).
        let provisioned = async {
            provision_all(space, identities).await?;
            super::dashboard::space_served(self, name, identities);
            Ok::<_, DaemonError>(())
        };
        let start = async {
            let (_, parts) = tokio::try_join!(provisioned, open)?;
            parts
                .start(services, Arc::new(account), cluster, watched)
                .await
        };
        let ((), started) = tokio::join!(watching, start);
        started
    }

    /// A node of a cluster first learns the identity records it missed while it was down (a
    /// revoke, above all), through the account the cluster already knows; only then does it
    /// push the account JWT, whose revocations come from those records. Returns the space's
    /// connection it made for that, for reuse; `None` on a single node.
    async fn learn_identities(
        &self,
        keys: &SpaceKeys,
        config: &SpaceConfig,
        identities: &Identities,
    ) -> Option<Space> {
        self.cluster.as_ref()?;
        let space = Space::connect(keys, config.clone(), self.local, &self.ca_cert)
            .await
            .ok()?;
        match identity_sync::pull(&space, identities).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                space = keys.name(),
                records = n,
                "identity records from the cluster"
            ),
            Err(e) => tracing::warn!(space = keys.name(), error = %crate::ops::error_text(&e),
                "cannot read the cluster's identity records before pushing the account"),
        }
        Some(space)
    }

    /// Bootstraps a space; a clustered node retries for a while, since the cluster's
    /// JetStream answers only once its nodes have elected a meta leader (the other nodes may
    /// still be starting).
    async fn bootstrap(&self, space: &Space) -> Result<(), DaemonError> {
        let deadline = tokio::time::Instant::now() + CLUSTER_FORMING;
        let mut backoff = Backoff::default();
        loop {
            match space.bootstrap().await {
                Ok(_) => return Ok(()),
                Err(e) if self.cluster.is_some() && tokio::time::Instant::now() < deadline => {
                    tracing::info!(
                        space = space.name(),
                        reason = crate::ops::error_text(&e),
                        "the cluster's JetStream is not ready yet; retrying"
                    );
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub(super) fn space_info(&self, space: &Space) -> Result<SpaceInfo, DaemonError> {
        Ok(SpaceInfo {
            name: space.name().to_owned(),
            account: space.account().to_owned(),
            profile: space.config().profile,
            link: self.link(space.name(), &[])?.to_string(),
            operator_creds: self.dir.operator_creds(space.name()),
        })
    }

    /// The credentials and address the membership feed watches the broker with (§7: a member
    /// that disconnects is seen offline by the broker before the roster says so).
    fn broker_view(&self, space: &Space) -> Result<BrokerView, DaemonError> {
        let view = broker_view(
            &self.keys,
            space.name(),
            space.account(),
            &self.ca_cert,
            self.local,
        )?;
        Ok(view)
    }

    pub(super) async fn ready_info(&self, status: &BrokerStatus) -> ReadyInfo {
        let spaces = self.spaces.all().await;
        let (version, unserved) = self
            .state
            .read(|s| (s.broker_version.clone(), s.unserved.clone()));
        ReadyInfo {
            data_dir: self.dir.root().to_owned(),
            listen: status.client,
            link_host: self.link_host.clone(),
            monitor: status.http_monitor,
            ca_cert: self.ca_cert.clone(),
            spaces: spaces
                .iter()
                .filter_map(|(_, s)| self.space_info(&s.space).ok())
                .collect(),
            broker_pid: status.pid,
            broker_version: version,
            unserved,
            dashboard: crate::dashboard::Availability::Disabled,
        }
    }

    /// Records where the appliance listens and what it serves, for the next start and for the
    /// commands that run while it is stopped.
    pub(super) async fn record_served(&self) -> Result<(), DaemonError> {
        let listen = self.state.read(|state| state.listen);
        let spaces = self
            .spaces
            .all()
            .await
            .iter()
            .map(|(_, s)| self.space_info(&s.space))
            .collect::<Result<_, _>>()?;
        // The dashboard records its own listener once bound; it is kept here.
        let dashboard = self.dir.read_last_served().and_then(|l| l.dashboard);
        self.dir.write_last_served(&LastServed {
            listen,
            link_host: self.link_host.clone(),
            spaces,
            dashboard,
        })?;
        Ok(())
    }

    /// A join link to `space` naming `channels`, at the host and port links name.
    pub(super) fn link(&self, space: &str, channels: &[String]) -> Result<JoinLink, DaemonError> {
        join_link(&self.link_host, space, channels)
    }
}

/// The spaces an appliance serves at start: the profile's first (they get their storage
/// first), and those already known to be unservable (an unreadable record).
pub(super) struct ToServe {
    spaces: Vec<(String, SpaceConfig)>,
    unserved: Vec<UnservedSpace>,
    /// The connections of those dialed while the broker got ready ([`dial_known`]).
    dialed: BTreeMap<String, DialedEarly>,
}

/// What was dialed for a space while the broker got ready ([`dial_known`]).
pub(super) struct DialedEarly {
    /// The space's provisioner connection.
    link: Dialed,
    /// The connections of its services, those that could be made.
    services: ServiceConnections,
}

/// The credentials and address the membership feed of `space` (its account `account`) watches
/// the broker with.
fn broker_view(
    keys: &KeyStore,
    space: &str,
    account: &str,
    ca: &std::path::Path,
    addr: SocketAddr,
) -> Result<BrokerView, crate::provision::ProvisionError> {
    let creds = keys.system_daemon_creds(&format!("cotald-membership-{space}"), |id| {
        crate::binding::acl::membership_daemon(account, id)
    })?;
    Ok(BrokerView {
        creds,
        ca: ca.to_owned(),
        addr,
    })
}

/// How many spaces are dialed while the broker gets ready: the first ones served.
const DIALED_EARLY: usize = 4;
/// How long such a dial may take; one that fails is dialed again when its space is served.
const EARLY_DIAL: Duration = Duration::from_secs(2);

/// Dials the first spaces to serve whose accounts the broker holds from an earlier start (its
/// resolver's files) as soon as `listening` says where the broker listens: their connections
/// are made while it gets ready, not after (startup time; the account is pushed again before
/// the space is bootstrapped when it changed). Never on a node of a cluster, which learns the
/// revocations it missed before it connects through the account it has
/// ([`Core::learn_identities`]).
pub(super) async fn dial_known(
    prepared: &Prepared,
    listening: oneshot::Receiver<SocketAddr>,
) -> BTreeMap<String, DialedEarly> {
    if prepared.replicas.is_some() {
        return BTreeMap::new();
    }
    let Ok(addr) = listening.await else {
        return BTreeMap::new();
    };
    let profile = |name: &&String| prepared.profile_spaces.contains(*name);
    let first = prepared.spaces.keys().filter(profile);
    let known = first
        .chain(prepared.spaces.keys().filter(|n| !profile(n)))
        .take(DIALED_EARLY)
        .filter_map(|name| prepared.keys.space(name).ok())
        .filter(|keys| {
            let jwt = format!("{}.jwt", keys.account_public());
            prepared.dir.resolver().join(jwt).is_file()
        });
    let dials = known.map(|keys| async move {
        let (space, ca) = (keys.name(), &prepared.ca_cert);
        // The membership feed's view and the warden's own connection too: each a TLS
        // connection that the last services of a start waited for.
        let view = async {
            let account = keys.account_public();
            let view = broker_view(&prepared.keys, space, &account, ca, addr).ok()?;
            match view.connect(space, "membership").await {
                Ok(reader) => Some(reader),
                Err(e) => {
                    tracing::debug!(space, error = %e, "membership view not dialed early");
                    None
                }
            }
        };
        let tap = async {
            match Space::dial_another_early(&keys, addr, ca, warden::OWN_CONNECTION).await {
                Ok(tap) => Some(tap),
                Err(e) => {
                    tracing::debug!(space, error = %e, "the warden's connection not dialed early");
                    None
                }
            }
        };
        let dial = async {
            let (link, view, tap) = tokio::join!(Space::dial(&keys, addr, ca), view, tap);
            let services = ServiceConnections { view, tap };
            link.map(|link| DialedEarly { link, services })
        };
        match tokio::time::timeout(EARLY_DIAL, dial).await {
            Ok(Ok(dialed)) => Some((keys.name().to_owned(), dialed)),
            Ok(Err(e)) => {
                tracing::debug!(space = keys.name(), error = %e, "not dialed early");
                None
            }
            Err(_) => None,
        }
    });
    futures_util::future::join_all(dials)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// How many identities' durables are made at once.
const PROVISION_AT_ONCE: usize = 16;

/// Makes the durables of every minted identity and of the builtin ones: the machine operator
/// is a person with a DM inbox too (an agent's answer to it waits in its `dm_<id>`). A few at
/// once: each is two round trips to the broker, and a space may have hundreds.
async fn provision_all(space: &Space, identities: &Identities) -> Result<(), DaemonError> {
    let records: Vec<_> = identities
        .active()
        .into_iter()
        .chain(identities.builtins())
        .collect();
    futures_util::stream::iter(records)
        .map(|record| async move { space.provision(&record).await })
        .buffer_unordered(PROVISION_AT_ONCE)
        .try_collect::<()>()
        .await?;
    Ok(())
}

/// What `run/state.json` says of an appliance whose broker is ready, before a space is served.
fn starting_state(status: &BrokerStatus, broker_version: String) -> RuntimeState {
    RuntimeState {
        pid: std::process::id(),
        broker_pid: status.pid,
        broker_version,
        listen: status.client,
        monitor: status.http_monitor,
        spaces: Vec::new(),
        broker_restarts: 0,
        broker_last_restart: None,
        services: Vec::new(),
        unserved: Vec::new(),
        dashboard: None,
        leases: Default::default(),
        cluster: None,
    }
}

/// The machine operator's own user in a space, as the manager knows it: unrestricted, like the
/// credential (it reads and posts everywhere, and may write channel configs).
fn operator_record(space: &str, id: String) -> IdentityRecord {
    IdentityRecord {
        id,
        name: crate::ops::OPERATOR.into(),
        space: space.to_owned(),
        profile: CredentialProfile::Admin,
        role: None,
        subscribe: Vec::new(),
        allow_subscribe: vec![">".into()],
        allow_publish: vec![">".into()],
        expires_at: None,
        issued_at: 0,
        revokes_before: None,
        revoked_at: None,
    }
}

/// The host:port a join link names: the first configured hostname when the listener is a
/// wildcard, else the listener itself (the actual port, once bound).
fn link_host(client: SocketAddr, hostnames: &[String]) -> String {
    match hostnames.first() {
        Some(host) if client.ip().is_unspecified() => format!("{host}:{}", client.port()),
        _ => local_addr(client).to_string(),
    }
}
