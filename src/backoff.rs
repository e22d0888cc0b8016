//! Capped exponential backoff between restarts: 100 ms doubling to 10 s, reset once a run lasted
//! long enough that its end is not a crash loop. The supervisor restarts the broker with it and
//! the service sets restart services with it.

use std::time::Duration;

/// The first delay.
pub const START: Duration = Duration::from_millis(100);
/// The longest delay.
pub const MAX: Duration = Duration::from_secs(10);
/// A run this long resets the delay.
pub const STABLE_AFTER: Duration = Duration::from_secs(30);

/// The delays before successive restarts.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: START }
    }
}

impl Backoff {
    /// Tells the backoff how long the last run lasted: a stable run starts the delays over.
    pub fn ran_for(&mut self, lasted: Duration) {
        if lasted >= STABLE_AFTER {
            self.next = START;
        }
    }

    /// The delay to wait now; the one after doubles, up to [`MAX`].
    pub fn next_delay(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(MAX);
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets_after_a_stable_run() {
        let mut b = Backoff::default();
        let delays: Vec<_> = (0..9).map(|_| b.next_delay()).collect();
        assert_eq!(delays[0], START);
        assert_eq!(delays[1], START * 2);
        assert_eq!(*delays.last().unwrap(), MAX);
        b.ran_for(Duration::from_secs(1));
        assert_eq!(b.next_delay(), MAX);
        b.ran_for(STABLE_AFTER);
        assert_eq!(b.next_delay(), START);
    }
}
