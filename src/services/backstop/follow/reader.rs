//! A feed's read of its channel (§8): what is new, asked for once per [`LINGER`] while entries
//! keep coming, and one pull left waiting at the broker while none come.
//!
//! A feed offers every [`LINGER`], so an entry read the moment it is stored waits for the next
//! offers anyway. Read that way (an ordered consumer pushing each entry as it is stored), every
//! message woke a consumer of the broker and the appliance once more, which one message at a
//! time was most of what the durable net added to the appliance's work (`docs/benchmarks.md`,
//! *The feed reads once per LINGER*). So the feed asks for what is new when it is about to
//! offer: one request and one burst of subjects and headers, however many entries came. A read
//! that brings nothing leaves a pull of one entry waiting at the broker for [`QUIET_WAIT`]; the
//! next entry answers it, and the feed reads at each [`LINGER`] again. A quiet channel costs a
//! request per [`QUIET_WAIT`].
//!
//! The consumer is a plain one (ephemeral, in memory, headers only, nothing acknowledged), so
//! what an ordered consumer promises is kept here: every delivery carries the consumer's
//! sequence, and one that is not the next (a delivery lost with a connection, or taken by a
//! pull nobody waits for any more), an error, or a consumer the broker no longer knows makes a
//! new consumer from the entry after the last one taken. No entry is passed over: a follower's
//! position moves only over entries the feed took.
//!
//! [`LINGER`]: crate::services::backstop::LINGER

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::{AckPolicy, Consumer, DeliverPolicy, pull};
use async_nats::jetstream::context::GetStreamError;
use async_nats::jetstream::stream::{ConsumerError, Stream};
use futures_util::StreamExt;

use super::MAX_BUFFER;
use super::feed::Entry;
use crate::protocol::{SubjectKind, parse_subject};
use crate::services::backstop::BATCH;
use crate::space::Space;

/// Most entries one request asks for; a read asks again while requests come back full, up to
/// [`MAX_BUFFER`] entries.
const READ_AT_ONCE: usize = 4 * BATCH;
/// How long the pull of a quiet channel waits at the broker before the feed asks again.
const QUIET_WAIT: Duration = Duration::from_secs(5);
/// How long a request of the reader may go unanswered before it counts as failed.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// The consumer's inactivity threshold: a few [`QUIET_WAIT`]s, so that one the feed left
/// behind (its task ended without deleting it) lapses soon.
const INACTIVE: Duration = Duration::from_secs(30);
/// New consumers one read makes before it gives up (the feed then stops, and its followers
/// go back to their own consumers).
const REOPENS: usize = 3;

/// Why the feed could not read its channel.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    /// The space's CHAT stream could not be looked up.
    #[error("the channel's stream could not be looked up")]
    Stream(#[source] GetStreamError),
    /// The feed's consumer could not be created.
    #[error("the feed's consumer could not be created")]
    Consumer(#[source] ConsumerError),
    /// The broker did not answer in time.
    #[error("the broker did not answer within {ANSWER_WITHIN:?}")]
    Unanswered,
    /// New consumers kept failing to read.
    #[error("the feed's consumer could not be read after {REOPENS} new ones")]
    Unreadable,
}

/// The read of one channel, from a sequence on.
pub(super) struct Reader {
    stream: Stream<()>,
    filter: String,
    consumer: Consumer<pull::Config>,
    /// The last entry taken: a new consumer starts after it.
    last: u64,
    /// The consumer's sequence of the last delivery taken.
    delivered: u64,
    /// The pull waiting at the broker while the channel is quiet.
    waiting: Option<pull::Batch>,
    /// The delivery that answered it, taken at the next read.
    woken_by: Option<jetstream::Message>,
}

impl Reader {
    /// Reads `channel` of `space` from the entry `start` on.
    pub(super) async fn open(space: &Space, channel: &str, start: u64) -> Result<Self, ReadError> {
        let names = space.names();
        let stream = answered(space.jetstream().get_stream_no_info(names.chat_stream()))
            .await?
            .map_err(ReadError::Stream)?;
        let filter = names.posts_on(channel);
        let consumer = create(&stream, &filter, start).await?;
        Ok(Reader {
            stream,
            filter,
            consumer,
            last: start.saturating_sub(1),
            delivered: 0,
            waiting: None,
            woken_by: None,
        })
    }

    /// Whether a pull waits at the broker for the channel's next entry.
    pub(super) fn quiet(&self) -> bool {
        self.waiting.is_some()
    }

    /// Resolves when the quiet ends: an entry came (it is taken at the next [`Reader::read`])
    /// or the pull expired (the next read asks again). Cancel-safe; pending while not quiet.
    pub(super) async fn quiet_ends(&mut self) {
        let Some(waiting) = self.waiting.as_mut() else {
            return std::future::pending().await;
        };
        let next = waiting.next().await;
        self.waiting = None;
        if let Some(Ok(msg)) = next {
            self.woken_by = Some(msg);
        }
    }

    /// The entries stored since the last read, in order (none while the channel is quiet);
    /// when there are none, leaves a pull waiting for the next.
    pub(super) async fn read(&mut self) -> Result<Vec<Entry>, ReadError> {
        if self.quiet() {
            return Ok(Vec::new());
        }
        let mut entries = Vec::new();
        let mut reopens = 0;
        let mut intact = self
            .woken_by
            .take()
            .is_none_or(|m| self.take(m, &mut entries));
        loop {
            if !intact {
                if reopens == REOPENS {
                    return Err(ReadError::Unreadable);
                }
                reopens += 1;
                self.reopen().await?;
            }
            let (read, whole) = self.fetch(&mut entries).await?;
            intact = whole;
            if whole && (read < READ_AT_ONCE || entries.len() >= MAX_BUFFER) {
                break;
            }
        }
        if entries.is_empty() {
            let waiting = self
                .consumer
                .batch()
                .max_messages(1)
                .expires(QUIET_WAIT)
                .messages();
            // Unanswered or refused, the next read asks again.
            if let Ok(Ok(waiting)) = tokio::time::timeout(ANSWER_WITHIN, waiting).await {
                self.waiting = Some(waiting);
            }
        }
        Ok(entries)
    }

    /// Deletes the consumer.
    pub(super) async fn close(self) {
        delete(&self.stream, &self.consumer).await;
    }

    /// One request for what is new, into `entries`: how many deliveries it brought, and
    /// whether they were whole (each the consumer's next, and no error).
    async fn fetch(&mut self, entries: &mut Vec<Entry>) -> Result<(usize, bool), ReadError> {
        let batch = self.consumer.fetch().max_messages(READ_AT_ONCE).messages();
        let Ok(Ok(mut batch)) = tokio::time::timeout(ANSWER_WITHIN, batch).await else {
            return Ok((0, false));
        };
        let mut read = 0;
        loop {
            match tokio::time::timeout(ANSWER_WITHIN, batch.next()).await {
                Err(_) => return Err(ReadError::Unanswered),
                Ok(None) => return Ok((read, true)),
                Ok(Some(Ok(msg))) => {
                    read += 1;
                    if !self.take(msg, entries) {
                        return Ok((read, false));
                    }
                }
                Ok(Some(Err(e))) => {
                    tracing::debug!(consumer = self.consumer.cached_info().name, error = %e, "feed read error");
                    return Ok((read, false));
                }
            }
        }
    }

    /// Takes one delivery into `entries`; false when it is not the consumer's next.
    fn take(&mut self, msg: jetstream::Message, entries: &mut Vec<Entry>) -> bool {
        let Ok(info) = msg.info() else {
            return false;
        };
        if info.consumer_sequence != self.delivered + 1 || info.stream_sequence <= self.last {
            return false;
        }
        self.delivered = info.consumer_sequence;
        self.last = info.stream_sequence;
        let subject = msg.subject.as_str();
        entries.push(Entry {
            seq: info.stream_sequence,
            subject: subject.to_owned(),
            sender: parse_subject(subject)
                .ok()
                .filter(|p| p.kind == SubjectKind::Chat)
                .map(|p| p.sender.to_owned()),
            id: msg
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .map(|id| id.as_str().to_owned()),
        });
        true
    }

    /// A new consumer from the entry after the last one taken, in place of the current one.
    async fn reopen(&mut self) -> Result<(), ReadError> {
        let consumer = create(&self.stream, &self.filter, self.last + 1).await?;
        let old = std::mem::replace(&mut self.consumer, consumer);
        self.delivered = 0;
        self.waiting = None;
        tracing::debug!(
            old = old.cached_info().name,
            from = self.last + 1,
            "the feed reads its channel through a new consumer"
        );
        delete(&self.stream, &old).await;
        Ok(())
    }
}

/// Deletes a consumer of the feed's, as far as the broker answers: one it could not delete
/// lapses after [`INACTIVE`].
async fn delete(stream: &Stream<()>, consumer: &Consumer<pull::Config>) {
    let name = &consumer.cached_info().name;
    match tokio::time::timeout(ANSWER_WITHIN, stream.delete_consumer(name)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::debug!(consumer = name, error = %e, "feed's consumer not deleted; it lapses")
        }
        Err(_) => tracing::debug!(
            consumer = name,
            "feed's consumer not deleted in time; it lapses"
        ),
    }
}

/// The feed's consumer of `filter` from `start` on.
async fn create(
    stream: &Stream<()>,
    filter: &str,
    start: u64,
) -> Result<Consumer<pull::Config>, ReadError> {
    let config = pull::Config {
        filter_subject: filter.to_owned(),
        headers_only: true,
        ack_policy: AckPolicy::None,
        deliver_policy: DeliverPolicy::ByStartSequence {
            start_sequence: start,
        },
        inactive_threshold: INACTIVE,
        memory_storage: true,
        num_replicas: 1,
        ..Default::default()
    };
    answered(stream.create_consumer(config))
        .await?
        .map_err(ReadError::Consumer)
}

/// `request`'s answer, unless it takes longer than [`ANSWER_WITHIN`].
async fn answered<T>(request: impl Future<Output = T>) -> Result<T, ReadError> {
    tokio::time::timeout(ANSWER_WITHIN, request)
        .await
        .map_err(|_| ReadError::Unanswered)
}
