//! The client's background tasks under one owner: the roster watch and the heartbeat (§6), the
//! DM and anycast pulls (§8), the backstop's receiver and session keeper, gap recovery. Each
//! is spawned here, tracked, and ends when the client stops receiving: nothing the client
//! started outlives it, and a task spawned after the stop (a join's gap recovery racing the
//! end) ends at once instead of running on unowned.

use std::future::Future;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The tracked tasks and what stops them.
#[derive(Default)]
pub(crate) struct Background {
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Background {
    /// Runs `task` until it ends or the client stops receiving.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let stop = self.stop.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = task => {}
            }
        });
    }

    /// Stops every task and waits until each has ended.
    pub(crate) async fn stop(&self) {
        self.stop.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stopping_ends_every_task_and_any_spawned_after() {
        let background = Background::default();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let held = tx.clone();
        background.spawn(async move {
            let _held = held;
            std::future::pending::<()>().await;
        });
        background.stop().await;
        let late = tx.clone();
        background.spawn(async move {
            let _late = late;
            std::future::pending::<()>().await;
        });
        drop(tx);
        // Every sender is dropped once the tasks holding them have ended.
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await;
        assert_eq!(ended, Ok(None));
    }
}
