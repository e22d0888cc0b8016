//! The runtime state `cotald status` reads (`run/state.json`), kept in step with the appliance:
//! written once serving, again whenever the broker is restarted (its pid changes) and whenever
//! a service's health changes.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::Core;
use crate::services::{Context, Health, Service, ServiceError};
use crate::supervisor::BrokerStatus;

/// How often service health is compared with what the file says.
const HEALTH_POLL: Duration = Duration::from_millis(500);

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
        let now = self.broker.borrow().clone();
        if let Ok(mut state) = self.core.state.lock() {
            state.broker_pid = now.pid;
            state.broker_restarts = now.restarts;
            state.broker_last_restart = now.last_restart;
            state.services = services;
        }
        self.core
            .write_state()
            .map_err(ServiceError::at("writing the runtime state"))
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
        let mut written = self.core.services().await;
        let mut poll = tokio::time::interval(HEALTH_POLL);
        loop {
            tokio::select! {
                () = ctx.cancelled() => return Ok(()),
                changed = broker.changed() => {
                    if changed.is_err() {
                        return Err(ServiceError::msg("the broker supervisor is gone"));
                    }
                    broker.borrow_and_update();
                    self.write().await?;
                }
                _ = poll.tick() => {
                    let now = self.core.services().await;
                    if now != written {
                        self.write().await?;
                        written = now;
                    }
                }
            }
        }
    }
}
