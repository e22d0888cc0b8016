//! Durable copies of `@mentions` on `live` channels (§4, §5, §8).
//!
//! A `live` channel is at-most-once: a peer that is away misses it. A message that mentions a
//! peer by name is the exception: each mentioned target that may read the channel gets a
//! durable copy, stored once in the backstop store (`INBOX_<space>`, subject
//! `cotal.<space>.backstop.<target>.m`) and delivered by the trusted reader like any durable
//! copy (re-authorized, at-least-once, acked by the member).
//!
//! The router reads CHAT through one durable consumer of its own (`cotald_mentions`), so a
//! message published while the appliance was down is routed when it is back. For each message
//! that names anyone:
//! - the channel's effective class comes from the one resolution of §7; only `live` channels
//!   get copies (a `durable` channel's members have the backstop already);
//! - each lowercased name resolves to one instance: the single *live* presence entry with that
//!   name (§4: ambiguous → no copy); when nobody of that name is live, the identity minted under
//!   that name (names are unique within a space), so that an authorized but offline target
//!   still gets it;
//! - the target must be able to read the channel now (its current read ACL, §9 item 6), and is
//!   never the sender.
//!
//! A copy is stored with `Nats-Msg-Id = <message id>.<target>`, so a router that crashed after
//! storing it and reads the message again stores nothing twice; the CHAT entry is acknowledged
//! only after every copy is stored.
//!
//! The router reads in bursts: while CHAT is quiet one pull of one entry waits at the broker
//! (the next message answers it at once); then it fetches what is new, again at once while the
//! broker says more is waiting, else after a `LINGER` (5 ms), until a fetch finds nothing. Read as
//! each entry was stored, every message of the space, mentions or not, cost the broker a
//! delivery and the appliance a wake: sent one at a time, most of the appliance's work per
//! message (`docs/benchmarks.md`, *The mention router reads in bursts*). A copy is stored up
//! to a `LINGER` later for it.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::{self, AckKind};
use futures_util::StreamExt;

use super::backstop::Backstop;
use super::presence::PresenceView;
use super::{Context, Health, Service, ServiceError};
use crate::binding::SpaceNames;
use crate::binding::frame::accept_delivery;
use crate::ops::COPY_SUBJECT;
use crate::protocol::{DeliveryClass, DeliveryKind};
use crate::space::{Identities, Space};

/// The router's consumer on CHAT.
pub const CONSUMER: &str = "cotald_mentions";
/// How long routing waits for the presence view to hold what the bucket holds.
const PRESENCE_CATCH_UP: Duration = Duration::from_secs(2);
/// How long the router lets CHAT's new entries gather, once it has read all there were,
/// before it reads again. CHAT keeps 1,000 entries per sender and channel: a sender would have
/// to store more than that within one LINGER and the routing of one burst (200,000 messages a
/// second) for an entry to go before it is read. At 20 ms, entries of a flood in a test went
/// (`it::durable::a_flood_of_posts_has_each_mention_copied_once`).
const LINGER: Duration = Duration::from_millis(5);
/// Most entries one read asks for (the consumer's `max_ack_pending`).
const READ_AT_ONCE: usize = 1024;
/// Most bytes one read asks for.
const READ_BYTES: usize = 8 * 1024 * 1024;
/// How long the pull of a quiet CHAT waits at the broker before the router asks again.
const QUIET_WAIT: Duration = Duration::from_secs(5);
/// How long a read may go unanswered before it counts as failed (the service is restarted).
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// The mention router of one space.
pub struct Mentions {
    space: Arc<Space>,
    identities: Arc<Identities>,
    presence: Arc<PresenceView>,
    /// Told of every copy stored, so that an online target's copies are pumped.
    backstop: Arc<Backstop>,
}

impl Mentions {
    /// The router of `space`.
    pub fn new(
        space: Arc<Space>,
        identities: Arc<Identities>,
        presence: Arc<PresenceView>,
        backstop: Arc<Backstop>,
    ) -> Self {
        Mentions {
            space,
            identities,
            presence,
            backstop,
        }
    }

    async fn consumer(&self) -> Result<jetstream::consumer::Consumer<pull::Config>, ServiceError> {
        let stream = self
            .space
            .jetstream()
            .get_stream_no_info(self.space.names().chat_stream())
            .await
            .map_err(ServiceError::at("opening CHAT"))?;
        stream
            .get_or_create_consumer(
                CONSUMER,
                pull::Config {
                    durable_name: Some(CONSUMER.to_owned()),
                    filter_subject: self.space.names().all_posts(),
                    // Routing starts with the first start of the router; older messages were
                    // published when nobody promised mention copies.
                    deliver_policy: DeliverPolicy::New,
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: Duration::from_secs(30),
                    max_ack_pending: READ_AT_ONCE as i64,
                    ..Default::default()
                },
            )
            .await
            .map_err(ServiceError::at("creating the mention router's consumer"))
    }

    /// Routes one CHAT message; returns whether it may be acknowledged.
    async fn route(&self, msg: &jetstream::Message) -> bool {
        // Most messages mention nobody: skip them without parsing.
        if !contains(&msg.payload, b"\"mentions\"") {
            return true;
        }
        let max_payload = self.space.nats().server_info().max_payload;
        let accepted = match accept_delivery(
            msg.subject.as_str(),
            msg.headers.as_ref(),
            msg.status,
            &msg.payload,
            max_payload,
        ) {
            Ok(accepted) => accepted,
            Err(rejection) => {
                self.space
                    .refusals()
                    .refuse("mentions", msg.subject.as_str(), &rejection);
                return true;
            }
        };
        if accepted.kind != DeliveryKind::Channel || accepted.message.mentions.is_empty() {
            return true;
        }
        let channel = accepted.route.as_str();
        let class = match self.space.effective_config(channel).await {
            Ok(effective) => effective.delivery_class,
            Err(e) => {
                tracing::warn!(space = self.space.name(), channel, error = %e,
                    "mention not routed yet: the channel registry is unreadable");
                return false;
            }
        };
        if class != DeliveryClass::Live {
            tracing::debug!(
                space = self.space.name(),
                channel,
                "mentions on a durable channel: no copy"
            );
            return true;
        }
        // Names resolve against presence as it is now: every record stored so far.
        if !self.presence_now().await {
            return false;
        }
        for name in &accepted.message.mentions {
            let Some(target) = self.copy_target(name, channel, accepted.sender()) else {
                continue;
            };
            if let Err(e) = self.store(msg, &accepted.message.id, &target).await {
                tracing::warn!(space = self.space.name(), channel, target, error = %e,
                    "mention copy not stored; the message is routed again");
                return false;
            }
            tracing::debug!(
                space = self.space.name(),
                channel,
                target,
                "mention copy stored"
            );
            self.backstop.mention_stored(&target).await;
        }
        true
    }

    /// The instance `name` designates, when it gets a copy of a post of `sender` on
    /// `channel`: never the sender, and only one that may read the channel now.
    fn copy_target(&self, name: &str, channel: &str, sender: &str) -> Option<String> {
        let space = self.space.name();
        let Some(target) = self.resolve(name) else {
            tracing::debug!(
                space,
                channel,
                name,
                "mention not copied: no one instance of that name"
            );
            return None;
        };
        if target == sender {
            return None;
        }
        if !self
            .identities
            .get(&target)
            .is_some_and(|record| record.may_read(channel))
        {
            tracing::debug!(
                space,
                channel,
                name,
                target,
                "mention not copied: the target may not read the channel"
            );
            return None;
        }
        Some(target)
    }

    /// Waits until the presence view holds every record stored in the bucket so far; false
    /// when it cannot tell (the message is then routed again shortly).
    async fn presence_now(&self) -> bool {
        let bucket = self.space.names().presence_bucket();
        let info = match self
            .space
            .jetstream()
            .get_stream_no_info(SpaceNames::kv_stream(&bucket))
            .await
        {
            Ok(stream) => stream.get_info().await.map(|i| i.state),
            Err(e) => {
                tracing::debug!(error = %e, "presence bucket unreadable");
                return false;
            }
        };
        let state = match info {
            Ok(state) => state,
            Err(e) => {
                tracing::debug!(error = %e, "presence bucket unreadable");
                return false;
            }
        };
        // Every record expired: nothing is left for the view to catch up with.
        let stored = if state.messages == 0 {
            0
        } else {
            state.last_sequence
        };
        self.presence.caught_up(stored, PRESENCE_CATCH_UP).await
    }

    /// The one instance `name` designates (§4): the single live one, else the minted identity
    /// of that name; `None` when ambiguous or unknown.
    fn resolve(&self, name: &str) -> Option<String> {
        let live = self.presence.live_named(name);
        match live.as_slice() {
            [one] => Some(one.clone()),
            [] => self
                .identities
                .active()
                .into_iter()
                .find(|r| r.name.to_lowercase() == name)
                .map(|r| r.id),
            _ => None,
        }
    }

    async fn store(
        &self,
        msg: &jetstream::Message,
        id: &str,
        target: &str,
    ) -> Result<(), ServiceError> {
        let mut headers = HeaderMap::new();
        headers.insert(COPY_SUBJECT, msg.subject.as_str());
        headers.insert("Nats-Msg-Id", format!("{id}.{target}").as_str());
        self.space
            .jetstream()
            .publish_with_headers(
                self.space.names().mentions_for(target),
                headers,
                msg.payload.clone(),
            )
            .await
            .map_err(ServiceError::at("storing a mention copy"))?
            .await
            .map_err(ServiceError::at("storing a mention copy"))?;
        Ok(())
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

impl Service for Mentions {
    fn name(&self) -> &'static str {
        "mentions"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let consumer = self.consumer().await?;
        ctx.report(Health::Running);
        let fetch = || {
            consumer
                .fetch()
                .max_messages(READ_AT_ONCE)
                .max_bytes(READ_BYTES)
                .messages()
        };
        loop {
            // Quiet: one pull of one entry waits at the broker; the next message answers it.
            let quiet = consumer
                .batch()
                .max_messages(1)
                .expires(QUIET_WAIT)
                .messages();
            let Some(woken) = ask(&ctx, quiet).await? else {
                return Ok(());
            };
            let Some(mut burst) = take(&ctx, woken).await? else {
                return Ok(());
            };
            // Busy: what is new is read in bursts until a read finds nothing. The next burst
            // is asked for while this one is routed when the broker said more is waiting (its
            // entries are then in hand before more of the same sender's could push them out of
            // CHAT); else once this one is routed and a LINGER has passed.
            while !burst.entries.is_empty() {
                let ahead = match burst.pending > 0 {
                    true => match ask(&ctx, fetch()).await? {
                        Some(asked) => Some(asked),
                        None => return Ok(()),
                    },
                    false => None,
                };
                for msg in &burst.entries {
                    self.route_and_ack(msg).await;
                }
                let next = match ahead {
                    Some(asked) => asked,
                    None => {
                        tokio::select! {
                            () = ctx.cancelled() => return Ok(()),
                            () = tokio::time::sleep(LINGER) => {}
                        }
                        let Some(asked) = ask(&ctx, fetch()).await? else {
                            return Ok(());
                        };
                        asked
                    }
                };
                let Some(next) = take(&ctx, next).await? else {
                    return Ok(());
                };
                burst = next;
            }
        }
    }
}

impl Mentions {
    /// Routes one entry and acknowledges it, or asks for it again shortly when it cannot be
    /// routed yet.
    async fn route_and_ack(&self, msg: &jetstream::Message) {
        let outcome = if self.route(msg).await {
            msg.ack().await
        } else {
            msg.ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await
        };
        if let Err(e) = outcome {
            tracing::debug!(error = %e, "mention router ack not sent; the message comes again");
        }
    }
}

/// What one read of CHAT brought.
struct Burst {
    entries: Vec<jetstream::Message>,
    /// How many more entries matched the consumer after the last of them, as the broker said.
    pending: u64,
}

/// The read `pull` asks CHAT for, once asked (within [`ANSWER_WITHIN`]); `None` when the
/// service is stopping.
async fn ask<E>(
    ctx: &Context,
    pull: impl Future<Output = Result<pull::Batch, E>>,
) -> Result<Option<pull::Batch>, ServiceError>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let asked = tokio::select! {
        () = ctx.cancelled() => return Ok(None),
        asked = tokio::time::timeout(ANSWER_WITHIN, pull) => asked,
    };
    match asked {
        Err(_) => Err(unanswered(ANSWER_WITHIN)),
        Ok(Err(e)) => Err(ServiceError::new("the CHAT reader failed", e)),
        Ok(Ok(batch)) => Ok(Some(batch)),
    }
}

/// Every entry `batch` brings; `None` when the service is stopping.
async fn take(ctx: &Context, mut batch: pull::Batch) -> Result<Option<Burst>, ServiceError> {
    let mut burst = Burst {
        entries: Vec::new(),
        pending: 0,
    };
    loop {
        let next = tokio::select! {
            () = ctx.cancelled() => return Ok(None),
            next = tokio::time::timeout(QUIET_WAIT + ANSWER_WITHIN, batch.next()) => next,
        };
        match next {
            Err(_) => return Err(unanswered(QUIET_WAIT + ANSWER_WITHIN)),
            Ok(None) => return Ok(Some(burst)),
            Ok(Some(Err(e))) => return Err(ServiceError::new("the CHAT reader failed", e)),
            Ok(Some(Ok(msg))) => {
                burst.pending = msg.info().map_or(0, |info| info.pending);
                burst.entries.push(msg);
            }
        }
    }
}

fn unanswered(within: Duration) -> ServiceError {
    ServiceError::msg(format!("the CHAT reader had no answer within {within:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_mentions_field() {
        assert!(contains(br#"{"mentions":["bob"]}"#, b"\"mentions\""));
        assert!(!contains(br#"{"text":"mention me"}"#, b"\"mentions\""));
        assert!(!contains(b"", b"\"mentions\""));
    }
}
