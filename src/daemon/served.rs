//! The spaces the appliance serves, and the JetStream storage each one holds of the disk's
//! budget ([`budget`]): what phase 6 adds to, `space add` adds to while running, the operations
//! and the runtime state read, and the teardown empties.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::budget::{Budget, BudgetFull};
use crate::services::lease::{LeaseKeeper, LeaseView};
use crate::services::manager::Manager;
use crate::services::{ServiceSet, ServiceStatus};
use crate::space::{Identities, Space};

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

/// The served spaces by name, and the storage budget they share.
pub(super) struct ServedSpaces {
    /// Never held across a broker round trip: lookups clone what they return.
    spaces: tokio::sync::Mutex<BTreeMap<String, Arc<Served>>>,
    budget: std::sync::Mutex<Budget>,
}

impl ServedSpaces {
    /// None yet, sharing a budget of `limit` bytes.
    pub(super) fn new(limit: i64) -> Self {
        ServedSpaces {
            spaces: tokio::sync::Mutex::new(BTreeMap::new()),
            budget: std::sync::Mutex::new(Budget::new(limit)),
        }
    }

    /// Grants `space` its storage before it is served: `wanted`, or what is left if less.
    pub(super) fn grant(&self, space: &str, wanted: i64) -> Result<i64, BudgetFull> {
        self.budget().grant(space, wanted)
    }

    /// Gives back what `space` was granted (it could not be served).
    pub(super) fn release(&self, space: &str) {
        self.budget().release(space);
    }

    fn budget(&self) -> std::sync::MutexGuard<'_, Budget> {
        self.budget.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves `served` under `name`.
    pub(super) async fn insert(&self, name: &str, served: Served) {
        self.spaces
            .lock()
            .await
            .insert(name.to_owned(), Arc::new(served));
    }

    /// A served space, by name.
    pub(super) async fn get(&self, name: &str) -> Option<Arc<Served>> {
        self.spaces.lock().await.get(name).cloned()
    }

    /// Whether a space of this name, in any case, is served.
    pub(super) async fn holds_name(&self, name: &str) -> bool {
        self.spaces
            .lock()
            .await
            .keys()
            .any(|s| s.eq_ignore_ascii_case(name))
    }

    /// Every served space by name, as it is now.
    pub(super) async fn all(&self) -> Vec<(String, Arc<Served>)> {
        self.spaces
            .lock()
            .await
            .iter()
            .map(|(name, served)| (name.clone(), served.clone()))
            .collect()
    }

    /// Every served space's connection, as it is now.
    pub(super) async fn spaces(&self) -> Vec<Arc<Space>> {
        let spaces = self.spaces.lock().await;
        spaces.values().map(|s| s.space.clone()).collect()
    }

    /// How many are served.
    pub(super) async fn len(&self) -> usize {
        self.spaces.lock().await.len()
    }

    /// Every served space, no longer served: for the teardown.
    pub(super) async fn take(&self) -> Vec<Arc<Served>> {
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

    /// The served spaces' services, the leased ones included.
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
}
