//! What the reader reports of delivery: for `cotald status`, what waits for each durable
//! member (acknowledgements an online member owes, the backlog of one away) and for how long;
//! for the reader's health, whether an online member is stalled (it is reported, never shown
//! healthy).

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use futures_util::StreamExt;

use super::{Backstop, token_seq};
use crate::ops::status::MemberDelivery;
use crate::services::{Context, Health};
use crate::space::members::Interval;

/// How many intervals of members away `delivery` counts the backlog of (each costs the broker
/// a consumer made and deleted); past it, the backlog is unknown.
const COUNTED_AWAY: usize = 64;

/// What waits for one member away, over its channels.
struct Waiting {
    count: u64,
    oldest: Option<time::OffsetDateTime>,
    /// Whether every channel of it could be counted.
    known: bool,
}

impl Default for Waiting {
    fn default() -> Self {
        Waiting {
            count: 0,
            oldest: None,
            known: true,
        }
    }
}

impl Waiting {
    /// Adds one channel's count (`None`: it could not be counted).
    fn add(&mut self, channel: Option<(u64, Option<time::OffsetDateTime>)>) {
        match channel {
            Some((count, oldest)) => {
                self.count += count;
                self.oldest = match (self.oldest, oldest) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            None => self.known = false,
        }
    }
}

impl Backstop {
    /// How delivery goes for every durable member (`cotald status`): for one with a session
    /// (online), what waits for its acknowledgement and for how long; for one away, what its
    /// channels stored since its position, and when the oldest of it was stored.
    pub async fn delivery(&self) -> Vec<MemberDelivery> {
        let mut members = self.online().await;
        let online: std::collections::HashSet<String> =
            members.iter().map(|m| m.id.clone()).collect();
        let mut away: std::collections::BTreeMap<String, Waiting> = Default::default();
        let mut asked = 0;
        for record in self.members.all() {
            let Some(interval) = record.open().filter(|_| !online.contains(&record.member)) else {
                continue;
            };
            let waiting = away.entry(record.member.clone()).or_default();
            asked += 1;
            match (asked <= COUNTED_AWAY).then_some(()) {
                Some(()) => waiting.add(self.waiting(&record.channel, interval).await),
                None => waiting.add(None),
            }
        }
        let now = time::OffsetDateTime::now_utc();
        members.extend(away.into_iter().map(|(member, waiting)| {
            let (backlog, oldest) = match waiting.known {
                true => (Some(waiting.count), waiting.oldest),
                false => (None, None),
            };
            MemberDelivery {
                name: self.identities.get(&member).map(|r| r.name),
                id: member,
                online: false,
                unacknowledged: 0,
                waiting_secs: 0,
                stalled: false,
                backlog,
                oldest_pending_secs: oldest.map(|at| (now - at).whole_seconds().max(0) as u64),
            }
        }));
        members.sort_by(|a, b| a.id.cmp(&b.id));
        members
    }

    /// How many messages `channel` stored after a member's position in `interval`, and when the
    /// oldest of them was: a consumer made for the question, read for one entry's headers and
    /// deleted. `None` when the broker could not say.
    async fn waiting(
        &self,
        channel: &str,
        interval: &Interval,
    ) -> Option<(u64, Option<time::OffsetDateTime>)> {
        let stream = self.chat().await?;
        let consumer = stream
            .create_consumer(pull::Config {
                filter_subject: self.space.names().posts_on(channel),
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: interval.join_cursor.max(interval.delivered) + 1,
                },
                ack_policy: AckPolicy::None,
                headers_only: true,
                inactive_threshold: Duration::from_secs(5),
                ..Default::default()
            })
            .await
            .ok()?;
        let count = consumer.cached_info().num_pending;
        let oldest = match count {
            0 => None,
            _ => {
                let mut first = consumer
                    .fetch()
                    .max_messages(1)
                    .expires(Duration::from_secs(1))
                    .messages()
                    .await
                    .ok()?;
                first
                    .next()
                    .await
                    .and_then(Result::ok)
                    .and_then(|m| m.info().ok().map(|i| i.published))
            }
        };
        let _ = stream.delete_consumer(&consumer.cached_info().name).await;
        Some((count, oldest))
    }

    /// The members with a session (online): what waits for their acknowledgement and for how
    /// long.
    async fn online(&self) -> Vec<MemberDelivery> {
        let sessions = self.sessions().await;
        let stall_after = self.stall_after();
        let now = Instant::now();
        let mut members: Vec<MemberDelivery> = sessions
            .into_iter()
            .map(|(member, session)| {
                // An entry a pump handed over before its member went on to follow the feed
                // is held and offered both: counted once, by its sequence.
                let mut entries: std::collections::BTreeSet<u64> =
                    self.feeds.unconfirmed(&member).into_iter().collect();
                let mut mentions = 0;
                if let Ok(held) = session.held.lock() {
                    for token in held.keys() {
                        match token_seq(token, &['c']) {
                            Some(seq) => {
                                entries.insert(seq);
                            }
                            None => mentions += 1,
                        }
                    }
                }
                let waiting = entries.len() + mentions + session.grants.waiting() as usize;
                let stuck = session
                    .progress
                    .lock()
                    .map(|mut p| p.stuck_for(waiting, now))
                    .unwrap_or_default();
                let waiting_for = if waiting == 0 { Duration::ZERO } else { stuck };
                MemberDelivery {
                    name: self.identities.get(&member).map(|r| r.name),
                    id: member,
                    online: true,
                    unacknowledged: waiting as u64,
                    waiting_secs: waiting_for.as_secs(),
                    stalled: waiting_for >= stall_after,
                    backlog: None,
                    oldest_pending_secs: None,
                }
            })
            .collect();
        members.sort_by(|a, b| a.id.cmp(&b.id));
        members
    }

    /// After how long without an acknowledgement an online member counts as stalled.
    pub fn stall_after(&self) -> Duration {
        self.space.config().delivery.stall_after.duration()
    }

    /// Reports the reader degraded while any online member is stalled, naming them; running
    /// again once none is.
    pub(super) async fn report_stalls(&self, ctx: &Context) {
        let stalled: Vec<String> = self
            .online()
            .await
            .into_iter()
            .filter(|m| m.stalled)
            .map(|m| m.stall())
            .collect();
        ctx.report(match stalled.is_empty() {
            true => Health::Running,
            false => Health::Degraded(format!("delivery stalled: {}", stalled.join("; "))),
        });
    }
}
