//! The connection watch: whether the space's services can reach the broker at all.
//!
//! Every service of a space shares the provisioner's connection ([`Space::nats`]). The NATS
//! library reconnects it on its own after a drop; while it is down nothing is delivered, so
//! the watch reports [`Health::Degraded`] (and `cotald status` says so) from the moment the
//! library says it is down until it is up again. A connection whose task ended for good
//! answers nothing ever again, while every service restarted on it would fail the same way:
//! the watch finds it (a flush that cannot even be queued), dials a new one in its place, and
//! each service, whose subscriptions ended with the old one, is restarted by its set on the
//! new one.

use std::sync::Arc;
use std::time::Duration;

use super::{Context, Health, Service, ServiceError};
use crate::space::Space;

/// How often the connection is probed.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long a probe may take.
const PROBE_WITHIN: Duration = Duration::from_secs(2);

/// Watches one space's connection.
pub struct LinkWatch {
    space: Arc<Space>,
}

impl LinkWatch {
    /// The watch of `space`'s connection.
    pub fn new(space: Arc<Space>) -> Self {
        LinkWatch { space }
    }

    /// One look at the connection; redials one that closed for good.
    async fn probe(&self) -> Health {
        if let Some(since) = self.space.link_state().borrow().down_since {
            return Health::Degraded(format!(
                "disconnected from the broker for {} s; reconnecting",
                since.elapsed().as_secs()
            ));
        }
        match tokio::time::timeout(PROBE_WITHIN, self.space.nats().flush()).await {
            Ok(Ok(())) => Health::Running,
            Err(_) => Health::Degraded(format!(
                "the connection did not flush within {PROBE_WITHIN:?}"
            )),
            Ok(Err(e)) => {
                tracing::warn!(space = self.space.name(), error = %e,
                    "the connection to the broker is closed; dialing again");
                match self.space.redial().await {
                    Ok(()) => {
                        tracing::info!(space = self.space.name(), "connected again");
                        Health::Degraded("the connection was closed; dialed again".into())
                    }
                    Err(e) => Health::Degraded(format!(
                        "the connection is closed and dialing again failed: {}",
                        crate::ops::error_text(&e)
                    )),
                }
            }
        }
    }
}

impl Service for LinkWatch {
    fn name(&self) -> &'static str {
        "connection"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let mut state = self.space.link_state();
        let mut tick = tokio::time::interval(PROBE_EVERY);
        loop {
            ctx.report(self.probe().await);
            fault::close_once(&self.space).await;
            tokio::select! {
                () = ctx.cancelled() => return Ok(()),
                _ = tick.tick() => {}
                changed = state.changed() => if changed.is_err() { return Ok(()) },
            }
        }
    }
}

/// Fault injection for the integration tests, in debug builds only:
/// `COTALD_FAULT_CLOSE=<space>` closes that space's connection for good once, a few seconds
/// after it is first up, as a connection whose task ended would be (an async-nats before 0.52
/// panicked on a malformed frame), so that a test sees it dialed again and every service
/// serving again.
mod fault {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use crate::space::Space;

    static DONE: AtomicBool = AtomicBool::new(false);

    pub(super) async fn close_once(space: &Space) {
        let asked = cfg!(debug_assertions)
            && std::env::var("COTALD_FAULT_CLOSE").is_ok_and(|wanted| wanted == space.name());
        if asked && !DONE.swap(true, Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(3)).await;
            tracing::warn!(
                space = space.name(),
                "fault injected: closing the connection"
            );
            let _ = space.nats().drain().await;
        }
    }
}
