//! Starting the web dashboard ([`crate::dashboard`]) as a service of the appliance: its token,
//! its listener, and an observer identity per space, handed to it as each space is served
//! (its streams made; the observer connects at the first request that shows it). The dashboard
//! is not part of the coordination path: when it cannot be served (a taken port), the
//! appliance serves without it and says why.

use std::net::SocketAddr;
use std::sync::Arc;

use super::{Core, DaemonError, join_link};
use crate::binding::{CredsError, SpaceNames, acl};
use crate::client::ConnectOptions;
use crate::dashboard::{Availability, Dashboard, SpaceAccess, StateView, Token};
use crate::ops::{CredentialProfile, IdentityRecord};
use crate::profile::DashboardConfig;
use crate::protocol::EndpointKind;
use crate::provision::ProvisionError;
use crate::services::ServiceSet;
use crate::space::Identities;

/// The name of the appliance's observer user in each space.
const OBSERVER: &str = "dashboard";

/// Starts the dashboard in `services` when the profile enables it, before any space is
/// served; `listen` overrides the profile's address. With it, where it listens
/// ([`remember`]).
pub(super) async fn start(
    core: &Arc<Core>,
    services: &ServiceSet,
    config: &DashboardConfig,
    listen: Option<SocketAddr>,
) -> (Availability, Option<SocketAddr>) {
    if !config.enabled {
        return (Availability::Disabled, None);
    }
    let listen = super::broker::keep_picked(
        listen.unwrap_or(config.listen),
        core.dir.read_last_served().and_then(|l| l.dashboard),
        "a dashboard URL kept from before names the old one",
    );
    let token = match Token::load_or_create(&core.dir.dashboard_token()) {
        Ok(token) => token,
        Err(e) => return (not_served(crate::ops::error_text(&e)), None),
    };
    let (added, spaces) = tokio::sync::watch::channel(Vec::new());
    let state: StateView = {
        let state = core.state.clone();
        Arc::new(move || state.read(Clone::clone))
    };
    let dashboard = match Dashboard::bind(listen, token, spaces, state, core.monitor.clone()) {
        Ok(d) => d,
        Err(e) => {
            let reason = format!(
                "cannot listen on {listen}: {e}; set `listen` under [dashboard] in the profile \
                 (port 0 picks a free one), pass --dashboard HOST:PORT, or set enabled = false"
            );
            return (not_served(reason), None);
        }
    };
    let listening = dashboard.addr();
    let url = dashboard.url();
    // Set before the service starts, and before any space is served: none is missed.
    let _ = core.dashboard.set(added);
    if let Err(e) = services.start(Arc::new(dashboard)).await {
        return (not_served(crate::ops::error_text(&e)), None);
    }
    core.state
        .update(|state| state.dashboard = Some(url.clone()));
    (Availability::Serving(url), Some(listening))
}

/// Once the spaces are served (and what was served recorded): remembers where the dashboard
/// listens, for the next start (a port picked with `HOST:0` is picked again). Nothing waits
/// for its observers: each space is observed at the first request that needs it.
pub(super) fn remember(core: &Core, listening: SocketAddr) {
    if let Some(mut last) = core.dir.read_last_served() {
        last.dashboard = Some(listening);
        if let Err(e) = core.dir.write_last_served(&last) {
            tracing::warn!(error = %e, "where the dashboard listens is not remembered");
        }
    }
}

fn not_served(reason: String) -> Availability {
    tracing::warn!(reason, "dashboard not served");
    Availability::NotServed(reason)
}

/// Hands a space to the dashboard, when it is served, as soon as its streams are made (at
/// start or by `cotald space add`).
pub(super) fn space_served(core: &Core, name: &str, identities: &Arc<Identities>) {
    let Some(added) = core.dashboard.get() else {
        return;
    };
    match observer(core, name, identities) {
        Ok(access) => {
            added.send_modify(|spaces| spaces.push(access));
        }
        Err(e) => tracing::warn!(space = name, error = %crate::ops::error_text(&e),
            "dashboard: space not shown"),
    }
}

/// Takes back a space handed over whose services then could not start.
pub(super) fn space_withdrawn(core: &Core, name: &str) {
    if let Some(added) = core.dashboard.get() {
        added.send_if_modified(|spaces| {
            let before = spaces.len();
            spaces.retain(|s| s.name != name);
            spaces.len() != before
        });
    }
}

/// A served space's observer and voice: the observer's credential (Appendix B observer grants and a read of the
/// membership feed, [`acl::dashboard_observer`]; never the SYS or manager credential), known to the space as a builtin identity like the local operator; the machine
/// operator's credential, which posts what a person types; and the options that connect both
/// to the appliance's own listener.
fn observer(
    core: &Core,
    name: &str,
    identities: &Arc<Identities>,
) -> Result<SpaceAccess, ObserverError> {
    let fail = |source| ObserverError {
        space: name.to_owned(),
        source,
    };
    let keys = core
        .keys
        .space(name)
        .map_err(|e| fail(ObserverFailure::Keys(e)))?;
    let names = SpaceNames::new(name);
    let creds = keys
        .own_user_creds_with(OBSERVER, |id| acl::dashboard_observer(&names, id))
        .map_err(|e| fail(ObserverFailure::Keys(e)))?;
    let id = creds
        .public_key()
        .map_err(|e| fail(ObserverFailure::Creds(e)))?;
    identities.insert_builtin(observer_record(name, id));
    let link = join_link(&core.local.to_string(), name, &[])
        .map_err(|e| fail(ObserverFailure::Link(Box::new(e))))?;
    let mut connect = ConnectOptions::new(link, creds.render());
    connect.ca = Some(core.ca_cert.clone());
    connect.name = Some(OBSERVER.into());
    connect.kind = EndpointKind::Endpoint;
    connect.receive_dms = false;
    connect.announce = false;
    connect.receive_backstop = false;
    let operator = keys
        .own_user_creds(crate::ops::OPERATOR)
        .map_err(|e| fail(ObserverFailure::Keys(e)))?;
    let mut voice = ConnectOptions::new(connect.link.clone(), operator.render());
    voice.ca = Some(core.ca_cert.clone());
    voice.kind = EndpointKind::Endpoint;
    voice.presence = false;
    voice.receive_dms = false;
    voice.receive_backstop = false;
    Ok(SpaceAccess {
        name: name.to_owned(),
        connect,
        voice,
        identities: identities.clone(),
    })
}

/// Why a space's observer could not be made: the dashboard serves without that space.
#[derive(Debug, thiserror::Error)]
#[error("space `{space}`: observer")]
struct ObserverError {
    space: String,
    #[source]
    source: ObserverFailure,
}

/// What failed of a space's observer.
#[derive(Debug, thiserror::Error)]
enum ObserverFailure {
    /// Its keys or credentials.
    #[error(transparent)]
    Keys(#[from] ProvisionError),
    /// Its credential's key.
    #[error(transparent)]
    Creds(#[from] CredsError),
    /// The link to the appliance's own listener.
    #[error(transparent)]
    Link(Box<DaemonError>),
}

/// The dashboard's observer as the space's manager knows it: the observer profile, reading
/// every channel, publishing nothing.
fn observer_record(space: &str, id: String) -> IdentityRecord {
    IdentityRecord {
        id,
        name: OBSERVER.into(),
        space: space.to_owned(),
        profile: CredentialProfile::Observer,
        role: None,
        subscribe: Vec::new(),
        allow_subscribe: vec![">".into()],
        allow_publish: Vec::new(),
        expires_at: None,
        issued_at: 0,
        revokes_before: None,
        revoked_at: None,
    }
}
