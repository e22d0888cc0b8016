//! Phase 6's last step: the services of one served space, built in dependency order and
//! started where they run. Every node runs the presence and registry watches; the others (the
//! backstop reader, the manager, the mention router, the warden, the consumer guard, the
//! membership feed) run on the one node that holds the space's lease in a cluster
//! ([`crate::services::lease`]), and at once on a single node.

use std::sync::Arc;

use super::DaemonError;
use crate::backoff::Backoff;
use crate::services::backstop::Backstop;
use crate::services::consumers::ConsumerGuard;
use crate::services::identity_sync::IdentitySync;
use crate::services::lease::{LeaseKeeper, Starter};
use crate::services::link::LinkWatch;
use crate::services::manager::Manager;
use crate::services::membership::{BrokerView, MembershipFeed};
use crate::services::mentions::Mentions;
use crate::services::presence::{PresenceView, PresenceWatch};
use crate::services::receipts::Receipts;
use crate::services::registry::RegistryWatch;
use crate::services::warden::{AccountPush, Warden};
use crate::services::{ServiceError, ServiceSet};
use crate::space::members::Members;
use crate::space::{Identities, Space};

/// How many times the members registry is read before the leased services give up starting.
const MEMBERS_ATTEMPTS: u32 = 10;

/// What a served space's services are made of; [`SpaceServices::start`] starts them.
#[derive(Clone)]
pub(super) struct SpaceServices {
    space: Arc<Space>,
    identities: Arc<Identities>,
    presence: Arc<PresenceView>,
    members: Arc<Members>,
    backstop: Arc<Backstop>,
    manager: Arc<Manager>,
    view: BrokerView,
    /// The membership feed's view connection, dialed while the broker got ready.
    view_dialed: Arc<std::sync::Mutex<Option<async_nats::Client>>>,
}

/// A space's services once started: the manager the operator's requests reach, and in a
/// cluster the lease that decides where the leased ones run.
pub(super) struct Started {
    pub(super) manager: Arc<Manager>,
    pub(super) lease: Option<Arc<LeaseKeeper>>,
}

impl SpaceServices {
    /// Opens what the services share (the members registry, the roster the presence watch
    /// keeps) and makes them; the connection watch and the presence watch are started in `set`
    /// at once, since the reader and the router need the roster.
    pub(super) async fn build(
        space: &Arc<Space>,
        identities: &Arc<Identities>,
        set: &ServiceSet,
        view: BrokerView,
        view_dialed: Option<async_nats::Client>,
    ) -> Result<SpaceServices, DaemonError> {
        let name = space.name();
        let presence = Arc::new(PresenceView::default());
        // The members registry is read while the three watches start: none needs another.
        let link_watch = set.start(Arc::new(LinkWatch::new(space.clone())));
        let presence_watch = set.start(Arc::new(PresenceWatch::new(
            space.clone(),
            presence.clone(),
        )));
        let registry_watch = set.start(Arc::new(RegistryWatch::new(space.clone())));
        let (members, link_watch, presence_watch, registry_watch) = tokio::join!(
            Members::open(space),
            link_watch,
            presence_watch,
            registry_watch
        );
        link_watch
            .and(presence_watch)
            .and(registry_watch)
            .map_err(|e| service_error(name, e))?;
        let members = Arc::new(members.map_err(|e| service_error(name, e))?);
        let backstop = Arc::new(Backstop::new(
            space.clone(),
            identities.clone(),
            members.clone(),
            presence.clone(),
        ));
        let receipts = Arc::new(Receipts::new(
            space.clone(),
            identities.clone(),
            members.clone(),
            presence.clone(),
            view.clone(),
        ));
        let manager = Arc::new(Manager::new(
            space.clone(),
            identities.clone(),
            members.clone(),
            backstop.clone(),
            receipts,
        ));
        Ok(SpaceServices {
            space: space.clone(),
            identities: identities.clone(),
            presence,
            members,
            backstop,
            manager,
            view,
            view_dialed: Arc::new(std::sync::Mutex::new(view_dialed)),
        })
    }

    /// Starts them in `set`: at once on a single node; in a cluster, the identity sync and
    /// the lease keeper, which starts the others while this node holds the lease. A clustered
    /// start that fails is not fatal (the bucket may be created by another node this very
    /// moment): the set retries it with backoff, and `status` shows it. The warden pushes the
    /// space's account again for its holds through `account`.
    pub(super) async fn start(
        self,
        set: &ServiceSet,
        account: Arc<dyn AccountPush>,
        cluster: Option<(&str, usize)>,
    ) -> Result<Started, DaemonError> {
        let manager = self.manager.clone();
        let name = self.space.name().to_owned();
        let Some((node, replicas)) = cluster else {
            self.start_leased(set, account)
                .await
                .map_err(|e| service_error(&name, e))?;
            return Ok(Started {
                manager,
                lease: None,
            });
        };
        let sync = IdentitySync::new(self.space.clone(), self.identities.clone(), replicas);
        if let Err(e) = set.start(Arc::new(sync)).await {
            tracing::warn!(space = name, error = %crate::ops::error_text(&e),
                "identity sync not running yet; retrying");
        }
        let space = self.space.clone();
        let starter: Starter = Arc::new(move |leased: Arc<ServiceSet>| {
            let parts = self.clone();
            let account = account.clone();
            Box::pin(async move {
                // The registry may have changed under another node's lease.
                parts.reload_members().await?;
                parts.start_leased(&leased, account).await
            })
        });
        let keeper = Arc::new(LeaseKeeper::new(space, node.to_owned(), replicas, starter));
        if let Err(e) = set.start(keeper.clone()).await {
            tracing::warn!(space = name, error = %crate::ops::error_text(&e),
                "lease keeper not running yet; retrying");
        }
        Ok(Started {
            manager,
            lease: Some(keeper),
        })
    }

    /// Reads the members registry again, for a node taking the space's lease over. Retried:
    /// a takeover often coincides with the registry's stream electing a leader.
    async fn reload_members(&self) -> Result<(), ServiceError> {
        let mut backoff = Backoff::default();
        let mut attempts = 0;
        while let Err(e) = self.members.reload().await {
            attempts += 1;
            if attempts >= MEMBERS_ATTEMPTS {
                return Err(ServiceError::new("reading the members registry", e));
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
        Ok(())
    }

    /// Starts the leased services in `set`, all at once but the manager, which starts once the
    /// reader it needs runs (one after the other, each waiting for its consumers and its
    /// round trips to the broker, they took most of a start's time). Each is started even
    /// when another fails to (it keeps being retried by the set): a warden waiting for a
    /// stream leader must not keep the manager from serving. The first failure is returned,
    /// the reader's and the manager's first. On a single node they start right after the
    /// registry was read ([`SpaceServices::build`]), which nothing wrote since.
    async fn start_leased(
        self,
        set: &ServiceSet,
        account: Arc<dyn AccountPush>,
    ) -> Result<(), ServiceError> {
        let (space, identities) = (&self.space, &self.identities);
        let mentions = Mentions::new(
            space.clone(),
            identities.clone(),
            self.presence.clone(),
            self.backstop.clone(),
        );
        let warden = Warden::new(space.clone(), identities.clone(), account);
        let guard = ConsumerGuard::new(space.clone(), identities.clone());
        let dialed = self.view_dialed.lock().ok().and_then(|mut d| d.take());
        let feed = MembershipFeed::new(
            space.clone(),
            self.members.clone(),
            self.view.clone(),
            dialed,
        );
        let reader_then_manager = async {
            let reader = set.start(self.backstop.clone()).await;
            (reader, set.start(self.manager.clone()).await)
        };
        // Each is listed (in `status`) when it is first polled: in this order, whatever the
        // timing, the reader and the manager last.
        let (mentions, warden, guard, feed, (reader, manager)) = tokio::join!(
            set.start(Arc::new(mentions)),
            set.start(Arc::new(warden)),
            set.start(Arc::new(guard)),
            set.start(Arc::new(feed)),
            reader_then_manager,
        );
        [reader, manager, mentions, warden, guard, feed]
            .into_iter()
            .collect()
    }
}

/// A service of `space` that could not start.
pub(super) fn service_error(
    space: &str,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> DaemonError {
    let source = e.into();
    DaemonError::Service {
        space: space.to_owned(),
        source: match source.downcast::<ServiceError>() {
            Ok(e) => *e,
            Err(other) => ServiceError::new("starting the space's services", other),
        },
    }
}
