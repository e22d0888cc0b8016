//! The conformant endpoint (§12): what every other surface (CLI, MCP server, benches) is
//! built on, and what third parties can embed.
//!
//! A [`Client`] is a cheap handle over one NATS connection. Everything it receives (live
//! channel copies, history backfill, DM and anycast copies) arrives on one [`Deliveries`]
//! stream, deduplicated by `id` across copies (§4), with the delivery kind taken from the
//! subject (§4) and the three anomalies terminated, never redelivered (§4, §5).
//!
//! | spec | where |
//! | --- | --- |
//! | §2 adopt the credential's id; inbox `_INBOX_<id>` (§10) | [`connect`] |
//! | §6 heartbeat, roster | [`presence`] |
//! | §7 join/leave, watermark, replay, durable membership | [`join`] |
//! | §4, §5, §8 receive, dedup, ack/term | [`deliver`] |
//! | §5, §8 send through JetStream with `Nats-Msg-Id` | [`Client::send`] |
//! | §5 control request/reply | [`Client::control`] |

mod connect;
pub mod deliver;
pub mod join;
pub mod presence;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::{broadcast, watch};

use crate::binding::{MANAGER_SERVICE, SpaceNames};
use crate::protocol::{
    AgentCard, ControlReply, ControlRequest, CotalMessage, EndpointRef, InstanceId, Part, Routing,
    SpaceSubjects,
};

pub use connect::{ConnectOptions, Connection};
pub use deliver::{Anomaly, Deliveries, Delivery, Notice};
pub use join::{DurableState, JoinError, JoinReport, Replay};
pub use presence::{Peer, Roster};

/// What the connection is doing (surfaced, never silent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    /// Connected to the broker.
    Connected,
    /// Lost the connection; reconnecting with backoff.
    Reconnecting,
    /// Closed for good.
    Disconnected,
}

/// Why a client operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connect options are invalid (link, credentials, id).
    #[error("{0}")]
    Config(String),
    /// The broker could not be reached or refused the connection.
    #[error("cannot connect to {server}: {reason}")]
    Connect { server: String, reason: String },
    /// The broker refused a publish (permission violation).
    #[error("the broker refused to publish on {subject}: not within this credential's permissions")]
    PublishRefused { subject: String },
    /// A request got no answer in time.
    #[error("{what}: no answer within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
    /// No service listens on a control subject.
    #[error("no `{service}` service answers in space `{space}`")]
    NoResponders { service: String, space: String },
    /// A JetStream or NATS operation failed.
    #[error("{action}: {reason}")]
    Nats { action: String, reason: String },
    /// A message could not be built.
    #[error("invalid message: {0}")]
    Message(String),
}

pub(crate) fn nats_err(action: impl Into<String>) -> impl FnOnce(String) -> ClientError {
    let action = action.into();
    move |reason| ClientError::Nats { action, reason }
}

/// A permission violation the broker reported on this connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    /// `Publish` or `Subscription`.
    pub verb: String,
    /// The refused subject.
    pub subject: String,
}

impl Violation {
    /// Parses `Permissions Violation for Subscription to "subject"` (the server's wording).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let rest = text.split_once("Permissions Violation for ")?.1;
        let (verb, rest) = rest.split_once(" to ")?;
        let subject = rest.trim().trim_matches(['"', '\'']);
        let subject = subject.split('"').next().unwrap_or(subject);
        Some(Violation {
            verb: verb.to_owned(),
            subject: subject.to_owned(),
        })
    }
}

pub(crate) struct Inner {
    pub(crate) nats: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) id: InstanceId,
    pub(crate) card: Mutex<AgentCard>,
    pub(crate) subjects: SpaceSubjects,
    pub(crate) names: SpaceNames,
    pub(crate) violations: broadcast::Sender<Violation>,
    pub(crate) state: watch::Receiver<ConnectionState>,
    pub(crate) out: deliver::Sink,
    pub(crate) joined: tokio::sync::Mutex<BTreeMap<String, join::Joined>>,
    /// Whether the credential denies the barrier subject (then a refused barrier SUB confirms
    /// every earlier SUB; otherwise nothing can be refused and a round trip confirms).
    pub(crate) barrier_refused: bool,
    pub(crate) tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    pub(crate) roster: presence::Roster,
    pub(crate) declared: Mutex<presence::Declared>,
    pub(crate) request_timeout: Duration,
    /// Whether this client heartbeats presence (and so owes a final `offline`).
    pub(crate) announced: bool,
}

/// A connected endpoint.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl Client {
    /// Connects to the space of `opts.link` (see [`ConnectOptions`]).
    pub async fn connect(opts: ConnectOptions) -> Result<Connection, ClientError> {
        connect::connect(opts).await
    }

    /// The instance id (the credential's user key, §2).
    pub fn id(&self) -> &InstanceId {
        &self.inner.id
    }

    /// The space.
    pub fn space(&self) -> &str {
        self.inner.names.space()
    }

    /// The connection state; changes are observable with [`watch::Receiver::changed`].
    pub fn state(&self) -> watch::Receiver<ConnectionState> {
        self.inner.state.clone()
    }

    /// The roster (§6), kept current by the presence watch.
    pub fn roster(&self) -> &Roster {
        &self.inner.roster
    }

    /// This endpoint as a sender reference.
    pub fn endpoint(&self) -> EndpointRef {
        let card = self.inner.card.lock().unwrap_or_else(|e| e.into_inner());
        let mut from = EndpointRef::new(&self.inner.id, card.name.clone());
        if let Some(role) = &card.role {
            from = from.with_role(role.clone());
        }
        from
    }

    /// Publishes a delivery message through JetStream with `Nats-Msg-Id = id` and returns the
    /// stream sequence of the ack (§8). A refused publish is an error naming the subject, not a
    /// timeout.
    pub async fn send(
        &self,
        routing: Routing,
        parts: Vec<Part>,
        mentions: &[String],
    ) -> Result<(CotalMessage, u64), ClientError> {
        let me = self.inner.id.as_str();
        let subject = match &routing {
            Routing::Channel(channel) => crate::protocol::Channel::new(channel)
                .map_err(|e| ClientError::Message(e.to_string()))
                .and_then(|c| {
                    self.inner
                        .subjects
                        .chat(me, &c)
                        .map_err(|e| ClientError::Message(e.to_string()))
                }),
            Routing::To(target) => self
                .inner
                .subjects
                .inst(target, me)
                .map_err(|e| ClientError::Message(e.to_string())),
            Routing::ToService(role) => self
                .inner
                .subjects
                .svc(role, me)
                .map_err(|e| ClientError::Message(e.to_string())),
        }?;
        let message = CotalMessage::new(self.space(), self.endpoint(), routing, parts)
            .with_mentions(mentions);
        let payload = message
            .to_json()
            .map_err(|e| ClientError::Message(e.to_string()))?;
        let mut violations = self.inner.violations.subscribe();
        let publish = async {
            let ack = self
                .inner
                .js
                .send_publish(
                    subject.clone(),
                    jetstream::message::PublishMessage::build()
                        .message_id(message.id.clone())
                        .payload(payload.into()),
                )
                .await
                .map_err(|e| nats_err(format!("publish on {subject}"))(e.to_string()))?;
            ack.await
                .map_err(|e| nats_err(format!("publish on {subject}"))(e.to_string()))
        };
        let refused = refused_publish(&mut violations, &subject);
        tokio::select! {
            ack = publish => Ok((message, ack?.sequence)),
            () = refused => Err(ClientError::PublishRefused { subject }),
        }
    }

    /// A text message on a channel (§4 multicast).
    pub async fn send_text(
        &self,
        routing: Routing,
        text: &str,
    ) -> Result<(CotalMessage, u64), ClientError> {
        self.send(routing, vec![Part::text(text)], &[]).await
    }

    /// A control request to `service` (§5): `ControlRequest` on `ctl.<service>.<id>`, the reply
    /// on the per-identity inbox.
    pub async fn control(
        &self,
        service: &str,
        op: &str,
        args: serde_json::Map<String, serde_json::Value>,
    ) -> Result<ControlReply, ClientError> {
        let subject = self
            .inner
            .subjects
            .ctl(service, self.inner.id.as_str())
            .map_err(|e| ClientError::Message(e.to_string()))?;
        let request = ControlRequest::new(op, self.endpoint()).with_args(args);
        let body = serde_json::to_vec(&request).map_err(|e| ClientError::Message(e.to_string()))?;
        let timeout = self.inner.request_timeout;
        let mut violations = self.inner.violations.subscribe();
        let request = tokio::time::timeout(
            timeout,
            self.inner.nats.request(subject.clone(), body.into()),
        );
        let refused = refused_publish(&mut violations, &subject);
        let reply = tokio::select! {
            reply = request => reply,
            () = refused => return Err(ClientError::PublishRefused { subject }),
        };
        let reply = reply
            .map_err(|_| ClientError::Timeout {
                what: format!("control {op} on {subject}"),
                timeout,
            })?
            .map_err(|e| match e.kind() {
                async_nats::RequestErrorKind::NoResponders => ClientError::NoResponders {
                    service: service.to_owned(),
                    space: self.space().to_owned(),
                },
                _ => nats_err(format!("control {op}"))(e.to_string()),
            })?;
        serde_json::from_slice(&reply.payload)
            .map_err(|e| nats_err(format!("control {op} reply"))(e.to_string()))
    }

    /// A control request to the privileged provisioner (`ctl.manager`, §7).
    pub async fn manager(
        &self,
        op: &str,
        args: serde_json::Map<String, serde_json::Value>,
    ) -> Result<ControlReply, ClientError> {
        self.control(MANAGER_SERVICE, op, args).await
    }

    /// Publishes the final `offline` presence (§6), leaves nothing durable behind (a
    /// disconnect is not a leave), and drains the connection.
    pub async fn close(self) {
        // Stop the heartbeat first, so that no beat lands after the final `offline`.
        let tasks = self
            .inner
            .tasks
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
        self.inner.joined.lock().await.clear();
        if self.inner.announced {
            presence::publish_offline(&self).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), self.inner.nats.drain()).await;
    }
}

/// Resolves when the broker reports a refused publish on `subject`.
async fn refused_publish(violations: &mut broadcast::Receiver<Violation>, subject: &str) {
    loop {
        match violations.recv().await {
            Ok(v) if v.verb == "Publish" && v.subject == subject => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violations_parse_the_server_wording() {
        let v =
            Violation::parse(r#"Permissions Violation for Subscription to "cotal.main.chat.*.x""#)
                .unwrap();
        assert_eq!(v.verb, "Subscription");
        assert_eq!(v.subject, "cotal.main.chat.*.x");
        let v = Violation::parse(
            r#"permissions violation: Permissions Violation for Publish to "a.b" using queue"#,
        );
        assert_eq!(v.unwrap().subject, "a.b");
        assert!(Violation::parse("authorization violation").is_none());
    }
}
