//! The runtime state `cotald status` reads (`run/state.json`), kept in step with the appliance:
//! written once serving, again whenever the broker is restarted (its pid changes) and whenever
//! a service's health changes. A clustered node also records who holds each space's lease (at
//! the same pace) and, every [`CLUSTER_POLL`], the cluster's nodes (the broker's `JSZ`) and each
//! stream's leader.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::Core;
use crate::binding::streams;
use crate::datadir::{ClusterNode, ClusterState, StreamLeader};
use crate::services::{Context, Health, Service, ServiceError};
use crate::supervisor::BrokerStatus;

/// How often service health is compared with what the file says.
const HEALTH_POLL: Duration = Duration::from_millis(500);
/// How often a clustered node reads its cluster's nodes and stream leaders.
const CLUSTER_POLL: Duration = Duration::from_secs(5);

/// Keeps `run/state.json` current.
pub(super) struct StateTracker {
    core: Arc<Core>,
    broker: watch::Receiver<BrokerStatus>,
}

impl StateTracker {
    pub(super) fn new(core: Arc<Core>, broker: watch::Receiver<BrokerStatus>) -> Self {
        StateTracker { core, broker }
    }

    async fn write(&self) -> Result<(), ServiceError> {
        let services = self.core.services().await;
        let leases = self.core.leases().await;
        let now = self.broker.borrow().clone();
        if let Ok(mut state) = self.core.state.lock() {
            state.broker_pid = now.pid;
            state.broker_restarts = now.restarts;
            state.broker_last_restart = now.last_restart;
            state.services = services;
            state.leases = leases;
        }
        self.core
            .write_state()
            .map_err(ServiceError::at("writing the runtime state"))
    }
}

impl StateTracker {
    /// The cluster as this node sees it: the meta group from the broker's `JSZ`, each served
    /// stream's leader from its info. What cannot be read is left out (a node without quorum
    /// still reports itself).
    async fn cluster(&self) -> ClusterState {
        let mut seen = ClusterState {
            node: self.core.node.clone(),
            ..Default::default()
        };
        if let Ok(jsz) = self.core.monitor.jsz(false, Duration::from_secs(1)).await {
            let meta = &jsz["meta_cluster"];
            seen.meta_leader = meta["leader"].as_str().unwrap_or_default().to_owned();
            seen.nodes.push(ClusterNode {
                name: self.core.node.clone(),
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
        for space in self.core.served_spaces().await {
            let names = streams::all(space.names(), &space.config().retention());
            for config in names {
                let info = async {
                    let mut stream = space.jetstream().get_stream(&config.name).await.ok()?;
                    stream.info().await.ok().map(|i| i.cluster.clone())
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
        self.write().await?;
        ctx.report(Health::Running);
        let mut written = (self.core.services().await, self.core.leases().await);
        let mut poll = tokio::time::interval(HEALTH_POLL);
        let mut cluster_poll = tokio::time::interval(CLUSTER_POLL);
        loop {
            tokio::select! {
                _ = cluster_poll.tick(), if self.core.clustered => {
                    let seen = self.cluster().await;
                    if let Ok(mut state) = self.core.state.lock() {
                        state.cluster = Some(seen);
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
                    let now = (self.core.services().await, self.core.leases().await);
                    if now != written {
                        self.write().await?;
                        written = now;
                    }
                }
            }
        }
    }
}
