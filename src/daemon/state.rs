//! The runtime state `cotald status` reads (`run/state.json`), kept in step with the appliance:
//! written once serving, again whenever the broker is restarted (its pid changes) and whenever
//! a service's health changes. A clustered node also records who holds each space's lease (at
//! the same pace) and, every [`CLUSTER_POLL`], the cluster's nodes (the broker's `JSZ`) and each
//! stream's leader.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;

use super::served::ServedSpaces;
use crate::binding::streams;
use crate::datadir::{
    ClusterNode, ClusterState, DataDir, DataDirError, RuntimeState, StreamLeader,
};
use crate::services::{Context, Health, Service, ServiceError, ServiceSet, ServiceStatus};
use crate::supervisor::BrokerStatus;
use crate::supervisor::monitor::Monitor;

/// How often service health is compared with what the file says.
const HEALTH_POLL: Duration = Duration::from_millis(500);
/// How often a clustered node reads its cluster's nodes and stream leaders.
const CLUSTER_POLL: Duration = Duration::from_secs(5);

/// `run/state.json` as the appliance says it now, and its one writer.
pub(super) struct StateFile {
    dir: DataDir,
    /// Held across a write, so that two writers (a broker restart and a `space add`) cannot
    /// land an older snapshot last.
    state: Mutex<RuntimeState>,
}

impl StateFile {
    /// What the appliance starts saying, written by the first [`StateFile::write`].
    pub(super) fn new(dir: DataDir, state: RuntimeState) -> Self {
        StateFile {
            dir,
            state: Mutex::new(state),
        }
    }

    /// Changes what it says; written by the next [`StateFile::write`].
    pub(super) fn update(&self, change: impl FnOnce(&mut RuntimeState)) {
        change(&mut self.lock());
    }

    /// A part of what it says.
    pub(super) fn read<T>(&self, part: impl FnOnce(&RuntimeState) -> T) -> T {
        part(&self.lock())
    }

    /// Writes `run/state.json`.
    pub(super) fn write(&self) -> Result<(), DataDirError> {
        let state = self.lock();
        self.dir.write_state(&state)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RuntimeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Keeps `run/state.json` current, from what it is handed.
pub(super) struct StateTracker {
    pub(super) file: Arc<StateFile>,
    pub(super) spaces: Arc<ServedSpaces>,
    pub(super) monitor: Monitor,
    /// This node's server name, in a cluster.
    pub(super) node: Option<String>,
    /// The appliance's own services (this one among them, hence not kept alive by it).
    pub(super) own: Weak<ServiceSet>,
    pub(super) broker: watch::Receiver<BrokerStatus>,
}

impl StateTracker {
    /// Every service's health: the appliance's own, then each space's. The tracker is running
    /// whenever it writes, its first write included (which its set would still call starting).
    async fn services(&self) -> Vec<ServiceStatus> {
        let own = self
            .own
            .upgrade()
            .map(|set| set.status())
            .unwrap_or_default();
        let own = own.into_iter().map(|mut service| {
            if service.name == self.name() {
                service.health = Health::Running;
            }
            service
        });
        own.chain(self.spaces.services().await).collect()
    }

    /// Writes the runtime state as it is now.
    async fn write(&self) -> Result<(), ServiceError> {
        let services = self.services().await;
        let leases = self.spaces.leases().await;
        let now = self.broker.borrow().clone();
        self.file.update(|state| {
            state.broker_pid = now.pid;
            state.broker_restarts = now.restarts;
            state.broker_last_restart = now.last_restart;
            state.services = services;
            state.leases = leases;
        });
        self.file
            .write()
            .map_err(ServiceError::at("writing the runtime state"))
    }
}

impl StateTracker {
    /// The cluster as this node sees it: the meta group from the broker's `JSZ`, each served
    /// stream's leader from its info. What cannot be read is left out (a node without quorum
    /// still reports itself).
    async fn cluster(&self, node: &str) -> ClusterState {
        let mut seen = ClusterState {
            node: node.to_owned(),
            ..Default::default()
        };
        if let Ok(jsz) = self.monitor.jsz(false, Duration::from_secs(1)).await {
            let meta = &jsz["meta_cluster"];
            seen.meta_leader = meta["leader"].as_str().unwrap_or_default().to_owned();
            seen.nodes.push(ClusterNode {
                name: node.to_owned(),
                current: true,
            });
            for peer in meta["replicas"].as_array().into_iter().flatten() {
                seen.nodes.push(ClusterNode {
                    name: peer["name"].as_str().unwrap_or_default().to_owned(),
                    current: peer["current"].as_bool().unwrap_or(false),
                });
            }
            seen.nodes.sort_by(|a, b| a.name.cmp(&b.name));
        }
        for space in self.spaces.spaces().await {
            let names = streams::all(space.names(), &space.config().retention());
            for config in names {
                let info = async {
                    let stream = space.jetstream().get_stream_no_info(&config.name).await;
                    stream.ok()?.get_info().await.ok().map(|i| i.cluster)
                };
                let Ok(Some(cluster)) = tokio::time::timeout(Duration::from_secs(1), info).await
                else {
                    continue;
                };
                let cluster = cluster.unwrap_or_default();
                seen.streams.push(StreamLeader {
                    stream: config.name.clone(),
                    leader: cluster.leader.unwrap_or_default(),
                    followers: cluster
                        .replicas
                        .iter()
                        .map(|p| ClusterNode {
                            name: p.name.clone(),
                            current: p.current,
                        })
                        .collect(),
                });
            }
        }
        seen
    }
}

impl Service for StateTracker {
    fn name(&self) -> &'static str {
        "state"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let mut broker = self.broker.clone();
        // Written before it says it runs: the set's start returns once the file is there.
        self.write().await?;
        ctx.report(Health::Running);
        let mut written = (self.services().await, self.spaces.leases().await);
        let mut poll = tokio::time::interval(HEALTH_POLL);
        let mut cluster_poll = tokio::time::interval(CLUSTER_POLL);
        loop {
            tokio::select! {
                _ = cluster_poll.tick(), if self.node.is_some() => {
                    if let Some(node) = &self.node {
                        let seen = self.cluster(node).await;
                        self.file.update(|state| state.cluster = Some(seen));
                    }
                    self.write().await?;
                }
                () = ctx.cancelled() => return Ok(()),
                changed = broker.changed() => {
                    if changed.is_err() {
                        return Err(ServiceError::msg("the broker supervisor is gone"));
                    }
                    broker.borrow_and_update();
                    self.write().await?;
                }
                _ = poll.tick() => {
                    let now = (self.services().await, self.spaces.leases().await);
                    if now != written {
                        self.write().await?;
                        written = now;
                    }
                }
            }
        }
    }
}
