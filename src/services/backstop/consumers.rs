//! The consumers the reader makes for a member, and when they go (§8): an interval's consumer
//! exists only while its member has a session, from the position saved in the members registry;
//! when the session ends it is parked (its ack floor saved as the new position, the consumer
//! deleted), and it is deleted for good once its interval is delivered or the identity revoked.
//! The mention consumer (`bkm_<member>`) reads the member's mention copies in `INBOX_<space>`;
//! it is made once the member has one ([`Backstop::has_mention_copies`]).
//!
//! An interval's consumer keeps its state in memory (`mem_storage`), though `CHAT` is on file:
//! one is made at every session's start, and a file consumer costs the broker a directory and
//! its files each time. In `space_1000`, a thousand members starting their sessions, creating
//! those inodes was a fifth of the broker's CPU, growing with every run as the file system's
//! recently deleted inodes piled up (`docs/benchmarks.md`). What a memory consumer does not
//! keep across a broker restart is its ack floor; the position in the members registry does,
//! saved when the session ends and every [`super::follow::CHECKPOINT_EVERY`] while its pump
//! moves, so a restart hands over again at most the last few seconds' entries (at least once,
//! §4) and a member's consumer is made again from there at its next `resume`.

use async_nats::jetstream;
use async_nats::jetstream::consumer::{AckPolicy, Consumer, DeliverPolicy, pull};

use super::{ACK_WAIT, Backstop, BackstopError, WINDOW};
use crate::binding::{interval_consumer, mention_consumer};
use crate::space::Space;
use crate::space::members::Interval;

/// The consumer of one membership interval of `member` on `channel`, from its saved position
/// on.
pub(super) fn interval_config(
    space: &Space,
    member: &str,
    channel: &str,
    interval: &Interval,
) -> pull::Config {
    pull::Config {
        durable_name: Some(interval_consumer(member, channel, interval.generation)),
        filter_subject: space.names().posts_on(channel),
        deliver_policy: DeliverPolicy::ByStartSequence {
            start_sequence: interval.join_cursor.max(interval.delivered) + 1,
        },
        ack_policy: AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        max_ack_pending: WINDOW,
        memory_storage: true,
        ..Default::default()
    }
}

impl Backstop {
    /// Creates (or finds) the consumer of one membership interval, from the member's saved
    /// position on: it exists only while the member has a session (see the module doc).
    pub(super) async fn ensure_interval(
        &self,
        channel: &str,
        member: &str,
        interval: &Interval,
    ) -> Result<Consumer<pull::Config>, BackstopError> {
        let config = interval_config(&self.space, member, channel, interval);
        self.ensure(self.space.names().chat_stream(), config).await
    }

    /// Whether `INBOX_<space>` holds any mention copy for `member` (an unreadable store counts
    /// as yes: the consumer is then made, as it always was). Most members never get one, and
    /// a mention consumer is a file consumer, its directory and files made at the member's
    /// first session, and a pull with its heartbeats for every session after
    /// (`docs/benchmarks.md`, `space_1000`).
    pub(super) async fn has_mention_copies(&self, member: &str) -> bool {
        // A handle without the stream's info: only the one lookup per `resume`.
        let Ok(stream) = self
            .space
            .jetstream()
            .get_stream_no_info(self.space.names().backstop_stream())
            .await
        else {
            return true;
        };
        match stream
            .get_last_raw_message_by_subject(&self.space.names().mentions_for(member))
            .await
        {
            Ok(_) => true,
            Err(e) => !matches!(
                e.kind(),
                jetstream::stream::LastRawMessageErrorKind::NoMessageFound
            ),
        }
    }

    pub(super) async fn ensure_mentions(
        &self,
        member: &str,
    ) -> Result<Consumer<pull::Config>, BackstopError> {
        let config = pull::Config {
            durable_name: Some(mention_consumer(member)),
            filter_subject: self.space.names().mentions_of(member),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            max_ack_pending: WINDOW,
            ..Default::default()
        };
        self.ensure(self.space.names().backstop_stream(), config)
            .await
    }

    /// The consumer `config` names on `stream`, made when absent, with its info as the broker
    /// answered (the pump's first bind takes it as it is).
    async fn ensure(
        &self,
        stream: String,
        config: pull::Config,
    ) -> Result<Consumer<pull::Config>, BackstopError> {
        let name = config.durable_name.clone().unwrap_or_default();
        let fail = |action, e: Box<dyn std::error::Error + Send + Sync>| BackstopError::JetStream {
            action,
            consumer: name.clone(),
            source: e,
        };
        let stream = self
            .space
            .jetstream()
            .get_stream_no_info(&stream)
            .await
            .map_err(|e| fail("opening the stream of", e.into()))?;
        // A session's consumer is mostly absent (parked when the member's last session
        // ended): made at once, one round trip where asking first took two. One that exists
        // with another config (a session replaced before it was parked) is refused to a
        // create, and taken as it is.
        if let Ok(made) = stream.create_consumer_strict(config.clone()).await {
            return Ok(made);
        }
        stream
            .get_or_create_consumer(&name, config)
            .await
            .map_err(|e| fail("creating", e.into()))
    }

    /// `CHAT_<space>`, where the intervals' consumers live: a handle, no round trip (`None`
    /// only for a name the broker would refuse); a caller whose request on it fails leaves
    /// things as they are, to be done again later.
    pub(super) async fn chat(&self) -> Option<jetstream::stream::Stream<()>> {
        self.space
            .jetstream()
            .get_stream_no_info(self.space.names().chat_stream())
            .await
            .ok()
    }

    /// Deletes one interval's consumer (its backlog was delivered, or the identity is gone).
    pub async fn delete_interval(&self, member: &str, channel: &str, generation: u64) {
        let name = interval_consumer(member, channel, generation);
        self.feeds.unfollow(member, channel);
        self.stop_pump(member, &name).await;
        if let Some(stream) = self.chat().await {
            let _ = stream.delete_consumer(&name).await;
        }
    }

    /// Whether a just-closed interval has nothing left to deliver: nothing handed over
    /// unacknowledged and nothing undelivered (its leave cursor is the frontier of the moment,
    /// so anything pending is newer, and the interval is kept to be safe).
    pub async fn drained_at_leave(&self, member: &str, channel: &str, interval: &Interval) -> bool {
        let name = interval_consumer(member, channel, interval.generation);
        // A follower's interval goes back to its consumer, which keeps the leave boundary.
        if let Some(stopped) = self.feeds.unfollow(member, channel) {
            self.save(member, &stopped).await;
            self.restart_pump(member, None, channel, stopped.generation)
                .await;
        }
        let Some(stream) = self.chat().await else {
            return false;
        };
        match stream.consumer_info(&name).await {
            Ok(info) => info.num_ack_pending == 0 && info.num_pending == 0,
            Err(_) => false,
        }
    }

    /// Ends `member`'s session and deletes every consumer it has (a revoked identity): its
    /// backlog is gone from the store.
    pub async fn forget(&self, member: &str) {
        if let Some(session) = self.sessions.lock().await.remove(member) {
            self.end_session(member, &session).await;
        }
        self.feeds.unfollow_all(member);
        for record in self.members.of(member) {
            for interval in &record.intervals {
                self.delete_interval(member, &record.channel, interval.generation)
                    .await;
            }
        }
        if let Ok(stream) = self
            .space
            .jetstream()
            .get_stream_no_info(self.space.names().backstop_stream())
            .await
        {
            let _ = stream.delete_consumer(&mention_consumer(member)).await;
            let _ = stream
                .purge()
                .filter(self.space.names().mentions_of(member))
                .await;
        }
    }

    /// Saves an interval's position (its consumer's ack floor: every entry up to it is
    /// handled) in the members registry, then deletes the consumer. A failure to save only
    /// means entries are handed over again (at least once).
    pub(super) async fn park(&self, member: &str, channel: &str, generation: u64) {
        let name = interval_consumer(member, channel, generation);
        let Some(stream) = self.chat().await else {
            return;
        };
        let Ok(info) = stream.consumer_info(&name).await else {
            return;
        };
        let floor = info.ack_floor.stream_sequence;
        self.feeds.save(member, channel, generation, floor).await;
        let _ = stream.delete_consumer(&name).await;
    }
}
