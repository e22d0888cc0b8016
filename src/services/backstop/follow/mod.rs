//! Members that follow (§8): one read of a durable channel for all of its members that have
//! caught up, and offers instead of copies.
//!
//! A member with a session is online: it surfaces each message of a durable channel from its
//! live copy, and the durable copy is the net under that. Read through the member's own
//! consumer, the net cost the broker one delivery per message per online member, and the
//! appliance a check, a handoff and two acks for each (`docs/benchmarks.md`, *The default
//! path at team scale*). So once a member's consumer has caught up, the member *follows* the
//! channel's [`Feed`] instead, and its consumer is deleted:
//!
//! - **One read per channel, headers only.** The feed reads the channel once for every
//!   follower, subject and headers without the payload, and all that is new in one request
//!   when it is about to offer (`reader.rs`): what an offer needs is the sender (from the
//!   subject, §3) and the message's `Nats-Msg-Id` (which publishers set to its `id`, §8).
//!   Content is fetched by sequence only for what a member asks for, and validated then (§5
//!   receive checks; an anomaly is handed to no one and counts as handled, as on a member's
//!   own consumer).
//! - **Re-authorized per member, per entry** (§9 item 5), as on the member's own consumer:
//!   against its *current* identity record and read ACL, and its membership interval (a
//!   post-leave entry is not due); and again before any content leaves for it.
//! - **Offers, not copies.** A follower is offered the entries due to it as subject, token and
//!   message `id` ([`crate::ops::OfferBatch`]), a batch every [`super::LINGER`]. It
//!   acknowledges the token of what it surfaced already (as it acks a duplicate copy: once the
//!   application handled it) and asks for the content of the rest (`backstop-want`), which is
//!   handed over as a copy with the same token. Nothing is confirmed for it that it did not
//!   confirm.
//! - **Positions, not acks.** A follower's position is the highest sequence such that every
//!   entry up to it was confirmed by the member or was not due. It is saved in the members
//!   registry (`delivered`) every [`CHECKPOINT_EVERY`] and when the follower stops following;
//!   its consumer is made again from there: when its session ends and it comes back, when it
//!   leaves the channel, or when it falls behind (more than [`MAX_OUTSTANDING`] offers
//!   unconfirmed for [`CONFIRM_WITHIN`], or the feed would have to hold more than
//!   [`MAX_BUFFER`] entries for it).
//!   An unconfirmed offer is handed over again as a copy after [`super::HANDOFF_TIMEOUT`]. A
//!   crash of the appliance forgets at most the confirmations since the last save: those
//!   entries are delivered again, so at-least-once holds.
//!
//! The feed's task, which reads the channel (`reader.rs`) and offers (`feed.rs`), and each
//! follower's bookkeeping (`follower.rs`) are apart from the registry of feeds here; what is
//! handed over as content goes through `copies.rs`.

mod copies;
mod feed;
mod follower;
mod reader;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::feed::Feed;
use self::follower::{Follower, consider, still_due};
use super::WINDOW;
use crate::protocol::Channel;
use crate::space::members::Members;
use crate::space::{Identities, Space};

/// A follower with more than this many offers unconfirmed for [`CONFIRM_WITHIN`] goes back to
/// its own consumer (the window its consumer would have had).
const MAX_OUTSTANDING: usize = WINDOW as usize;
/// How long an offer may wait for its confirmation before it counts against
/// [`MAX_OUTSTANDING`]. A member that keeps up confirms a batch of offers within a
/// [`super::LINGER`] or two, however large the batch: a busy channel's offers (thousands per
/// batch at the bench's rates) are not a member falling behind.
const CONFIRM_WITHIN: Duration = Duration::from_secs(1);
/// How long an entry waits before it is offered: its live copy, published at the same moment,
/// has had that long to reach the member and be surfaced, so the member confirms it rather than
/// ask for its content. The feed reads at each [`super::LINGER`], and offers what it read the
/// time before.
const LIVE_FIRST: Duration = Duration::from_millis(100);
/// The most entries a feed holds for its slowest follower before that follower goes back to
/// its own consumer: two seconds of the bench's 16,000 msg/s (subjects and ids, about 8 MiB at
/// most), room for offers a [`super::LINGER`] late and their confirmations a little later.
const MAX_BUFFER: usize = 64 * WINDOW as usize;
/// A pump that caught up hands its interval over to the feed when, a [`super::LINGER`] later, no
/// more than this is pending on its consumer: what a busy channel stored while the pump waited
/// (up to 1,000 entries in the bench, at 16,000 msg/s). The feed reads them from the pump's
/// position on and offers them with the rest; a member on a channel that busy would otherwise
/// stay on its consumer, whose copies cost the broker and the appliance the most per message.
/// A larger backlog is the pump's to read (the catch-up path).
pub(super) const HAND_OVER_PENDING: u64 = 8 * WINDOW as u64;
/// How often a follower's position, or a pump's, is saved while it moves.
pub(super) const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);

/// A follower that stopped following while its session goes on: its consumer is to be made
/// again from its saved position.
#[derive(Debug)]
pub(super) struct Demoted {
    pub member: String,
    pub session: String,
    pub channel: String,
    pub generation: u64,
}

/// Where a member's consumer stood when the member went on to follow its channel.
pub(super) struct Handoff {
    /// The interval's generation.
    pub generation: u64,
    /// Every entry up to this one is handled (the consumer's ack floor).
    pub position: u64,
    /// The highest entry the consumer's pump took: what comes after it is offered.
    pub taken: u64,
    /// Entries after `position` the pump handed over as copies, not acknowledged yet.
    pub held: Vec<u64>,
}

/// Where a member stood when it stopped following a channel.
pub(super) struct Stopped {
    pub channel: String,
    pub generation: u64,
    pub position: u64,
}

/// The feeds of one space, by channel.
pub(super) struct Feeds {
    space: Arc<Space>,
    identities: Arc<Identities>,
    members: Arc<Members>,
    feeds: Mutex<HashMap<String, Arc<Feed>>>,
    demoted: mpsc::UnboundedSender<Demoted>,
}

impl Feeds {
    pub(super) fn new(
        space: Arc<Space>,
        identities: Arc<Identities>,
        members: Arc<Members>,
        demoted: mpsc::UnboundedSender<Demoted>,
    ) -> Self {
        Feeds {
            space,
            identities,
            members,
            feeds: Mutex::default(),
            demoted,
        }
    }

    /// Makes `member` (session `session`) follow `channel` where its consumer stood; false
    /// when the channel's feed is already past it (the member stays on its own consumer).
    pub(super) fn follow(
        self: &Arc<Self>,
        member: &str,
        session: &str,
        channel: &str,
        handoff: &Handoff,
        inbox: String,
        run: (&CancellationToken, &TaskTracker),
    ) -> bool {
        let position = handoff.position;
        let (Ok(name), Ok(mut feeds)) = (Channel::new(channel), self.feeds.lock()) else {
            return false;
        };
        let open = feeds
            .get(channel)
            .filter(|f| f.state.lock().is_ok_and(|s| !s.closed))
            .cloned();
        let (feed, created) = match open {
            Some(feed) => (feed, false),
            None => {
                let feed = Arc::new(Feed::new(channel, name, run.0.child_token(), position + 1));
                feeds.insert(channel.to_owned(), feed.clone());
                (feed, true)
            }
        };
        // The follower is in before the feed's task runs, and a feed that closed meanwhile is
        // not joined (it is closed under the same lock).
        let Ok(mut state) = feed.state.lock() else {
            return false;
        };
        if state.closed || position + 1 < state.covered_from {
            return false;
        }
        let now = Instant::now();
        let mut follower = Follower::new(session, handoff, inbox, now);
        follower.refresh(&self.identities, &self.members, member, &feed.name);
        for entry in state.buffer.iter().filter(|e| e.seq > handoff.taken) {
            consider(&mut follower, member, entry, now);
        }
        state.followers.insert(member.to_owned(), follower);
        drop(state);
        drop(feeds);
        if created {
            let feeds = self.clone();
            run.1
                .spawn(async move { feeds.read(feed, position + 1).await });
        }
        true
    }

    /// Stops `member` following `channel`; where it stood, if it did.
    pub(super) fn unfollow(&self, member: &str, channel: &str) -> Option<Stopped> {
        let feed = self.feeds.lock().ok()?.get(channel).cloned()?;
        let follower = feed.state.lock().ok()?.followers.remove(member)?;
        Some(Stopped {
            channel: channel.to_owned(),
            generation: follower.generation,
            position: follower.position(),
        })
    }

    /// Stops `member` following every channel; where it stood in each.
    pub(super) fn unfollow_all(&self, member: &str) -> Vec<Stopped> {
        let channels: Vec<String> = self
            .feeds
            .lock()
            .map(|f| f.keys().cloned().collect())
            .unwrap_or_default();
        channels
            .iter()
            .filter_map(|c| self.unfollow(member, c))
            .collect()
    }

    fn each(&self) -> Vec<Arc<Feed>> {
        self.feeds
            .lock()
            .map(|f| f.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The entries offered to `member` and not confirmed yet, over every channel it follows.
    pub(super) fn unconfirmed(&self, member: &str) -> Vec<u64> {
        self.each()
            .iter()
            .filter_map(|feed| {
                let state = feed.state.lock().ok()?;
                let follower = state.followers.get(member)?;
                Some(
                    follower
                        .outstanding
                        .keys()
                        .filter(|seq| !follower.fresh.contains(seq))
                        .copied()
                        .collect::<Vec<u64>>(),
                )
            })
            .flatten()
            .collect()
    }

    /// The member confirmed these offers (`backstop-ack` of their tokens).
    pub(super) fn confirm(&self, member: &str, seqs: &[u64]) {
        for feed in self.each() {
            if let Ok(mut state) = feed.state.lock()
                && let Some(follower) = state.followers.get_mut(member)
            {
                for seq in seqs {
                    follower.outstanding.remove(seq);
                }
            }
        }
    }

    /// The member asks for the content of these offers: those still due to it are handed over
    /// as copies.
    pub(super) async fn want(&self, member: &str, seqs: &[u64]) {
        let mut carry = Vec::new();
        for feed in self.each() {
            let Ok(mut state) = feed.state.lock() else {
                continue;
            };
            let state = &mut *state;
            let Some(follower) = state.followers.get_mut(member) else {
                continue;
            };
            follower.refresh(&self.identities, &self.members, member, &feed.name);
            let asked = seqs
                .iter()
                .copied()
                .filter(|s| follower.outstanding.contains_key(s))
                .collect();
            let items = still_due(follower, member, &state.buffer, asked);
            carry.push((member.to_owned(), follower.inbox.clone(), items));
        }
        for c in carry {
            self.hand_over(c).await;
        }
    }

    /// Saves a member's position in one interval as its `delivered` (a follower's, or a parked
    /// consumer's ack floor); a failure only means entries are handed over again.
    pub(super) async fn save(&self, member: &str, channel: &str, generation: u64, position: u64) {
        let saved = self
            .members
            .update(member, channel, |stored| {
                stored.map(|mut r| {
                    for i in r
                        .intervals
                        .iter_mut()
                        .filter(|i| i.generation == generation)
                    {
                        i.delivered = i.delivered.max(position);
                    }
                    r
                })
            })
            .await;
        if let Err(e) = saved {
            tracing::warn!(member, channel, error = %e, "backstop position not saved; entries will be handed over again");
        }
    }
}
