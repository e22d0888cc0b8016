//! Connecting (§2, §10): a join link, a credential and the CA. The client adopts the id bound
//! to the credential (an explicit id must match, or connect fails before any publish), sets
//! the inbox prefix `_INBOX_<id>` before any request, consumer or watch, verifies TLS against
//! the given CA, and reconnects with backoff; subscriptions, presence and consumers are
//! re-established after a reconnect.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use tokio::sync::{broadcast, watch};

use super::deliver::{self, Deliveries};
use super::presence::{self, Roster};
use super::{Client, ClientError, ConnectionState, Inner, Violation};
use crate::binding::{SpaceNames, dm_durable, svc_durable};
use crate::protocol::{
    AgentCard, EndpointKind, InstanceId, JoinLink, SpaceSubjects, WIRE_PROTOCOL_VERSION,
    subject_matches,
};
use crate::provision::Creds;

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
    /// Bind `dm_<id>` and receive DMs.
    pub receive_dms: bool,
    /// Heartbeat presence and watch the roster.
    pub presence: bool,
}

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
            receive_dms: true,
            presence: true,
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

/// The claims of our own user JWT that the client needs.
struct OwnClaims {
    subject: String,
    name: String,
    sub_allow: Vec<String>,
    sub_deny: Vec<String>,
    pub_allow: Vec<String>,
}

fn own_claims(jwt: &str) -> Result<OwnClaims, ClientError> {
    let bad = |m: &str| ClientError::Config(format!("the credential's JWT is malformed: {m}"));
    let payload = jwt.split('.').nth(1).ok_or_else(|| bad("no payload"))?;
    let bytes = URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|e| bad(&e.to_string()))?;
    let claims: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(&e.to_string()))?;
    let list = |dir: &str, key: &str| -> Vec<String> {
        claims["nats"][dir][key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    Ok(OwnClaims {
        subject: claims["sub"].as_str().unwrap_or_default().to_owned(),
        name: claims["name"].as_str().unwrap_or_default().to_owned(),
        sub_allow: list("sub", "allow"),
        sub_deny: list("sub", "deny"),
        pub_allow: list("pub", "allow"),
    })
}

/// Connects, binds the identity's durables, starts presence.
pub async fn connect(opts: ConnectOptions) -> Result<Connection, ClientError> {
    let creds = Creds::parse(&opts.creds).map_err(|e| ClientError::Config(e.to_string()))?;
    let public = creds
        .public_key()
        .map_err(|e| ClientError::Config(e.to_string()))?;
    let claims = own_claims(&creds.jwt)?;
    if claims.subject != public {
        return Err(ClientError::Config(format!(
            "the credential's seed ({public}) does not belong to its JWT ({}): spliced credentials",
            claims.subject
        )));
    }
    let id = InstanceId::from_user_nkey(&public).map_err(|e| ClientError::Config(e.to_string()))?;
    if let Some(expected) = &opts.expect_id
        && expected != id.as_str()
    {
        return Err(ClientError::Config(format!(
            "id {expected} was requested but the credential is bound to {id} (§2)",
            id = id.as_str()
        )));
    }
    if opts.link.auth().is_some() {
        return Err(ClientError::Config(
            "the join link carries a token or user:password, which cannot be combined with a \
             credential (§10)"
                .into(),
        ));
    }
    let subjects =
        SpaceSubjects::new(opts.link.space()).map_err(|e| ClientError::Config(e.to_string()))?;
    let names = SpaceNames::new(subjects.space().as_str());

    let (state_tx, state) = watch::channel(ConnectionState::Connected);
    let (violations, _) = broadcast::channel::<Violation>(256);
    let events_tx = violations.clone();
    let mut options = async_nats::ConnectOptions::with_credentials(&opts.creds)
        .map_err(|e| ClientError::Config(e.to_string()))?
        .custom_inbox_prefix(id.inbox_prefix())
        .name(format!("cotal:{}", opts.name.as_deref().unwrap_or(&claims.name)))
        .connection_timeout(Duration::from_secs(10))
        .event_callback(move |event| {
            let state_tx = state_tx.clone();
            let events_tx = events_tx.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        let _ = state_tx.send(ConnectionState::Connected);
                    }
                    async_nats::Event::Disconnected => {
                        let _ = state_tx.send(ConnectionState::Reconnecting);
                    }
                    async_nats::Event::Closed => {
                        let _ = state_tx.send(ConnectionState::Disconnected);
                    }
                    async_nats::Event::ServerError(async_nats::ServerError::Other(text)) => {
                        if let Some(v) = Violation::parse(&text) {
                            tracing::debug!(verb = %v.verb, subject = %v.subject, "permission violation");
                            let _ = events_tx.send(v);
                        }
                    }
                    other => tracing::debug!(event = %other, "connection event"),
                }
            }
        });
    if opts.link.tls_required() {
        options = options.require_tls(true);
    }
    if let Some(ca) = &opts.ca {
        options = options.add_root_certificates(ca.clone());
    }
    let server = opts.link.server_url();
    let nats = options
        .connect(&server)
        .await
        .map_err(|e| ClientError::Connect {
            server: server.clone(),
            reason: e.to_string(),
        })?;
    let js = async_nats::jetstream::new(nats.clone());

    let mut card = AgentCard::new(
        &id,
        opts.name.clone().unwrap_or(claims.name.clone()),
        opts.kind,
    );
    card.role = opts.role.clone();
    card.protocol_version = Some(WIRE_PROTOCOL_VERSION.to_owned());
    let max_payload = nats.server_info().max_payload;
    let (sink, deliveries) = deliver::channel(max_payload, id.as_str().to_owned());
    let barrier = "_INBOX.cotal-barrier.probe";
    let barrier_refused = claims.sub_deny.iter().any(|p| subject_matches(p, barrier))
        || (!claims.sub_allow.is_empty()
            && !claims.sub_allow.iter().any(|p| subject_matches(p, barrier)));
    let unrestricted = claims.pub_allow.is_empty();
    let may_publish = |subject: &str| {
        unrestricted || claims.pub_allow.iter().any(|p| subject_matches(p, subject))
    };
    // Observers and admins hold no presence write (Appendix B): they watch, never announce.
    let announce =
        opts.presence && may_publish(&format!("$KV.{}.{}", names.presence_bucket(), id.as_str()));
    let grants = |consumer: &str| {
        claims.pub_allow.iter().any(|s| {
            s.starts_with("$JS.API.CONSUMER.MSG.NEXT.") && s.ends_with(&format!(".{consumer}"))
        })
    };
    let dm = dm_durable(id.as_str());
    let bind_dm = opts.receive_dms && (unrestricted || grants(&dm));
    if let Some(role) = &opts.role {
        let svc = svc_durable(role);
        if !unrestricted && !grants(&svc) {
            return Err(ClientError::Config(format!(
                "role `{role}`: this credential may not read {svc} (mint it with --role {role})"
            )));
        }
    }
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
        barrier_refused,
        tasks: Mutex::new(Vec::new()),
        roster: Roster::default(),
        declared: Mutex::new(Default::default()),
        request_timeout: opts.request_timeout,
        announced: announce,
    });
    let client = Client { inner };

    // Every check is done: bind the durables this credential reads (Appendix B), start
    // presence. A failure here stops whatever was started.
    let started = async {
        if bind_dm {
            deliver::bind(&client, &client.inner.names.dm_stream(), &dm).await?;
        }
        if let Some(role) = &opts.role {
            deliver::bind(
                &client,
                &client.inner.names.task_stream(),
                &svc_durable(role),
            )
            .await?;
        }
        if opts.presence {
            presence::start(&client, announce).await?;
        }
        Ok::<(), ClientError>(())
    };
    if let Err(e) = started.await {
        for task in client
            .inner
            .tasks
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default()
        {
            task.abort();
        }
        let _ = client.inner.nats.drain().await;
        return Err(e);
    }
    Ok(Connection { client, deliveries })
}
