//! What each sender has stored and nobody has read or taken yet: the totals the warden holds
//! a sender by (`space/holds.rs`). Pure bookkeeping: the warden does the reading.
//!
//! [`Ledger`] (DM) is fed with every DM as DM stores it (its sequence, its pair, its size) and
//! told how far each target has read (the ack floor of `dm_<target>`). An entry at or below its
//! target's floor was read; what the stream no longer holds (aged out, purged) is forgotten by
//! sequence or by target.
//!
//! [`TaskSizes`] (TASK) is an estimate: TASK is a work queue, which admits no consumer beside
//! the workers' `svc_<role>` to follow it with, so the warden knows the sizes a pair published
//! (its core subscription) and how many tasks the pair still holds (the stream's subject
//! counts), and counts the last ones published as the ones held.

use std::collections::{HashMap, VecDeque};

use crate::binding::streams::TASK_MAX_MSGS_PER_PAIR;

/// One (target, sender) pair's unread DMs: (stream sequence, bytes), in sequence order.
#[derive(Debug, Default)]
struct Pair {
    entries: VecDeque<(u64, u64)>,
}

/// Unread DMs by target and sender, each sender's unread bytes, and each target's floor.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    by_target: HashMap<String, HashMap<String, Pair>>,
    unread: HashMap<String, u64>,
    floors: HashMap<String, u64>,
}

impl Ledger {
    /// DM stored `bytes` from `sender` to `target` at `seq`; returns the sender's unread bytes.
    /// A DM at or below the target's floor, as last read, was read already (the stored feed
    /// starts from the first DM the stream holds).
    pub(super) fn stored(&mut self, target: &str, sender: &str, seq: u64, bytes: u64) -> u64 {
        if self.floors.get(target).is_some_and(|floor| seq <= *floor) {
            return self.unread(sender);
        }
        self.by_target
            .entry(target.to_owned())
            .or_default()
            .entry(sender.to_owned())
            .or_default()
            .entries
            .push_back((seq, bytes));
        let unread = self.unread.entry(sender.to_owned()).or_default();
        *unread += bytes;
        *unread
    }

    /// `sender`'s unread bytes.
    pub(super) fn unread(&self, sender: &str) -> u64 {
        self.unread.get(sender).copied().unwrap_or(0)
    }

    /// The targets `sender` has unread DMs for.
    pub(super) fn targets_of(&self, sender: &str) -> Vec<String> {
        self.by_target
            .iter()
            .filter(|(_, senders)| senders.contains_key(sender))
            .map(|(target, _)| target.clone())
            .collect()
    }

    /// Every target with unread DMs.
    pub(super) fn targets(&self) -> Vec<String> {
        self.by_target.keys().cloned().collect()
    }

    /// `target` has read every DM up to `floor`.
    pub(super) fn read(&mut self, target: &str, floor: u64) {
        self.floors.insert(target.to_owned(), floor);
        self.drop_where(Some(target), |seq| seq <= floor);
    }

    /// The stream no longer holds anything below `first`.
    pub(super) fn below(&mut self, first: u64) {
        self.drop_where(None, |seq| seq < first);
    }

    /// Everything to `target` is gone (purged: it is no agent any more).
    pub(super) fn forget_target(&mut self, target: &str) {
        self.floors.remove(target);
        self.drop_where(Some(target), |_| true);
    }

    /// Drops the entries of `target` (or of every target) whose sequence satisfies `gone`;
    /// entries are in sequence order, so only the front of each pair is looked at.
    fn drop_where(&mut self, target: Option<&str>, gone: impl Fn(u64) -> bool) {
        let unread = &mut self.unread;
        self.by_target.retain(|t, senders| {
            if target.is_some_and(|only| only != t) {
                return true;
            }
            senders.retain(|sender, pair| {
                while let Some(&(seq, bytes)) = pair.entries.front() {
                    if !gone(seq) {
                        break;
                    }
                    pair.entries.pop_front();
                    if let Some(total) = unread.get_mut(sender) {
                        *total = total.saturating_sub(bytes);
                    }
                }
                !pair.entries.is_empty()
            });
            !senders.is_empty()
        });
        self.unread.retain(|_, total| *total > 0);
    }
}

/// The sizes each (role, sender) pair of TASK published last, as many as a pair may hold.
#[derive(Debug, Default)]
pub(super) struct TaskSizes {
    pairs: HashMap<String, VecDeque<u64>>,
}

impl TaskSizes {
    /// The pair (subject) `pair` published a task of `bytes`.
    pub(super) fn published(&mut self, pair: &str, bytes: u64) {
        let sizes = self.pairs.entry(pair.to_owned()).or_default();
        sizes.push_back(bytes);
        if sizes.len() > TASK_MAX_MSGS_PER_PAIR as usize {
            sizes.pop_front();
        }
    }

    /// The bytes of the `held` tasks `pair` still has stored: its last `held` publishes, one
    /// whose size is unknown (published before the warden started) counted as `unknown`. Keeps
    /// no more sizes than that.
    pub(super) fn held(&mut self, pair: &str, held: u64, unknown: u64) -> u64 {
        let Some(sizes) = self.pairs.get_mut(pair) else {
            return held * unknown;
        };
        while sizes.len() as u64 > held {
            sizes.pop_front();
        }
        let known: u64 = sizes.iter().sum();
        known + (held - sizes.len() as u64) * unknown
    }

    /// Keeps the pairs `listed` says the stream holds.
    pub(super) fn retain(&mut self, listed: impl Fn(&str) -> bool) {
        self.pairs.retain(|pair, _| listed(pair));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tasks_a_pair_holds_are_its_last_published() {
        let mut t = TaskSizes::default();
        for size in [10, 20, 30] {
            t.published("svc.r.UMAL", size);
        }
        // A worker took the first: the two last are held.
        assert_eq!(t.held("svc.r.UMAL", 2, 1000), 50);
        // Held more than the warden saw published: the rest counted at the stream's mean.
        assert_eq!(t.held("svc.r.UMAL", 4, 1000), 2050);
        assert_eq!(t.held("svc.r.UOTHER", 3, 7), 21);
        for _ in 0..TASK_MAX_MSGS_PER_PAIR + 5 {
            t.published("svc.r.UMAL", 1);
        }
        assert_eq!(
            t.held("svc.r.UMAL", TASK_MAX_MSGS_PER_PAIR as u64, 1000),
            TASK_MAX_MSGS_PER_PAIR as u64
        );
        t.retain(|pair| pair != "svc.r.UMAL");
        assert_eq!(t.held("svc.r.UMAL", 1, 9), 9);
    }

    #[test]
    fn a_senders_total_spans_its_targets_and_falls_as_they_read() {
        let mut l = Ledger::default();
        assert_eq!(l.stored("UBOB", "UMAL", 1, 100), 100);
        assert_eq!(l.stored("UDAN", "UMAL", 2, 100), 200);
        assert_eq!(l.stored("UBOB", "UCAR", 3, 7), 7);
        assert_eq!(l.stored("UBOB", "UMAL", 4, 100), 300);
        let mut targets = l.targets_of("UMAL");
        targets.sort();
        assert_eq!(targets, ["UBOB", "UDAN"]);

        // Bob read up to 3: Mallory's first and Carol's; Mallory's fourth waits.
        l.read("UBOB", 3);
        assert_eq!(l.unread("UMAL"), 200);
        assert_eq!(l.unread("UCAR"), 0);
        // Dan's DMs are purged.
        l.forget_target("UDAN");
        assert_eq!(l.unread("UMAL"), 100);
        assert_eq!(l.targets_of("UMAL"), ["UBOB"]);
        // The stream aged out everything below 5.
        l.below(5);
        assert_eq!(l.unread("UMAL"), 0);
        assert!(l.targets().is_empty());
        // What is heard of late, at or below a floor already read, was read.
        assert_eq!(l.stored("UBOB", "UMAL", 3, 100), 0);
        assert_eq!(l.stored("UBOB", "UMAL", 6, 100), 100);
    }
}
