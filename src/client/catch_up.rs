//! What waited for this endpoint when it connected, and whether it has been surfaced yet.
//!
//! An endpoint that connects may have a backlog in three places: its DM durable, its role's
//! anycast durable (§8), and the trusted reader's durable copies of its channels (§4
//! `durable`, §8). An application asked "what waits for me" right after connecting (an MCP
//! host's first call) must not answer before that backlog arrived. Each source registers here
//! before [`super::Client::connect`] returns and says when what it held at that moment has been
//! surfaced, or when its window is full (the rest comes as the application acknowledges);
//! [`super::Client::caught_up`] waits for all of them, and
//! [`super::Client::catching_up`] says which are still on their way.

use std::collections::BTreeMap;

use tokio::sync::watch;

/// The sources whose backlog at connect is still on its way, each with what it is in words.
pub(crate) struct CatchUp {
    outstanding: watch::Sender<BTreeMap<String, &'static str>>,
}

impl Default for CatchUp {
    fn default() -> Self {
        CatchUp {
            outstanding: watch::Sender::new(BTreeMap::new()),
        }
    }
}

impl CatchUp {
    /// `key` has a backlog on its way, `what` in words (once: a source registers at most once).
    pub(crate) fn register(&self, key: &str, what: &'static str) {
        self.outstanding.send_modify(|o| {
            o.insert(key.to_owned(), what);
        });
    }

    /// `key`'s backlog at connect has been surfaced (or was none).
    pub(crate) fn done(&self, key: &str) {
        self.outstanding
            .send_if_modified(|o| o.remove(key).is_some());
    }

    /// Waits until every registered source is done.
    pub(crate) async fn wait(&self) {
        let mut rx = self.outstanding.subscribe();
        let _ = rx.wait_for(BTreeMap::is_empty).await;
    }

    /// What is still on its way, in words, each once.
    pub(crate) fn outstanding(&self) -> Vec<&'static str> {
        let mut what: Vec<&'static str> = self.outstanding.borrow().values().copied().collect();
        what.sort_unstable();
        what.dedup();
        what
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_every_source_and_names_what_is_left() {
        let c = CatchUp::default();
        c.register("dm_x", "direct messages");
        c.register("bk_1", "durable channel backlog");
        c.register("bk_2", "durable channel backlog");
        assert_eq!(
            c.outstanding(),
            ["direct messages", "durable channel backlog"]
        );
        c.done("dm_x");
        c.done("bk_1");
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), c.wait()).await;
        assert!(waiting.is_err(), "bk_2 is still on its way");
        c.done("bk_2");
        tokio::time::timeout(std::time::Duration::from_secs(1), c.wait())
            .await
            .expect("all done");
        assert!(c.outstanding().is_empty());
    }
}
