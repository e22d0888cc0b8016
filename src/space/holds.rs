//! Senders whose direct messages are held: refused at publish, to them alone, until the
//! recipients have read enough of what they already stored (§4's promise kept for every agent:
//! one sender must not fill DM for the others).
//!
//! JetStream bounds a subject (one (target, sender) pair, `binding/streams.rs`) and a stream,
//! never a sender, and §8 fixes DM's capture as `cotal.<space>.inst.>`, into which an agent may
//! publish to any target (Appendix B: `inst.*.<id>`). So the warden (`services/warden.rs`)
//! keeps each sender's unread total and, past its share, holds it; the broker carries the hold
//! out. The space's account JWT maps the held sender's `inst.*.<id>` onto its own
//! `ctl.manager.<id>` ([`Holds::mappings`]): the broker applies an account mapping before it
//! checks publish permissions, and that subject is one the sender's grants already allow and
//! that no stream captures. Its DM publishes reach the manager instead of DM, and the manager
//! answers each the way JetStream answers a refused publish, with the reason
//! ([`Hold::refusal`]). So the sender's client sees a refused publish at once, with words;
//! nothing it sent is stored, nothing acknowledged is dropped later, and its channel posts,
//! presence and control requests are untouched. A hold ends when the warden sees the sender
//! back under half its share, and lives in memory only: the warden rebuilds its totals from DM
//! when it starts.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::binding::MANAGER_SERVICE;
use crate::profile::human_size;

/// How a hold's refusal begins; a client finds the reason after it.
pub const HELD: &str = "held: ";

/// Why one sender is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// Bytes of its DMs stored and not yet read when it was held.
    pub unread: u64,
    /// What one sender may have stored unread.
    pub share: u64,
    /// The DM store's byte limit the share is cut from.
    pub store: u64,
}

impl Hold {
    /// What the manager answers a held publish with: a JetStream API error, so that any
    /// client's publish fails with this text (`code` 429: too many, for now).
    pub fn refusal(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "code": 429,
                "description": format!(
                    "{HELD}{} of your direct messages wait unread, more than your share of this \
                     space's DM store ({} of {}); your direct messages are refused until \
                     their recipients have read some",
                    human_size(self.unread),
                    human_size(self.share),
                    human_size(self.store),
                ),
            }
        })
    }
}

/// The held senders of one space.
#[derive(Debug, Default)]
pub struct Holds {
    held: Mutex<BTreeMap<String, Hold>>,
}

impl Holds {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Hold>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why `sender` is held, if it is.
    pub fn get(&self, sender: &str) -> Option<Hold> {
        self.lock().get(sender).copied()
    }

    /// Holds `sender`; false when it already was.
    pub fn hold(&self, sender: &str, hold: Hold) -> bool {
        self.lock().insert(sender.to_owned(), hold).is_none()
    }

    /// Ends the hold of `sender`; false when it was not held.
    pub fn release(&self, sender: &str) -> bool {
        self.lock().remove(sender).is_some()
    }

    /// The held senders.
    pub fn senders(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// The account's subject mappings that carry the holds out, source → destination: each
    /// held sender's `<prefix>.inst.*.<id>` onto `<prefix>.ctl.manager.<id>`.
    pub fn mappings(&self, prefix: &str) -> BTreeMap<String, String> {
        self.lock()
            .keys()
            .map(|id| {
                (
                    format!("{prefix}.inst.*.{id}"),
                    format!("{prefix}.ctl.{MANAGER_SERVICE}.{id}"),
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_maps_only_the_senders_dms_onto_its_own_control_subject() {
        let holds = Holds::default();
        let hold = Hold {
            unread: 3 << 20,
            share: 2 << 20,
            store: 16 << 20,
        };
        assert!(holds.hold("UMAL", hold));
        assert!(!holds.hold("UMAL", hold));
        assert_eq!(
            holds.mappings("cotal.main"),
            BTreeMap::from([(
                "cotal.main.inst.*.UMAL".to_owned(),
                "cotal.main.ctl.manager.UMAL".to_owned()
            )])
        );
        assert!(holds.release("UMAL"));
        assert!(holds.mappings("cotal.main").is_empty());
        assert!(!holds.release("UMAL"));
    }

    #[test]
    fn the_refusal_reads_as_a_jetstream_error_with_the_figures() {
        let refusal = Hold {
            unread: 3 << 20,
            share: 2 << 20,
            store: 16 << 20,
        }
        .refusal();
        assert_eq!(refusal["error"]["code"], 429);
        let said = refusal["error"]["description"].as_str().unwrap();
        assert!(said.starts_with("held: 3.0 MiB"), "{said}");
        assert!(said.contains("more than your share"), "{said}");
        assert!(said.contains("(2.0 MiB of 16.0 MiB)"), "{said}");
    }
}
