//! The manager: the `ctl.manager` transport of [`crate::ops`] (§5, §7, Appendix B).
//!
//! It listens on `cotal.<space>.ctl.manager.*` and, before acting on a request:
//! - takes the sender from the subject (token 4) and requires `from.id` to equal it (§5);
//! - answers only on the sender's own `_INBOX_<sender>.…`: a request whose reply subject is
//!   anything else gets no answer and is not acted on, so nobody can make the privileged
//!   manager publish elsewhere (confused deputy);
//! - requires the sender to be an identity this appliance minted (its record is the caller's
//!   current read ACL, §9 item 6) and the op to be one `ctl` carries.
//!
//! A held sender's DMs or tasks arrive here too (the broker maps them, `space/holds.rs`): they
//! are answered with the hold's refusal and never acted on.
//!
//! Durable membership (§7): `durable-join` records a new interval from the caller's join
//! cursor in the members registry (the stream keeps the messages; the trusted reader reads
//! them from the member's position whenever it is connected); a rejoin while joined returns the open membership unchanged; a rejoin after a leave
//! takes a new cursor (the gap is not durably redelivered). `durable-leave` closes the interval
//! at the current CHAT frontier, and works whatever the caller's ACL is now (leave is the only
//! thing that ends a membership).

use std::sync::Arc;

use futures_util::StreamExt;
use tokio_util::task::TaskTracker;

use super::backstop::{Backstop, BackstopError};
use super::{Context, Health, Service, ServiceError};
use crate::binding::MANAGER_SERVICE;
use crate::ops::{
    self, ChannelRemoved, ChannelsRm, ChannelsSet, CredentialProfile, DurableJoin, DurableLeave,
    IdentityRecord, Membership, OpError, ReplayMark, Request, Resumed, Transport,
};
use crate::protocol::{
    Channel, ChannelPattern, ControlReply, DeliveryClass, is_covered, parse_subject,
};
use crate::space::members::{Interval, MemberRecord, Members, MembersError};
use crate::space::{Held, Hold, Holds, Identities, Space, SpaceError};

/// Why an op was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The request cannot be executed as it is.
    #[error(transparent)]
    Op(#[from] OpError),
    /// The caller may not do this.
    #[error("{0}")]
    Refused(String),
    /// The members registry.
    #[error(transparent)]
    Members(#[from] MembersError),
    /// The trusted reader.
    #[error(transparent)]
    Backstop(#[from] BackstopError),
    /// The space (registry, frontier).
    #[error(transparent)]
    Space(#[from] SpaceError),
    /// A receipt.
    #[error(transparent)]
    Receipt(#[from] super::receipts::ReceiptError),
}

/// The manager of one space.
pub struct Manager {
    space: Arc<Space>,
    identities: Arc<Identities>,
    members: Arc<Members>,
    backstop: Arc<Backstop>,
    receipts: Arc<super::receipts::Receipts>,
}

impl Manager {
    /// The space's trusted reader, which the manager's ops reach.
    pub fn backstop(&self) -> &Arc<Backstop> {
        &self.backstop
    }

    /// The manager of `space`.
    pub fn new(
        space: Arc<Space>,
        identities: Arc<Identities>,
        members: Arc<Members>,
        backstop: Arc<Backstop>,
        receipts: Arc<super::receipts::Receipts>,
    ) -> Self {
        Manager {
            space,
            identities,
            members,
            backstop,
            receipts,
        }
    }

    /// The sender of a request and where its reply may go: only the sender's own
    /// `_INBOX_<sender>.…`, or nowhere (a request published without a reply subject). `None`
    /// for a request that must not be acted on: an unparseable subject, or a reply subject
    /// elsewhere (confused deputy). Checked in arrival order, before anything is spawned.
    fn confine(&self, msg: &async_nats::Message) -> Option<(String, Option<String>)> {
        let sender = parse_subject(msg.subject.as_str()).ok()?.sender.to_owned();
        let own_inbox = crate::binding::inbox_of(&sender);
        match msg.reply.as_ref().map(|r| r.as_str()) {
            Some(r) if r.starts_with(&own_inbox) => Some((sender, Some(r.to_owned()))),
            Some(other) => {
                tracing::warn!(
                    space = self.space.name(),
                    sender,
                    reply = other,
                    "ctl request with a reply subject outside the sender's inbox: ignored"
                );
                None
            }
            None => Some((sender, None)),
        }
    }

    /// Handles one confined request: checks, executes, replies on the sender's inbox. A held
    /// sender's DM or task, which the broker maps here (`space/holds.rs`), is answered as JetStream
    /// answers a refused publish, with the reason.
    async fn serve(&self, msg: async_nats::Message, sender: String, reply_to: Option<String>) {
        if let Some((held, hold)) = hold_of(self.space.holds(), &sender, &msg.payload) {
            if let Some(reply_to) = reply_to {
                let body = serde_json::to_vec(&hold.refusal(held)).unwrap_or_default();
                if let Err(e) = self.space.nats().publish(reply_to, body.into()).await {
                    tracing::debug!(sender, error = %e, "refusal of a held DM not sent");
                }
            }
            return;
        }
        let subject = msg.subject.as_str();
        let max_payload = self.space.nats().server_info().max_payload;
        let checked = crate::binding::frame::accept_control_request(
            subject,
            msg.headers.as_ref(),
            msg.status,
            &msg.payload,
            max_payload,
        );
        let reply = match checked {
            Err(rejection) => {
                self.space.refusals().refuse("manager", subject, &rejection);
                ControlReply::failure(rejection.reason().as_str())
            }
            Ok(accepted) => {
                let request = accepted.request;
                match Request::from_parts(&request.op, request.args) {
                    Err(e) => ops::reply::<(), _>(Err(e)),
                    Ok(request) => ops::reply(self.execute(&sender, request).await),
                }
            }
        };
        if let Some(reply_to) = reply_to {
            let body = serde_json::to_vec(&reply).unwrap_or_default();
            if let Err(e) = self.space.nats().publish(reply_to, body.into()).await {
                tracing::debug!(sender, error = %e, "ctl reply not sent");
            }
        }
    }

    async fn execute(
        &self,
        sender: &str,
        request: Request,
    ) -> Result<serde_json::Value, ManagerError> {
        if !request.served_on(Transport::Control) {
            return Err(OpError::WrongTransport {
                op: request.op(),
                transport: "ctl.manager (it is the machine operator's, on the admin socket)",
            }
            .into());
        }
        let known = match self.identities.get(sender) {
            Some(record) => Some(record),
            // Minted on another node of a cluster a moment ago?
            None => super::identity_sync::fetch(&self.space, &self.identities, sender).await,
        };
        let caller = known.ok_or_else(|| {
            ManagerError::Refused(format!(
                "{sender} is not an identity of space `{}` (mint it with `cotald mint`)",
                self.space.name()
            ))
        })?;
        fn json<T: serde::Serialize>(value: &T) -> serde_json::Value {
            serde_json::to_value(value).unwrap_or_default()
        }
        Ok(match request {
            Request::DurableJoin(req) => json(&self.durable_join(&caller, req).await?),
            Request::DurableLeave(req) => json(&self.durable_leave(&caller, req).await?),
            Request::Memberships => json(&self.memberships(&caller.id)),
            Request::Resume(req) => {
                let consumers = self
                    .backstop
                    .resume(&caller.id, &req.session, req.offers, req.ranges)
                    .await?;
                json(&Resumed {
                    session: req.session,
                    memberships: self.memberships(&caller.id),
                    consumers,
                })
            }
            Request::BackstopAck(req) => {
                self.backstop.ack(&caller.id, &req.tokens).await;
                serde_json::Value::Null
            }
            Request::BackstopWant(req) => {
                self.backstop.want(&caller.id, &req.tokens).await;
                serde_json::Value::Null
            }
            Request::ReplayMark(req) => {
                self.replay_mark(&caller, req).await?;
                serde_json::Value::Null
            }
            Request::ReplayMarks => json(&self.members.marks(&caller.id).await?),
            Request::Receipt(to) => json(&self.receipts.receipt(&caller, &to).await?),
            Request::Read(sent) => json(&self.receipts.read(&caller, &sent).await?),
            Request::ChannelsSet(req) => json(&self.channels_set(&caller, req).await?),
            Request::ChannelsRm(req) => json(&self.channels_rm(&caller, req).await?),
            other => {
                return Err(OpError::WrongTransport {
                    op: other.op(),
                    transport: "ctl.manager",
                }
                .into());
            }
        })
    }

    /// `replay-mark`: only concrete channels the caller may read, at most
    /// [`ReplayMark::MAX`]; the rest is refused whole (a mark is a convenience, never a way to
    /// store data in the registry).
    async fn replay_mark(
        &self,
        caller: &IdentityRecord,
        req: ReplayMark,
    ) -> Result<(), ManagerError> {
        if req.marks.len() > ReplayMark::MAX {
            return Err(ManagerError::Refused(format!(
                "a replay mark carries at most {} channels",
                ReplayMark::MAX
            )));
        }
        let read = caller.read_acl();
        for channel in req.marks.keys() {
            let readable = Channel::new(channel).is_ok_and(|c| is_covered(&read, &c));
            if !readable {
                return Err(ManagerError::Refused(format!(
                    "{channel} is not a channel this identity may read"
                )));
            }
        }
        self.members.mark(&caller.id, &req.marks).await?;
        Ok(())
    }

    fn memberships(&self, member: &str) -> Vec<Membership> {
        self.members
            .of(member)
            .iter()
            .filter(|r| r.open().is_some())
            .filter_map(MemberRecord::membership)
            .collect()
    }

    async fn durable_join(
        &self,
        caller: &IdentityRecord,
        req: DurableJoin,
    ) -> Result<Membership, ManagerError> {
        let channel = concrete(&req.channel)?;
        if !caller.may_read(&channel) {
            return Err(ManagerError::Refused(format!(
                "{channel} is not within {}'s read ACL",
                caller.name
            )));
        }
        let effective = self.space.effective_config(&channel).await?;
        if effective.delivery_class != DeliveryClass::Durable {
            return Err(ManagerError::Refused(format!(
                "{channel} is a live channel: it has no durable membership"
            )));
        }
        if let Some(frontier) = self.space.frontier_below(req.cursor).await? {
            return Err(ManagerError::Refused(format!(
                "join cursor {} is beyond the CHAT frontier {frontier}",
                req.cursor
            )));
        }
        let member = caller.id.as_str();
        let stored = self
            .members
            .update(member, &channel, |stored| {
                Some(match stored {
                    Some(record) if record.open().is_some() => record,
                    Some(mut record) => {
                        record.generation += 1;
                        record.intervals.push(Interval {
                            generation: record.generation,
                            join_cursor: req.cursor,
                            leave_cursor: None,
                            delivered: 0,
                        });
                        record
                    }
                    None => MemberRecord {
                        member: member.to_owned(),
                        channel: channel.clone(),
                        intervals: vec![Interval {
                            generation: 1,
                            join_cursor: req.cursor,
                            leave_cursor: None,
                            delivered: 0,
                        }],
                        generation: 1,
                    },
                })
            })
            .await?;
        let Some(record) = stored else {
            return Err(ManagerError::Refused(
                "the membership was not recorded".into(),
            ));
        };
        let Some(open) = record.open().cloned() else {
            return Err(ManagerError::Refused(
                "the membership was not recorded".into(),
            ));
        };
        self.backstop.memberships_changed(member).await;
        tracing::info!(
            space = self.space.name(),
            member,
            channel,
            cursor = open.join_cursor,
            generation = open.generation,
            "durable join"
        );
        record
            .membership()
            .ok_or_else(|| ManagerError::Refused("the membership was not recorded".into()))
    }

    async fn durable_leave(
        &self,
        caller: &IdentityRecord,
        req: DurableLeave,
    ) -> Result<Membership, ManagerError> {
        let channel = concrete(&req.channel)?;
        let member = caller.id.as_str();
        let frontier = self.space.chat_frontier().await?;
        let stored = self
            .members
            .try_update(member, &channel, |stored| {
                let mut record = stored.filter(|r| r.open().is_some()).ok_or_else(|| {
                    ManagerError::Refused(format!("not durable-joined to {channel}"))
                })?;
                if let Some(last) = record.intervals.last_mut() {
                    last.leave_cursor = Some(frontier);
                }
                Ok::<_, ManagerError>(Some(record))
            })
            .await??;
        let Some(record) = stored else {
            return Err(ManagerError::Refused(format!(
                "not durable-joined to {channel}"
            )));
        };
        let membership = record
            .membership()
            .ok_or_else(|| ManagerError::Refused(format!("not durable-joined to {channel}")))?;
        if let Some(closed) = record.intervals.last()
            && self
                .backstop
                .drained_at_leave(member, &channel, closed)
                .await
        {
            let generation = closed.generation;
            self.backstop
                .delete_interval(member, &channel, generation)
                .await;
            self.members
                .remove_interval(member, &channel, generation)
                .await?;
        }
        tracing::info!(
            space = self.space.name(),
            member,
            channel,
            cursor = frontier,
            "durable leave"
        );
        Ok(membership)
    }

    async fn channels_set(
        &self,
        caller: &IdentityRecord,
        req: ChannelsSet,
    ) -> Result<crate::protocol::ChannelConfig, ManagerError> {
        if caller.profile != CredentialProfile::Admin {
            return Err(ManagerError::Refused(
                "channel configs are written by admin identities".into(),
            ));
        }
        if req.space.as_deref().is_some_and(|s| s != self.space.name()) {
            return Err(ManagerError::Refused(format!(
                "this manager serves space `{}`",
                self.space.name()
            )));
        }
        Ok(self.space.set_channel(&req.channel, &req.config).await?)
    }

    async fn channels_rm(
        &self,
        caller: &IdentityRecord,
        req: ChannelsRm,
    ) -> Result<ChannelRemoved, ManagerError> {
        if caller.profile != CredentialProfile::Admin {
            return Err(ManagerError::Refused(
                "channels are removed by admin identities".into(),
            ));
        }
        if req.space.as_deref().is_some_and(|s| s != self.space.name()) {
            return Err(ManagerError::Refused(format!(
                "this manager serves space `{}`",
                self.space.name()
            )));
        }
        Ok(self.space.remove_channel(&req.channel, req.purge).await?)
    }

    /// Ends every membership of a revoked identity and deletes its backlog.
    pub async fn forget(&self, member: &str) -> Result<(), MembersError> {
        self.backstop.forget(member).await;
        for record in self.members.of(member) {
            self.members
                .update(member, &record.channel, |_| None)
                .await?;
        }
        Ok(())
    }
}

/// A durable membership is per concrete channel, named exactly (nothing is rewritten).
fn concrete(channel: &str) -> Result<String, ManagerError> {
    ChannelPattern::from_policy(channel)
        .ok()
        .filter(ChannelPattern::is_concrete)
        .map(|p| p.as_str().to_owned())
        .ok_or_else(|| {
            ManagerError::Refused(format!(
                "channel {channel:?}: durable membership is per concrete channel, segments from \
                 [A-Za-z0-9_-]; join each channel of a wildcard"
            ))
        })
}

/// The hold a publish of `sender` that the broker mapped here falls under: none for a control
/// request (a JSON object with an `op`, §5); else a task's (`toService`) or a DM's, or, when
/// the payload says neither, whichever the sender is held from.
fn hold_of(holds: &Holds, sender: &str, payload: &[u8]) -> Option<(Held, Hold)> {
    let [dms, tasks] =
        [Held::Dms, Held::Tasks].map(|held| holds.get(held, sender).map(|hold| (held, hold)));
    if dms.is_none() && tasks.is_none() {
        return None;
    }
    let object = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(payload).ok();
    if object.as_ref().is_some_and(|o| o.contains_key("op")) {
        return None;
    }
    match object.is_some_and(|o| o.contains_key("toService")) {
        true => tasks.or(dms),
        false => dms.or(tasks),
    }
}

impl Service for Manager {
    fn name(&self) -> &'static str {
        "manager"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let subject = self.space.names().manager_requests();
        let mut requests = self
            .space
            .nats()
            .queue_subscribe(subject, MANAGER_SERVICE.to_owned())
            .await
            .map_err(ServiceError::at("subscribing to ctl.manager"))?;
        // The subscription is registered once the server answered a round trip after it;
        // JetStream is asked meanwhile.
        let nats = self.space.nats();
        let (flushed, reached) = tokio::join!(nats.flush(), self.space.chat_frontier());
        flushed.map_err(ServiceError::at("subscribing to ctl.manager"))?;
        reached.map_err(ServiceError::at("reaching JetStream"))?;
        ctx.report(Health::Running);
        let handlers = TaskTracker::new();
        let outcome = loop {
            tokio::select! {
                () = ctx.cancelled() => break Ok(()),
                next = requests.next() => match next {
                    Some(msg) => {
                        let Some((sender, reply_to)) = self.confine(&msg) else {
                            continue;
                        };
                        let this = Manager {
                            space: self.space.clone(),
                            identities: self.identities.clone(),
                            members: self.members.clone(),
                            backstop: self.backstop.clone(),
                            receipts: self.receipts.clone(),
                        };
                        handlers.spawn(async move { this.serve(msg, sender, reply_to).await });
                    }
                    None => break Err(ServiceError::msg("the ctl.manager subscription ended")),
                },
            }
        };
        handlers.close();
        handlers.wait().await;
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_senders_publish_is_refused_by_what_it_carries_and_a_control_request_is_served() {
        let holds = Holds::default();
        let hold = Hold {
            unread: 3,
            share: 2,
            store: 16,
        };
        let dm = br#"{"to":{"id":"UBOB"},"parts":[]}"#;
        let task = br#"{"toService":"reviewer","parts":[]}"#;
        let control = br#"{"op":"durable-join","from":{"id":"UMAL"}}"#;
        assert_eq!(hold_of(&holds, "UMAL", dm), None, "nobody is held");

        holds.hold(Held::Tasks, "UMAL", hold);
        assert_eq!(hold_of(&holds, "UMAL", task), Some((Held::Tasks, hold)));
        // Held from tasks only: a mapped DM can only be junk published on a task subject.
        assert_eq!(hold_of(&holds, "UMAL", dm), Some((Held::Tasks, hold)));
        holds.hold(Held::Dms, "UMAL", hold);
        assert_eq!(hold_of(&holds, "UMAL", dm), Some((Held::Dms, hold)));
        assert_eq!(
            hold_of(&holds, "UMAL", b"not json"),
            Some((Held::Dms, hold))
        );
        assert_eq!(hold_of(&holds, "UMAL", control), None, "served as ever");
        assert_eq!(hold_of(&holds, "UCAROL", dm), None, "only the held sender");
    }
}
