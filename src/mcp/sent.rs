//! What this session sent, newest last, for `cotal_receipts` to ask about: each message's id,
//! where it went, its stream sequence and the start of its text. Bounded ([`KEEP`]): read
//! receipts are for what an agent is still waiting on, not an archive.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::protocol::Routing;

/// How many sent messages a session remembers.
pub(super) const KEEP: usize = 200;

/// One message this session sent.
#[derive(Debug, Clone)]
pub(super) struct Outgoing {
    /// Its id.
    pub id: String,
    /// Where it went.
    pub routing: Routing,
    /// Its stream sequence.
    pub sequence: u64,
    /// The start of its text.
    pub preview: String,
}

/// The messages this session sent.
#[derive(Default)]
pub(super) struct SentLog {
    sent: Mutex<VecDeque<Outgoing>>,
}

impl SentLog {
    /// Remembers `message` (the oldest is forgotten past [`KEEP`]).
    pub(super) fn record(&self, message: Outgoing) {
        if let Ok(mut sent) = self.sent.lock() {
            if sent.len() == KEEP {
                sent.pop_front();
            }
            sent.push_back(message);
        }
    }

    /// The message with `id`, or the `n` most recent, newest first.
    pub(super) fn pick(&self, id: Option<&str>, n: usize) -> Vec<Outgoing> {
        let Ok(sent) = self.sent.lock() else {
            return Vec::new();
        };
        match id {
            Some(id) => sent.iter().filter(|m| m.id == id).cloned().collect(),
            None => sent.iter().rev().take(n).cloned().collect(),
        }
    }
}
