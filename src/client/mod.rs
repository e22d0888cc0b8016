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
//! | §2 adopt the credential's id; inbox `_INBOX_<id>` (§10) | `connect` |
//! | §6 heartbeat, roster | [`presence`] |
//! | §7 join/leave, watermark, durable membership | [`join`] |
//! | §7 replay, history, the gap of a reconnect | `history` |
//! | §7 the channels: registry, effective config, activity | [`ChannelInfo`] |
//! | §4, §5, §8 receive, dedup, ack/term | [`deliver`] |
//! | §4 `durable`, §8 the trusted reader's copies, acked once handled | `backstop` |
//! | §5, §8 send through JetStream with `Nats-Msg-Id` | [`Client::send`] |
//! | §5 control request/reply | [`Client::control`] |

mod background;
mod backstop;
mod catch_up;
mod channels;
mod connect;
pub mod deliver;
mod error;
mod health;
mod history;
pub mod join;
pub mod presence;
mod range;
mod transient;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::context::PublishErrorKind;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::binding::{MANAGER_SERVICE, SpaceNames};
use crate::ops;
use crate::protocol::{
    AgentCard, ControlReply, ControlRequest, CotalMessage, EndpointRef, InstanceId, Part, Routing,
    SpaceSubjects,
};

pub use crate::dial::{DialError, dial, nats_options};
pub use channels::ChannelInfo;
pub use connect::{ConnectOptions, Connection, DEFAULT_PAIR_WAIT};
pub use deliver::{Anomaly, Deliveries, Delivery, Notice};
pub use error::{BoxError, ClientError, StoreLimit};
pub(crate) use error::{Violation, nats_err};
use error::{sent_what, store_refusal, unanswered};
pub use health::{DurableWaiting, HealthReport};
pub use join::{ChannelRegistry, DurableState, JoinError, JoinReport, Replay};
pub use presence::{Declared, Peer, ResolveError, Roster};

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

/// What stopping left unsettled of what this session handled: what the next session of this
/// identity may be handed again (at-least-once, §4). A report, not a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Messages handled from their live copy whose durable copy did not come in time to be
    /// acknowledged, and mentions of this member handled before their mention copy came (it
    /// is not certain to come, and not waited for; when it comes after this session, the next
    /// one is handed it).
    pub unsettled: usize,
    /// Whether the appliance confirmed the last acknowledgements of durable copies (true when
    /// there were none to confirm).
    pub acks_confirmed: bool,
}

impl Settled {
    /// Whether everything handled is acknowledged: the next session gets none of it again.
    pub fn complete(&self) -> bool {
        self.unsettled == 0 && self.acks_confirmed
    }
}

/// How long a publish is sent again for while it gets no answer (well within the streams'
/// duplicate window of two minutes, so that it is stored at most once).
const PUBLISH_WAIT: Duration = Duration::from_secs(30);

/// How long a closing client waits for a connection that is down to come back before it
/// gives up what needs the broker (its last acks' confirmation, its final presence): a broker
/// restarting is back within it; a credential refused, or an appliance gone, is not.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// A publish the stream did not store: a fairness bound (per pair, or the stream's or the
/// space's storage) is named with what the sender can do; anything else stays a NATS error.
/// The first pause before a DM or task whose pair is full is sent again; it doubles up to
/// [`PAIR_BACKOFF_MAX`].
const PAIR_BACKOFF_FIRST: Duration = Duration::from_millis(20);
/// The longest pause between two tries of a DM or task whose pair is full.
const PAIR_BACKOFF_MAX: Duration = Duration::from_millis(500);

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
    /// Held by a history read: they share the `chathist_<id>` consumer.
    pub(crate) history: tokio::sync::Mutex<()>,
    /// The CHAT frontier last sent as this session's replay mark.
    pub(crate) marked: std::sync::atomic::AtomicU64,
    /// What the credential may publish and subscribe to (its JWT's grants): a join the grants
    /// refuse is refused before any SUB.
    pub(crate) grants: crate::binding::UserPermissions,
    /// The background tasks (watch, heartbeat, pulls, backstop, gap recovery).
    pub(crate) background: background::Background,
    pub(crate) roster: presence::Roster,
    pub(crate) declared: Mutex<presence::Declared>,
    pub(crate) request_timeout: Duration,
    pub(crate) pair_wait: Duration,
    /// Whether this client heartbeats presence (and so owes a final `offline`).
    pub(crate) announced: bool,
    /// The durable acks' batcher and what tells it to send its last ones, confirmed, before
    /// the connection closes (`client::backstop`).
    pub(crate) ack_batcher: Mutex<Option<(CancellationToken, tokio::task::JoinHandle<bool>)>>,
    /// The backlog found at connect, source by source, until it is surfaced.
    pub(crate) catch_up: catch_up::CatchUp,
    /// What the connection went through.
    pub(crate) health: Arc<health::Health>,
    /// The channel registry's bucket, once opened (`channels.rs`): its handle holds only
    /// names, so every read after the first skips the bucket's `STREAM.INFO`.
    pub(crate) registry: tokio::sync::OnceCell<async_nats::jetstream::kv::Store>,
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

    /// Waits until what waited for this endpoint when it connected (its DMs, its role's tasks,
    /// its durable channels' backlog) has been surfaced on [`Deliveries`], or as much of it as
    /// the broker hands out before copies are acknowledged. Unbounded: wrap it in a timeout,
    /// and say what [`Client::catching_up`] names when it passes.
    pub async fn caught_up(&self) {
        self.inner.catch_up.wait().await;
    }

    /// What of the backlog found at connect is still on its way, in words.
    pub fn catching_up(&self) -> Vec<&'static str> {
        self.inner.catch_up.outstanding()
    }

    /// How many messages have been surfaced on [`Deliveries`] so far: a reader that has taken
    /// this many has everything surfaced before the call.
    pub fn surfaced(&self) -> u64 {
        self.inner.out.surfaced()
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
        let message = CotalMessage::new(self.space(), self.endpoint(), routing, parts)
            .with_mentions(mentions);
        let seq = self.publish(&message).await?;
        Ok((message, seq))
    }

    /// Publishes a message built by the caller (e.g. with `reply_to` or `context_id` set) on
    /// the subject its routing names, as [`Client::send`] does; returns the stream sequence.
    /// Its `from` must be [`Client::endpoint`]: the broker only accepts our own sender token.
    /// A failure is recorded as the connection's last error ([`Client::health`]).
    pub async fn publish(&self, message: &CotalMessage) -> Result<u64, ClientError> {
        let sent = self.publish_once(message).await;
        if let Err(e) = &sent {
            self.met_error(format!("a send failed: {}", crate::ops::error_text(e)));
        }
        sent
    }

    /// [`Client::publish`], unrecorded.
    async fn publish_once(&self, message: &CotalMessage) -> Result<u64, ClientError> {
        let me = self.inner.id.as_str();
        let subject = match &message.routing {
            Routing::Channel(channel) => {
                let channel = crate::protocol::Channel::new(channel)?;
                self.inner.subjects.chat(me, &channel)?
            }
            Routing::To(target) => self.inner.subjects.inst(target, me)?,
            Routing::ToService(role) => self.inner.subjects.svc(role, me)?,
        };
        let payload = message.to_json().map_err(|source| ClientError::Json {
            what: "message",
            source,
        })?;
        let payload = bytes::Bytes::from(payload);
        let mut violations = self.inner.violations.subscribe();
        // A full pair of a DM or a task is backpressure while its recipient reads: the warden
        // trims what was read (`services/warden/`), so the same message (same id: stored at
        // most once) is sent again, with backoff, for up to `pair_wait`.
        let waits = !matches!(message.routing, Routing::Channel(_));
        let publish = async {
            let started = tokio::time::Instant::now();
            let mut backoff = PAIR_BACKOFF_FIRST;
            let (mut resend, mut maybe_stored) = (PAIR_BACKOFF_FIRST, false);
            loop {
                let ack = self
                    .inner
                    .js
                    .send_publish(
                        subject.clone(),
                        jetstream::message::PublishMessage::build()
                            .message_id(message.id.clone())
                            .payload(payload.clone()),
                    )
                    .await
                    .map_err(|e| nats_err(format!("publish on {subject}"))(e))?;
                let refusal = match ack.await {
                    Ok(ack) => return Ok(ack),
                    // No answer, or no JetStream to answer yet (a broker that paused or is
                    // restarting, a reconnect in between): the same message again is stored
                    // once (same id, the stream's duplicate window of two minutes), so it is
                    // sent again until it is acknowledged, for up to PUBLISH_WAIT.
                    Err(e) if unanswered(&e) => {
                        maybe_stored |= e.kind() != PublishErrorKind::StreamNotFound;
                        if started.elapsed() >= PUBLISH_WAIT {
                            return Err(match maybe_stored {
                                true => ClientError::OutcomeUnknown {
                                    what: sent_what(&message.routing),
                                    id: message.id.clone(),
                                    waited: started.elapsed(),
                                },
                                false => {
                                    store_refusal(&message.routing, &subject, e, started.elapsed())
                                }
                            });
                        }
                        tracing::debug!(subject, error = %e, "publish not acknowledged; sending again");
                        tokio::time::sleep(resend).await;
                        resend = (resend * 2).min(PAIR_BACKOFF_MAX);
                        continue;
                    }
                    Err(e) => store_refusal(&message.routing, &subject, e, started.elapsed()),
                };
                let full = matches!(
                    refusal,
                    ClientError::StoreFull {
                        limit: StoreLimit::PairFull,
                        ..
                    }
                );
                if !(waits && full) || started.elapsed() + backoff > self.inner.pair_wait {
                    return Err(refusal);
                }
                if backoff == PAIR_BACKOFF_FIRST {
                    tracing::debug!(subject, "pair full: waiting for the recipient to read");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(PAIR_BACKOFF_MAX);
            }
        };
        let refused = refused_publish(&mut violations, &subject);
        tokio::select! {
            ack = publish => Ok(ack?.sequence),
            () = refused => Err(ClientError::PublishRefused { subject }),
        }
    }

    /// Drops the connection to the broker and reconnects at once (subscriptions, consumers and
    /// presence are re-established as after any reconnect).
    pub async fn force_reconnect(&self) -> Result<(), ClientError> {
        self.inner
            .nats
            .force_reconnect()
            .await
            .map_err(nats_err("reconnect"))
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
    /// on the per-identity inbox. A refused publish is [`ClientError::PublishRefused`], a
    /// subject nobody serves [`ClientError::NoResponders`].
    pub async fn control(
        &self,
        service: &str,
        request: &ControlRequest,
    ) -> Result<ControlReply, ClientError> {
        let op = request.op.as_str();
        let subject = self.inner.subjects.ctl(service, self.inner.id.as_str())?;
        let body = serde_json::to_vec(request).map_err(|source| ClientError::Json {
            what: "control request",
            source,
        })?;
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
                _ => nats_err(format!("control {op}"))(e),
            })?;
        serde_json::from_slice(&reply.payload).map_err(|source| ClientError::Json {
            what: "control reply",
            source,
        })
    }

    /// A control request that expects no reply (§5: published without a reply subject).
    pub async fn notify(&self, service: &str, request: &ControlRequest) -> Result<(), ClientError> {
        let subject = self.inner.subjects.ctl(service, self.inner.id.as_str())?;
        let body = serde_json::to_vec(request).map_err(|source| ClientError::Json {
            what: "control request",
            source,
        })?;
        self.inner
            .nats
            .publish(subject.clone(), body.into())
            .await
            .map_err(nats_err(format!("control {} on {subject}", request.op)))
    }

    /// Where a message sent on `routing` goes now, as the appliance counts it (`receipt` on
    /// `ctl.manager`): durable members and how many are away, live subscribers, whether a
    /// DM's target is online, a role's holders online.
    pub async fn receipt(&self, routing: &Routing) -> Result<ops::Receipt, ClientError> {
        let to = ops::ReceiptFor::of(routing);
        self.manager(&ops::Request::Receipt(to)).await
    }

    /// Whether the message this client sent to `routing`, stored at `sequence`, was
    /// acknowledged by its reader (see [`ops::ReadReceipt`]).
    pub async fn read_receipt(
        &self,
        routing: &Routing,
        sequence: u64,
    ) -> Result<ops::ReadReceipt, ClientError> {
        let to = ops::ReceiptFor::of(routing);
        self.manager(&ops::Request::Read(ops::ReadFor { to, sequence }))
            .await
    }

    /// An operation of the appliance's manager (`ctl.manager`, §7; the ops are listed in
    /// [`crate::ops`]): its reply's `data` as `T`, or [`ClientError::Refused`].
    pub async fn manager<T: serde::de::DeserializeOwned>(
        &self,
        request: &ops::Request,
    ) -> Result<T, ClientError> {
        let reply = self
            .control(MANAGER_SERVICE, &request.to_control(self.endpoint()))
            .await?;
        if !reply.ok {
            return Err(ClientError::Refused {
                op: request.op().to_owned(),
                error: reply.error.unwrap_or_default(),
            });
        }
        serde_json::from_value(reply.data.unwrap_or_default()).map_err(|source| ClientError::Json {
            what: "control reply data",
            source,
        })
    }

    /// Publishes the final `offline` presence (§6), leaves nothing durable behind (a
    /// disconnect is not a leave), and drains the connection. Returns what receiving left
    /// unsettled, as [`Client::stop_receiving`]. A connection down for two seconds (a
    /// credential refused, an appliance gone) is not waited for: what needs it is given up.
    pub async fn close(self) -> Settled {
        // Stop the heartbeat first, so that no beat lands after the final `offline`.
        let settled = self.stop_receiving().await;
        self.inner.joined.lock().await.clear();
        if self.inner.announced
            && self
                .unless_down(presence::publish_offline(&self))
                .await
                .is_none()
        {
            tracing::debug!("final offline presence not written: the connection is down");
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), self.inner.nats.drain()).await;
        self.inner.out.close();
        settled
    }

    /// Runs `work`, which needs the broker, unless the connection is down for
    /// [`CLOSE_GRACE`] first (`None` then): a close is not held for a request's timeout by a
    /// broker that refuses this credential now, or is gone.
    async fn unless_down<T>(&self, work: impl std::future::Future<Output = T>) -> Option<T> {
        let mut state = self.inner.state.clone();
        let down = async {
            loop {
                if state
                    .wait_for(|s| *s != ConnectionState::Connected)
                    .await
                    .is_err()
                {
                    return;
                }
                let back = state.wait_for(|s| *s == ConnectionState::Connected);
                if tokio::time::timeout(CLOSE_GRACE, back).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            done = work => Some(done),
            () = down => None,
        }
    }

    /// Stops every background task (heartbeat, roster watch, DM and anycast pulls, backstop,
    /// gap recovery) while the connection stays open: nothing more is pulled, so a copy handed
    /// back now ([`Delivery::nak`]) goes to the next connection, not to a pull of this one.
    /// Only [`Client::close`] should follow. Returns whether what was handled is settled: when
    /// it is not (the connection was cut, the appliance did not answer), the next session of
    /// this identity may be handed some of it again, as at-least-once allows (§4).
    pub async fn stop_receiving(&self) -> Settled {
        // What was surfaced live on a durable channel has a durable copy on its way: acked as a
        // duplicate here, it is not handed to the next session of this identity.
        let unsettled = self.inner.out.settle(deliver::SETTLE).await;
        if unsettled > 0 {
            tracing::debug!(
                unsettled,
                "durable copies of surfaced messages not seen before stopping"
            );
        }
        // The acks of what was handled reach the reader before the session ends, so that the
        // next session of this identity does not get it again.
        let batcher = self
            .inner
            .ack_batcher
            .lock()
            .ok()
            .and_then(|mut b| b.take());
        let mut acks_confirmed = true;
        if let Some((stop, mut task)) = batcher {
            stop.cancel();
            let last = tokio::time::timeout(self.inner.request_timeout, &mut task);
            acks_confirmed = matches!(self.unless_down(last).await, Some(Ok(Ok(true))));
            task.abort();
            if !acks_confirmed {
                tracing::debug!("the last durable acks were not confirmed before stopping");
            }
        }
        self.inner.background.stop().await;
        Settled {
            unsettled,
            acks_confirmed,
        }
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
