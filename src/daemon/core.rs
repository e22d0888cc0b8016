//! Phases 5 and 6: what the running appliance's operations share ([`Core`]), made once the
//! broker is ready (the appliance's system connection), and each space served on it: its
//! account pushed (`$SYS.REQ.CLAIMS.UPDATE`), its provisioner connected, its streams and
//! buckets bootstrapped (§8), its minted identities provisioned, its services started
//! ([`super::space_services`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::space_services::{SpaceServices, Started};
use super::{
    CLUSTER_FORMING, DaemonError, Prepared, ReadyInfo, SERVICES_DEADLINE, budget, join_link,
};
use crate::backoff::Backoff;
use crate::datadir::{DataDir, LastServed, RuntimeState, UnservedSpace};
use crate::ops::{CredentialProfile, IdentityRecord, SpaceInfo};
use crate::profile::SpaceConfig;
use crate::provision::{JetStreamLimits, KeyStore, SpaceKeys};
use crate::services::identity_sync;
use crate::services::lease::{LeaseKeeper, LeaseView};
use crate::services::manager::Manager;
use crate::services::{ServiceSet, ServiceStatus};
use crate::space::{Identities, Space};
use crate::supervisor::monitor::Monitor;
use crate::supervisor::{BrokerStatus, local_addr};

/// One served space: its provisioner connection, its identities, its services.
pub(super) struct Served {
    pub(super) space: Arc<Space>,
    pub(super) identities: Arc<Identities>,
    pub(super) manager: Arc<Manager>,
    pub(super) services: ServiceSet,
    /// In a cluster: the space's lease, and the services it runs while this node holds it.
    pub(super) lease: Option<Arc<LeaseKeeper>>,
    /// Held by an operation that changes the space's identities (mint, revoke), one at a
    /// time per space; never the map of spaces, which the state tracker reads every 500 ms.
    pub(super) changing: tokio::sync::Mutex<()>,
}

/// What the running appliance's operations share.
pub(super) struct Core {
    pub(super) dir: DataDir,
    pub(super) keys: KeyStore,
    pub(super) ca_cert: PathBuf,
    /// Where the appliance itself dials the broker.
    pub(super) local: SocketAddr,
    /// The host:port join links name.
    pub(super) link_host: String,
    pub(super) system: async_nats::Client,
    /// Asks the broker about itself (health, figures) over the system account.
    pub(super) monitor: Monitor,
    /// The JetStream storage each space holds.
    pub(super) budget: std::sync::Mutex<budget::Budget>,
    /// Held while an account JWT is signed and pushed.
    pub(super) pushing: tokio::sync::Mutex<()>,
    /// What each space's account JWT last pushed said.
    pub(super) pushed: std::sync::Mutex<BTreeMap<String, AccountState>>,
    pub(super) spaces: tokio::sync::Mutex<BTreeMap<String, Arc<Served>>>,
    pub(super) state: std::sync::Mutex<RuntimeState>,
    /// Cancels every service of the appliance.
    pub(super) root: CancellationToken,
    /// Cancelled when an operator asks the appliance to stop (`cotald down`).
    pub(super) stop: CancellationToken,
    /// Whether this node is one of a cluster.
    pub(super) clustered: bool,
    /// Replicas of every space's streams and buckets.
    pub(super) replicas: usize,
    /// This node's server name (the lease names its holder by it).
    pub(super) node: String,
    /// The profile's text, as a backup carries it.
    pub(super) profile_text: String,
    /// Where spaces added while running are handed to the dashboard, once it is served.
    pub(super) dashboard:
        std::sync::OnceLock<tokio::sync::watch::Sender<Vec<crate::dashboard::SpaceAccess>>>,
}

impl Core {
    /// Phases 5 and 6 once the broker is ready: the system connection, then each space.
    pub(super) async fn start(
        prepared: Prepared,
        status: &BrokerStatus,
        monitor: Monitor,
    ) -> Result<Arc<Core>, DaemonError> {
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
        } = prepared;
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
            monitor,
            budget: std::sync::Mutex::new(budget::Budget::new(budget::grantable(store_limit))),
            pushing: tokio::sync::Mutex::new(()),
            pushed: std::sync::Mutex::new(BTreeMap::new()),
            spaces: tokio::sync::Mutex::new(BTreeMap::new()),
            state: std::sync::Mutex::new(RuntimeState {
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
                leases: BTreeMap::new(),
                cluster: None,
            }),
            root: CancellationToken::new(),
            stop: CancellationToken::new(),
            clustered: replicas.is_some(),
            replicas: replicas.unwrap_or(1),
            node,
            profile_text,
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

    /// Signs and pushes a space's account JWT: its JetStream limits, the revocations of its
    /// identities (a revoked credential is refused from then on) and the mappings of its held
    /// senders (`space/holds.rs`; none before the space is served).
    pub(super) async fn push_account(
        &self,
        keys: &SpaceKeys,
        config: &SpaceConfig,
        identities: &Identities,
        served: Option<&Space>,
        push: Push,
    ) -> Result<(), DaemonError> {
        // One at a time, so that they reach the broker in the order they were signed: it
        // ignores an account JWT issued before the one it has. The state is read once the
        // turn comes, so a burst of requests costs one push of the latest state, and those
        // after it find nothing changed.
        let _pushing = self.pushing.lock().await;
        let wanted = AccountState {
            limits: JetStreamLimits {
                mem_storage: config.jetstream.max_memory_store,
                disk_storage: config.jetstream.max_file_store,
                streams: -1,
                consumer: -1,
            },
            revocations: identities.revocations(),
            mappings: served
                .map(|s| s.holds().mappings(s.names()))
                .unwrap_or_default(),
        };
        let space = keys.name();
        // A push rebuilds the account's JetStream API import in the broker: its agents' requests
        // of that instant find no responder. So nothing is pushed that the broker has already;
        // a node of a cluster always pushes (another node may have pushed another state).
        let unchanged = push == Push::IfChanged
            && self
                .pushed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(space)
                .is_some_and(|pushed| *pushed == wanted);
        if unchanged && !self.clustered {
            tracing::debug!(space, "account unchanged; not pushed");
            return Ok(());
        }
        let jwt = self.keys.space_account_jwt(
            keys,
            wanted.limits,
            &wanted.revocations,
            &wanted.mappings,
        )?;
        push_account(&self.system, space, jwt).await?;
        self.pushed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(space.to_owned(), wanted);
        Ok(())
    }

    /// [`Core::push_account`] of a served space.
    pub(super) async fn push_served(
        &self,
        keys: &SpaceKeys,
        served: &Served,
    ) -> Result<(), DaemonError> {
        self.push_account(
            keys,
            served.space.config(),
            &served.identities,
            Some(&served.space),
            Push::IfChanged,
        )
        .await
    }

    /// Pushes a space's account, connects its provisioner, bootstraps it, provisions its
    /// minted identities and starts its services; then serves it.
    pub(super) async fn serve_space(
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
        let early = self.learn_identities(&keys, &config, &identities).await;
        self.push_account(&keys, &config, &identities, None, Push::IfChanged)
            .await?;
        crate::files::private_dir(&self.dir.space(name))?;
        let creds = keys.own_user_creds(crate::ops::OPERATOR)?;
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
            self.restore_pending(&space).await?;
            self.bootstrap(&space).await?;
            // The machine operator is a person with a DM inbox too: an agent's answer to it
            // waits in its `dm_<id>`.
            for record in identities.active().into_iter().chain(identities.builtins()) {
                space.provision(&record).await?;
            }
            let cluster = self
                .clustered
                .then_some((self.node.as_str(), self.replicas));
            SpaceServices::build(self, &space, &identities, &services)
                .await?
                .start(&services, cluster)
                .await
        };
        let Started { manager, lease } = match started.await {
            Ok(started) => started,
            Err(e) => {
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
        self.spaces
            .lock()
            .await
            .insert(name.to_owned(), Arc::new(served));
        if let Ok(mut state) = self.state.lock()
            && !state.spaces.iter().any(|s| s == name)
        {
            state.spaces.push(name.to_owned());
            state.spaces.sort();
        }
        Ok(info)
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
        if !self.clustered {
            return None;
        }
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

    pub(super) fn space_info(&self, space: &Space) -> Result<SpaceInfo, DaemonError> {
        Ok(SpaceInfo {
            name: space.name().to_owned(),
            account: space.account().to_owned(),
            profile: space.config().profile,
            link: self.link(space.name(), &[])?,
            operator_creds: self.dir.operator_creds(space.name()),
        })
    }

    /// Every served space, as it is now.
    pub(super) async fn served_spaces(&self) -> Vec<Arc<Space>> {
        let spaces = self.spaces.lock().await;
        spaces.values().map(|s| s.space.clone()).collect()
    }

    /// Every served space, no longer served: for the teardown.
    pub(super) async fn take_spaces(&self) -> Vec<Arc<Served>> {
        let spaces = std::mem::take(&mut *self.spaces.lock().await);
        spaces.into_values().collect()
    }

    /// Who holds each served space's lease (a cluster's node only).
    pub(super) async fn leases(&self) -> BTreeMap<String, LeaseView> {
        self.spaces
            .lock()
            .await
            .iter()
            .filter_map(|(name, s)| s.lease.as_ref().map(|l| (name.clone(), l.view())))
            .collect()
    }

    /// The served spaces' and the appliance's services.
    pub(super) async fn services(&self) -> Vec<ServiceStatus> {
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

    pub(super) async fn ready_info(&self, status: &BrokerStatus) -> ReadyInfo {
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
            monitor: status.http_monitor,
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
    pub(super) async fn record_served(&self) -> Result<(), DaemonError> {
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

    pub(super) fn link(&self, space: &str, channels: &[String]) -> Result<String, DaemonError> {
        join_link(&self.link_host, space, channels)
    }

    /// Writes `run/state.json`; the lock is held across the write so that two writers (a
    /// broker restart and a `space add`) cannot land an older snapshot last.
    pub(super) fn write_state(&self) -> Result<(), DaemonError> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.dir.write_state(&state)?;
        Ok(())
    }
}

/// Whether an account is pushed when it says what the last push said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Push {
    /// Only when it changed (an operator's mint or revoke, a space served).
    IfChanged,
    /// Whatever was pushed before: the warden pushes its holds again until the broker has
    /// them (another node of a cluster, or a push the broker ignored, may have left it without).
    Always,
}

/// What a space's account JWT says beyond its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AccountState {
    limits: JetStreamLimits,
    revocations: BTreeMap<String, i64>,
    mappings: BTreeMap<String, String>,
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
        system.request(crate::binding::system::CLAIMS_UPDATE, jwt.into()),
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

/// The host:port a join link names: the first configured hostname when the listener is a
/// wildcard, else the listener itself (the actual port, once bound).
fn link_host(client: SocketAddr, hostnames: &[String]) -> String {
    match hostnames.first() {
        Some(host) if client.ip().is_unspecified() => format!("{host}:{}", client.port()),
        _ => local_addr(client).to_string(),
    }
}
