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
    /// Connections of the services dialed while the broker got ready, each taken by the first
    /// run of its service.
    dialed: Arc<std::sync::Mutex<ServiceConnections>>,
}

/// Connections of a space's services dialed before the space is served (startup time), those
/// that could be made; a service whose connection is not here dials it itself.
#[derive(Default)]
pub(super) struct ServiceConnections {
    /// The membership feed's view of the space's connections.
    pub(super) view: Option<async_nats::Client>,
    /// The warden's own connection.
    pub(super) tap: Option<async_nats::Client>,
}

/// A space's services once started: the manager the operator's requests reach, and in a
/// cluster the lease that decides where the leased ones run.
pub(super) struct Started {
    pub(super) manager: Arc<Manager>,
    pub(super) lease: Option<Arc<LeaseKeeper>>,
}

/// The services every node runs, started at once ([`SpaceServices::watch`]): running once the
/// connection watch, the presence watch and the registry watch are; the reader and the router
/// need the roster the presence watch keeps.
pub(super) type Watches = tokio::sync::oneshot::Receiver<Result<(), ServiceError>>;

impl SpaceServices {
    /// Starts the connection watch, the presence watch and the registry watch of `space` in
    /// `set`. The returned future runs them until they report running and tells `watched`
    /// then; it is polled beside the rest of the start.
    pub(super) fn watch(
        space: &Arc<Space>,
        presence: Arc<PresenceView>,
        set: &ServiceSet,
    ) -> (impl Future<Output = ()>, Watches) {
        let (tell, watched) = tokio::sync::oneshot::channel();
        let link_watch = set.start(Arc::new(LinkWatch::new(space.clone())));
        let presence_watch = set.start(Arc::new(PresenceWatch::new(space.clone(), presence)));
        let registry_watch = set.start(Arc::new(RegistryWatch::new(space.clone())));
        let watching = async move {
            let (link, presence, registry) =
                tokio::join!(link_watch, presence_watch, registry_watch);
            let _ = tell.send(link.and(presence).and(registry));
        };
        (watching, watched)
    }

    /// Opens what the services share (the members registry; the roster is `presence`, kept
    /// by the presence watch [`SpaceServices::watch`] starts) and makes them; starts none.
    pub(super) async fn open(
        space: &Arc<Space>,
        identities: &Arc<Identities>,
        presence: Arc<PresenceView>,
        view: BrokerView,
        dialed: ServiceConnections,
    ) -> Result<SpaceServices, DaemonError> {
        let members = Members::open(space)
            .await
            .map_err(|e| service_error(space.name(), e))?;
        let members = Arc::new(members);
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
            dialed: Arc::new(std::sync::Mutex::new(dialed)),
        })
    }

    /// Starts them in `set`: at once on a single node; in a cluster, once the watches run,
    /// the identity sync and the lease keeper, which starts the others while this node holds
    /// the lease. A clustered start that fails is not fatal (the bucket may be created by
    /// another node this very moment): the set retries it with backoff, and `status` shows it.
    /// The warden pushes the space's account again for its holds through `account`.
    pub(super) async fn start(
        self,
        set: &ServiceSet,
        account: Arc<dyn AccountPush>,
        cluster: Option<(&str, usize)>,
        watched: Watches,
    ) -> Result<Started, DaemonError> {
        let manager = self.manager.clone();
        let name = self.space.name().to_owned();
        let Some((node, replicas)) = cluster else {
            self.start_leased(set, account, Some(watched))
                .await
                .map_err(|e| service_error(&name, e))?;
            return Ok(Started {
                manager,
                lease: None,
            });
        };
        running(watched)
            .await
            .map_err(|e| service_error(&name, e))?;
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
                parts.start_leased(&leased, account, None).await
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

    /// Starts the leased services in `set`, all at once but the router, the reader and the
    /// manager: the router and the reader once the watches run (`watched`, when they are still
    /// starting: a single node's start), the manager once the reader it needs runs (one after
    /// the other, each waiting for its consumers and its round trips to the broker, they took
    /// most of a start's time). Each is started even when another fails to (it keeps being
    /// retried by the set): a warden waiting for a stream leader must not keep the manager
    /// from serving. The first failure is returned, the watches', the reader's and the
    /// manager's first. On a single node they start right after the registry was read
    /// ([`SpaceServices::open`]), which nothing wrote since.
    async fn start_leased(
        self,
        set: &ServiceSet,
        account: Arc<dyn AccountPush>,
        watched: Option<Watches>,
    ) -> Result<(), ServiceError> {
        let (space, identities) = (&self.space, &self.identities);
        let mentions = Mentions::new(
            space.clone(),
            identities.clone(),
            self.presence.clone(),
            self.backstop.clone(),
        );
        let (view, tap) = self
            .dialed
            .lock()
            .map(|mut d| (d.view.take(), d.tap.take()))
            .unwrap_or_default();
        let warden = Warden::new(space.clone(), identities.clone(), account, tap);
        let guard = ConsumerGuard::new(space.clone(), identities.clone());
        let feed =
            MembershipFeed::new(space.clone(), self.members.clone(), self.view.clone(), view);
        let after_roster = async {
            if let Some(watched) = watched {
                running(watched).await?;
            }
            let reader_then_manager = async {
                let reader = set.start(self.backstop.clone()).await;
                (reader, set.start(self.manager.clone()).await)
            };
            let (mentions, (reader, manager)) =
                tokio::join!(set.start(Arc::new(mentions)), reader_then_manager);
            Ok::<_, ServiceError>([reader, manager, mentions])
        };
        // Each is listed (in `status`) when it is first polled: in this order, whatever the
        // timing, the router, the reader and the manager last.
        let (warden, guard, feed, after_roster) = tokio::join!(
            set.start(Arc::new(warden)),
            set.start(Arc::new(guard)),
            set.start(Arc::new(feed)),
            after_roster,
        );
        after_roster?
            .into_iter()
            .chain([warden, guard, feed])
            .collect()
    }
}

/// What the watches said once they ran, or failed to.
async fn running(watched: Watches) -> Result<(), ServiceError> {
    watched
        .await
        .unwrap_or_else(|_| Err(ServiceError::msg("the watches were not started")))
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
