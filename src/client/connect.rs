//! Connecting (§2, §10): a join link, a credential and the CA. The client adopts the id bound
//! to the credential (an explicit id must match, or connect fails before any publish), sets
//! the inbox prefix `_INBOX_<id>` before any request, consumer or watch, verifies TLS against
//! the given CA, and reconnects with backoff; subscriptions, presence and consumers are
//! re-established after a reconnect.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use super::deliver::{self, Deliveries};
use super::presence::{self, Roster};
use super::{Client, ClientError, ConnectionState, Inner, Violation};
use crate::binding::{Creds, SpaceNames, dm_durable, svc_durable};
use crate::dial::nats_options;
use crate::protocol::{
    AgentCard, EndpointKind, InstanceId, JoinLink, SpaceSubjects, WIRE_PROTOCOL_VERSION,
};

/// How to reach a space.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The join link (§10): server, TLS, space, boot channels.
    pub link: JoinLink,
    /// The credential (`.creds` text).
    pub creds: String,
    /// The CA certificate to trust for `cotals://` links.
    pub ca: Option<PathBuf>,
    /// Display name on the card (default: the credential's name).
    pub name: Option<String>,
    /// `agent` or `endpoint`.
    pub kind: EndpointKind,
    /// Anycast role: binds `svc_<role>` and is advertised on the card.
    pub role: Option<String>,
    /// An id the caller expects; must equal the credential's (§2).
    pub expect_id: Option<String>,
    /// Bound on control and JetStream requests.
    pub request_timeout: Duration,
    /// How long a direct message or task waits, when its (target, sender) pair is full, for the
    /// recipient to read some before it is refused ([`DEFAULT_PAIR_WAIT`]): a reader that keeps
    /// up makes room within a moment, one that reads nothing gets the refusal.
    pub pair_wait: Duration,
    /// Bind `dm_<id>` and receive DMs.
    pub receive_dms: bool,
    /// Watch the roster and, when `announce` is set too, heartbeat our own presence.
    pub presence: bool,
    /// Heartbeat our own presence (with `presence`): off for a command that only reads the
    /// roster, so that it does not show up in it.
    pub announce: bool,
    /// Receive the durable backstop's copies (§4 `durable`): this identity's backlog on
    /// durable channels it joined, and `@mention` copies. The trusted reader delivers only
    /// to members whose presence is live.
    pub receive_backstop: bool,
    /// Identities known by name before any presence, (instance id, name): on the appliance's
    /// own machine, those it minted and its operator, so that a peer that is away can be
    /// addressed by name.
    pub known: Vec<(String, String)>,
}

/// The default of [`ConnectOptions::pair_wait`].
pub const DEFAULT_PAIR_WAIT: Duration = Duration::from_secs(15);

impl ConnectOptions {
    /// Options for `link` with the `.creds` text `creds`.
    pub fn new(link: JoinLink, creds: String) -> Self {
        ConnectOptions {
            link,
            creds,
            ca: None,
            name: None,
            kind: EndpointKind::Agent,
            role: None,
            expect_id: None,
            request_timeout: Duration::from_secs(5),
            pair_wait: DEFAULT_PAIR_WAIT,
            receive_dms: true,
            presence: true,
            announce: true,
            receive_backstop: true,
            known: Vec::new(),
        }
    }
}

/// What a successful connect hands back besides the client.
pub struct Connection {
    /// The client handle.
    pub client: Client,
    /// Everything the client receives.
    pub deliveries: Deliveries,
}

/// The space a credential's grants are confined to: the `<space>` of the `cotal.<space>.…`
/// subjects it may publish or subscribe to, when they all name one. `None` for a credential
/// unrestricted within its account (the machine operator's) or one that names no space.
fn granted_space(grants: &crate::binding::UserPermissions) -> Option<String> {
    let mut spaces = grants
        .publish
        .allow
        .iter()
        .chain(&grants.subscribe.allow)
        .filter_map(|s| SpaceNames::space_of(s))
        .filter(|s| !matches!(*s, "*" | ">"));
    let first = spaces.next()?;
    spaces.all(|s| s == first).then(|| first.to_owned())
}

/// Whether a TLS failure is the server's certificate not chaining to a trusted CA.
fn untrusted(e: &async_nats::ConnectError) -> bool {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&s.to_string());
        source = s.source();
    }
    text.contains("UnknownIssuer") || text.contains("invalid peer certificate")
}

/// The longest wait between two reconnect attempts to an appliance on this machine.
const LOOPBACK_MAX_DELAY: Duration = Duration::from_millis(250);
/// The longest wait between two reconnect attempts to a remote appliance.
const REMOTE_MAX_DELAY: Duration = Duration::from_secs(4);

/// How long to wait before reconnect attempt `attempts` (1-based). An appliance on this machine
/// answers or refuses at once, so retrying it often costs nothing and a restarted broker is
/// back in use within a quarter second; a remote one is retried with exponential backoff.
fn reconnect_delay(loopback: bool) -> impl Fn(usize) -> Duration + Send + Sync + 'static {
    move |attempts| {
        if attempts <= 1 {
            return Duration::ZERO;
        }
        if loopback {
            (Duration::from_millis(50) * attempts as u32).min(LOOPBACK_MAX_DELAY)
        } else {
            let exp = u32::try_from(attempts - 1).unwrap_or(u32::MAX).min(16);
            Duration::from_millis(2u64.saturating_pow(exp) * 10).min(REMOTE_MAX_DELAY)
        }
    }
}

/// Connects, binds the identity's durables, starts presence.
pub(super) async fn connect(opts: ConnectOptions) -> Result<Connection, ClientError> {
    let (creds, claims, id) = check_credential(&opts)?;
    let subjects = SpaceSubjects::new(opts.link.space())?;
    let names = SpaceNames::new(subjects.space().as_str());
    let (state_tx, state) = watch::channel(ConnectionState::Connected);
    let (violations, _) = broadcast::channel::<Violation>(256);
    let health: Arc<super::health::Health> = Arc::default();
    let events = Events {
        state: state_tx,
        violations: violations.clone(),
        health: health.clone(),
    };
    let nats = dial_space(&opts, &creds, &claims, &id, events).await?;
    let js = async_nats::jetstream::new(nats.clone());

    let mut card = AgentCard::new(
        &id,
        opts.name.clone().unwrap_or(claims.name.clone()),
        opts.kind,
    );
    card.role = opts.role.clone();
    card.protocol_version = Some(WIRE_PROTOCOL_VERSION.to_owned());
    let max_payload = nats.server_info().max_payload;
    let roster = Roster::default();
    for (id, name) in &opts.known {
        roster.know(id, name);
    }
    let (sink, deliveries) = deliver::channel(
        max_payload,
        id.as_str().to_owned(),
        &[card.name.as_str(), claims.name.as_str()],
        roster.clone(),
    );
    let grants = &claims.permissions;
    // Observers and admins hold no presence write (Appendix B): they watch, never announce.
    let announce = opts.presence
        && opts.announce
        && grants.may_publish(&SpaceNames::kv_subject(
            &names.presence_bucket(),
            id.as_str(),
        ));
    let bind_dm = durables_granted(&opts, grants, &names, &id)?;
    let inner = Arc::new(Inner {
        nats,
        js,
        id,
        card: Mutex::new(card),
        subjects,
        names,
        violations,
        state,
        out: sink,
        joined: tokio::sync::Mutex::new(Default::default()),
        history: tokio::sync::Mutex::new(()),
        marked: Default::default(),
        health,
        grants: claims.permissions.clone(),
        background: Default::default(),
        roster,
        declared: Mutex::new(Default::default()),
        request_timeout: opts.request_timeout,
        pair_wait: opts.pair_wait,
        announced: announce,
        ack_batcher: Mutex::default(),
        catch_up: Default::default(),
        registry: Default::default(),
    });
    let client = Client { inner };
    let backstop = opts.receive_backstop && super::backstop::granted(&client, grants);
    if let Err(e) = start(&client, &opts, bind_dm, announce, backstop).await {
        client.inner.background.stop().await;
        let _ = client.inner.nats.drain().await;
        return Err(e);
    }
    Ok(Connection { client, deliveries })
}

/// Whether the DM durable is to be bound (wanted and granted); refused when the role asked
/// for is not the credential's to read (Appendix B).
fn durables_granted(
    opts: &ConnectOptions,
    grants: &crate::binding::UserPermissions,
    names: &SpaceNames,
    id: &InstanceId,
) -> Result<bool, ClientError> {
    let may_read = |stream: &str, durable: &str| {
        grants.may_publish(&crate::binding::system::consumer_next(stream, durable))
    };
    if let Some(role) = &opts.role {
        let svc = svc_durable(role);
        if !may_read(&names.task_stream(), &svc) {
            return Err(ClientError::RoleNotGranted {
                role: role.clone(),
                durable: svc,
            });
        }
    }
    Ok(opts.receive_dms && may_read(&names.dm_stream(), &dm_durable(id.as_str())))
}

/// Where the connection's events go: its state, the permission violations the server
/// reports, and the health record.
#[derive(Clone)]
struct Events {
    state: watch::Sender<ConnectionState>,
    violations: broadcast::Sender<Violation>,
    health: Arc<super::health::Health>,
}

/// What a credential must be before it is dialled: whole, not spliced, of the expected
/// identity, unexpired, for the link's space, with no secret in the link itself.
fn check_credential(
    opts: &ConnectOptions,
) -> Result<(Creds, crate::binding::UserClaims, InstanceId), ClientError> {
    let creds = Creds::parse(&opts.creds)?;
    let public = creds.public_key()?;
    let claims = creds.claims()?;
    if claims.subject != public {
        return Err(ClientError::Spliced {
            seed: public,
            jwt: claims.subject,
        });
    }
    let id = InstanceId::from_user_nkey(&public)?;
    if let Some(expected) = &opts.expect_id
        && expected != id.as_str()
    {
        return Err(ClientError::IdMismatch {
            expected: expected.clone(),
            actual: id.as_str().to_owned(),
        });
    }
    if opts.link.auth().is_some() {
        return Err(ClientError::LinkAuth);
    }
    if let Some(exp) = claims.expires
        && exp <= crate::provision::now_secs()
    {
        return Err(ClientError::Expired {
            at: crate::provision::rfc3339(exp),
        });
    }
    if let Some(space) = granted_space(&claims.permissions)
        && space != opts.link.space()
    {
        return Err(ClientError::WrongSpace {
            credential: space,
            link: opts.link.space().to_owned(),
        });
    }
    Ok((creds, claims, id))
}

/// How long a credential the broker refuses at connect is offered again before the refusal
/// is reported: a broker reloading its configuration (a server certificate renewal) refuses
/// the connections that register in that instant, valid credentials too, so one refusal says
/// nothing yet. A credential that is truly refused (revoked, of another appliance) is
/// reported this much later.
const REFUSAL_RETRY: Duration = Duration::from_secs(1);
/// The pause between two offers of a refused credential.
const REFUSAL_PAUSE: Duration = Duration::from_millis(100);

/// Dials the link's server as the identity: its inbox prefix (Appendix B), reconnects paced
/// for loopback or a remote server, connection states and permission violations reported.
async fn dial_space(
    opts: &ConnectOptions,
    creds: &Creds,
    claims: &crate::binding::UserClaims,
    id: &InstanceId,
    events: Events,
) -> Result<async_nats::Client, ClientError> {
    let server = opts.link.server_url();
    let first = tokio::time::Instant::now();
    loop {
        let options = space_options(opts, creds, claims, id, events.clone())?;
        let e = match options.connect(&server).await {
            Ok(client) => return Ok(client),
            Err(e) => e,
        };
        let refused = matches!(
            e.kind(),
            async_nats::ConnectErrorKind::AuthorizationViolation
        );
        if refused && first.elapsed() < REFUSAL_RETRY {
            tracing::debug!(%server, "credential refused at connect; offered again");
            tokio::time::sleep(REFUSAL_PAUSE).await;
            continue;
        }
        return Err(match e.kind() {
            async_nats::ConnectErrorKind::AuthorizationViolation => {
                ClientError::NotAuthorized { server }
            }
            // rustls reports the verdict through an I/O error.
            async_nats::ConnectErrorKind::Tls | async_nats::ConnectErrorKind::Io
                if untrusted(&e) =>
            {
                ClientError::UntrustedCertificate {
                    server,
                    source: e.into(),
                }
            }
            _ => ClientError::Connect {
                server,
                source: e.into(),
            },
        });
    }
}

/// The options of one dial of the space as the identity, its events reported to `events`.
fn space_options(
    opts: &ConnectOptions,
    creds: &Creds,
    claims: &crate::binding::UserClaims,
    id: &InstanceId,
    events: Events,
) -> Result<async_nats::ConnectOptions, ClientError> {
    let options = nats_options(
        creds,
        format!("cotal:{}", opts.name.as_deref().unwrap_or(&claims.name)),
        opts.ca.as_deref(),
        opts.link.tls_required(),
    )
    .map_err(|e| ClientError::Connect {
        server: opts.link.server_url(),
        source: e,
    })?;
    Ok(options
        .custom_inbox_prefix(id.inbox_prefix())
        .reconnect_delay_callback(reconnect_delay(opts.link.host().is_loopback()))
        .event_callback(move |event| {
            let state_tx = events.state.clone();
            let events_tx = events.violations.clone();
            let health = events.health.clone();
            let connected = *state_tx.borrow() == ConnectionState::Connected;
            async move {
                let state = match event {
                    async_nats::Event::Connected => Some(ConnectionState::Connected),
                    async_nats::Event::Disconnected => Some(ConnectionState::Reconnecting),
                    async_nats::Event::Closed => Some(ConnectionState::Disconnected),
                    async_nats::Event::ServerError(async_nats::ServerError::Other(text)) => {
                        if let Some(v) = Violation::parse(&text) {
                            tracing::debug!(verb = %v.verb, subject = %v.subject, "permission violation");
                            let _ = events_tx.send(v);
                        }
                        health.error(format!("the server said: {text}"), connected);
                        None
                    }
                    async_nats::Event::ServerError(other) => {
                        health.error(format!("the server said: {other}"), connected);
                        None
                    }
                    async_nats::Event::ClientError(e) => {
                        health.error(format!("the connection failed: {e}"), connected);
                        None
                    }
                    other => {
                        tracing::debug!(event = %other, "connection event");
                        None
                    }
                };
                if let Some(state) = state {
                    health.changed(state);
                    // Told only of a change: a watcher that is told, and finds the connection
                    // up, knows it was down meanwhile, however quickly it came back.
                    state_tx.send_if_modified(|now| std::mem::replace(now, state) != state);
                }
            }
        }))
}

/// Every check is done: binds the durables this credential reads (Appendix B), starts
/// presence, the backstop's copies and gap recovery.
async fn start(
    client: &Client,
    opts: &ConnectOptions,
    bind_dm: bool,
    announce: bool,
    backstop: bool,
) -> Result<(), ClientError> {
    let names = &client.inner.names;
    if bind_dm {
        let dm = dm_durable(client.inner.id.as_str());
        deliver::bind(client, &names.dm_stream(), &dm, "direct messages").await?;
    }
    if let Some(role) = &opts.role {
        let svc = svc_durable(role);
        deliver::bind(client, &names.task_stream(), &svc, "tasks for your role").await?;
    }
    if opts.presence {
        presence::start(client, announce).await?;
    }
    if backstop {
        super::backstop::start(client).await?;
    }
    super::history::start_gap_recovery(client);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_appliance_is_retried_within_a_quarter_second() {
        let local = reconnect_delay(true);
        let delays: Vec<Duration> = (1..=10).map(&local).collect();
        assert_eq!(delays[0], Duration::ZERO);
        assert!(
            delays.iter().all(|d| *d <= LOOPBACK_MAX_DELAY),
            "{delays:?}"
        );
        let first_second: Duration = delays[..5].iter().sum();
        assert!(first_second < Duration::from_secs(1), "{delays:?}");
        let remote = reconnect_delay(false);
        assert_eq!(remote(1), Duration::ZERO);
        assert!(remote(3) < remote(6));
        assert_eq!(remote(100), REMOTE_MAX_DELAY);
    }
}
