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

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::{self, AckKind};

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
                    max_ack_pending: 1024,
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
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(256)
            .heartbeat(Duration::from_secs(5))
            .messages()
            .await
            .map_err(ServiceError::at("reading CHAT"))?;
        ctx.report(Health::Running);
        loop {
            let Some(msg) = super::next_read(&ctx, &mut messages, "the CHAT reader").await? else {
                return Ok(());
            };
            let outcome = if self.route(&msg).await {
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
