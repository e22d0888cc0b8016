//! Senders held from sending direct messages or tasks: refused at publish, to them alone,
//! until enough of what they already stored is read or taken (§4's promise kept for every
//! agent: one sender must not fill DM or TASK for the others).
//!
//! JetStream bounds a subject (one (target, sender) pair, `binding/streams.rs`) and a stream,
//! never a sender, and §8 fixes the captures as `cotal.<space>.inst.>` and `….svc.>`, into which
//! an agent may publish to any target or role (Appendix B: `inst.*.<id>`, `svc.*.<id>`). So the
//! warden (`services/warden/`) keeps each sender's total and, past its share, holds it; the
//! broker carries the hold out. The space's account JWT maps the held sender's `inst.*.<id>`
//! (or `svc.*.<id>`) onto its own `ctl.manager.<id>` ([`Holds::mappings`]): the broker applies
//! an account mapping before it checks publish permissions, and that subject is one the
//! sender's grants already allow and that no stream captures. Its publishes reach the manager
//! instead of the stream, and the manager answers each the way JetStream answers a refused
//! publish, with the reason ([`Hold::refusal`]). So the sender's client sees a refused publish
//! at once, with words; nothing it sent is stored, nothing acknowledged is dropped later, and its
//! channel posts, presence and control requests are untouched. A hold ends when the warden sees
//! the sender back under half its share, and lives in memory only: the warden rebuilds its
//! totals from the streams when it starts.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::binding::{HELD, SpaceNames};
use crate::profile::human_size;

/// What a sender is held from sending: each has its share of its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Held {
    /// Direct messages (`inst.*.<id>`, DM).
    Dms,
    /// Tasks (`svc.*.<id>`, TASK).
    Tasks,
}

impl Held {
    /// The publish subjects of `sender` the hold maps away.
    fn subjects(self, names: &SpaceNames, sender: &str) -> String {
        match self {
            Held::Dms => names.dms_from(sender),
            Held::Tasks => names.tasks_from(sender),
        }
    }
}

/// Why one sender is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// Bytes of its messages stored and not yet read (or, tasks, not yet taken).
    pub unread: u64,
    /// What one sender may have stored so.
    pub share: u64,
    /// The store's byte limit the share is cut from.
    pub store: u64,
}

impl Hold {
    /// What the manager answers a held publish with: a JetStream API error, so that any
    /// client's publish fails with this text (`code` 429: too many, for now).
    pub fn refusal(&self, held: Held) -> serde_json::Value {
        let (what, waiting, store, until) = match held {
            Held::Dms => (
                "direct messages",
                "wait unread",
                "DM store",
                "their recipients have read some",
            ),
            Held::Tasks => (
                "tasks",
                "wait untaken",
                "task store",
                "workers have taken some",
            ),
        };
        serde_json::json!({
            "error": {
                "code": 429,
                "description": format!(
                    "{HELD}{} of your {what} {waiting}, more than your share of this space's \
                     {store} ({} of {}); your {what} are refused until {until}",
                    human_size(self.unread),
                    human_size(self.share),
                    human_size(self.store),
                ),
            }
        })
    }
}

/// The held senders of one space. A hold ends in two steps: [`Holds::release`] takes it out
/// of the mappings, and [`Holds::forget_released`] forgets it once the account without it is
/// pushed; until then the broker may still map a publish here, and the manager still answers
/// it with the refusal.
#[derive(Debug, Default)]
pub struct Holds {
    held: Mutex<BTreeMap<(Held, String), (Hold, Mapped)>>,
}

/// Whether a hold is in the account's mappings.
type Mapped = bool;

impl Holds {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(Held, String), (Hold, Mapped)>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why `sender` is held from sending `held`, if it is (or was, until the broker knows).
    pub fn get(&self, held: Held, sender: &str) -> Option<Hold> {
        self.lock().get(&(held, sender.to_owned())).map(|h| h.0)
    }

    /// Holds `sender` from sending `held` (or updates the figures); false when it already was.
    pub fn hold(&self, held: Held, sender: &str, hold: Hold) -> bool {
        self.lock()
            .insert((held, sender.to_owned()), (hold, true))
            .is_none_or(|(_, mapped)| !mapped)
    }

    /// Takes that hold out of the mappings; false when there was none.
    pub fn release(&self, held: Held, sender: &str) -> bool {
        match self.lock().get_mut(&(held, sender.to_owned())) {
            Some((_, mapped)) if *mapped => {
                *mapped = false;
                true
            }
            _ => false,
        }
    }

    /// Forgets the released holds: the account without them is pushed.
    pub fn forget_released(&self) {
        self.lock().retain(|_, (_, mapped)| *mapped);
    }

    /// The senders held from sending `held` (released ones not).
    pub fn senders(&self, held: Held) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|((h, _), (_, mapped))| *h == held && *mapped)
            .map(|((_, sender), _)| sender.clone())
            .collect()
    }

    /// Whether anyone is held.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The account's subject mappings that carry the holds out, source → destination: a held
    /// sender's `<prefix>.inst.*.<id>` (or `svc.*.<id>`) onto `<prefix>.ctl.manager.<id>`.
    pub fn mappings(&self, names: &SpaceNames) -> BTreeMap<String, String> {
        self.lock()
            .iter()
            .filter(|(_, (_, mapped))| *mapped)
            .map(|((held, id), _)| (held.subjects(names, id), names.manager_control(id)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_maps_only_what_the_sender_is_held_from_onto_its_own_control_subject() {
        let holds = Holds::default();
        let hold = Hold {
            unread: 3 << 20,
            share: 2 << 20,
            store: 16 << 20,
        };
        assert!(holds.hold(Held::Dms, "UMAL", hold));
        assert!(!holds.hold(Held::Dms, "UMAL", hold));
        assert_eq!(
            holds.mappings(&SpaceNames::new("main")),
            BTreeMap::from([(
                "cotal.main.inst.*.UMAL".to_owned(),
                "cotal.main.ctl.manager.UMAL".to_owned()
            )])
        );
        assert!(holds.hold(Held::Tasks, "UMAL", hold));
        assert_eq!(
            holds.mappings(&SpaceNames::new("main"))["cotal.main.svc.*.UMAL"],
            "cotal.main.ctl.manager.UMAL"
        );
        assert_eq!(holds.senders(Held::Tasks), ["UMAL"]);
        assert!(holds.release(Held::Dms, "UMAL"));
        assert!(holds.release(Held::Tasks, "UMAL"));
        assert!(holds.mappings(&SpaceNames::new("main")).is_empty());
        // Until the account without them is pushed, the manager still refuses.
        assert_eq!(holds.get(Held::Dms, "UMAL"), Some(hold));
        assert!(!holds.release(Held::Dms, "UMAL"));
        holds.forget_released();
        assert!(holds.is_empty());
    }

    #[test]
    fn the_refusal_reads_as_a_jetstream_error_with_the_figures() {
        let refusal = Hold {
            unread: 3 << 20,
            share: 2 << 20,
            store: 16 << 20,
        }
        .refusal(Held::Dms);
        assert_eq!(refusal["error"]["code"], 429);
        let said = refusal["error"]["description"].as_str().unwrap();
        assert!(said.starts_with("held: 3.0 MiB"), "{said}");
        assert!(said.contains("more than your share"), "{said}");
        assert!(said.contains("(2.0 MiB of 16.0 MiB)"), "{said}");
    }
}
