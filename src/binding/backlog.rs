//! What a pull consumer held when it was bound, counted down as its entries are taken: how a
//! reader knows that the backlog it found on connecting has been read (§8 durables, the
//! trusted reader's consumers), without waiting for a quiet moment that proves nothing.

/// Counts what a pull consumer surfaced after it was bound, against what it held then:
/// `pending + ack_pending` (copies handed to an earlier session come again), at most its
/// `max_ack_pending` (past that the broker hands out more only as copies are acknowledged).
pub struct Backlog {
    left: u64,
}

impl Backlog {
    /// The backlog of a consumer as its info says.
    pub fn of(pending: u64, ack_pending: usize, max_ack_pending: i64) -> Backlog {
        let held = pending.saturating_add(ack_pending as u64);
        let window = u64::try_from(max_ack_pending)
            .ok()
            .filter(|w| *w > 0)
            .unwrap_or(u64::MAX);
        Backlog {
            left: held.min(window),
        }
    }

    /// The backlog of a consumer as the broker described it.
    pub fn at(info: &async_nats::jetstream::consumer::Info) -> Backlog {
        Self::of(
            info.num_pending,
            info.num_ack_pending,
            info.config.max_ack_pending,
        )
    }

    /// Whether nothing is left.
    pub fn is_done(&self) -> bool {
        self.left == 0
    }

    /// One entry taken; true when that was the last.
    pub fn took_one(&mut self) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        self.left == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backlog_counts_redeliveries_and_stops_at_the_window() {
        let mut b = Backlog::of(2, 1, 512);
        assert!(!b.is_done());
        assert!(!b.took_one() && !b.took_one());
        assert!(b.took_one(), "the third was the last");
        assert!(b.is_done() && !b.took_one());
        assert!(Backlog::of(0, 0, 512).is_done());
        let mut full = Backlog::of(10_000, 0, 2);
        assert!(!full.took_one() && full.took_one(), "a window of two");
        assert!(!Backlog::of(5, 0, -1).is_done(), "no window: everything");
    }
}
