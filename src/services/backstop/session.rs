//! A member's delivery session (§8): it starts with the member's `resume` and ends when its
//! heartbeats stop (or it resumes again). While it lasts, a pump reads each of the member's
//! consumers, the copies handed over are held (their `ack_wait` extended) until the member
//! acknowledges them, and the member's `backstop-ack` and `backstop-want` are served; when it
//! ends, every held copy is nak'ed for the next session and each interval's consumer is parked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind};
use tokio_util::sync::CancellationToken;

use super::follow::Stopped;
use super::pump::{Pump, Source};
use super::range::Grants;
use super::{Backstop, BackstopError, HANDOFF_TIMEOUT, token_seq};
use crate::binding::{interval_consumer, mention_consumer};

/// How often held copies get their `ack_wait` extended.
const PROGRESS_EVERY: Duration = Duration::from_secs(3);

/// A copy handed to the member and not acknowledged yet.
pub(super) struct Held {
    pub(super) message: jetstream::Message,
    /// When it was handed over.
    pub(super) handed: Instant,
    /// When its `ack_wait` was last extended.
    pub(super) since: Instant,
}

/// One member's delivery session.
pub(super) struct Session {
    pub(super) name: String,
    /// Whether the member takes offers, so that it may follow its channels' feeds.
    pub(super) offers: bool,
    /// Whether the member reads its backlogs itself when granted a range of each.
    pub(super) ranges: bool,
    /// The ranges granted to it.
    pub(super) grants: Arc<Grants>,
    token: CancellationToken,
    started: Instant,
    pub(super) held: Arc<Mutex<HashMap<String, Held>>>,
    /// Consumer name → its pump.
    pumps: Mutex<HashMap<String, PumpHandle>>,
    /// Whether the member keeps up.
    pub(super) progress: Mutex<Progress>,
}

/// Whether a member keeps up with its copies: when it last acknowledged one, and when it last
/// had none waiting. A member that has copies waiting and acknowledged none of them since the
/// later of the two is stuck for that long (the age of its oldest pending copy, counted while
/// it was connected).
pub(super) struct Progress {
    acked: Instant,
    clear: Instant,
}

impl Progress {
    fn new() -> Self {
        let now = Instant::now();
        Progress {
            acked: now,
            clear: now,
        }
    }

    /// How long the member has had `waiting` copies without acknowledging any.
    pub(super) fn stuck_for(&mut self, waiting: usize, now: Instant) -> Duration {
        if waiting == 0 {
            self.clear = now;
        }
        now.duration_since(self.acked.max(self.clear))
    }
}

/// A running pump as its session sees it.
struct PumpHandle {
    token: CancellationToken,
    /// (channel, generation) of an interval's pump; `None` for the mention pump.
    interval: Option<(String, u64)>,
}

impl Backstop {
    /// `resume`: starts a new delivery session for `member` named `session`, ending the
    /// previous one (whose unacknowledged copies are delivered again); returns the consumers
    /// whose backlog the session hands over.
    pub async fn resume(
        &self,
        member: &str,
        session: &str,
        offers: bool,
        ranges: bool,
    ) -> Result<Vec<String>, BackstopError> {
        let (root, tracker) = self
            .running
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .ok_or(BackstopError::NotRunning)?;
        let fresh = Arc::new(Session {
            name: session.to_owned(),
            offers,
            ranges,
            grants: Arc::default(),
            token: root.child_token(),
            started: Instant::now(),
            held: Arc::default(),
            pumps: Mutex::default(),
            progress: Mutex::new(Progress::new()),
        });
        let old = self
            .sessions
            .lock()
            .await
            .insert(member.to_owned(), fresh.clone());
        if let Some(old) = old {
            self.end_session(member, &old).await;
        }
        let consumers = self.start_pumps(member, &fresh).await;
        // Held copies get their `ack_wait` extended while the session lasts.
        tracker.spawn(keep_held(fresh.held.clone(), fresh.token.clone()));
        tracing::debug!(
            space = self.space.name(),
            member,
            session,
            "backstop session started"
        );
        Ok(consumers)
    }

    /// Starts a pump for every consumer of `member` that has none in `session`; returns the
    /// consumers it started. The mention consumer is made and pumped only once the member has
    /// mention copies stored ([`Backstop::has_mention_copies`]).
    async fn start_pumps(&self, member: &str, session: &Arc<Session>) -> Vec<String> {
        let mut started = Vec::new();
        let Some(run) = self.running.lock().ok().and_then(|r| r.clone()) else {
            return started;
        };
        let mentions = mention_consumer(member);
        let pumped = |consumer: &str| session.pumps.lock().is_ok_and(|p| p.contains_key(consumer));
        let mut wanted = Vec::new();
        if !pumped(&mentions) && self.has_mention_copies(member).await {
            wanted.push((mentions, Source::Mention));
        }
        for record in self.members.of(member) {
            for interval in &record.intervals {
                wanted.push((
                    interval_consumer(member, &record.channel, interval.generation),
                    Source::Chat {
                        channel: record.channel.clone(),
                        interval: interval.clone(),
                    },
                ));
            }
        }
        for (consumer, source) in wanted {
            let interval = match &source {
                Source::Chat { channel, interval } => Some((channel.clone(), interval.generation)),
                Source::Mention => None,
            };
            let token = {
                let Ok(mut pumps) = session.pumps.lock() else {
                    continue;
                };
                if pumps.contains_key(&consumer) {
                    continue;
                }
                let token = session.token.child_token();
                pumps.insert(
                    consumer.clone(),
                    PumpHandle {
                        token: token.clone(),
                        interval,
                    },
                );
                token
            };
            let ensured = match &source {
                Source::Chat { channel, interval } => {
                    self.ensure_interval(channel, member, interval).await
                }
                Source::Mention => self.ensure_mentions(member).await,
            };
            let bound = match ensured {
                Ok(bound) => bound,
                Err(e) => {
                    tracing::warn!(member, consumer, error = %e, "backstop consumer not created; retried at the next session");
                    if let Ok(mut pumps) = session.pumps.lock() {
                        pumps.remove(&consumer);
                    }
                    continue;
                }
            };
            started.push(consumer.clone());
            let pump = Pump::new(self, member, consumer, source, session, run.clone());
            run.1.spawn(async move { pump.run(token, bound).await });
        }
        started
    }

    pub(super) async fn stop_pump(&self, member: &str, consumer: &str) {
        if let Some(session) = self.sessions.lock().await.get(member)
            && let Ok(mut pumps) = session.pumps.lock()
            && let Some(pump) = pumps.remove(consumer)
        {
            pump.token.cancel();
        }
    }

    /// A mention copy for `member` was stored: during a session that pumps none yet, its
    /// mention consumer is made and pumped now.
    pub async fn mention_stored(&self, member: &str) {
        self.pump_current(member).await;
    }

    /// The member's memberships changed: pump the consumers of new intervals.
    pub async fn memberships_changed(&self, member: &str) {
        self.pump_current(member).await;
    }

    /// Starts what `member`'s session lacks; again for the session that replaced it meanwhile.
    /// A `resume` that came while the change was being made may have looked before it (no
    /// mention copy yet, not the new interval) while the pumps were started on the session it
    /// ended: the change would then wait for the member's next session.
    async fn pump_current(&self, member: &str) {
        let mut pumped: Option<Arc<Session>> = None;
        loop {
            let Some(current) = self.sessions.lock().await.get(member).cloned() else {
                return;
            };
            if pumped.as_ref().is_some_and(|p| Arc::ptr_eq(p, &current)) {
                return;
            }
            self.start_pumps(member, &current).await;
            pumped = Some(current);
        }
    }

    /// Makes the consumer of one of `member`'s intervals again, from its saved position, and
    /// pumps it (a follower that stopped following while its session goes on). With
    /// `session`, only if that session is still the member's.
    pub(super) async fn restart_pump(
        &self,
        member: &str,
        session: Option<&str>,
        channel: &str,
        generation: u64,
    ) {
        let Some(current) = self.sessions.lock().await.get(member).cloned() else {
            return;
        };
        if session.is_some_and(|s| s != current.name) || current.token.is_cancelled() {
            return;
        }
        let consumer = interval_consumer(member, channel, generation);
        if let Ok(mut pumps) = current.pumps.lock()
            && let Some(pump) = pumps.remove(&consumer)
        {
            pump.token.cancel();
        }
        self.start_pumps(member, &current).await;
    }

    /// Saves where a follower stood.
    pub(super) async fn save(&self, member: &str, stopped: &Stopped) {
        self.feeds
            .save(
                member,
                &stopped.channel,
                stopped.generation,
                stopped.position,
            )
            .await;
    }

    /// `backstop-want`: the member asks for the content of offers it has not surfaced.
    pub async fn want(&self, member: &str, tokens: &[String]) {
        let seqs: Vec<u64> = tokens.iter().filter_map(|t| token_seq(t, &['f'])).collect();
        self.feeds.want(member, &seqs).await;
    }

    /// `backstop-ack`: the member handled these copies; their stored entries are acknowledged.
    pub async fn ack(&self, member: &str, tokens: &[String]) {
        // An offer's token, or a copy's that a pump handed over before its member went on to
        // follow the feed.
        let offered: Vec<u64> = tokens
            .iter()
            .filter_map(|t| token_seq(t, &['f', 'c']))
            .collect();
        if !offered.is_empty() {
            self.feeds.confirm(member, &offered);
        }
        let Some(session) = self.sessions.lock().await.get(member).cloned() else {
            return;
        };
        if let Ok(mut progress) = session.progress.lock() {
            progress.acked = Instant::now();
        }
        for (grant, progress) in tokens.iter().filter_map(|t| crate::ops::range_progress(t)) {
            session.grants.progress(grant, progress);
        }
        let done: Vec<Held> = session
            .held
            .lock()
            .map(|mut h| tokens.iter().filter_map(|t| h.remove(t)).collect())
            .unwrap_or_default();
        for h in done {
            if let Err(e) = h.message.ack().await {
                tracing::debug!(member, error = %e, "backstop ack not sent; the entry will be redelivered");
            }
        }
    }

    /// Ends a session: its pumps stop, every held copy is nak'ed for the next session, and each
    /// interval's position is saved and its consumer deleted (an absent member costs the broker
    /// nothing).
    pub(super) async fn end_session(&self, member: &str, session: &Session) {
        session.token.cancel();
        for stopped in self.feeds.unfollow_all(member) {
            self.save(member, &stopped).await;
        }
        let held: Vec<Held> = session
            .held
            .lock()
            .map(|mut h| h.drain().map(|(_, v)| v).collect())
            .unwrap_or_default();
        for h in held {
            let _ = h.message.ack_with(AckKind::Nak(None)).await;
        }
        let intervals: Vec<(String, u64)> = session
            .pumps
            .lock()
            .map(|mut p| p.drain().filter_map(|(_, pump)| pump.interval).collect())
            .unwrap_or_default();
        for (channel, generation) in intervals {
            self.park(member, &channel, generation).await;
        }
    }

    /// The sessions as they are now.
    pub(super) async fn sessions(&self) -> Vec<(String, Arc<Session>)> {
        let sessions = self.sessions.lock().await;
        sessions
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Ends the sessions of members whose heartbeats stopped (or who said `offline`).
    pub(super) async fn sweep(&self) {
        let sessions = self.sessions().await;
        for (member, session) in sessions {
            let live = match self.presence.get(&member) {
                Some(heard) if heard.at >= session.started => heard.is_live(),
                // Not heard since the session began: give it one liveness window.
                _ => session.started.elapsed() <= crate::protocol::LIVENESS_WINDOW,
            };
            if !live {
                let mut sessions = self.sessions.lock().await;
                if sessions
                    .get(&member)
                    .is_some_and(|s| Arc::ptr_eq(s, &session))
                {
                    sessions.remove(&member);
                    drop(sessions);
                    self.end_session(&member, &session).await;
                    tracing::debug!(
                        space = self.space.name(),
                        member,
                        session = session.name,
                        "backstop session ended: the member is gone"
                    );
                }
            }
        }
    }
}

/// Extends the `ack_wait` of the copies `held` while the session lasts (until `token` is
/// cancelled), and naks those held past [`HANDOFF_TIMEOUT`] so that they are handed over again.
async fn keep_held(held: Arc<Mutex<HashMap<String, Held>>>, token: CancellationToken) {
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (expired, due): (Vec<Held>, Vec<jetstream::Message>) = held
            .lock()
            .map(|mut h| {
                let expired: Vec<String> = h
                    .iter()
                    .filter(|(_, e)| e.handed.elapsed() >= HANDOFF_TIMEOUT)
                    .map(|(token, _)| token.clone())
                    .collect();
                let expired = expired.iter().filter_map(|t| h.remove(t)).collect();
                let due = h
                    .values_mut()
                    .filter(|e| e.since.elapsed() >= PROGRESS_EVERY)
                    .map(|e| {
                        e.since = Instant::now();
                        e.message.clone()
                    })
                    .collect();
                (expired, due)
            })
            .unwrap_or_default();
        for h in expired {
            let _ = h.message.ack_with(AckKind::Nak(None)).await;
        }
        for m in due {
            let _ = m.ack_with(AckKind::Progress).await;
        }
    }
}
