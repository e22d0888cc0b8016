//! The appliance: one supervisor process that owns a child nats-server and everything it
//! needs, started and stopped in named phases (teardown in reverse):
//!
//! 1. lock the data dir (one appliance per data dir);
//! 2. install the broker executable;
//! 3. provision: key store, TLS, every space's account keys;
//! 4. render the broker config and start the child; await readiness;
//! 5. connect as the appliance's SYS user and push each space's account JWT to the resolver
//!    (`$SYS.REQ.CLAIMS.UPDATE`: works without a restart, unlike a memory resolver);
//! 6. per space: connect its provisioner, bootstrap streams and buckets (§8), pre-create the
//!    durables of every identity minted so far, start the space's services
//!    ([`crate::services`]); on a node of a cluster ([`cluster`]), the identity records are
//!    read from the cluster before the account is pushed, and the services other than the
//!    presence watch run only while this node holds the space's lease
//!    ([`crate::services::lease`]);
//! 7. start the appliance's own services: the runtime state for `cotald status`, the admin
//!    socket, the web dashboard ([`crate::dashboard`], when enabled); ready (and a service
//!    manager that asked is told so: [`notify`]).
//!
//! Every background task belongs to a [`ServiceSet`] under one root cancellation token: the
//! appliance's set, and one per space. Shutdown cancels the root, waits for each set up to its
//! deadline, closes the spaces' connections, then stops the broker.
//!
//! Spaces come from the profile and from `cotald space add` (remembered in the data dir once
//! they are served); the operations the admin socket serves are listed in [`crate::ops`].

pub mod admin;
pub mod budget;
pub mod cluster;
mod dashboard;
pub mod notify;
mod ops;
mod state;

pub use ops::execute_offline;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::client::DialError;
use crate::datadir::{DataDir, DataDirError, DataDirLock, LastServed, RuntimeState, UnservedSpace};
use crate::files::FileError;
use crate::ops::{CredentialProfile, IdentityRecord};
use crate::ops::{OpError, SpaceInfo};
use crate::profile::{Profile, SpaceConfig};
use crate::protocol::{Host, JoinLink};
use crate::provision::{JetStreamLimits, KeyStore, ProvisionError, SpaceKeys, TlsFiles};
use crate::services::backstop::Backstop;
use crate::services::consumers::ConsumerGuard;
use crate::services::identity_sync::{self, IdentitySync};
use crate::services::lease::{LeaseKeeper, Starter};
use crate::services::manager::Manager;
use crate::services::members::Members;
use crate::services::membership::{BrokerView, MembershipFeed};
use crate::services::mentions::Mentions;
use crate::services::presence::{PresenceView, PresenceWatch};
use crate::services::warden::{PushAccount, Warden};
use crate::services::{ServiceSet, ServiceStatus};
use crate::space::store::{self, StoreError};
use crate::space::{Identities, MintError, Space, SpaceError};
use crate::supervisor::{self, BrokerBinary, BrokerSpec, ServerConf, Supervisor, SupervisorError};

/// What `cotald up` needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The data dir.
    pub data_dir: DataDir,
    /// The profile (embedded default or `--config`).
    pub profile: Profile,
    /// `--listen`, overriding the profile.
    pub listen: Option<SocketAddr>,
    /// `--hostname` values, added to the profile's.
    pub hostnames: Vec<String>,
    /// The broker executable.
    pub broker: BrokerBinary,
    /// `--dashboard`, overriding the profile's dashboard listener.
    pub dashboard: Option<SocketAddr>,
}

/// Why the appliance, or one of its operations, failed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The data dir is unusable or taken.
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    /// Keys or TLS material.
    #[error(transparent)]
    Provision(#[from] ProvisionError),
    /// The broker.
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    /// A space.
    #[error(transparent)]
    Space(#[from] SpaceError),
    /// No storage left on this disk for a space.
    #[error(transparent)]
    Budget(#[from] budget::BudgetFull),
    /// The space store in the data dir.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A file.
    #[error(transparent)]
    File(#[from] FileError),
    /// A credential the appliance made for itself.
    #[error(transparent)]
    Creds(#[from] crate::binding::CredsError),
    /// A mint request.
    #[error(transparent)]
    Mint(#[from] MintError),
    /// A request that cannot be executed as it is.
    #[error(transparent)]
    Op(#[from] OpError),
    /// A service of a space could not start.
    #[error("space `{space}`: {source}")]
    Service {
        /// The space.
        space: String,
        /// What failed.
        #[source]
        source: crate::services::ServiceError,
    },
    /// The appliance's own connection to the broker failed.
    #[error("cannot connect to the broker at {addr} as the system user")]
    Connect {
        /// Where.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: DialError,
    },
    /// The broker refused a space's account JWT.
    #[error("the broker refused the account of space `{space}`: {reason}")]
    ClaimsUpdate {
        /// The space.
        space: String,
        /// What it said.
        reason: String,
    },
    /// The request names a space this appliance does not serve.
    #[error("unknown space `{0}` (see `cotald space list`)")]
    UnknownSpace(String),
    /// `space add` of a space that exists.
    #[error("space `{0}` already exists")]
    SpaceExists(String),
    /// A request argument is invalid.
    #[error("{0}")]
    Invalid(String),
    /// The admin socket.
    #[error("admin socket {path}")]
    Admin {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What the running appliance announces.
#[derive(Debug, Clone)]
pub struct ReadyInfo {
    /// The data dir.
    pub data_dir: PathBuf,
    /// Client listener.
    pub listen: SocketAddr,
    /// The `host:port` join links name.
    pub link_host: String,
    /// Monitoring listener.
    pub monitor: SocketAddr,
    /// The CA certificate clients trust.
    pub ca_cert: PathBuf,
    /// The served spaces.
    pub spaces: Vec<SpaceInfo>,
    /// The spaces that could not be served, and why.
    pub unserved: Vec<UnservedSpace>,
    /// The child's pid.
    pub broker_pid: u32,
    /// The broker version.
    pub broker_version: String,
    /// The web dashboard.
    pub dashboard: crate::dashboard::Availability,
}

/// A running appliance.
pub struct Appliance {
    core: Arc<Core>,
    _lock: DataDirLock,
    supervisor: Supervisor,
    services: ServiceSet,
    info: ReadyInfo,
}

/// What the phases before the broker produced, for the phases after it.
struct Prepared {
    dir: DataDir,
    spaces: BTreeMap<String, SpaceConfig>,
    /// The spaces of the profile: served first, so they get their storage first.
    profile_spaces: std::collections::BTreeSet<String>,
    /// The JetStream store limit the broker runs with.
    store_limit: i64,
    /// Spaces already known to be unservable (an unreadable record).
    unserved: Vec<UnservedSpace>,
    hostnames: Vec<String>,
    ca_cert: PathBuf,
    keys: KeyStore,
    broker_version: String,
    /// The cluster's replicas, when clustered.
    replicas: Option<usize>,
    node: String,
}

/// One served space: its provisioner connection, its identities, its services.
pub(crate) struct Served {
    pub(crate) space: Arc<Space>,
    pub(crate) identities: Arc<Identities>,
    pub(crate) manager: Arc<Manager>,
    pub(crate) services: ServiceSet,
    /// In a cluster: the space's lease, and the services it runs while this node holds it.
    pub(crate) lease: Option<Arc<LeaseKeeper>>,
}

/// The services of a space that run on one node of a cluster at a time (all of them but the
/// presence watch), and what they are made of.
#[derive(Clone)]
struct Leased {
    space: Arc<Space>,
    identities: Arc<Identities>,
    presence: Arc<PresenceView>,
    members: Arc<Members>,
    backstop: Arc<Backstop>,
    manager: Arc<Manager>,
    view: BrokerView,
    /// Pushes the space's account JWT again, for the warden's holds.
    push_account: PushAccount,
}

impl Leased {
    /// Starts them in `set`, in dependency order (the manager needs the reader); on a
    /// takeover (`first_the_manager`) the reader and the manager come first, since clients
    /// wait for the manager. Each is started even when one before it fails to (it keeps being
    /// retried by the set): a warden waiting for a stream leader must not keep the manager
    /// from serving. The first failure is returned.
    async fn start(
        self,
        set: &ServiceSet,
        first_the_manager: bool,
    ) -> Result<(), crate::services::ServiceError> {
        // Retried: a takeover often coincides with the registry's stream electing a leader.
        let mut backoff = crate::backoff::Backoff::default();
        let mut attempts = 0;
        while let Err(e) = self.members.reload().await {
            attempts += 1;
            if attempts >= 10 {
                return Err(crate::services::ServiceError::new(
                    "reading the members registry",
                    e,
                ));
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
        let mut results = Vec::new();
        if first_the_manager {
            results.push(set.start(self.backstop.clone()).await);
            results.push(set.start(self.manager.clone()).await);
        }
        results.push(
            set.start(Arc::new(Mentions::new(
                self.space.clone(),
                self.identities.clone(),
                self.presence.clone(),
            )))
            .await,
        );
        results.push(
            set.start(Arc::new(Warden::new(
                self.space.clone(),
                self.identities.clone(),
                self.push_account.clone(),
            )))
            .await,
        );
        results.push(
            set.start(Arc::new(ConsumerGuard::new(
                self.space.clone(),
                self.identities.clone(),
            )))
            .await,
        );
        if !first_the_manager {
            results.push(set.start(self.backstop).await);
            results.push(set.start(self.manager).await);
        }
        results.push(
            set.start(Arc::new(MembershipFeed::new(
                self.space,
                self.members,
                self.view,
            )))
            .await,
        );
        results.into_iter().collect()
    }
}

/// What the running appliance's operations share.
pub(crate) struct Core {
    pub(crate) dir: DataDir,
    pub(crate) keys: KeyStore,
    ca_cert: PathBuf,
    /// Where the appliance itself dials the broker.
    local: SocketAddr,
    /// The host:port join links name.
    link_host: String,
    system: async_nats::Client,
    /// The JetStream storage each space holds.
    budget: std::sync::Mutex<budget::Budget>,
    /// Held while an account JWT is signed and pushed.
    pushing: tokio::sync::Mutex<()>,
    pub(crate) spaces: tokio::sync::Mutex<BTreeMap<String, Served>>,
    state: std::sync::Mutex<RuntimeState>,
    /// Cancels every service of the appliance.
    root: CancellationToken,
    /// Cancelled when an operator asks the appliance to stop (`cotald down`).
    pub(crate) stop: CancellationToken,
    /// Whether this node is one of a cluster.
    pub(crate) clustered: bool,
    /// Replicas of every space's streams and buckets.
    replicas: usize,
    /// This node's server name (the lease names its holder by it).
    node: String,
    /// Where spaces added while running are handed to the dashboard, once it is served.
    dashboard: std::sync::OnceLock<tokio::sync::watch::Sender<Vec<crate::dashboard::SpaceAccess>>>,
}

const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a clustered node waits for the cluster's JetStream to answer its bootstrap.
const CLUSTER_FORMING: Duration = Duration::from_secs(90);
const STOP_DEADLINE: Duration = Duration::from_secs(10);
/// How long a set of services may take to stop.
const SERVICES_DEADLINE: Duration = Duration::from_secs(5);

impl Appliance {
    /// Runs the startup phases; returns once the broker is ready and every space is served.
    pub async fn start(opts: Options) -> Result<Self, DaemonError> {
        let dir = opts.data_dir;
        let lock = dir.lock()?;
        tracing::info!(data_dir = %dir.root().display(), "phase: data dir locked");

        let executable = opts.broker.install(&dir.bin())?;
        let broker_version = opts.broker.version().unwrap_or("unknown").to_owned();

        let broker = &opts.profile.broker;
        let listen = keep_picked_port(opts.listen.unwrap_or(broker.listen), &dir);
        let cluster = match &opts.profile.cluster {
            Some(c) => Some(c.clone()),
            None => cluster::read_joined(&dir)?,
        };
        let mut listeners = vec![listen, broker.monitor];
        listeners.extend(cluster.as_ref().map(|c| c.listen));
        supervisor::claim(&dir.run(), &executable, &dir.broker_conf(), &listeners).await?;
        let mut hostnames = broker.hostnames.clone();
        hostnames.extend(opts.hostnames.iter().cloned());
        if !listen.ip().is_unspecified() && !listen.ip().is_loopback() {
            hostnames.push(listen.ip().to_string());
        }
        if listen.ip().is_unspecified()
            && hostnames.is_empty()
            && let Some(outward) = outward_address(listen.ip())
        {
            // Links must name a host remote peers can dial and the certificate covers.
            hostnames.push(outward.to_string());
        }
        let keys = KeyStore::load_or_create(&dir.keys())?;
        let tls = TlsFiles::ensure(&dir.tls(), &hostnames)?;
        let (mut spaces, mut unserved) = store::runtime_spaces(&dir);
        let profile_spaces = opts.profile.spaces.keys().cloned().collect();
        for (name, config) in &opts.profile.spaces {
            spaces.insert(name.clone(), config.clone());
            unserved.retain(|u| &u.name != name);
        }
        for name in spaces.keys() {
            keys.ensure_space(name)?;
        }
        tracing::info!(spaces = spaces.len(), "phase: provisioned keys and TLS");
        let store_limit = budget::store_limit(dir.root(), &dir.jetstream()).map_err(|e| {
            DaemonError::Invalid(format!(
                "cannot read the free space of {}: {e}",
                dir.root().display()
            ))
        })?;
        tracing::info!(
            limit = crate::profile::human_size(store_limit.max(0) as u64),
            "JetStream storage budget: three quarters of the free disk space plus what it stores"
        );

        let leaf_remotes = match &opts.profile.leaf {
            Some(leaf) => leaf
                .spaces(&opts.profile)
                .iter()
                .map(|space| {
                    Ok(supervisor::LeafRemote {
                        url: leaf.remote.clone(),
                        account: keys.ensure_space(space)?.account_public(),
                        credentials: leaf.credentials.clone(),
                        ca: leaf.ca.clone(),
                    })
                })
                .collect::<Result<Vec<_>, ProvisionError>>()?,
            None => Vec::new(),
        };
        if let Some(c) = &cluster {
            tracing::info!(
                cluster = c.name,
                routes = ?c.routes,
                replicas = c.replicas(),
                "clustered: routes to the other nodes"
            );
        }
        let server_name = cluster::server_name(&dir, &keys);
        let spec = BrokerSpec {
            executable,
            conf: ServerConf {
                server_name: server_name.clone(),
                host: listen.ip(),
                port: (listen.port() != 0).then_some(listen.port()),
                monitor_host: broker.monitor.ip(),
                monitor_port: (broker.monitor.port() != 0).then_some(broker.monitor.port()),
                ports_file_dir: dir.run(),
                operator_jwt: keys.operator_jwt()?,
                system_account: keys.system_account(),
                system_account_jwt: keys.system_account_jwt()?,
                resolver_dir: dir.resolver(),
                store_dir: dir.jetstream(),
                max_file_store: store_limit,
                sync_interval: broker.sync_interval.clone(),
                tls_cert: tls.server_cert.clone(),
                tls_key: tls.server_key.clone(),
                tls_ca: tls.ca_cert.clone(),
                cluster: cluster.as_ref().map(|c| supervisor::ClusterConf {
                    name: c.name.clone(),
                    host: c.listen.ip(),
                    port: c.listen.port(),
                    routes: c.routes.clone(),
                }),
                leaf_remotes,
            },
            conf_path: dir.broker_conf(),
            log_path: dir.broker_log(),
            ready_timeout: READY_TIMEOUT,
            stop_deadline: STOP_DEADLINE,
        };
        let supervisor = Supervisor::start(spec).await?;
        let prepared = Prepared {
            dir,
            spaces,
            profile_spaces,
            store_limit,
            unserved,
            hostnames,
            ca_cert: tls.ca_cert,
            keys,
            broker_version,
            replicas: cluster.as_ref().map(|c| c.replicas()),
            node: server_name,
        };
        let core = match Self::serve(prepared, &supervisor).await {
            Ok(core) => core,
            Err(e) => {
                // Leave nothing running behind a failed start.
                supervisor.stop().await;
                return Err(e);
            }
        };
        let services = ServiceSet::new("appliance", &core.root);
        let started = async {
            services
                .start(Arc::new(state::StateTracker::new(
                    core.clone(),
                    supervisor.status(),
                )))
                .await
                .map_err(|source| DaemonError::Service {
                    space: "appliance".into(),
                    source,
                })?;
            let socket = admin::AdminSocket::bind(core.clone())?;
            services
                .start(Arc::new(socket))
                .await
                .map_err(|source| DaemonError::Service {
                    space: "appliance".into(),
                    source,
                })
        };
        if let Err(e) = started.await {
            let appliance = Appliance {
                info: core.ready_info(&supervisor).await,
                core,
                _lock: lock,
                supervisor,
                services,
            };
            appliance.stop().await;
            return Err(e);
        }
        let dashboard =
            dashboard::start(&core, &services, &opts.profile.dashboard, opts.dashboard).await;
        tracing::info!("phase: ready");
        Ok(Appliance {
            info: ReadyInfo {
                dashboard,
                ..core.ready_info(&supervisor).await
            },
            core,
            _lock: lock,
            supervisor,
            services,
        })
    }

    /// The phases after the broker is ready: system connection, then each space.
    async fn serve(prepared: Prepared, supervisor: &Supervisor) -> Result<Arc<Core>, DaemonError> {
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
        } = prepared;
        let status = supervisor.status().borrow().clone();
        tracing::info!(pid = status.pid, client = %status.client, "phase: broker ready");

        let local = local_addr(status.client);
        let system =
            crate::client::dial(&keys.system_user_creds()?, "cotald-system", &ca_cert, local)
                .await
                .map_err(|source| DaemonError::Connect {
                    addr: local,
                    source,
                })?;
        let core = Arc::new(Core {
            dir: dir.clone(),
            keys,
            ca_cert,
            local,
            link_host: link_host(status.client, &hostnames),
            system,
            budget: std::sync::Mutex::new(budget::Budget::new(budget::grantable(store_limit))),
            pushing: tokio::sync::Mutex::new(()),
            spaces: tokio::sync::Mutex::new(BTreeMap::new()),
            state: std::sync::Mutex::new(RuntimeState {
                pid: std::process::id(),
                broker_pid: status.pid,
                broker_version,
                listen: status.client,
                monitor: status.monitor,
                spaces: Vec::new(),
                broker_restarts: 0,
                broker_last_restart: None,
                services: Vec::new(),
                unserved: Vec::new(),
                dashboard: None,
                leases: BTreeMap::new(),
                cluster: None,
            }),
            root: CancellationToken::new(),
            stop: CancellationToken::new(),
            clustered: replicas.is_some(),
            replicas: replicas.unwrap_or(1),
            node,
            dashboard: std::sync::OnceLock::new(),
        });
        // Spaces fail alone: one that cannot be served is reported, the others are served.
        for space in &unserved {
            tracing::error!(
                space = space.name,
                reason = space.reason,
                "space not served"
            );
        }
        let mut unserved = unserved;
        let mut first_error = None;
        let (first, rest): (Vec<_>, Vec<_>) = spaces
            .into_iter()
            .partition(|(name, _)| profile_spaces.contains(name));
        for (name, config) in first.into_iter().chain(rest) {
            if let Err(e) = core.serve_space(&name, config).await {
                let reason = crate::ops::error_text(&e);
                tracing::error!(space = name, reason, "space not served");
                unserved.push(UnservedSpace { name, reason });
                first_error.get_or_insert(e);
            }
        }
        let served = core.spaces.lock().await.len();
        if served == 0
            && let Some(e) = first_error
        {
            // Nothing to serve: say why rather than run empty.
            return Err(e);
        }
        if let Ok(mut state) = core.state.lock() {
            state.unserved = unserved;
        }
        core.record_served().await?;
        tracing::info!(spaces = served, "phase: spaces served");
        Ok(core)
    }

    /// What the appliance announces.
    pub fn info(&self) -> &ReadyInfo {
        &self.info
    }

    /// Serves until `shutdown` resolves or an operator asks it to stop (`cotald down`), then
    /// tells the service manager it is stopping and tears down in reverse order.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>, notifier: &notify::Notifier) {
        tokio::select! {
            () = shutdown => {}
            () = self.core.stop.cancelled() => {}
        }
        tracing::info!("phase: shutting down");
        notifier.stopping();
        self.stop().await;
        tracing::info!("phase: stopped");
    }

    async fn stop(self) {
        self.services.shutdown(SERVICES_DEADLINE).await;
        self.core.close_spaces().await;
        self.core.root.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.core.system.drain()).await;
        self.supervisor.stop().await;
        self.core.dir.clear_state();
    }
}

impl Core {
    /// Signs and pushes a space's account JWT: its JetStream limits, the revocations of its
    /// identities (a revoked credential is refused from then on) and the mappings of its held
    /// senders (`space/holds.rs`; none before the space is served).
    async fn push_account(
        &self,
        keys: &SpaceKeys,
        config: &SpaceConfig,
        identities: &Identities,
        served: Option<&Space>,
    ) -> Result<(), DaemonError> {
        // One at a time, so that they reach the broker in the order they were signed: it
        // ignores an account JWT issued before the one it has.
        let _pushing = self.pushing.lock().await;
        let mappings = served
            .map(|s| s.holds().mappings(&s.names().prefix()))
            .unwrap_or_default();
        let jwt = self.keys.space_account_jwt(
            keys,
            JetStreamLimits {
                mem_storage: config.jetstream.max_memory_store,
                disk_storage: config.jetstream.max_file_store,
                streams: -1,
                consumer: -1,
            },
            &identities.revocations(),
            &mappings,
        )?;
        push_account(&self.system, keys.name(), jwt).await
    }

    /// [`Core::push_account`] of a served space.
    async fn push_served(&self, keys: &SpaceKeys, served: &Served) -> Result<(), DaemonError> {
        self.push_account(
            keys,
            served.space.config(),
            &served.identities,
            Some(&served.space),
        )
        .await
    }

    /// Pushes a space's account, connects its provisioner, bootstraps it, provisions its
    /// minted identities and starts its services; then serves it.
    async fn serve_space(
        self: &Arc<Self>,
        name: &str,
        mut config: SpaceConfig,
    ) -> Result<SpaceInfo, DaemonError> {
        let wanted = config.jetstream.max_file_store;
        let granted = self.budget().grant(name, wanted)?;
        if granted < wanted {
            tracing::warn!(
                space = name,
                wanted = crate::profile::human_size(wanted.max(0) as u64),
                granted = crate::profile::human_size(granted.max(0) as u64),
                "the space's JetStream quota is cut to what is left of the disk's budget"
            );
        }
        config.jetstream.max_file_store = granted;
        config.replicas = self.replicas;
        let served = self.serve_granted(name, config).await;
        if served.is_err() {
            self.budget().release(name);
        }
        served
    }

    fn budget(&self) -> std::sync::MutexGuard<'_, budget::Budget> {
        self.budget.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Core::serve_space`] once its storage is granted.
    async fn serve_granted(
        self: &Arc<Self>,
        name: &str,
        config: SpaceConfig,
    ) -> Result<SpaceInfo, DaemonError> {
        let keys = self.keys.ensure_space(name)?;
        let identities = Arc::new(Identities::load(&self.dir, name));
        // A node of a cluster first learns the identity records it missed while it was down
        // (a revoke, above all), through the account the cluster already knows; only then
        // does it push the account JWT, whose revocations come from those records.
        let early = match self.clustered {
            true => Space::connect(&keys, config.clone(), self.local, &self.ca_cert)
                .await
                .ok(),
            false => None,
        };
        if let Some(space) = &early {
            match identity_sync::pull(space, &identities).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    space = name,
                    records = n,
                    "identity records from the cluster"
                ),
                Err(e) => tracing::warn!(space = name, error = %crate::ops::error_text(&e),
                    "cannot read the cluster's identity records before pushing the account"),
            }
        }
        self.push_account(&keys, &config, &identities, None).await?;
        crate::files::private_dir(&self.dir.space(name))?;
        let creds = keys.own_user_creds("local-operator")?;
        crate::files::write_atomic(
            &self.dir.operator_creds(name),
            creds.render().as_bytes(),
            0o600,
        )?;
        identities.insert_builtin(operator_record(name, creds.public_key()?));
        let space = match early {
            Some(space) => Arc::new(space),
            None => Arc::new(Space::connect(&keys, config, self.local, &self.ca_cert).await?),
        };
        let services = ServiceSet::new(name, &self.root);
        let started = async {
            self.bootstrap(&space).await?;
            for record in identities.active() {
                space.provision(&record).await?;
            }
            let members = Arc::new(
                Members::open(space.jetstream(), space.names())
                    .await
                    .map_err(|e| service_error(name, e))?,
            );
            let presence = Arc::new(PresenceView::default());
            let backstop = Arc::new(Backstop::new(
                space.clone(),
                identities.clone(),
                members.clone(),
                presence.clone(),
            ));
            let manager = Arc::new(Manager::new(
                space.clone(),
                identities.clone(),
                members.clone(),
                backstop.clone(),
            ));
            let account = space.account().to_owned();
            let view = BrokerView {
                creds: self
                    .keys
                    .system_daemon_creds(&format!("cotald-membership-{name}"), |id| {
                        crate::binding::acl::membership_daemon(&account, id)
                    })?,
                ca: self.ca_cert.clone(),
                addr: self.local,
            };
            // The reader and the router need the roster, the manager needs the reader.
            services
                .start(Arc::new(PresenceWatch::new(
                    space.clone(),
                    presence.clone(),
                )))
                .await
                .map_err(|e| service_error(name, e))?;
            let push_account: PushAccount = {
                // The keys loaded once: a hold is pushed while its sender may be flooding.
                let keys = Arc::new(self.keys.space(name)?);
                let core = Arc::downgrade(self);
                let config = space.config().clone();
                let (identities, space) = (identities.clone(), Arc::downgrade(&space));
                Arc::new(move || {
                    let (core, space) = (core.upgrade(), space.upgrade());
                    let (keys, config, identities) =
                        (keys.clone(), config.clone(), identities.clone());
                    Box::pin(async move {
                        let (Some(core), Some(space)) = (core, space) else {
                            return Err("the space is no longer served".to_owned());
                        };
                        core.push_account(&keys, &config, &identities, Some(&space))
                            .await
                            .map_err(|e| crate::ops::error_text(&e))
                    })
                })
            };
            let parts = Leased {
                space: space.clone(),
                identities: identities.clone(),
                presence,
                members,
                backstop,
                manager: manager.clone(),
                view,
                push_account,
            };
            let lease = if self.clustered {
                // One node of the cluster runs them, the lease's holder.
                // Not fatal when it fails to start (its bucket may be created by another node
                // this very moment): the set retries it with backoff, and `status` shows it.
                if let Err(e) = services
                    .start(Arc::new(IdentitySync::new(
                        space.clone(),
                        identities.clone(),
                        self.replicas,
                    )))
                    .await
                {
                    tracing::warn!(space = name, error = %crate::ops::error_text(&e),
                        "identity sync not running yet; retrying");
                }
                let starter: Starter = Arc::new(move |set: Arc<ServiceSet>| {
                    let parts = parts.clone();
                    Box::pin(async move { parts.start(&set, true).await })
                });
                let keeper = Arc::new(LeaseKeeper::new(
                    space.clone(),
                    self.node.clone(),
                    self.replicas,
                    starter,
                ));
                if let Err(e) = services.start(keeper.clone()).await {
                    tracing::warn!(space = name, error = %crate::ops::error_text(&e),
                        "lease keeper not running yet; retrying");
                }
                Some(keeper)
            } else {
                parts
                    .start(&services, false)
                    .await
                    .map_err(|e| service_error(name, e))?;
                None
            };
            Ok::<_, DaemonError>((manager, lease))
        };
        let (manager, lease) = match started.await {
            Ok(started) => started,
            Err(e) => {
                services.shutdown(SERVICES_DEADLINE).await;
                space.close().await;
                return Err(e);
            }
        };
        let info = self.space_info(&space)?;
        self.spaces.lock().await.insert(
            name.to_owned(),
            Served {
                space,
                identities,
                manager,
                services,
                lease,
            },
        );
        if let Ok(mut state) = self.state.lock()
            && !state.spaces.iter().any(|s| s == name)
        {
            state.spaces.push(name.to_owned());
            state.spaces.sort();
        }
        Ok(info)
    }

    /// Bootstraps a space; a clustered node retries for a while, since the cluster's
    /// JetStream answers only once its nodes have elected a meta leader (the other nodes may
    /// still be starting).
    async fn bootstrap(&self, space: &Space) -> Result<(), DaemonError> {
        let deadline = tokio::time::Instant::now() + CLUSTER_FORMING;
        let mut backoff = crate::backoff::Backoff::default();
        loop {
            match space.bootstrap().await {
                Ok(_) => return Ok(()),
                Err(e) if self.clustered && tokio::time::Instant::now() < deadline => {
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

    fn space_info(&self, space: &Space) -> Result<SpaceInfo, DaemonError> {
        Ok(SpaceInfo {
            name: space.name().to_owned(),
            account: space.account().to_owned(),
            profile: space.config().profile,
            link: self.link(space.name(), &[])?,
            operator_creds: self.dir.operator_creds(space.name()),
        })
    }

    /// Stops every space's services, then closes its connection.
    async fn close_spaces(&self) {
        let spaces = std::mem::take(&mut *self.spaces.lock().await);
        for (_, served) in spaces {
            served.services.shutdown(SERVICES_DEADLINE).await;
            served.space.close().await;
        }
    }

    /// Who holds each served space's lease (a cluster's node only).
    pub(crate) async fn leases(&self) -> BTreeMap<String, crate::services::lease::LeaseView> {
        self.spaces
            .lock()
            .await
            .iter()
            .filter_map(|(name, s)| s.lease.as_ref().map(|l| (name.clone(), l.view())))
            .collect()
    }

    /// The served spaces' and the appliance's services.
    pub(crate) async fn services(&self) -> Vec<ServiceStatus> {
        self.spaces
            .lock()
            .await
            .values()
            .flat_map(|s| {
                let leased = s.lease.as_ref().map(|l| l.status()).unwrap_or_default();
                s.services.status().into_iter().chain(leased)
            })
            .collect()
    }

    async fn ready_info(&self, supervisor: &Supervisor) -> ReadyInfo {
        let status = supervisor.status().borrow().clone();
        let spaces = self.spaces.lock().await;
        let (version, unserved) = self
            .state
            .lock()
            .map(|s| (s.broker_version.clone(), s.unserved.clone()))
            .unwrap_or_default();
        ReadyInfo {
            data_dir: self.dir.root().to_owned(),
            listen: status.client,
            link_host: self.link_host.clone(),
            monitor: status.monitor,
            ca_cert: self.ca_cert.clone(),
            spaces: spaces
                .values()
                .filter_map(|s| self.space_info(&s.space).ok())
                .collect(),
            broker_pid: status.pid,
            broker_version: version,
            unserved,
            dashboard: crate::dashboard::Availability::Disabled,
        }
    }

    /// Records where the appliance listens and what it serves, for the next start and for the
    /// commands that run while it is stopped.
    pub(crate) async fn record_served(&self) -> Result<(), DaemonError> {
        let listen = match self.state.lock() {
            Ok(state) => state.listen,
            Err(poisoned) => poisoned.into_inner().listen,
        };
        let spaces = self
            .spaces
            .lock()
            .await
            .values()
            .map(|s| self.space_info(&s.space))
            .collect::<Result<_, _>>()?;
        self.dir.write_last_served(&LastServed {
            listen,
            link_host: self.link_host.clone(),
            spaces,
        })?;
        Ok(())
    }

    fn link(&self, space: &str, channels: &[String]) -> Result<String, DaemonError> {
        join_link(&self.link_host, space, channels)
    }

    /// Writes `run/state.json`; the lock is held across the write so that two writers (a
    /// broker restart and a `space add`) cannot land an older snapshot last.
    fn write_state(&self) -> Result<(), DaemonError> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.dir.write_state(&state)?;
        Ok(())
    }
}

/// A service of `space` that could not start.
fn service_error(
    space: &str,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> DaemonError {
    let source = e.into();
    DaemonError::Service {
        space: space.to_owned(),
        source: match source.downcast::<crate::services::ServiceError>() {
            Ok(e) => *e,
            Err(other) => {
                crate::services::ServiceError::new("starting the space's services", other)
            }
        },
    }
}

/// The machine operator's own user in a space, as the manager knows it: unrestricted, like the
/// credential (it reads and posts everywhere, and may write channel configs).
fn operator_record(space: &str, id: String) -> IdentityRecord {
    IdentityRecord {
        id,
        name: "local-operator".into(),
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

/// A `cotals://` join link for `space` at `host_port`, naming `channels` (§10).
pub fn join_link(host_port: &str, space: &str, channels: &[String]) -> Result<String, DaemonError> {
    let invalid = |e: crate::protocol::JoinLinkError| DaemonError::Invalid(e.to_string());
    let (host, port) = host_port
        .rsplit_once(':')
        .ok_or_else(|| DaemonError::Invalid(format!("no port in {host_port}")))?;
    let port: u16 = port
        .parse()
        .map_err(|_| DaemonError::Invalid(format!("bad port in {host_port}")))?;
    let link = JoinLink::new(true, Host::parse(host).map_err(invalid)?, space)
        .map_err(invalid)?
        .with_port(port)
        .map_err(invalid)?
        .with_channels(channels.iter().cloned());
    Ok(link.to_string())
}

async fn push_account(
    system: &async_nats::Client,
    space: &str,
    jwt: String,
) -> Result<(), DaemonError> {
    let refused = |reason: String| DaemonError::ClaimsUpdate {
        space: space.to_owned(),
        reason,
    };
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        system.request("$SYS.REQ.CLAIMS.UPDATE", jwt.into()),
    )
    .await
    .map_err(|_| refused("no answer within 10s".into()))?
    .map_err(|e| refused(crate::ops::error_text(&e)))?;
    let body: serde_json::Value =
        serde_json::from_slice(&reply.payload).map_err(|e| refused(e.to_string()))?;
    if let Some(err) = body.get("error") {
        return Err(refused(err.to_string()));
    }
    tracing::debug!(space, reply = %body, "account pushed");
    Ok(())
}

/// `listen` as given, except that a port 0 becomes the port this data dir's appliance picked
/// last time on the same address, when that port is free: the join links handed out then
/// stay valid. When it is taken, a new port is picked and the warning says the links change.
fn keep_picked_port(listen: SocketAddr, dir: &DataDir) -> SocketAddr {
    let Some(last) = dir.read_last_served() else {
        return listen;
    };
    if listen.port() != 0 || last.listen.ip() != listen.ip() {
        return listen;
    }
    match std::net::TcpListener::bind(last.listen) {
        Ok(_) => last.listen,
        Err(e) => {
            tracing::warn!(
                port = last.listen.port(),
                error = %e,
                "the port picked last time is taken; a new one is picked, and join links \
                 handed out before name the old one"
            );
            listen
        }
    }
}

/// The address of this machine that others on its network most likely dial: the source
/// address of its default route, found by connecting a UDP socket (which sends nothing).
/// `None` when there is no route (an offline machine): links then name loopback.
fn outward_address(family: IpAddr) -> Option<IpAddr> {
    let (bind, probe): (SocketAddr, SocketAddr) = match family {
        IpAddr::V4(_) => (
            (Ipv4Addr::UNSPECIFIED, 0).into(),
            (Ipv4Addr::new(192, 0, 2, 1), 9).into(),
        ),
        IpAddr::V6(_) => (
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
            ("2001:db8::1".parse::<std::net::Ipv6Addr>().ok()?, 9).into(),
        ),
    };
    let socket = std::net::UdpSocket::bind(bind).ok()?;
    socket.connect(probe).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified() && !ip.is_loopback()).then_some(ip)
}

/// The address the appliance itself dials: loopback when the listener is a wildcard.
fn local_addr(client: SocketAddr) -> SocketAddr {
    if client.ip().is_unspecified() {
        let ip = match client.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        };
        SocketAddr::new(ip, client.port())
    } else {
        client
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
