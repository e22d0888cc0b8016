//! Threads: conversations by `replyTo` and `contextId` (§5's message fields), from what this
//! session saw (what it received and sent, what `cotal_history` read) and from the history of
//! the channels a thread ran on.
//!
//! A thread's id is a message's `contextId` when it carries one, else the first message of
//! its reply chain; a reply this server sends carries its thread's id as `contextId`, so that
//! every endpoint can correlate it without holding the chain. What the session keeps is
//! bounded ([`KEEP_MESSAGES`], [`KEEP_BYTES`]): the oldest goes first. DMs exchanged before
//! this session started are in no history an endpoint may read (they were acknowledged), so a
//! thread read back says that it may miss them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::protocol::CotalMessage;

/// The most messages a session keeps for its threads.
pub(super) const KEEP_MESSAGES: usize = 10_000;
/// The most bytes of text a session keeps for its threads.
pub(super) const KEEP_BYTES: usize = 16 << 20;

/// How many replies up a chain is followed to its first message.
const CHAIN_MAX: usize = 1_000;

/// What a session saw, by message id, oldest first.
#[derive(Default)]
pub(super) struct Threads {
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    by_id: HashMap<String, Arc<CotalMessage>>,
    order: VecDeque<(String, usize)>,
    bytes: usize,
}

/// A message's weight against [`KEEP_BYTES`]: its text and a share for its other fields.
fn weight(m: &CotalMessage) -> usize {
    super::tools::text_of(&m.parts).len() + 512
}

impl Threads {
    /// Keeps `m` (once per id: the first copy seen stays).
    pub(super) fn record(&self, m: &CotalMessage) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        if seen.by_id.contains_key(&m.id) {
            return;
        }
        let w = weight(m);
        seen.by_id.insert(m.id.clone(), Arc::new(m.clone()));
        seen.order.push_back((m.id.clone(), w));
        seen.bytes += w;
        while seen.order.len() > KEEP_MESSAGES || seen.bytes > KEEP_BYTES {
            let Some((id, w)) = seen.order.pop_front() else {
                break;
            };
            seen.by_id.remove(&id);
            seen.bytes -= w;
        }
    }

    /// The thread `id` names: a known message's thread, else `id` itself (a thread id).
    pub(super) fn resolve(&self, id: &str) -> String {
        let Ok(seen) = self.seen.lock() else {
            return id.to_owned();
        };
        seen.by_id
            .get(id)
            .map_or_else(|| id.to_owned(), |m| seen.thread_of(m))
    }

    /// The thread of `m` when it is part of one (it answers a message or carries a context);
    /// `None` for a message that starts nothing yet.
    pub(super) fn thread(&self, m: &CotalMessage) -> Option<String> {
        if m.context_id.is_none() && m.reply_to.is_none() {
            return None;
        }
        let seen = self.seen.lock().ok()?;
        Some(seen.thread_of(m))
    }

    /// Every kept message of thread `thread` (its first message included), in the order they
    /// were sent (then kept).
    pub(super) fn messages(&self, thread: &str) -> Vec<Arc<CotalMessage>> {
        let Ok(seen) = self.seen.lock() else {
            return Vec::new();
        };
        let mut found: Vec<(usize, Arc<CotalMessage>)> = seen
            .order
            .iter()
            .enumerate()
            .filter_map(|(at, (id, _))| seen.by_id.get(id).map(|m| (at, m)))
            .filter(|(_, m)| m.id == thread || seen.thread_of(m) == thread)
            .map(|(at, m)| (at, m.clone()))
            .collect();
        found.sort_by(|(a_at, a), (b_at, b)| {
            let (a_ts, b_ts) = (a.ts.as_f64().unwrap_or(0.0), b.ts.as_f64().unwrap_or(0.0));
            a_ts.total_cmp(&b_ts).then(a_at.cmp(b_at))
        });
        found.into_iter().map(|(_, m)| m).collect()
    }
}

impl Seen {
    /// `m`'s context id, else the first message of its reply chain that is known (or the
    /// unknown message the chain stops at).
    fn thread_of(&self, m: &CotalMessage) -> String {
        if let Some(context) = &m.context_id {
            return context.clone();
        }
        let mut at = m;
        for _ in 0..CHAIN_MAX {
            let Some(parent) = &at.reply_to else {
                return at.id.clone();
            };
            match self.by_id.get(parent) {
                Some(p) if p.context_id.is_some() => {
                    return p.context_id.clone().unwrap_or_default();
                }
                Some(p) => at = p,
                None => return parent.clone(),
            }
        }
        at.id.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Channel, EndpointRef, InstanceId, Part, Routing};

    fn message(text: &str, reply_to: Option<&str>) -> CotalMessage {
        let from = InstanceId::from_user_nkey(&nkeys::KeyPair::new_user().public_key()).unwrap();
        let mut m = CotalMessage::new(
            "main",
            EndpointRef::new(&from, "alice"),
            Routing::channel(&Channel::new("general").unwrap()),
            vec![Part::text(text)],
        );
        m.reply_to = reply_to.map(str::to_owned);
        m
    }

    #[test]
    fn a_reply_chain_is_one_thread_named_by_its_first_message() {
        let threads = Threads::default();
        let root = message("root", None);
        let a = message("a", Some(&root.id));
        let b = message("b", Some(&a.id));
        let other = message("other", None);
        for m in [&root, &a, &b, &other] {
            threads.record(m);
        }
        assert_eq!(
            threads.thread(&root),
            None,
            "a first message starts nothing yet"
        );
        assert_eq!(threads.thread(&b), Some(root.id.clone()));
        assert_eq!(threads.resolve(&b.id), root.id);
        let texts: Vec<String> = threads
            .messages(&root.id)
            .iter()
            .map(|m| crate::mcp::tools::text_of(&m.parts))
            .collect();
        assert_eq!(texts, ["root", "a", "b"]);
        let mut c = message("c", Some("unknown"));
        c.context_id = Some(root.id.clone());
        threads.record(&c);
        assert_eq!(threads.messages(&root.id).len(), 4, "by context too");
    }
}
