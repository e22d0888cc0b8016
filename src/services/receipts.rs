//! Receipts (`receipt` on `ctl.manager`): where a message the caller sent goes, counted from
//! what the appliance knows at the moment of asking: the members registry (durable members,
//! §7), the presence view (who is online, §6), the minted identities (who holds a role) and
//! the broker's connection list over the system account (who is subscribed live, as the
//! membership feed of §8 reads it). Display only, like that feed: nothing here decides a
//! delivery. A count that cannot be established is left out (unknown), never guessed.
//!
//! The caller may ask only about where it may send: a channel its post ACL covers, an
//! instance, a role. The answer holds counts, never who.
//!
//! Read receipts (`read` on `ctl.manager`) answer for one message the caller sent, named by its
//! stream sequence: the stored message must be the caller's, on the subject it names (a
//! sequence is not a way to learn about another's messages). A DM or task is placed against
//! the reading durable's ack floor and delivered position (§8); a durable-channel message
//! against the positions the members registry saved (§7), a lower bound while members read.
//! A message no longer stored (a DM pair the warden trimmed once read, an entry past
//! retention) cannot be checked: it is read when the floor passed it, else unknown.

use std::sync::Arc;

use tokio::sync::OnceCell;

use super::ServiceError;
use super::membership::{BrokerView, live_subscriptions};
use super::presence::PresenceView;
use crate::binding::{dm_durable, svc_durable};
use crate::ops::receipt::{ReadState, Tier};
use crate::ops::{CredentialProfile, IdentityRecord, ReadFor, ReadReceipt, Receipt, ReceiptFor};
use crate::protocol::{Channel, ChannelPattern, DeliveryClass, is_covered};
use crate::space::members::Members;
use crate::space::{Identities, Space, SpaceError};

/// Why a receipt was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    /// The caller may not send there, or the target is not a valid name.
    #[error("{0}")]
    Refused(String),
    /// The channel registry could not be read.
    #[error(transparent)]
    Space(#[from] SpaceError),
}

/// The receipts of one space.
pub struct Receipts {
    space: Arc<Space>,
    identities: Arc<Identities>,
    members: Arc<Members>,
    presence: Arc<PresenceView>,
    view: BrokerView,
    /// The system-account connection, made at the first receipt that needs it.
    reader: OnceCell<async_nats::Client>,
}

impl Receipts {
    /// The receipts of `space`.
    pub fn new(
        space: Arc<Space>,
        identities: Arc<Identities>,
        members: Arc<Members>,
        presence: Arc<PresenceView>,
        view: BrokerView,
    ) -> Self {
        Receipts {
            space,
            identities,
            members,
            presence,
            view,
            reader: OnceCell::new(),
        }
    }

    /// Where a message from `caller` to `to` goes now.
    pub async fn receipt(
        &self,
        caller: &IdentityRecord,
        to: &ReceiptFor,
    ) -> Result<Receipt, ReceiptError> {
        let mut receipt = Receipt::unknown(Tier::Dm);
        match to {
            ReceiptFor::Channel(name) => {
                let channel = Channel::new(name)
                    .map_err(|e| ReceiptError::Refused(format!("invalid channel: {e}")))?;
                let unrestricted = caller.profile == CredentialProfile::Admin;
                if !unrestricted && !caller.may_post(name) {
                    return Err(ReceiptError::Refused(format!(
                        "you may not post to #{name}, so it has no receipt for you"
                    )));
                }
                let effective = self.space.effective_config(name).await?;
                receipt.live_now = self.live_now(&caller.id, &channel).await;
                receipt.tier = match effective.delivery_class {
                    DeliveryClass::Live => Tier::Live,
                    DeliveryClass::Durable => {
                        let members: Vec<String> = self
                            .members
                            .all()
                            .into_iter()
                            .filter(|r| r.channel == *name && r.member != caller.id)
                            .filter(|r| r.open().is_some())
                            .map(|r| r.member)
                            .collect();
                        let away = members.iter().filter(|m| !self.online(m)).count();
                        receipt.durable_members = Some(members.len() as u32);
                        receipt.durable_away = Some(away as u32);
                        Tier::Durable
                    }
                };
            }
            ReceiptFor::To(target) => {
                receipt.tier = Tier::Dm;
                let record = self.identities.get(target);
                receipt.target = record.map(|r| r.name);
                receipt.target_online = Some(self.online(target));
            }
            ReceiptFor::Role(role) => {
                receipt.tier = Tier::Task;
                let holders: Vec<IdentityRecord> = self
                    .identities
                    .active()
                    .into_iter()
                    .filter(|r| r.role.as_deref() == Some(role))
                    .collect();
                let online = holders.iter().filter(|r| self.online(&r.id)).count();
                receipt.role_holders = Some(holders.len() as u32);
                receipt.role_online = Some(online as u32);
            }
        }
        Ok(receipt)
    }

    /// Whether the message `sent` names, which `caller` sent, was acknowledged by its reader.
    pub async fn read(
        &self,
        caller: &IdentityRecord,
        sent: &ReadFor,
    ) -> Result<ReadReceipt, ReceiptError> {
        let names = self.space.names();
        let mut receipt = ReadReceipt {
            tier: Tier::Dm,
            state: None,
            due_to: None,
            read_by_at_least: None,
        };
        let (stream, target) = match &sent.to {
            ReceiptFor::Channel(name) => {
                let effective = self.space.effective_config(name).await?;
                if effective.delivery_class == DeliveryClass::Live {
                    receipt.tier = Tier::Live;
                    return Ok(receipt);
                }
                receipt.tier = Tier::Durable;
                (names.chat_stream(), name.as_str())
            }
            ReceiptFor::To(target) => (names.dm_stream(), target.as_str()),
            ReceiptFor::Role(role) => {
                receipt.tier = Tier::Task;
                (names.task_stream(), role.as_str())
            }
        };
        let stored = self.senders_message(&stream, sent.sequence).await;
        match &stored {
            Some((sender, to)) if sender != &caller.id || to != target => {
                return Err(ReceiptError::Refused(format!(
                    "message {} is not one you sent there",
                    sent.sequence
                )));
            }
            _ => {}
        }
        let durable = match &sent.to {
            ReceiptFor::Channel(name) => {
                let due: Vec<_> = self
                    .members
                    .all()
                    .into_iter()
                    .filter(|r| r.channel == *name && r.member != caller.id)
                    .filter_map(|r| {
                        r.intervals
                            .iter()
                            .find(|i| i.contains(sent.sequence))
                            .cloned()
                    })
                    .collect();
                if stored.is_some() {
                    receipt.due_to = Some(due.len() as u32);
                    receipt.read_by_at_least =
                        Some(due.iter().filter(|i| i.delivered >= sent.sequence).count() as u32);
                }
                return Ok(receipt);
            }
            ReceiptFor::To(target) => dm_durable(target),
            ReceiptFor::Role(role) => svc_durable(role),
        };
        let Ok(info) = self.consumer_info(&stream, &durable).await else {
            return Ok(receipt);
        };
        receipt.state = if info.ack_floor.stream_sequence >= sent.sequence {
            Some(ReadState::Read)
        } else if stored.is_none() {
            None
        } else if info.delivered.stream_sequence >= sent.sequence {
            Some(ReadState::Delivered)
        } else {
            Some(ReadState::Waiting)
        };
        Ok(receipt)
    }

    /// The sender and route target (the channel, the target instance or the role) of the
    /// message stored at `sequence` in `stream`; `None` when it is not stored (any more).
    async fn senders_message(&self, stream: &str, sequence: u64) -> Option<(String, String)> {
        let stream = self
            .space
            .jetstream()
            .get_stream_no_info(stream)
            .await
            .ok()?;
        let stored = stream.get_raw_message(sequence).await.ok()?;
        let parsed = crate::protocol::parse_subject(&stored.subject).ok()?;
        Some((parsed.sender.to_owned(), parsed.rest.to_owned()))
    }

    /// The info of `durable` on `stream`, in one request.
    async fn consumer_info(
        &self,
        stream: &str,
        durable: &str,
    ) -> Result<async_nats::jetstream::consumer::Info, Box<dyn std::error::Error + Send + Sync>>
    {
        let stream = self.space.jetstream().get_stream_no_info(stream).await?;
        Ok(stream.consumer_info(durable).await?)
    }

    /// Whether `id` is online by the liveness rule (§6).
    fn online(&self, id: &str) -> bool {
        self.presence.get(id).is_some_and(|h| h.is_live())
    }

    /// How many instances other than `sender` (and observers) are subscribed to `channel`
    /// now; `None` when the broker did not say.
    async fn live_now(&self, sender: &str, channel: &Channel) -> Option<u32> {
        let reader = self
            .reader
            .get_or_try_init(|| self.view.connect(self.space.name(), "receipts"))
            .await
            .map_err(|e| tracing::debug!(error = %e, "no broker view for receipts"))
            .ok()?;
        let live = live_subscriptions(&self.space, reader)
            .await
            .map_err(|e: ServiceError| tracing::debug!(error = %e, "live subscriptions unknown"))
            .ok()?;
        // An observer (the dashboard's among them) reads everything for display: not a reader
        // the sender is told about.
        let observer = |id: &str| {
            self.identities
                .get(id)
                .is_some_and(|r| r.profile == CredentialProfile::Observer)
        };
        let count = live
            .iter()
            .filter(|(id, _)| id.as_str() != sender && !observer(id))
            .filter(|(_, patterns)| {
                let patterns: Vec<ChannelPattern> = patterns
                    .iter()
                    .filter_map(|p| ChannelPattern::new(p).ok())
                    .collect();
                is_covered(&patterns, channel)
            })
            .count();
        Some(count as u32)
    }
}
