//! The channel registry (§7) as the appliance last saw it: every key of
//! `cotal_channels_<space>` with the revision it was read at, kept current by a watch of the
//! bucket (`services::registry`) and by the appliance's own writes as they are made.
//!
//! A durable join, a mention and a receipt each ask a channel's effective config; read from
//! the bucket, that was two `STREAM.MSG.GET`s every time. While the watch holds the registry
//! they are answered here; while it does not (not caught up yet, or its watch ended), nothing
//! is answered here and the bucket is read as before, so a stale view is never taken for the
//! registry. A value is replaced only by one of a later revision: a watch delivering an older
//! entry after the appliance's own write cannot bring the older value back.

use std::collections::HashMap;
use std::sync::RwLock;

use bytes::Bytes;

/// One key as last seen: its revision, and its value (`None`: deleted or purged).
type Seen = (u64, Option<Bytes>);

/// The registry's keys as last seen, while a watch holds them.
#[derive(Default)]
pub struct RegistryView {
    held: RwLock<Option<HashMap<String, Seen>>>,
}

impl RegistryView {
    /// The value of `key` (`Some(None)`: not in the registry); `None` when the view is not
    /// held and the bucket must be read.
    pub fn lookup(&self, key: &str) -> Option<Option<Bytes>> {
        let held = self.held.read().unwrap_or_else(|e| e.into_inner());
        let keys = held.as_ref()?;
        Some(keys.get(key).and_then(|(_, value)| value.clone()))
    }

    /// Holds `keys`, every key of the bucket as a watch read it up to the present.
    pub fn hold(&self, keys: HashMap<String, Seen>) {
        *self.held.write().unwrap_or_else(|e| e.into_inner()) = Some(keys);
    }

    /// Stops answering (the watch ended): the bucket is read again until a watch holds it.
    pub fn release(&self) {
        *self.held.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// `key` is `value` as of `revision`, unless a later revision was seen already.
    pub fn apply(&self, key: &str, revision: u64, value: Option<Bytes>) {
        let mut held = self.held.write().unwrap_or_else(|e| e.into_inner());
        if let Some(keys) = held.as_mut() {
            apply(keys, key, revision, value);
        }
    }

    /// `key` was just purged by the appliance (a purge answers no revision): its marker's
    /// revision is later than the last value seen, so that value is gone, and anything the
    /// watch brings later than it is newer.
    pub fn removed(&self, key: &str) {
        let mut held = self.held.write().unwrap_or_else(|e| e.into_inner());
        if let Some(keys) = held.as_mut() {
            let after = keys.get(key).map_or(0, |(revision, _)| revision + 1);
            apply(keys, key, after, None);
        }
    }
}

/// Puts `value` at `revision` into `keys` unless a later revision is there.
pub fn apply(keys: &mut HashMap<String, Seen>, key: &str, revision: u64, value: Option<Bytes>) {
    let later = keys.get(key).is_some_and(|(seen, _)| *seen > revision);
    if !later {
        keys.insert(key.to_owned(), (revision, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &'static str) -> Option<Bytes> {
        Some(Bytes::from_static(text.as_bytes()))
    }

    #[test]
    fn nothing_is_answered_until_a_watch_holds_the_registry_and_after_it_ended() {
        let view = RegistryView::default();
        view.apply("general", 3, value("a"));
        assert_eq!(view.lookup("general"), None, "not held: read the bucket");
        view.hold(HashMap::from([("general".to_owned(), (3, value("a")))]));
        assert_eq!(view.lookup("general"), Some(value("a")));
        assert_eq!(
            view.lookup("other"),
            Some(None),
            "held, and not in the registry"
        );
        view.release();
        assert_eq!(view.lookup("general"), None);
    }

    #[test]
    fn an_older_revision_never_replaces_a_later_one() {
        let view = RegistryView::default();
        view.hold(HashMap::new());
        // The appliance's own write lands first; the watch then brings an older entry.
        view.apply("general", 7, value("new"));
        view.apply("general", 5, value("old"));
        assert_eq!(view.lookup("general"), Some(value("new")));
        // A purge by the appliance: the value seen is gone; the watch's older entries cannot
        // bring it back, its marker and anything after it apply.
        view.removed("general");
        view.apply("general", 7, value("new"));
        assert_eq!(view.lookup("general"), Some(None));
        view.apply("general", 9, None);
        view.apply("general", 10, value("again"));
        assert_eq!(view.lookup("general"), Some(value("again")));
    }
}
