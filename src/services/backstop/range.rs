//! Ranges a member reads itself (§8): for a member that said so in its `resume`, a pump whose
//! interval is open grants the member's backlog on the channel as one [`crate::ops::Range`]
//! instead of carrying each entry's content. The reader re-authorizes the range as a whole
//! before granting it: the member's current read ACL covers the channel (the consumer's filter
//! holds every entry to it) and the interval is open, so every entry stored before the grant is
//! past the join cursor and before any leave cursor to come. The member reads the entries
//! through its own history consumer, which the broker bounds to its read ACL (§9 item 4), and
//! confirms its progress; the reader saves that progress as the interval's position and, once
//! the range is handled, goes on from there with its consumer (at-least-once: a range not
//! confirmed is granted again from where its progress stood).
//!
//! Why: a catch-up then costs the appliance a few messages per range instead of a receive,
//! a check, a copy and an ack per entry, and the broker delivers each entry once, to the member,
//! as a raw pull does (`docs/benchmarks.md`, *Catch-up: the member reads its range*).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

use crate::ops::RangeProgress;

/// Where a granted range stands, as its member said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Granted {
    /// Every entry up to this stream sequence is handled.
    pub(super) position: u64,
    /// How many of its entries are handled.
    pub(super) handled: u64,
    /// The member could not read it.
    pub(super) declined: bool,
}

/// One session's granted ranges.
#[derive(Default)]
pub(super) struct Grants {
    next: AtomicU64,
    /// Grant → (entries granted, its progress).
    open: Mutex<HashMap<u64, (u64, watch::Sender<Granted>)>>,
}

impl Grants {
    /// Opens a grant of `count` entries after `after`: its number and its progress.
    pub(super) fn open(&self, after: u64, count: u64) -> (u64, watch::Receiver<Granted>) {
        let grant = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(Granted {
            position: after,
            handled: 0,
            declined: false,
        });
        if let Ok(mut open) = self.open.lock() {
            open.insert(grant, (count, tx));
        }
        (grant, rx)
    }

    /// Closes a grant: what its member says of it later is not heard.
    pub(super) fn close(&self, grant: u64) {
        if let Ok(mut open) = self.open.lock() {
            open.remove(&grant);
        }
    }

    /// The member's word on `grant`; only ever forward (a token that comes late is no step
    /// back), and never past what was granted.
    pub(super) fn progress(&self, grant: u64, progress: RangeProgress) {
        let Ok(open) = self.open.lock() else { return };
        let Some((count, tx)) = open.get(&grant) else {
            return;
        };
        tx.send_if_modified(|g| match progress {
            RangeProgress::Declined => !std::mem::replace(&mut g.declined, true),
            RangeProgress::Handled { position, handled } => {
                let handled = handled.min(*count);
                let moved = position > g.position || handled > g.handled;
                g.position = g.position.max(position);
                g.handled = g.handled.max(handled);
                moved
            }
        });
    }

    /// How many granted entries the member has not confirmed.
    pub(super) fn waiting(&self) -> u64 {
        self.open
            .lock()
            .map(|open| {
                open.values()
                    .map(|(count, tx)| count.saturating_sub(tx.borrow().handled))
                    .sum()
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_only_moves_forward_within_what_was_granted_and_a_closed_grant_hears_nothing() {
        let grants = Grants::default();
        let (a, rx) = grants.open(10, 100);
        assert_eq!(grants.waiting(), 100);
        let handled = |position, handled| RangeProgress::Handled { position, handled };
        grants.progress(a, handled(50, 40));
        grants.progress(a, handled(30, 20));
        assert_eq!(
            *rx.borrow(),
            Granted {
                position: 50,
                handled: 40,
                declined: false
            }
        );
        assert_eq!(grants.waiting(), 60);
        grants.progress(a, handled(500, 1_000));
        assert_eq!(rx.borrow().handled, 100, "never past what was granted");
        assert_eq!(grants.waiting(), 0);
        let (b, rx_b) = grants.open(0, 5);
        assert_ne!(a, b);
        grants.close(b);
        grants.progress(b, RangeProgress::Declined);
        assert!(!rx_b.borrow().declined);
        grants.progress(a, RangeProgress::Declined);
        assert!(rx.borrow().declined);
    }
}
