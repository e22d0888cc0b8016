//! The appliance: one supervisor process that owns a child nats-server and everything it
//! needs, started and stopped in named phases (teardown in reverse):
//!
//! 1. lock the data dir (one appliance per data dir);
//! 2. install the broker executable;
//! 3. provision: key store, space accounts, TLS;
//! 4. render the broker config and start the child; await readiness;
//! 5. connect as the appliance's SYS user and push each space's account JWT to the resolver
//!    (`$SYS.REQ.CLAIMS.UPDATE`: works without a restart, unlike a memory resolver);
//! 6. record the runtime state for `cotald status`; ready.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::datadir::{DataDir, DataDirError, DataDirLock, RuntimeState};
use crate::profile::Profile;
use crate::provision::{JetStreamLimits, KeyStore, ProvisionError, TlsFiles};
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

/// Why the appliance failed.
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
    /// The appliance's own connection to the broker failed.
    #[error("cannot connect to the broker at {addr} as the system user: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    /// The broker refused a space's account JWT.
    #[error("the broker refused the account of space `{space}`: {reason}")]
    ClaimsUpdate { space: String, reason: String },
}

/// One served space, as announced when ready.
#[derive(Debug, Clone)]
pub struct SpaceInfo {
    /// The space name.
    pub name: String,
    /// The account public key.
    pub account: String,
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

/// A running appliance.
pub struct Appliance {
    data_dir: DataDir,
    _lock: DataDirLock,
    supervisor: Supervisor,
    system: async_nats::Client,
    state_task: tokio::task::JoinHandle<()>,
    info: ReadyInfo,
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
        let mut spaces = Vec::new();
        for (name, space) in &opts.profile.spaces {
            let space_keys = keys.ensure_space(name)?;
            let jwt = keys.space_account_jwt(
                &space_keys,
                JetStreamLimits {
                    mem_storage: space.jetstream.max_memory_store,
                    disk_storage: space.jetstream.max_file_store,
                    streams: -1,
                    consumer: -1,
                },
            )?;
            let creds_path = dir.space(name).join("local-operator.creds");
            write_creds(&creds_path, &space_keys.local_operator_creds()?.render())?;
            spaces.push((space_keys, jwt, creds_path));
        }
        tracing::info!(
            spaces = spaces.len(),
            "phase: provisioned keys, accounts and TLS"
        );

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
        let status = supervisor.status().borrow().clone();
        tracing::info!(pid = status.pid, client = %status.client, "phase: broker ready");

        let local = local_addr(status.client);
        let system =
            async_nats::ConnectOptions::with_credentials(&keys.system_user_creds()?.render())
                .map_err(|e| DaemonError::Connect {
                    addr: local,
                    reason: e.to_string(),
                })?
                .name("cotald-system")
                .add_root_certificates(tls.ca_cert.clone())
                .require_tls(true)
                .retry_on_initial_connect()
                .connect(format!("tls://{local}"))
                .await
                .map_err(|e| DaemonError::Connect {
                    addr: local,
                    reason: e.to_string(),
                })?;
        let mut infos = Vec::new();
        for (space_keys, jwt, creds_path) in spaces {
            push_account(&system, space_keys.name(), jwt).await?;
            infos.push(SpaceInfo {
                name: space_keys.name().to_owned(),
                account: space_keys.account_public(),
                link: format!(
                    "cotals://{}/{}",
                    link_host(status.client, &hostnames),
                    space_keys.name()
                ),
                operator_creds: creds_path,
            });
        }
        tracing::info!(spaces = infos.len(), "phase: space accounts pushed");

        let state = RuntimeState {
            pid: std::process::id(),
            broker_pid: status.pid,
            broker_version: broker_version.clone(),
            listen: status.client,
            monitor: status.monitor,
            spaces: infos.iter().map(|s| s.name.clone()).collect(),
            broker_restarts: 0,
        };
        dir.write_state(&state)?;
        let state_task = tokio::spawn(track_state(dir.clone(), state, supervisor.status()));

        let info = ReadyInfo {
            data_dir: dir.root().to_owned(),
            listen: status.client,
            monitor: status.monitor,
            ca_cert: tls.ca_cert,
            spaces: infos,
            broker_pid: status.pid,
            broker_version,
        };
        tracing::info!("phase: ready");
        Ok(Appliance {
            data_dir: dir,
            _lock: lock,
            supervisor,
            system,
            state_task,
            info,
        })
    }

    /// What the appliance announces.
    pub fn info(&self) -> &ReadyInfo {
        &self.info
    }

    /// Serves until `shutdown` resolves, then tears down in reverse order.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) {
        shutdown.await;
        tracing::info!("phase: shutting down");
        self.state_task.abort();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.system.drain()).await;
        self.supervisor.stop().await;
        self.data_dir.clear_state();
        tracing::info!("phase: stopped");
    }
}

/// Keeps `run/state.json` in step with the broker (its pid changes on a restart).
async fn track_state(
    dir: DataDir,
    mut state: RuntimeState,
    mut status: tokio::sync::watch::Receiver<crate::supervisor::BrokerStatus>,
) {
    while status.changed().await.is_ok() {
        let now = status.borrow_and_update().clone();
        state.broker_pid = now.pid;
        state.broker_restarts = now.restarts;
        if let Err(e) = dir.write_state(&state) {
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

fn write_creds(path: &std::path::Path, text: &str) -> Result<(), ProvisionError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let io = |action, source| ProvisionError::Io {
        path: path.to_owned(),
        action,
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| io("creating the directory of", e))?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io("creating", e))?;
    f.write_all(text.as_bytes()).map_err(|e| io("writing", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("renaming into place", e))
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
