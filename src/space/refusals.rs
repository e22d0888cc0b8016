//! What the appliance's readers refuse of what they read in a space (§4, §5: a permanent
//! anomaly is terminated, never redelivered, and costs that message only).
//!
//! Every refusal is counted by reason (`cotald status --json`, `refused`) and logged with its
//! sender (the subject's sender token, §3) and its subject, at most one line per sender each
//! [`LOG_EVERY`]: one agent's flood of bad frames cannot fill the operator's log, and the next
//! line about that sender says how many were refused meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::protocol::{Rejection, parse_subject};

/// At most one log line per sender this often.
pub const LOG_EVERY: Duration = Duration::from_secs(60);
/// The senders remembered for the rate limit; past that, the memory starts over.
const SENDERS: usize = 10_000;

/// The refusals of one space's readers.
pub struct Refusals {
    space: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    counts: BTreeMap<&'static str, u64>,
    senders: HashMap<String, Logged>,
}

/// When a sender's refusal was last logged, and how many were not since.
struct Logged {
    at: Instant,
    unlogged: u64,
}

impl Refusals {
    /// No refusal yet, in `space`.
    pub fn new(space: &str) -> Self {
        Refusals {
            space: space.to_owned(),
            state: Mutex::default(),
        }
    }

    /// Counts a message `reader` refused, and logs it unless its sender was logged within
    /// [`LOG_EVERY`].
    pub fn refuse(&self, reader: &'static str, subject: &str, rejection: &Rejection) {
        let reason = rejection.reason().as_str();
        let sender = parse_subject(subject)
            .map(|p| p.sender.to_owned())
            .unwrap_or_else(|_| "unknown (the subject names none)".to_owned());
        let unlogged = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            *state.counts.entry(reason).or_default() += 1;
            if state.senders.len() >= SENDERS && !state.senders.contains_key(&sender) {
                state.senders.clear();
            }
            let now = Instant::now();
            match state.senders.get_mut(&sender) {
                Some(logged) if now.duration_since(logged.at) < LOG_EVERY => {
                    logged.unlogged += 1;
                    return;
                }
                Some(logged) => {
                    logged.at = now;
                    std::mem::take(&mut logged.unlogged)
                }
                None => {
                    state.senders.insert(
                        sender.clone(),
                        Logged {
                            at: now,
                            unlogged: 0,
                        },
                    );
                    0
                }
            }
        };
        tracing::warn!(
            space = self.space,
            reader,
            sender,
            subject,
            reason,
            detail = %rejection,
            refused_since_last_line = unlogged,
            "message refused"
        );
    }

    /// How many messages were refused, by reason token.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state
            .counts
            .iter()
            .map(|(reason, n)| ((*reason).to_owned(), *n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_is_counted_and_a_sender_is_logged_once_a_minute() {
        let refusals = Refusals::new("main");
        let subject = "cotal.main.chat.UALICE.general";
        for _ in 0..3 {
            refusals.refuse("test", subject, &Rejection::MalformedHeader("x".into()));
        }
        refusals.refuse("test", "nonsense", &Rejection::MissingSender);
        let counts = refusals.counts();
        assert_eq!(counts["malformed-header"], 3);
        assert_eq!(counts["sender-mismatch"], 1);
        let state = refusals.state.lock().unwrap();
        assert_eq!(state.senders["UALICE"].unlogged, 2, "two were not logged");
    }
}
