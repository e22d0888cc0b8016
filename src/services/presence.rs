//! The services' view of a space's presence directory (§6): who is live, under which name.
//! The trusted reader delivers only to members that are live (it stops pulling for one whose
//! heartbeats stop, and resumes when it asks again); the mention router resolves `@names` to
//! live instances with it.
//!
//! Liveness is judged by when a heartbeat was *observed* here, not by the record's `ts`, so a
//! skewed clock on an agent's machine cannot make it look live or dead. A record whose key is
//! not its `card.id` is dropped (§6), like every reader must.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use async_nats::jetstream::kv::Operation;
use tokio::sync::{Notify, watch};

use super::{Context, Health, Service, ServiceError};
use crate::protocol::{EndpointKind, LIVENESS_WINDOW, PresenceStatus, accept_presence_record};
use crate::space::Space;

/// One instance as last heard.
#[derive(Debug, Clone)]
pub struct Heard {
    /// Its card's name, lowercased (mentions are lowercased names, §5).
    pub name: String,
    /// `agent` or `endpoint`.
    pub kind: EndpointKind,
    /// Its declared status.
    pub status: PresenceStatus,
    /// When its last record was observed here.
    pub at: Instant,
}

impl Heard {
    /// Live: heard within the liveness window and not `offline` (§6).
    pub fn is_live(&self) -> bool {
        self.status != PresenceStatus::Offline && self.at.elapsed() <= LIVENESS_WINDOW
    }
}

/// What the presence watch has heard, shared with the other services.
pub struct PresenceView {
    heard: RwLock<HashMap<String, Heard>>,
    changed: Notify,
    /// The bucket's stream sequence the view has applied up to.
    applied: watch::Sender<u64>,
}

impl Default for PresenceView {
    fn default() -> Self {
        PresenceView {
            heard: RwLock::default(),
            changed: Notify::new(),
            applied: watch::channel(0).0,
        }
    }
}

impl PresenceView {
    /// The instance `id`, if heard.
    pub fn get(&self, id: &str) -> Option<Heard> {
        self.read().get(id).cloned()
    }

    /// The live instances whose lowercased name is `name`.
    pub fn live_named(&self, name: &str) -> Vec<String> {
        self.read()
            .iter()
            .filter(|(_, h)| h.name == name && h.is_live())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Resolves when a record was observed (or removed).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Waits until the view holds every presence record stored so far (the bucket's stream
    /// sequence `seq`), at most `timeout`; false when it did not catch up in time. A reader
    /// that must judge presence *now* (the mention router, §4 "at publish time") calls it.
    pub async fn caught_up(&self, seq: u64, timeout: std::time::Duration) -> bool {
        let mut applied = self.applied.subscribe();
        tokio::time::timeout(timeout, applied.wait_for(|a| *a >= seq))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Heard>> {
        self.heard.read().unwrap_or_else(|e| e.into_inner())
    }

    fn apply(&self, id: &str, heard: Option<Heard>, revision: u64) {
        if let Ok(mut map) = self.heard.write() {
            match heard {
                Some(h) => map.insert(id.to_owned(), h),
                None => map.remove(id),
            };
        }
        self.applied.send_if_modified(|a| {
            let newer = revision > *a;
            *a = (*a).max(revision);
            newer
        });
        self.changed.notify_waiters();
    }
}

/// Keeps a [`PresenceView`] current: a watch of the presence bucket, rebound when it ends.
pub struct PresenceWatch {
    space: Arc<Space>,
    view: Arc<PresenceView>,
}

impl PresenceWatch {
    /// A watch of `space`'s presence into `view`.
    pub fn new(space: Arc<Space>, view: Arc<PresenceView>) -> Self {
        PresenceWatch { space, view }
    }
}

impl Service for PresenceWatch {
    fn name(&self) -> &'static str {
        "presence"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let bucket = self.space.names().presence_bucket();
        let kv = self
            .space
            .jetstream()
            .get_key_value(&bucket)
            .await
            .map_err(ServiceError::at("opening the presence bucket"))?;
        // The current record of every key first, then every change.
        let mut watch = kv
            .watch_with_history(">")
            .await
            .map_err(ServiceError::at("watching the presence bucket"))?;
        ctx.report(Health::Running);
        loop {
            let Some(entry) = super::next_read(&ctx, &mut watch, "the presence watch").await?
            else {
                return Ok(());
            };
            if entry.operation != Operation::Put {
                self.view.apply(&entry.key, None, entry.revision);
                continue;
            }
            match accept_presence_record(&entry.key, &entry.value) {
                Ok(p) => self.view.apply(
                    &entry.key,
                    Some(Heard {
                        name: p.card.name.to_lowercase(),
                        kind: p.card.kind,
                        status: p.status,
                        at: Instant::now(),
                    }),
                    entry.revision,
                ),
                Err(e) => {
                    self.view.apply(&entry.key, None, entry.revision);
                    tracing::debug!(key = entry.key, error = %e, "presence record dropped");
                }
            }
        }
    }
}
