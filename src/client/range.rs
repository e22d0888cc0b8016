//! Reading a granted range of a durable channel (§8, [`crate::ops::Range`]): when this member
//! has a backlog on a channel, the trusted reader grants it as a range, re-authorized as a
//! whole, and the member reads the entries itself through its history consumer (`chathist_<id>`,
//! which the broker bounds to its read ACL), instead of receiving each as a copy. Each entry is
//! checked and deduplicated like any copy and surfaced as durable with an ack handle; the
//! member's progress (every entry up to a stream sequence handled, and how many) goes to the
//! reader in a `backstop-ack` token with each batch of acks sent after an entry of it was
//! handled, so what the client says is settled is settled. A range it cannot read is
//! declined, and the reader hands the entries over as copies.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use async_nats::jetstream::consumer::DeliverPolicy;
use tokio::sync::mpsc;

use super::deliver::{Acked, BackstopToken};
use super::history::HISTORY_IDLE;
use super::{Client, ClientError, nats_err};
use crate::ops::{self, Range, RangeProgress};

/// What this member did of one range: the entries it read and has not handled yet.
pub(crate) struct RangeRead {
    grant: u64,
    /// How many entries it held when granted.
    count: u64,
    state: Mutex<Progress>,
}

#[derive(Default)]
struct Progress {
    /// Read, not handled yet.
    outstanding: BTreeSet<u64>,
    /// The highest stream sequence read (the range's start before the first).
    read_to: u64,
    /// Handled, and those the stream no longer held once the read ended.
    handled: u64,
    /// `handled` as the last token said.
    reported: u64,
    /// Whether the ack batcher has been handed this range since its last token.
    queued: bool,
}

impl RangeRead {
    fn new(range: &Range<'_>) -> Self {
        RangeRead {
            grant: range.grant,
            count: range.count,
            state: Mutex::new(Progress {
                read_to: range.after,
                ..Progress::default()
            }),
        }
    }

    /// An entry read: outstanding until it is handled.
    fn read(&self, seq: u64) {
        if let Ok(mut p) = self.state.lock() {
            p.outstanding.insert(seq);
            p.read_to = p.read_to.max(seq);
        }
    }

    /// An entry handled; true when the range is to be handed to the ack batcher (it has news
    /// and is not queued already).
    pub(crate) fn handled(&self, seq: u64) -> bool {
        let Ok(mut p) = self.state.lock() else {
            return false;
        };
        if p.outstanding.remove(&seq) {
            p.handled += 1;
        }
        Self::queue(&mut p)
    }

    /// The read ended, `missing` of the range's entries no longer in the stream; as
    /// [`RangeRead::handled`].
    fn finished(&self, missing: u64) -> bool {
        let Ok(mut p) = self.state.lock() else {
            return false;
        };
        p.handled += missing;
        Self::queue(&mut p)
    }

    fn queue(p: &mut Progress) -> bool {
        let queue = !p.queued && p.handled > p.reported;
        p.queued |= queue;
        queue
    }

    /// Whether every entry of the range is handled (or no longer in the stream).
    pub(crate) fn done(&self) -> bool {
        self.state
            .lock()
            .is_ok_and(|p| p.outstanding.is_empty() && p.handled >= self.count)
    }

    /// The progress token the ack batcher sends, when there is news since the last.
    pub(crate) fn take(&self) -> Option<String> {
        let mut p = self.state.lock().ok()?;
        p.queued = false;
        if p.handled == p.reported {
            return None;
        }
        p.reported = p.handled;
        let position = match p.outstanding.first() {
            Some(first) => first - 1,
            None => p.read_to,
        };
        let handled = p.handled;
        Some(ops::range_token(
            self.grant,
            RangeProgress::Handled { position, handled },
        ))
    }
}

/// Reads `range` in the background; declines it when it cannot be read.
pub(crate) fn start(client: &Client, range: Range<'_>, acks: &mpsc::UnboundedSender<Acked>) {
    let (reader, acks) = (client.clone(), acks.clone());
    let subject = range.subject.to_owned();
    let read = Arc::new(RangeRead::new(&range));
    let Range {
        after, last, count, ..
    } = range;
    client.inner.background.spawn(async move {
        if let Err(e) = reader
            .read_range(&subject, after, last, count, &read, &acks)
            .await
        {
            tracing::debug!(error = %e, subject, "a durable range not read: declined");
            let declined = ops::range_token(read.grant, RangeProgress::Declined);
            let _ = acks.send(Acked::Token(declined));
        }
    });
}

impl Client {
    /// Reads the entries of `subject` after `after` up to `last` (`count` of them when they
    /// were granted) through the history consumer, surfacing each as a durable copy of `read`.
    async fn read_range(
        &self,
        subject: &str,
        after: u64,
        last: u64,
        count: u64,
        read: &Arc<RangeRead>,
        acks: &mpsc::UnboundedSender<Acked>,
    ) -> Result<(), ClientError> {
        let what = || format!("range of {subject}");
        let _one_at_a_time = self.inner.history.lock().await;
        let start = DeliverPolicy::ByStartSequence {
            start_sequence: after + 1,
        };
        let (stream, name, mut pending, mut messages) =
            self.history_messages(subject, start).await?;
        let mut taken = 0;
        while pending > 0 {
            let msg = match messages.next().await {
                Some(msg) => msg.map_err(|e| nats_err(what())(e))?,
                None => {
                    return Err(ClientError::Timeout {
                        what: what(),
                        timeout: HISTORY_IDLE,
                    });
                }
            };
            let Ok(info) = msg.info() else { continue };
            let (seq, left) = (info.stream_sequence, info.pending);
            if seq > last {
                break;
            }
            pending = left;
            taken += 1;
            read.read(seq);
            let token = BackstopToken::range(read.clone(), seq, acks);
            self.inner.out.range_copy(&msg.message, token).await;
        }
        drop(messages);
        let _ = stream.delete_consumer(&name).await;
        if read.finished(count.saturating_sub(taken)) {
            let _ = acks.send(Acked::Range(read.clone()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(after: u64) -> RangeRead {
        RangeRead::new(&Range {
            subject: "cotal.s.chat.*.c",
            after,
            last: after + 1_000,
            count: 1_000,
            grant: 9,
        })
    }

    fn said(token: Option<String>) -> Option<(u64, u64)> {
        match ops::range_progress(&token?)? {
            (9, RangeProgress::Handled { position, handled }) => Some((position, handled)),
            _ => None,
        }
    }

    #[test]
    fn the_position_stops_below_the_first_entry_not_handled() {
        let r = range(100);
        for seq in 101..=400 {
            r.read(seq);
        }
        // Handled out of order, all but 150: queued once, the position stays at 149.
        let queued: Vec<bool> = (101..=400)
            .rev()
            .filter(|s| *s != 150)
            .map(|seq| r.handled(seq))
            .collect();
        assert_eq!(queued.iter().filter(|q| **q).count(), 1);
        assert_eq!(said(r.take()), Some((149, 299)));
        assert!(r.finished(700), "news since the last token");
        assert_eq!(said(r.take()), Some((149, 999)), "150 is still outstanding");
        assert!(!r.done());
        assert!(r.handled(150));
        assert!(r.done());
        assert_eq!(said(r.take()), Some((400, 1_000)));
    }

    #[test]
    fn nothing_is_said_twice_and_an_unknown_entry_counts_for_nothing() {
        let r = range(0);
        r.read(5);
        assert!(!r.handled(6));
        assert_eq!(r.take(), None);
        assert!(r.handled(5));
        assert!(!r.handled(5), "queued already");
        assert_eq!(said(r.take()), Some((5, 1)));
        assert_eq!(r.take(), None);
        assert!(r.finished(999));
        assert_eq!(said(r.take()), Some((5, 1_000)));
        assert!(!r.finished(0));
    }
}
