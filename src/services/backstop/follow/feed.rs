//! A channel's feed (§8): one task reads the channel once for all of its followers (subjects
//! and headers only, what is new at each [`LINGER`]: `reader.rs`), keeps what some follower has
//! not passed yet, and every [`LINGER`] offers each follower what is due to it, saves the
//! positions that moved and sends back to their own consumers the followers that left, fell
//! behind or do not confirm.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_nats::HeaderMap;
use tokio_util::sync::CancellationToken;

use super::copies::Carry;
use super::follower::{Follower, consider, offer};
use super::reader::Reader;
use super::{CHECKPOINT_EVERY, Demoted, Feeds, MAX_BUFFER, MAX_OUTSTANDING};
use crate::ops::{BATCH_KIND, OFFERS};
use crate::protocol::Channel;
use crate::services::backstop::LINGER;

/// One channel's feed.
pub(super) struct Feed {
    pub(super) channel: String,
    pub(super) name: Channel,
    pub(super) token: CancellationToken,
    pub(super) state: Mutex<State>,
}

impl Feed {
    /// The feed of `channel` (`name`), covering it from `covered_from` on.
    pub(super) fn new(
        channel: &str,
        name: Channel,
        token: CancellationToken,
        covered_from: u64,
    ) -> Self {
        Feed {
            channel: channel.to_owned(),
            name,
            token,
            state: Mutex::new(State {
                covered_from,
                ..State::default()
            }),
        }
    }
}

#[derive(Default)]
pub(super) struct State {
    /// Entries read and not yet passed by every follower's position, in order.
    pub(super) buffer: VecDeque<Entry>,
    /// Every entry of the channel from this sequence on is in the buffer or still to be read.
    pub(super) covered_from: u64,
    pub(super) followers: HashMap<String, Follower>,
    /// Set when the feed stopped: no follower may join it any more.
    pub(super) closed: bool,
}

impl State {
    /// The slowest followers, beside those already `stopping`, for which the feed would hold
    /// more than [`MAX_BUFFER`] entries: they go back to their consumers rather than the feed
    /// holding without bound what they have not confirmed.
    fn behind(&self, stopping: &[(String, bool)]) -> Vec<String> {
        let mut positions: Vec<(u64, &String)> = self
            .followers
            .iter()
            .filter(|(m, _)| !stopping.iter().any(|(s, _)| s == *m))
            .map(|(m, f)| (f.position(), m))
            .collect();
        positions.sort();
        positions
            .into_iter()
            .take_while(|(position, _)| {
                self.buffer.len() - self.buffer.partition_point(|e| e.seq <= *position) > MAX_BUFFER
            })
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Stops the followers `stopping` and those [`State::behind`]: each that goes back to its
    /// own consumer is demoted in `outbox`, from where it stood.
    fn stop(&mut self, channel: &str, mut stopping: Vec<(String, bool)>, outbox: &mut Outbox) {
        let behind = self.behind(&stopping);
        if !behind.is_empty() {
            tracing::debug!(
                channel,
                ?behind,
                "followers behind go back to their consumers"
            );
        }
        stopping.extend(behind.into_iter().map(|m| (m, true)));
        for (member, restart) in stopping {
            if let Some(f) = self.followers.remove(&member) {
                let position = f.position();
                match restart {
                    true => outbox
                        .demote
                        .push((member, f.session, f.generation, position)),
                    false => tracing::debug!(member, channel, "follower's interval is gone"),
                }
            }
        }
    }

    /// Lets go of the entries every follower passed.
    fn trim(&mut self) {
        let floor = self
            .followers
            .values()
            .map(Follower::position)
            .min()
            .unwrap_or(u64::MAX);
        let passed = self.buffer.partition_point(|e| e.seq <= floor);
        if let Some(last) = self.buffer.drain(..passed).next_back() {
            self.covered_from = self.covered_from.max(last.seq + 1);
        }
    }
}

/// One entry as read: its subject and headers, not its content.
pub(super) struct Entry {
    pub(super) seq: u64,
    pub(super) subject: String,
    /// The sender of a chat subject (§3); `None` makes the entry due to no one.
    pub(super) sender: Option<String>,
    /// Its `Nats-Msg-Id`, what it is offered by; without one it is handed over as a copy.
    pub(super) id: Option<String>,
}

/// What a pass over the followers leaves to do once the feed's lock is released.
#[derive(Default)]
pub(super) struct Outbox {
    /// (inbox, offers).
    pub(super) offers: Vec<(String, Vec<u8>)>,
    /// Entries to hand over as copies.
    pub(super) carry: Vec<Carry>,
    /// (member, generation, position) to save.
    pub(super) saves: Vec<(String, u64, u64)>,
    /// Followers that stop: (member, session, generation, position).
    pub(super) demote: Vec<(String, String, u64, u64)>,
}

impl Feeds {
    /// The feed's task: reads the channel from `start`, offers every [`LINGER`], and stops when
    /// no one follows any more (or the reader stops).
    pub(super) async fn read(self: Arc<Self>, feed: Arc<Feed>, start: u64) {
        match Reader::open(&self.space, &feed.channel, start).await {
            Ok(mut reader) => {
                let went_on = self.follow_channel(&feed, &mut reader).await;
                // Stopping with the reader, the appliance may be closing its connection: the
                // consumer is left to lapse rather than a stop waiting on the broker.
                if !feed.token.is_cancelled() {
                    reader.close().await;
                }
                if !went_on {
                    return;
                }
            }
            Err(e) => tracing::warn!(
                channel = feed.channel,
                error = crate::ops::error_text(&e),
                "feed not opened: its followers go back to their consumers"
            ),
        }
        // Stopped with followers: each goes back to its own consumer from where it stood.
        let outbox = {
            let Ok(mut state) = feed.state.lock() else {
                return;
            };
            state.closed = true;
            let mut outbox = Outbox::default();
            for (member, f) in state.followers.drain() {
                let position = f.position();
                outbox
                    .demote
                    .push((member, f.session, f.generation, position));
            }
            outbox
        };
        self.deliver(&feed, outbox).await;
    }

    /// Reads the channel and offers every [`LINGER`] until the feed is cancelled or its
    /// reader fails (true: its followers are to go back to their consumers) or no one follows
    /// any more (false).
    async fn follow_channel(&self, feed: &Feed, reader: &mut Reader) -> bool {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + LINGER, LINGER);
        let mut checkpoint = Instant::now();
        loop {
            tokio::select! {
                () = feed.token.cancelled() => return true,
                () = reader.quiet_ends(), if reader.quiet() => {}
                _ = tick.tick() => {
                    match reader.read().await {
                        Ok(entries) => self.take(feed, entries),
                        Err(e) => {
                            tracing::warn!(
                                channel = feed.channel,
                                error = crate::ops::error_text(&e),
                                "feed stopped: its followers go back to their consumers"
                            );
                            return true;
                        }
                    }
                    let save = checkpoint.elapsed() >= CHECKPOINT_EVERY;
                    if save {
                        checkpoint = Instant::now();
                    }
                    if !self.flush(feed, save).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Takes entries read (subjects and headers): each considered for every follower.
    fn take(&self, feed: &Feed, entries: Vec<Entry>) {
        if entries.is_empty() {
            return;
        }
        let Ok(mut state) = feed.state.lock() else {
            return;
        };
        let state = &mut *state;
        for (member, follower) in state.followers.iter_mut() {
            follower.refresh(&self.identities, &self.members, member, &feed.name);
        }
        let now = Instant::now();
        for entry in entries {
            for (member, follower) in state.followers.iter_mut() {
                consider(follower, member, &entry, now);
            }
            state.buffer.push_back(entry);
        }
    }

    /// Every [`LINGER`]: offers what is fresh, hands over again what waited too long, saves
    /// positions that moved (when `save`), lets go of entries every follower passed, and
    /// stops followers that fell behind or left. False when no one follows any more.
    async fn flush(&self, feed: &Feed, save: bool) -> bool {
        let max_payload = self.space.nats().server_info().max_payload;
        let (outbox, alive) = {
            let Ok(mut state) = feed.state.lock() else {
                return false;
            };
            let state = &mut *state;
            let mut outbox = Outbox::default();
            let stopping = self.serve(feed, state, save, max_payload, &mut outbox);
            state.stop(&feed.channel, stopping, &mut outbox);
            state.trim();
            let alive = !state.followers.is_empty();
            if !alive {
                state.closed = true;
            }
            (outbox, alive)
        };
        if !alive {
            self.unregister(feed);
        }
        self.deliver(feed, outbox).await;
        alive
    }

    /// Offers each follower that goes on what is fresh, hands over again what waited too long,
    /// and records the positions that moved (when `save`); returns the followers that stop,
    /// each with whether it goes back to its consumer.
    fn serve(
        &self,
        feed: &Feed,
        state: &mut State,
        save: bool,
        max_payload: usize,
        outbox: &mut Outbox,
    ) -> Vec<(String, bool)> {
        let mut stopping = Vec::new();
        for (member, follower) in state.followers.iter_mut() {
            follower.refresh(&self.identities, &self.members, member, &feed.name);
            if let Some(restart) = stops(&feed.channel, member, follower) {
                stopping.push((member.clone(), restart));
                continue;
            }
            offer(follower, member, &state.buffer, max_payload, outbox);
            let position = follower.position();
            if save && position > follower.saved {
                follower.saved = position;
                outbox
                    .saves
                    .push((member.clone(), follower.generation, position));
            }
        }
        stopping
    }

    /// Takes a feed no one follows out of the registry, unless another took its place.
    fn unregister(&self, feed: &Feed) {
        if let Ok(mut feeds) = self.feeds.lock()
            && feeds
                .get(&feed.channel)
                .is_some_and(|f| std::ptr::eq(Arc::as_ptr(f), feed))
        {
            feeds.remove(&feed.channel);
        }
    }

    /// Sends, saves and demotes what a pass left to do.
    async fn deliver(&self, feed: &Feed, outbox: Outbox) {
        for (inbox, body) in outbox.offers {
            let mut headers = HeaderMap::new();
            headers.insert(BATCH_KIND, OFFERS);
            let sent = self
                .space
                .nats()
                .publish_with_headers(inbox, headers, body.into())
                .await;
            if let Err(e) = sent {
                // Handed over as copies after the handoff timeout.
                tracing::debug!(channel = feed.channel, error = %e, "offers not sent");
            }
        }
        for carry in outbox.carry {
            self.hand_over(carry).await;
        }
        for (member, generation, position) in outbox.saves {
            self.save(&member, &feed.channel, generation, position)
                .await;
        }
        for (member, session, generation, position) in outbox.demote {
            self.save(&member, &feed.channel, generation, position)
                .await;
            let _ = self.demoted.send(Demoted {
                member,
                session,
                channel: feed.channel.clone(),
                generation,
            });
        }
    }
}

/// Whether `member` stops following `channel`, and if so whether it goes back to its own
/// consumer.
fn stops(channel: &str, member: &str, follower: &Follower) -> Option<bool> {
    match &follower.interval {
        // Gone (delivered, or the identity forgotten): nothing to save.
        None => return Some(false),
        // Left: the leave boundary is kept by its consumer, from where it stood.
        Some(i) if i.leave_cursor.is_some() => return Some(true),
        Some(_) => {}
    }
    let unconfirmed = follower.unconfirmed(Instant::now());
    if unconfirmed > MAX_OUTSTANDING {
        tracing::debug!(
            member,
            channel,
            unconfirmed,
            "a follower that does not confirm goes back to its consumer"
        );
        return Some(true);
    }
    None
}
