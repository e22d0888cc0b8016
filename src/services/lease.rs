//! The per-space lease of a cluster of appliances: which node's manager, trusted reader, mention
//! router, membership feed and warden serve a space. Two of them at once would deliver every
//! durable copy twice and race on the members registry, so exactly one node holds each space.
//!
//! The lease is one key (`holder`) in the space's `cotald_lease_<space>` bucket, replicated like
//! the space's streams, whose `max_age` is the lease's TTL ([`LEASE_TTL`]):
//!
//! - a node without the lease tries to **create** the key every [`LEASE_RENEW`]; creation
//!   succeeds only when the key is absent, i.e. nobody holds it or the holder's last renewal
//!   expired;
//! - the holder **renews** it every [`LEASE_RENEW`] with an update that names the revision it
//!   wrote last (revision fencing): if anyone else wrote the key meanwhile, the update fails and
//!   the holder stops its services at once;
//! - a holder that cannot renew (no quorum, no broker) stops its services once its last renewal
//!   is [`LEASE_TTL`] minus one renewal old, before the key can expire and another node take
//!   over, so two holders never serve at once as long as clocks run at the same rate;
//! - a holder that stops cleanly deletes the key (with its revision), so another node takes
//!   over at its next attempt instead of after the TTL.
//!
//! A node that dies holds the lease for at most [`LEASE_TTL`]; another takes it within one more
//! [`LEASE_RENEW`] and starts the services, which resume from what the stream holds: the
//! trusted reader's per-member consumers and the members registry are replicated JetStream
//! state, so durable delivery continues where it was acknowledged (at least once: what the
//! dead holder had handed out but not seen acknowledged is delivered again, §4).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv::{self, CreateErrorKind, UpdateErrorKind};
use bytes::Bytes;
use tokio::time::Instant;

pub use crate::ops::status::LeaseView;

use super::{Context, Health, Service, ServiceError, ServiceSet, ServiceStatus};
use crate::space::Space;

/// How long a lease lives without renewal.
pub const LEASE_TTL: Duration = Duration::from_secs(4);
/// How often the holder renews and the others try to take it.
pub const LEASE_RENEW: Duration = Duration::from_millis(1000);
/// The key of the lease.
const KEY: &str = "holder";

/// The start of the leased services, under way.
pub type Starting = Pin<Box<dyn Future<Output = Result<(), ServiceError>> + Send>>;

/// Starts the leased services into the given set (they stop with it).
pub type Starter = Arc<dyn Fn(Arc<ServiceSet>) -> Starting + Send + Sync>;

/// The lease's bucket of a space.
pub fn bucket_name(space: &str) -> String {
    format!("cotald_lease_{space}")
}

/// Contends for a space's lease and runs the leased services while it holds it.
pub struct LeaseKeeper {
    space: Arc<Space>,
    node: String,
    replicas: usize,
    starter: Starter,
    leased: Mutex<Option<Arc<ServiceSet>>>,
    view: Mutex<LeaseView>,
}

impl LeaseKeeper {
    /// The keeper of `space` on the node named `node`.
    pub fn new(space: Arc<Space>, node: String, replicas: usize, starter: Starter) -> Self {
        LeaseKeeper {
            space,
            node,
            replicas,
            starter,
            leased: Mutex::new(None),
            view: Mutex::new(LeaseView::default()),
        }
    }

    /// The leased services' status (none while another node holds the lease).
    pub fn status(&self) -> Vec<ServiceStatus> {
        self.leased
            .lock()
            .ok()
            .and_then(|l| l.as_ref().map(|s| s.status()))
            .unwrap_or_default()
    }

    /// Who holds the lease.
    pub fn view(&self) -> LeaseView {
        self.view.lock().map(|v| v.clone()).unwrap_or_default()
    }

    fn set_view(&self, holder: Option<String>) {
        if let Ok(mut v) = self.view.lock() {
            v.mine = holder.as_deref() == Some(self.node.as_str());
            v.holder = holder;
        }
    }

    async fn bucket(&self) -> Result<kv::Store, ServiceError> {
        super::identity_sync::ensure_bucket(
            &self.space.jetstream(),
            kv::Config {
                bucket: bucket_name(self.space.name()),
                history: 1,
                max_age: LEASE_TTL,
                num_replicas: self.replicas.max(1),
                storage: async_nats::jetstream::stream::StorageType::File,
                ..Default::default()
            },
        )
        .await
    }

    /// Starts the leased services in a fresh set under `ctx`.
    fn take(&self, ctx: &Context) -> Arc<ServiceSet> {
        let set = Arc::new(ServiceSet::new(self.space.name(), ctx.token()));
        if let Ok(mut l) = self.leased.lock() {
            *l = Some(set.clone());
        }
        set
    }

    /// Stops the leased services, if running.
    async fn stand_down(&self) {
        let set = self.leased.lock().ok().and_then(|mut l| l.take());
        if let Some(set) = set {
            set.shutdown(Duration::from_secs(5)).await;
        }
    }
}

impl Service for LeaseKeeper {
    fn name(&self) -> &'static str {
        "lease"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let kv = self.bucket().await?;
        let space = self.space.name().to_owned();
        let me = Bytes::from(self.node.clone());
        // The revision this node wrote last, and when, while it holds the lease.
        let mut held: Option<(u64, Instant)> = None;
        let mut starting: Option<Starting> = None;
        let mut tick = tokio::time::interval(LEASE_RENEW);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let outcome = loop {
            tokio::select! {
                () = ctx.cancelled() => break Ok(()),
                started = async { starting.as_mut().expect("guarded").await }, if starting.is_some() => {
                    starting = None;
                    match started {
                        Ok(()) => tracing::info!(space, node = self.node, "leased services running"),
                        Err(e) => tracing::error!(space, error = %crate::ops::error_text(&e), "a leased service did not start (it is retried)"),
                    }
                }
                _ = tick.tick() => {
                    match held {
                        Some((rev, at)) => match kv.update(KEY, me.clone(), rev).await {
                            Ok(next) => held = Some((next, Instant::now())),
                            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => {
                                tracing::warn!(space, node = self.node, "lease taken by another node; standing down");
                                starting = None;
                                held = None;
                                self.stand_down().await;
                                self.set_view(None);
                            }
                            Err(e) => {
                                if at.elapsed() + LEASE_RENEW >= LEASE_TTL {
                                    tracing::warn!(space, node = self.node, error = %e, "cannot renew the lease; standing down before it expires");
                                    starting = None;
                                    held = None;
                                    self.stand_down().await;
                                    self.set_view(None);
                                } else {
                                    tracing::debug!(space, error = %e, "lease renewal failed; retrying");
                                }
                            }
                        },
                        None => match kv.create(KEY, me.clone()).await {
                            Ok(rev) => {
                                tracing::info!(space, node = self.node, "lease taken: this node serves the space");
                                held = Some((rev, Instant::now()));
                                self.set_view(Some(self.node.clone()));
                                let set = self.take(&ctx);
                                starting = Some((self.starter)(set));
                            }
                            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
                                if let Ok(holder) = kv.get(KEY).await {
                                    self.set_view(holder.map(|h| String::from_utf8_lossy(&h).into_owned()));
                                }
                            }
                            Err(e) => tracing::debug!(space, error = %e, "lease attempt failed; retrying"),
                        },
                    }
                    ctx.report(Health::Running);
                }
            }
        };
        starting = None;
        drop(starting);
        self.stand_down().await;
        if let Some((rev, _)) = held {
            // Hand over at once rather than after the TTL.
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                kv.delete_expect_revision(KEY, Some(rev)),
            )
            .await;
        }
        self.set_view(None);
        outcome
    }
}
