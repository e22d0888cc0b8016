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
//!    durables of every identity minted so far;
//! 7. record the runtime state for `cotald status`, open the admin socket; ready.
//!
//! Spaces come from the profile and from `cotald space add` (remembered in the data dir); the
//! admin socket (`run/admin.sock`, owner-only) serves `space add`, `space list` and `mint`.

pub mod admin;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::datadir::{DataDir, DataDirError, DataDirLock, RuntimeState};
use crate::profile::{Profile, SpaceConfig};
use crate::protocol::{Host, JoinLink};
use crate::provision::{JetStreamLimits, KeyStore, ProvisionError, TlsFiles};
use crate::space::store::{self, StoreError};
use crate::space::{self, IdentityRecord, MintError, MintRequest, Space, SpaceError};
use crate::supervisor::{BrokerBinary, BrokerSpec, ServerConf, Supervisor, SupervisorError};

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
    /// The space store in the data dir.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A mint request.
    #[error(transparent)]
    Mint(#[from] MintError),
    /// The appliance's own connection to the broker failed.
    #[error("cannot connect to the broker at {addr} as the system user: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    /// The broker refused a space's account JWT.
    #[error("the broker refused the account of space `{space}`: {reason}")]
    ClaimsUpdate { space: String, reason: String },
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
    #[error("admin socket {path}: {reason}")]
    Admin { path: PathBuf, reason: String },
}

/// One served space, as announced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpaceInfo {
    /// The space name.
    pub name: String,
    /// The account public key.
    pub account: String,
    /// The deployment profile.
    pub profile: crate::profile::DeploymentProfile,
    /// The join link (§10).
    pub link: String,
    /// The machine operator's credentials for this space.
    pub operator_creds: PathBuf,
}

/// What the running appliance announces.
#[derive(Debug, Clone)]
pub struct ReadyInfo {
    /// The data dir.
    pub data_dir: PathBuf,
    /// Client listener.
    pub listen: SocketAddr,
    /// Monitoring listener.
    pub monitor: SocketAddr,
    /// The CA certificate clients trust.
    pub ca_cert: PathBuf,
    /// The served spaces.
    pub spaces: Vec<SpaceInfo>,
    /// The child's pid.
    pub broker_pid: u32,
    /// The broker version.
    pub broker_version: String,
}

/// A minted credential, as the admin socket returns it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MintReply {
    /// The identity.
    pub record: IdentityRecord,
    /// The `.creds` text (secret; the caller writes it).
    pub creds: String,
    /// A join link naming the identity's boot channels.
    pub link: String,
    /// Whether its durables were created (false when minted without a running appliance).
    pub provisioned: bool,
}

/// A running appliance.
pub struct Appliance {
    core: Arc<Core>,
    _lock: DataDirLock,
    supervisor: Supervisor,
    state_task: tokio::task::JoinHandle<()>,
    admin: admin::AdminServer,
    info: ReadyInfo,
}

/// What the phases before the broker produced, for the phases after it.
struct Prepared {
    dir: DataDir,
    lock: DataDirLock,
    spaces: BTreeMap<String, SpaceConfig>,
    hostnames: Vec<String>,
    ca_cert: PathBuf,
    keys: KeyStore,
    broker_version: String,
}

/// What the running appliance's operations share.
pub(crate) struct Core {
    dir: DataDir,
    keys: KeyStore,
    ca_cert: PathBuf,
    /// Where the appliance itself dials the broker.
    local: SocketAddr,
    /// The host:port join links name.
    link_host: String,
    system: async_nats::Client,
    spaces: tokio::sync::Mutex<BTreeMap<String, Space>>,
    state: std::sync::Mutex<RuntimeState>,
}

const READY_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_DEADLINE: Duration = Duration::from_secs(10);

impl Appliance {
    /// Runs the startup phases; returns once the broker is ready and every space is served.
    pub async fn start(opts: Options) -> Result<Self, DaemonError> {
        let dir = opts.data_dir;
        let lock = dir.lock()?;
        tracing::info!(data_dir = %dir.root().display(), "phase: data dir locked");

        let executable = opts.broker.install(&dir.bin())?;
        let broker_version = opts.broker.version().unwrap_or("unknown").to_owned();

        let broker = &opts.profile.broker;
        let listen = opts.listen.unwrap_or(broker.listen);
        let mut hostnames = broker.hostnames.clone();
        hostnames.extend(opts.hostnames.iter().cloned());
        if !listen.ip().is_unspecified() && !listen.ip().is_loopback() {
            hostnames.push(listen.ip().to_string());
        }
        let keys = KeyStore::load_or_create(&dir.keys())?;
        let tls = TlsFiles::ensure(&dir.tls(), &hostnames)?;
        let mut spaces = store::runtime_spaces(&dir)?;
        for (name, config) in &opts.profile.spaces {
            spaces.insert(name.clone(), config.clone());
        }
        for name in spaces.keys() {
            keys.ensure_space(name)?;
        }
        tracing::info!(spaces = spaces.len(), "phase: provisioned keys and TLS");

        let spec = BrokerSpec {
            executable,
            conf: ServerConf {
                server_name: format!("cotald_{}", &keys.operator_public()[..12]),
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
                sync_interval: broker.sync_interval.clone(),
                tls_cert: tls.server_cert.clone(),
                tls_key: tls.server_key.clone(),
            },
            conf_path: dir.run().join("nats-server.conf"),
            log_path: dir.log().join("nats-server.log"),
            ready_timeout: READY_TIMEOUT,
            stop_deadline: STOP_DEADLINE,
        };
        let supervisor = Supervisor::start(spec).await?;
        let prepared = Prepared {
            dir,
            lock,
            spaces,
            hostnames,
            ca_cert: tls.ca_cert,
            keys,
            broker_version,
        };
        match Self::serve(prepared, &supervisor).await {
            Ok((core, lock, admin, info)) => {
                let state_task = tokio::spawn(track_state(core.clone(), supervisor.status()));
                tracing::info!("phase: ready");
                Ok(Appliance {
                    core,
                    _lock: lock,
                    supervisor,
                    state_task,
                    admin,
                    info,
                })
            }
            Err(e) => {
                // Leave nothing running behind a failed start.
                supervisor.stop().await;
                Err(e)
            }
        }
    }

    /// The phases after the broker is ready: system connection, spaces, state, admin socket.
    async fn serve(
        prepared: Prepared,
        supervisor: &Supervisor,
    ) -> Result<(Arc<Core>, DataDirLock, admin::AdminServer, ReadyInfo), DaemonError> {
        let Prepared {
            dir,
            lock,
            spaces,
            hostnames,
            ca_cert,
            keys,
            broker_version,
        } = prepared;
        let status = supervisor.status().borrow().clone();
        tracing::info!(pid = status.pid, client = %status.client, "phase: broker ready");

        let local = local_addr(status.client);
        let system = connect_system(&keys, &ca_cert, local).await?;
        let core = Arc::new(Core {
            dir: dir.clone(),
            keys,
            ca_cert: ca_cert.clone(),
            local,
            link_host: link_host(status.client, &hostnames),
            system,
            spaces: tokio::sync::Mutex::new(BTreeMap::new()),
            state: std::sync::Mutex::new(RuntimeState {
                pid: std::process::id(),
                broker_pid: status.pid,
                broker_version: broker_version.clone(),
                listen: status.client,
                monitor: status.monitor,
                spaces: Vec::new(),
                broker_restarts: 0,
            }),
        });
        let mut infos = Vec::new();
        for (name, config) in spaces {
            infos.push(core.serve_space(&name, config).await?);
        }
        tracing::info!(spaces = infos.len(), "phase: spaces served");

        core.write_state()?;
        let admin = admin::AdminServer::start(core.clone())?;
        let info = ReadyInfo {
            data_dir: dir.root().to_owned(),
            listen: status.client,
            monitor: status.monitor,
            ca_cert,
            spaces: infos,
            broker_pid: status.pid,
            broker_version,
        };
        Ok((core, lock, admin, info))
    }

    /// What the appliance announces.
    pub fn info(&self) -> &ReadyInfo {
        &self.info
    }

    /// Serves until `shutdown` resolves, then tears down in reverse order.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) {
        shutdown.await;
        tracing::info!("phase: shutting down");
        self.admin.stop().await;
        self.state_task.abort();
        let spaces = std::mem::take(&mut *self.core.spaces.lock().await);
        for (_, space) in spaces {
            space.close().await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), self.core.system.drain()).await;
        self.supervisor.stop().await;
        self.core.dir.clear_state();
        tracing::info!("phase: stopped");
    }
}

impl Core {
    /// Pushes a space's account, connects its provisioner, bootstraps it and provisions its
    /// minted identities; then serves it.
    async fn serve_space(&self, name: &str, config: SpaceConfig) -> Result<SpaceInfo, DaemonError> {
        let keys = self.keys.ensure_space(name)?;
        let jwt = self.keys.space_account_jwt(
            &keys,
            JetStreamLimits {
                mem_storage: config.jetstream.max_memory_store,
                disk_storage: config.jetstream.max_file_store,
                streams: -1,
                consumer: -1,
            },
        )?;
        push_account(&self.system, name, jwt).await?;
        let creds_path = self.dir.space(name).join("local-operator.creds");
        keys.own_user_creds("local-operator")?.write(&creds_path)?;
        let profile = config.profile;
        let space = Space::connect(&keys, config, self.local, &self.ca_cert).await?;
        space.bootstrap().await?;
        for record in store::identities(&self.dir, name)? {
            space.provision(&record).await?;
        }
        let info = SpaceInfo {
            name: name.to_owned(),
            account: space.account().to_owned(),
            profile,
            link: self.link(name, &[])?,
            operator_creds: creds_path,
        };
        self.spaces.lock().await.insert(name.to_owned(), space);
        if let Ok(mut state) = self.state.lock()
            && !state.spaces.iter().any(|s| s == name)
        {
            state.spaces.push(name.to_owned());
            state.spaces.sort();
        }
        Ok(info)
    }

    /// `cotald space add`: a new space, served at once and remembered for later starts.
    pub(crate) async fn add_space(
        &self,
        name: &str,
        profile: crate::profile::DeploymentProfile,
    ) -> Result<SpaceInfo, DaemonError> {
        crate::profile::validate_space_name(name).map_err(DaemonError::Invalid)?;
        if self.spaces.lock().await.contains_key(name) {
            return Err(DaemonError::SpaceExists(name.to_owned()));
        }
        store::add_runtime_space(&self.dir, name, profile)?;
        let info = self
            .serve_space(name, SpaceConfig::with_profile(profile))
            .await?;
        self.write_state()?;
        tracing::info!(space = name, ?profile, "space added");
        Ok(info)
    }

    /// `cotald space list`.
    pub(crate) async fn list_spaces(&self) -> Result<Vec<SpaceInfo>, DaemonError> {
        let spaces = self.spaces.lock().await;
        let mut out = Vec::new();
        for (name, space) in spaces.iter() {
            out.push(SpaceInfo {
                name: name.clone(),
                account: space.account().to_owned(),
                profile: space.config().profile,
                link: self.link(name, &[])?,
                operator_creds: self.dir.space(name).join("local-operator.creds"),
            });
        }
        Ok(out)
    }

    /// `cotald mint`: sign, remember, and pre-create the identity's durables.
    pub(crate) async fn mint(&self, req: &MintRequest) -> Result<MintReply, DaemonError> {
        let spaces = self.spaces.lock().await;
        let space = spaces
            .get(&req.space)
            .ok_or_else(|| DaemonError::UnknownSpace(req.space.clone()))?;
        let minted = space::identity::mint(&self.keys.space(&req.space)?, req)?;
        space.provision(&minted.record).await?;
        store::save_identity(&self.dir, &minted.record)?;
        tracing::info!(space = %req.space, id = %minted.record.id, name = %minted.record.name,
            profile = ?minted.record.profile, "minted");
        Ok(MintReply {
            link: self.link(&req.space, &minted.record.subscribe)?,
            creds: minted.creds.render(),
            record: minted.record,
            provisioned: true,
        })
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

async fn connect_system(
    keys: &KeyStore,
    ca: &Path,
    local: SocketAddr,
) -> Result<async_nats::Client, DaemonError> {
    let fail = |reason: String| DaemonError::Connect {
        addr: local,
        reason,
    };
    async_nats::ConnectOptions::with_credentials(&keys.system_user_creds()?.render())
        .map_err(|e| fail(e.to_string()))?
        .name("cotald-system")
        .add_root_certificates(ca.to_owned())
        .require_tls(true)
        .connect(format!("tls://{local}"))
        .await
        .map_err(|e| fail(e.to_string()))
}

/// Keeps `run/state.json` in step with the broker (its pid changes on a restart).
async fn track_state(
    core: Arc<Core>,
    mut status: tokio::sync::watch::Receiver<crate::supervisor::BrokerStatus>,
) {
    while status.changed().await.is_ok() {
        let now = status.borrow_and_update().clone();
        if let Ok(mut state) = core.state.lock() {
            state.broker_pid = now.pid;
            state.broker_restarts = now.restarts;
        }
        if let Err(e) = core.write_state() {
            tracing::warn!(error = %e, "cannot update the runtime state");
        }
    }
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
    .map_err(|e| refused(e.to_string()))?;
    let body: serde_json::Value =
        serde_json::from_slice(&reply.payload).map_err(|e| refused(e.to_string()))?;
    if let Some(err) = body.get("error") {
        return Err(refused(err.to_string()));
    }
    tracing::debug!(space, reply = %body, "account pushed");
    Ok(())
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
