//! The trusted backstop reader (§8, §9 item 5): the durable half of a `durable` channel, and
//! the delivery of `@mention` copies.
//!
//! **No write amplification, no cost for the absent.** A message on a durable channel is stored
//! once, in `CHAT_<space>`, which keeps it within its retention (§4 "within retention"). A
//! member's backlog is not a copy but a position: each membership interval (§7:
//! `joinCursor < seq ≤ leaveCursor`) records in the members registry how far it was delivered
//! (`delivered`). Only while the member has a session does this reader hold a pull consumer
//! for the interval (`bk_<member>_<generation>_<channel hash>`), filtered to the channel and
//! starting after that position; when the session ends, the consumer's ack floor is saved as
//! the new position and the consumer deleted. nats-server touches every matching consumer on
//! each store and each eviction, so a consumer per *absent* member would make every publish
//! cost more with each member (measured in `docs/benchmarks.md`); with consumers only for the
//! members that are connected, absent members cost the broker nothing. The broker keeps such a
//! consumer's state in memory (`consumers` says why): a broker restart takes it, and the
//! member's next session starts from the saved position, which its pump saves every few
//! seconds while it moves (what came after is handed over again: at least once). Consumers a
//! crash left in place are parked at the reader's next start. The only copies written are `@mention` copies on live channels, stored once
//! per target in `INBOX_<space>` and read through `bkm_<member>`.
//!
//! **Re-authorized per message.** Before content leaves the broker, each entry is checked
//! against the member's *current* read ACL (the identity record the appliance minted, §9 item
//! 6) and its membership interval; a post-leave entry, an entry of a channel dropped from the
//! ACL, the member's own message, or one of a revoked identity is acknowledged and never sent.
//!
//! **At-least-once handoff.** An authorized entry is sent to the member's own
//! `_INBOX_<id>.backstop` ([`crate::binding::backstop_inbox`]) with the original payload, its chat
//! subject and a token, together with every other entry already received
//! ([`crate::ops::CopyBatch`]: a catch-up costs the broker one message per batch on the way
//! out, not one per entry); the stored entry is acknowledged only when the member acks that token
//! (`backstop-ack` on `ctl.manager`). While the member holds it, the entry's `ack_wait` is
//! extended, up to [`HANDOFF_TIMEOUT`], after which it is handed over again; when the member's
//! session ends (it asked to `resume` again, or its presence went stale) every unacknowledged
//! entry is nak'ed, so the next session gets it at once; a crash of the appliance leaves it
//! pending in JetStream, redelivered after `ack_wait`.
//!
//! **Only for members that are there.** Nothing is pulled for a member without a session: a
//! session starts with the member's `resume` and ends when its heartbeats stop.
//!
//! **One read for the members that follow.** A pump that has caught up waits `LINGER`
//! before it reads on, so a member online on a busy channel gets its durable copies (the net
//! under the live copies it already surfaced) a batch at a time. A member that takes offers
//! (`resume` with `offers`) then leaves its consumer and follows the channel's feed
//! (`follow`): one read of the channel for every such member, with offers in place of
//! copies, so what an online member costs does not grow with every message.
//!
//! # Parts
//!
//! - `session`: a member's delivery session, from its `resume` to the end of its heartbeats;
//!   its acks and wants; the copies it holds.
//! - `consumers`: the consumers made for a session, parked when it ends, deleted when
//!   delivered or revoked.
//! - `pump`: the reading of one consumer, the re-authorization of each entry, the handoff.
//! - `range`: the backlogs members read themselves, granted a range at a time.
//! - `follow`: the channels' feeds, for members that caught up and take offers.
//! - `status`: what waits for each member and for how long (`cotald status`, stalls).

mod consumers;
mod follow;
mod pump;
mod range;
mod session;
mod status;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::follow::{Demoted, Feeds};
use self::session::Session;
use super::presence::PresenceView;
use super::{Context, Health, Service, ServiceError};
use crate::ops::IdentityRecord;
use crate::protocol::ChannelPattern;
use crate::space::members::Members;
use crate::space::{Identities, Space};

/// How long a handed-over copy may stay unacknowledged before JetStream redelivers it (the
/// reader extends it while the member's session lasts).
pub const ACK_WAIT: Duration = Duration::from_secs(10);
/// Copies in flight per consumer (the consumer's `max_ack_pending`).
pub const WINDOW: i64 = 512;
/// How long a member may hold a copy unacknowledged before it is handed over again (the copy
/// may have been lost on the way: the handoff is a plain publish to the member's inbox).
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(30);
/// How often sessions are checked against presence.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Pull batch size.
const BATCH: usize = 256;
/// How long a pump that has caught up waits before it takes what arrived meanwhile. A member
/// with a session is online and surfaces each message from its live copy; its durable copy is
/// the net under that, and read one message at a time it cost the appliance a pull, a handoff
/// and two acks per message per online member. Waiting lets the copies of a fraction of a
/// second go out in one batch (`docs/benchmarks.md`, *The default path at team scale*). A
/// catch-up is not slowed: a pump waits only when the broker says nothing is pending after the
/// last entry it got.
const LINGER: Duration = Duration::from_millis(200);

/// Why the reader could not do something for a member.
#[derive(Debug, thiserror::Error)]
pub enum BackstopError {
    /// The reader is not running (the appliance is starting or stopping).
    #[error("the backstop reader is not running")]
    NotRunning,
    /// A JetStream operation failed.
    #[error("backstop: {action} {consumer}")]
    JetStream {
        /// What was being done.
        action: &'static str,
        /// The consumer.
        consumer: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The stream sequence a token names, when it is of one of `kinds`: `c` a channel copy from a
/// member's consumer, `f` an entry of a channel's feed, `m` a mention copy.
fn token_seq(token: &str, kinds: &[char]) -> Option<u64> {
    token.strip_prefix(kinds)?.parse().ok()
}

/// The member's identity and parsed read ACL, re-read whenever the identities changed.
struct Acl {
    version: u64,
    record: Option<IdentityRecord>,
    read: Vec<ChannelPattern>,
}

impl Acl {
    /// Not read yet: the first [`Acl::refresh`] reads it.
    fn unread() -> Self {
        Acl {
            version: u64::MAX,
            record: None,
            read: Vec::new(),
        }
    }

    fn refresh(&mut self, identities: &Identities, member: &str) {
        let version = identities.version();
        if self.version != version {
            self.version = version;
            self.record = identities.get(member);
            self.read = self
                .record
                .as_ref()
                .map(IdentityRecord::read_acl)
                .unwrap_or_default();
        }
    }
}

/// The trusted reader of one space.
pub struct Backstop {
    space: Arc<Space>,
    identities: Arc<Identities>,
    members: Arc<Members>,
    presence: Arc<PresenceView>,
    sessions: tokio::sync::Mutex<HashMap<String, Arc<Session>>>,
    /// Set while running: the token sessions hang under, the tracker their pumps run on.
    running: Mutex<Option<(CancellationToken, TaskTracker)>>,
    /// The channels' feeds, for members that follow.
    feeds: Arc<Feeds>,
    /// Followers that went back to their consumers (taken by `run`).
    demoted: Mutex<Option<mpsc::UnboundedReceiver<Demoted>>>,
}

impl Backstop {
    /// The reader of `space`.
    pub fn new(
        space: Arc<Space>,
        identities: Arc<Identities>,
        members: Arc<Members>,
        presence: Arc<PresenceView>,
    ) -> Self {
        let (demote, demoted) = mpsc::unbounded_channel();
        let feeds = Feeds::new(space.clone(), identities.clone(), members.clone(), demote);
        Backstop {
            space,
            identities,
            members,
            presence,
            sessions: Default::default(),
            running: Mutex::new(None),
            feeds: Arc::new(feeds),
            demoted: Mutex::new(Some(demoted)),
        }
    }
}

impl Service for Backstop {
    fn name(&self) -> &'static str {
        "backstop"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        // Consumers left by a crash belong to sessions that are gone: park them, so that only
        // members who come back (and `resume`) have one.
        for record in self.members.all() {
            for interval in &record.intervals {
                self.park(&record.member, &record.channel, interval.generation)
                    .await;
            }
        }
        let tracker = TaskTracker::new();
        if let Ok(mut running) = self.running.lock() {
            *running = Some((ctx.token().clone(), tracker.clone()));
        }
        ctx.report(Health::Running);
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        let mut demoted = self.demoted.lock().ok().and_then(|mut d| d.take());
        loop {
            tokio::select! {
                () = ctx.cancelled() => break,
                _ = sweep.tick() => {
                    self.sweep().await;
                    self.report_stalls(&ctx).await;
                }
                Some(d) = async { demoted.as_mut()?.recv().await } => {
                    self.restart_pump(&d.member, Some(&d.session), &d.channel, d.generation).await;
                }
            }
        }
        if let Ok(mut slot) = self.demoted.lock() {
            *slot = demoted;
        }
        if let Ok(mut running) = self.running.lock() {
            *running = None;
        }
        let sessions: Vec<(String, Arc<Session>)> = self.sessions.lock().await.drain().collect();
        for (member, s) in sessions {
            self.end_session(&member, &s).await;
        }
        tracker.close();
        tracker.wait().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_a_sequence_of_its_kind_only() {
        assert_eq!(token_seq("c12", &['c']), Some(12));
        assert_eq!(token_seq("f12", &['f', 'c']), Some(12));
        assert_eq!(token_seq("f12", &['c']), None);
        assert_eq!(token_seq("m3", &['f', 'c']), None);
        assert_eq!(token_seq("c", &['c']), None);
        assert_eq!(token_seq("c1x", &['c']), None);
    }
}
