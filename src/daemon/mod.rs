//! The appliance: one supervisor process that owns a child nats-server and everything it
//! needs, started and stopped in named phases (teardown in reverse):
//!
//! 1. lock the data dir (one appliance per data dir);
//! 2. install the broker executable;
//! 3. provision: key store, TLS, every space's account keys;
//! 4. render the broker config and start the child; await readiness;
//! 5. start the web dashboard's listener ([`crate::dashboard`], when enabled): it shows each
//!    space as it is handed over in phase 6;
//! 6. per space: push its account JWT to the resolver (`$SYS.REQ.CLAIMS.UPDATE`: works
//!    without a restart, unlike a memory resolver) over the SYS user's connection that asked
//!    the broker whether it is ready ([`crate::supervisor::monitor`]); connect its
//!    provisioner, bootstrap streams and buckets (§8), pre-create the durables of every
//!    identity minted so far; hand it to the dashboard; start the space's services
//!    ([`crate::services`]). On a node of a cluster ([`cluster`]), the identity records are
//!    read from the cluster before the account is pushed, and the services other than the
//!    presence watch run only while this node holds the space's lease
//!    ([`crate::services::lease`]). Meanwhile, the admin socket and the server
//!    certificate's renewal start;
//! 7. once the dashboard has tried to show every served space, the runtime state for
//!    `cotald status`; ready (and a service manager that asked is told so: [`notify`]).
//!
//! Every background task of the appliance belongs to a [`ServiceSet`] under one root
//! cancellation token (the appliance's set, and one per space), but one: the broker's
//! supervisor, which must outlive them all, is the task of the [`Supervisor`] handle, stopped
//! by it (or by its drop) last. Shutdown cancels the root, waits for each set up to its
//! deadline, closes the spaces' connections, then stops the broker.
//!
//! Spaces come from the profile and from `cotald space add` (remembered in the data dir once
//! they are served); the operations the admin socket serves are listed in [`crate::ops`].

mod accounts;
pub mod admin;
pub mod backup;
mod broker;
pub mod budget;
pub mod cluster;
mod core;
mod dashboard;
pub mod notify;
mod ops;
mod renewal;
mod served;
mod space_services;
mod state;

pub use ops::execute_offline;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::datadir::{DataDir, DataDirError, DataDirLock, UnservedSpace};
use crate::files::FileError;
use crate::ops::{OpError, SpaceInfo};
use crate::profile::{Profile, ProfileError, SpaceConfig};
use crate::protocol::{Host, JoinLink, JoinLinkError};
use crate::provision::{KeyStore, ProvisionError};
use crate::services::ServiceSet;
use crate::space::store::StoreError;
use crate::space::{MintError, SpaceError};
use crate::supervisor::{BrokerBinary, Supervisor, SupervisorError};

pub use self::accounts::PushError;
use self::core::Core;
use self::served::Served;

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
    /// A backup, or the restore of one.
    #[error(transparent)]
    Backup(#[from] backup::BackupError),
    /// A service of a space could not start.
    #[error("space `{space}`: {source}")]
    Service {
        /// The space.
        space: String,
        /// What failed.
        #[source]
        source: crate::services::ServiceError,
    },
    /// A space's account JWT is not in the broker.
    #[error(transparent)]
    Account(#[from] PushError),
    /// The request names a space this appliance does not serve.
    #[error("unknown space `{0}` (see `cotald space list`)")]
    UnknownSpace(String),
    /// `space add` of a space that exists.
    #[error("space `{0}` already exists")]
    SpaceExists(String),
    /// A space name the profile's rules refuse, in their words.
    #[error("{0}")]
    SpaceName(String),
    /// An operation on a space's channels that names no space.
    #[error("`{0}` needs a space")]
    NeedsSpace(&'static str),
    /// The request names an identity the space does not have.
    #[error("no identity `{name}` in space `{space}`")]
    UnknownIdentity {
        /// The name asked for.
        name: String,
        /// The space.
        space: String,
    },
    /// A reply could not be written as JSON.
    #[error("writing the reply")]
    Reply(#[source] serde_json::Error),
    /// The profile built into the binary does not parse (a defect of the build).
    #[error("the embedded profile")]
    EmbeddedProfile(#[source] ProfileError),
    /// The host and port join links name is not `HOST:PORT`.
    #[error("`{0}` is not HOST:PORT")]
    LinkHost(String),
    /// A join link could not be made of its parts.
    #[error("making a join link")]
    Link(#[source] JoinLinkError),
    /// The free space of the data dir's disk cannot be read.
    #[error("cannot read the free space of {path}")]
    FreeSpace {
        /// The data dir.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A cluster operation refused.
    #[error(transparent)]
    Cluster(#[from] cluster::ClusterError),
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
    /// The broker's HTTP monitoring listener, when the profile turns it on.
    pub monitor: Option<SocketAddr>,
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
    services: Arc<ServiceSet>,
    info: ReadyInfo,
}

/// What the phases before the broker produced, for the phases after it.
pub(super) struct Prepared {
    pub(super) dir: DataDir,
    pub(super) spaces: BTreeMap<String, SpaceConfig>,
    /// The spaces of the profile: served first, so they get their storage first.
    pub(super) profile_spaces: std::collections::BTreeSet<String>,
    /// The JetStream store limit the broker runs with.
    pub(super) store_limit: i64,
    /// Spaces already known to be unservable (an unreadable record).
    pub(super) unserved: Vec<UnservedSpace>,
    pub(super) hostnames: Vec<String>,
    pub(super) ca_cert: PathBuf,
    pub(super) keys: KeyStore,
    pub(super) broker_version: String,
    /// The cluster's replicas, when clustered.
    pub(super) replicas: Option<usize>,
    pub(super) node: String,
    /// The profile's text, as a backup carries it.
    pub(super) profile_text: String,
    /// The server certificate the broker starts with, renewed while it runs.
    pub(super) certificate: renewal::ServerCertificate,
}

const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a clustered node waits for the cluster's JetStream to answer its bootstrap.
const CLUSTER_FORMING: Duration = Duration::from_secs(90);
/// How long the broker may take to stop before it is killed; with [`SERVICES_DEADLINE`] and
/// [`CLOSE_DEADLINE`], a stop takes under 10 s in every state.
const STOP_DEADLINE: Duration = Duration::from_secs(5);
/// How long a set of services may take to stop.
const SERVICES_DEADLINE: Duration = Duration::from_secs(3);
/// How long the appliance's connections may take to drain at a stop.
const CLOSE_DEADLINE: Duration = Duration::from_secs(1);

impl Appliance {
    /// Runs the startup phases; returns once the broker is ready and every space is served.
    pub async fn start(opts: Options) -> Result<Self, DaemonError> {
        let lock = opts.data_dir.lock()?;
        tracing::info!(data_dir = %opts.data_dir.root().display(), "phase: data dir locked");
        let (prepared, spec) = broker::prepare(&opts).await?;
        let certificate = prepared.certificate.clone();
        // The spaces the broker knows are dialed while it gets ready.
        let (listening, listens) = tokio::sync::oneshot::channel();
        let (supervisor, dialed) = tokio::join!(
            Supervisor::start(spec, listening),
            core::dial_known(&prepared, listens)
        );
        let supervisor = supervisor?;
        let status = supervisor.status().borrow().clone();
        tracing::info!(pid = status.pid, client = %status.client, "phase: broker ready");
        let (core, to_serve) = Core::new(prepared, &status, supervisor.monitor(), dialed);
        let services = Arc::new(ServiceSet::new("appliance", &core.root));
        let mut appliance = Appliance {
            info: core.ready_info(&status).await,
            core,
            _lock: lock,
            supervisor,
            services,
        };
        // The dashboard listens first; each space is handed to it once its streams are made
        // (its observer connects at the first request that shows it). The admin socket and
        // the certificate's renewal start meanwhile: none of them needs another.
        let (dashboard, listening) = dashboard::start(
            &appliance.core,
            &appliance.services,
            &opts.profile.dashboard,
            opts.dashboard,
        )
        .await;
        let (served, own) = tokio::join!(
            appliance.core.serve_all(to_serve),
            appliance.start_own_services(certificate)
        );
        if let Err(e) = served.and(own) {
            // Leave nothing running behind a failed start.
            appliance.stop().await;
            return Err(e);
        }
        if let Some(listening) = listening {
            dashboard::remember(&appliance.core, listening);
        }
        appliance.info = appliance.core.ready_info(&status).await;
        appliance.info.dashboard = dashboard;
        if let Err(e) = appliance.track_state().await {
            appliance.stop().await;
            return Err(e);
        }
        tracing::info!("phase: ready");
        Ok(appliance)
    }

    /// The admin socket and the server certificate's renewal (during phase 6).
    async fn start_own_services(
        &self,
        certificate: renewal::ServerCertificate,
    ) -> Result<(), DaemonError> {
        let socket = admin::AdminSocket::bind(self.core.clone())?;
        self.services.start(Arc::new(socket)).await.map_err(own)?;
        let renewal = renewal::CertificateRenewal::new(certificate, self.core.monitor.clone());
        self.services.start(Arc::new(renewal)).await.map_err(own)
    }

    /// Phase 7's last step: the runtime state for `cotald status`, written once every other
    /// service runs (so that a `status` right after `ready` finds them all running, this one
    /// too), then tracked.
    async fn track_state(&self) -> Result<(), DaemonError> {
        let core = &self.core;
        let tracker = state::StateTracker {
            file: core.state.clone(),
            spaces: core.spaces.clone(),
            monitor: core.monitor.clone(),
            node: core.cluster.as_ref().map(|c| c.name.clone()),
            own: Arc::downgrade(&self.services),
            broker: self.supervisor.status(),
        };
        self.services.start(Arc::new(tracker)).await.map_err(own)
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

    /// The teardown, bounded whatever state the broker and a cluster are in (a dead peer, a
    /// hung broker): every set of services at once, each abandoning what has not stopped
    /// after [`SERVICES_DEADLINE`] (named in the log); the connections closed at once within
    /// [`CLOSE_DEADLINE`]; then the broker, SIGKILLed after [`STOP_DEADLINE`] (logged). In all
    /// under 10 s.
    async fn stop(self) {
        let spaces = self.core.spaces.take().await;
        let sets = std::iter::once(&*self.services).chain(spaces.iter().map(|s| &s.services));
        futures_util::future::join_all(sets.map(|set| set.shutdown(SERVICES_DEADLINE))).await;
        let closes = futures_util::future::join_all(spaces.iter().map(|s| s.space.close()));
        let _ = tokio::time::timeout(CLOSE_DEADLINE, closes).await;
        self.core.root.cancel();
        self.supervisor.stop().await;
        self.core.dir.clear_state();
    }
}

/// A service of the appliance's own set that could not start.
fn own(source: crate::services::ServiceError) -> DaemonError {
    DaemonError::Service {
        space: "appliance".into(),
        source,
    }
}

/// A `cotals://` join link for `space` at `host_port`, naming `channels` (§10).
pub fn join_link(
    host_port: &str,
    space: &str,
    channels: &[String],
) -> Result<JoinLink, DaemonError> {
    let not_host_port = || DaemonError::LinkHost(host_port.to_owned());
    let (host, port) = host_port.rsplit_once(':').ok_or_else(not_host_port)?;
    let port: u16 = port.parse().map_err(|_| not_host_port())?;
    let host = Host::parse(host).map_err(|_| not_host_port())?;
    let link = JoinLink::new(true, host, space)
        .and_then(|link| link.with_port(port))
        .map_err(DaemonError::Link)?
        .with_channels(channels.iter().cloned());
    Ok(link)
}
