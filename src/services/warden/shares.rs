//! Each sender's share of a store, and the holds of senders past it (see the module doc of
//! [`super`]): what a sender holds is estimated from what the warden saw published and stored,
//! measured at the broker before it is held, and measured again until it is back under half its
//! share; the holds reach the broker in the space's account JWT ([`super::AccountPush`]).

use std::collections::{HashMap, HashSet};

use async_nats::jetstream::stream;
use futures_util::StreamExt;
use tokio::time::Instant;

use super::ledger::{Ledger, TaskSizes};
use super::{REMEASURE_AFTER, SHARE_DIVISOR, TRIM_EVERY, Warden};
use crate::profile::human_size;
use crate::services::ServiceError;
use crate::space::{Held, Hold};

/// What the senders hold in one store (DM or TASK), and the share each may hold.
#[derive(Default)]
pub(super) struct Shares {
    /// DM: every DM stored and unread.
    pub(super) ledger: Ledger,
    /// TASK: the sizes each pair published last.
    pub(super) tasks: TaskSizes,
    /// TASK: what each sender held when last measured.
    pub(super) measured: HashMap<String, u64>,
    /// Bytes each sender published (seen on the core subscription) that are not counted yet:
    /// DM's stored feed trails the publishes by some milliseconds, in which a fast sender
    /// stores megabytes, and TASK is measured only now and then. DM's is cleared every
    /// [`TRIM_EVERY`] (refused publishes never reach the ledger), TASK's when measured.
    /// Below zero when DM's feed delivered a DM before the warden took its publish from the
    /// core subscription (the two wait side by side and either may be taken first): that
    /// publish, when taken, is counted once, not twice; meanwhile the DM counts as stored.
    pub(super) in_flight: HashMap<String, i64>,
    /// When each sender past its share may be judged again.
    pub(super) judged: HashMap<String, Instant>,
    /// The store's byte limit (0: none, and no share).
    pub(super) store: u64,
}

impl Shares {
    /// `bytes` from `sender` were published.
    pub(super) fn published(&mut self, sender: &str, bytes: u64) {
        *self.in_flight.entry(sender.to_owned()).or_default() += signed(bytes);
    }

    /// DM stored `bytes` from `sender` to `target` at `seq`; `seen` when its publish was, or
    /// is yet to be, taken from the core subscription (published since the warden
    /// subscribed), and so moves from in flight to the ledger.
    pub(super) fn stored(&mut self, target: &str, sender: &str, seq: u64, bytes: u64, seen: bool) {
        self.ledger.stored(target, sender, seq, bytes);
        if seen {
            *self.in_flight.entry(sender.to_owned()).or_default() -= signed(bytes);
        }
    }

    /// What `sender` holds, or is about to, as far as is known without asking the broker.
    pub(super) fn estimate(&self, sender: &str) -> u64 {
        let counted = self.ledger.unread(sender) + self.measured.get(sender).copied().unwrap_or(0);
        let in_flight = self.in_flight.get(sender).copied().unwrap_or(0);
        counted + u64::try_from(in_flight).unwrap_or(0)
    }

    pub(super) fn share(&self) -> u64 {
        match self.store {
            0 => u64::MAX,
            store => store / SHARE_DIVISOR,
        }
    }

    pub(super) fn hold(&self, unread: u64) -> Hold {
        Hold {
            unread,
            share: self.share(),
            store: self.store,
        }
    }
}

/// A message's size as a signed count of bytes (sizes are far below `i64::MAX`).
fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

impl Warden {
    /// What `sender` holds, asked of the broker: its DM targets' floors read again, or the
    /// tasks TASK still counts for its pairs (each at the size it was published with, or the
    /// stream's mean).
    async fn measure(&self, held: Held, shares: &mut Shares, sender: &str) -> u64 {
        if held == Held::Dms {
            let targets = shares.ledger.targets_of(sender);
            self.read_floors(&mut shares.ledger, targets).await;
            return shares.estimate(sender);
        }
        let measured = async {
            let task = self.stream_info(&self.space.names().task_stream()).await?;
            let filter = self.space.names().tasks_from(sender);
            let pairs = self.task_pairs(filter, &task.state, shares).await?;
            let listed: HashSet<&str> = pairs.iter().map(|(pair, _)| pair.as_str()).collect();
            let own = format!(".{sender}");
            shares
                .tasks
                .retain(|pair| !pair.ends_with(&own) || listed.contains(pair));
            Ok::<_, ServiceError>(pairs.iter().map(|(_, bytes)| bytes).sum())
        };
        match measured.await {
            Ok(bytes) => {
                shares.measured.insert(sender.to_owned(), bytes);
                shares.in_flight.remove(sender);
                bytes
            }
            Err(e) => {
                tracing::debug!(space = self.space.name(), sender, error = %e,
                    "a sender's tasks not measured");
                shares.estimate(sender)
            }
        }
    }

    /// The task pairs TASK (its `state` as just read) holds under `filter`, each with the
    /// bytes of what it holds (the sizes its last tasks were published with, or the stream's
    /// mean).
    async fn task_pairs(
        &self,
        filter: String,
        state: &stream::State,
        shares: &mut Shares,
    ) -> Result<Vec<(String, u64)>, ServiceError> {
        let mean = state.bytes.checked_div(state.messages).unwrap_or(0);
        let stream = self
            .space
            .jetstream()
            .get_stream_no_info(self.space.names().task_stream())
            .await
            .map_err(ServiceError::at("reading TASK"))?;
        let mut subjects = stream
            .info_with_subjects(filter)
            .await
            .map_err(ServiceError::at("listing TASK's subjects"))?;
        let mut pairs = Vec::new();
        while let Some(entry) = subjects.next().await {
            let (pair, count) = entry.map_err(ServiceError::at("listing TASK's subjects"))?;
            let bytes = shares.tasks.held(&pair, count as u64, mean);
            pairs.push((pair, bytes));
        }
        Ok(pairs)
    }

    /// What every sender holds in TASK (its `state` as just read), by the stream's counts (all
    /// its pairs listed, those `counted`), kept as measured; returns the senders past their
    /// share.
    pub(super) async fn task_senders_past_share(
        &self,
        state: &stream::State,
        shares: &mut Shares,
        counted: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let filter = self.space.names().tasks();
        let pairs = match self.task_pairs(filter, state, shares).await {
            Ok(pairs) => pairs,
            Err(e) => {
                tracing::debug!(space = self.space.name(), error = %e, "TASK's pairs not listed");
                return Vec::new();
            }
        };
        let mut by_sender: HashMap<String, u64> = HashMap::new();
        for (pair, bytes) in pairs.into_iter().filter(|(pair, _)| counted(pair)) {
            let sender = pair.rsplit('.').next().unwrap_or_default().to_owned();
            *by_sender.entry(sender).or_default() += bytes;
        }
        let share = shares.share();
        let mut past = Vec::new();
        for (sender, bytes) in by_sender {
            shares.in_flight.remove(&sender);
            if bytes > share {
                past.push(sender.clone());
            }
            shares.measured.insert(sender, bytes);
        }
        past
    }

    /// Holds `sender` from sending `held` when it is past its share, not held, not judged
    /// recently ([`TRIM_EVERY`] after a hold, [`REMEASURE_AFTER`] after a measure that found it
    /// under), and, measured again, still past it; returns whether the holds changed.
    pub(super) async fn judge_share(&self, held: Held, shares: &mut Shares, sender: &str) -> bool {
        if shares.estimate(sender) <= shares.share()
            || self.space.holds().get(held, sender).is_some()
            || shares
                .judged
                .get(sender)
                .is_some_and(|again| Instant::now() < *again)
        {
            return false;
        }
        let unread = self.measure(held, shares, sender).await;
        if unread <= shares.share() {
            // Under its share once measured (what it sent may not be counted as stored yet):
            // looked at again soon, while it may still be flooding.
            shares
                .judged
                .insert(sender.to_owned(), Instant::now() + REMEASURE_AFTER);
            return false;
        }
        shares
            .judged
            .insert(sender.to_owned(), Instant::now() + TRIM_EVERY);
        let hold = shares.hold(unread);
        let newly = self.space.holds().hold(held, sender, hold);
        if newly {
            tracing::warn!(
                space = self.space.name(),
                sender,
                held = ?held,
                unread = human_size(unread),
                share = human_size(hold.share),
                "a sender holds more than its share of the store: those publishes of it are \
                 refused until some are read"
            );
        }
        newly
    }

    /// Ends the holds of senders back under half their share (and updates the others'
    /// figures); returns whether the holds changed.
    pub(super) async fn review_holds(&self, held: Held, shares: &mut Shares) -> bool {
        let mut changed = false;
        for sender in self.space.holds().senders(held) {
            let unread = self.measure(held, shares, &sender).await;
            if unread <= shares.share() / 2 {
                self.space.holds().release(held, &sender);
                tracing::info!(
                    space = self.space.name(),
                    sender,
                    held = ?held,
                    unread = human_size(unread),
                    "a held sender's messages were read: it may send again"
                );
                changed = true;
            } else {
                self.space.holds().hold(held, &sender, shares.hold(unread));
            }
        }
        changed
    }

    /// Pushes the account JWT with the current holds; false (logged) when that failed.
    pub(super) async fn push_holds(&self) -> bool {
        match self.account.push_again().await {
            Ok(()) => {
                self.space.holds().forget_released();
                true
            }
            Err(e) => {
                tracing::warn!(
                    space = self.space.name(),
                    error = %crate::ops::error_text(&*e),
                    "the holds could not be pushed to the broker; retrying"
                );
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dm_is_counted_once_whichever_of_its_publish_and_its_storing_is_taken_first() {
        let mut dm = Shares::default();
        // Published, then stored: in flight, then in the ledger.
        dm.published("UMAL", 100);
        assert_eq!(dm.estimate("UMAL"), 100);
        dm.stored("UBOB", "UMAL", 1, 100, true);
        assert_eq!(dm.estimate("UMAL"), 100);
        // Stored first: counted as stored at once; its publish, taken after, adds nothing.
        dm.stored("UBOB", "UMAL", 2, 100, true);
        assert_eq!(dm.estimate("UMAL"), 200);
        dm.published("UMAL", 100);
        assert_eq!(dm.estimate("UMAL"), 200);
        dm.published("UMAL", 100);
        assert_eq!(dm.estimate("UMAL"), 300, "one more in flight");
        dm.stored("UBOB", "UMAL", 3, 100, true);
        assert_eq!(dm.estimate("UMAL"), 300);
        // Stored before the warden subscribed: no publish of it will be seen.
        dm.stored("UBOB", "UMAL", 4, 100, false);
        assert_eq!(dm.estimate("UMAL"), 400);
        // A refused publish stays in flight until the review clears it.
        dm.published("UMAL", 100);
        assert_eq!(dm.estimate("UMAL"), 500);
    }
}
