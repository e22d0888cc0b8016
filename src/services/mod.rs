//! The in-process services, and the one way they are run.
//!
//! A [`Service`] is a long-running loop with a name: it runs until its [`Context`] is
//! cancelled, reports its [`Health`] as it goes, and returns an error when it cannot go on. A
//! [`ServiceSet`] owns services: it starts each on a child of its cancellation token, restarts
//! one that failed with capped exponential [`Backoff`], and on shutdown cancels them all and
//! waits for them up to an exit deadline. Nothing else in the appliance spawns a background
//! task of its own (the pattern of garage's workers and mini-redis's `run(listener,
//! shutdown)`: the owner decides when work stops, the work only listens).
//!
//! The appliance has one set for itself (admin socket, runtime state) and one per space, started
//! after the space's bootstrap and shut down before its connection closes:
//!
//! | service | what it does | spec |
//! | --- | --- | --- |
//! | [`link`] | the connection watch: reports a space cut off from its broker, dials again a connection closed for good | |
//! | [`manager`] | `ctl.manager`: durable join/leave, memberships, resume, acks, channel configs | §5, §7, App. B |
//! | [`backstop`] | the trusted reader: re-authorizes and hands durable copies to members | §4, §8, §9 item 5 |
//! | [`mentions`] | durable copies of `@mentions` on `live` channels | §4, §5 |
//! | [`membership`] | the derived membership feed (display only) | §8 |
//! | [`presence`] | the services' view of who is live (the backstop delivers only to them) | §6 |
//! | [`registry`] | the services' view of the channel registry (a channel's delivery class without a read) | §7 |
//! | [`warden`] | purges DMs and tasks nobody can read, trims full DM pairs of read messages, holds a sender past its share | §4, §8 |
//! | [`consumers`] | the consumer guard: bounds each identity's consumers on the presence and registry buckets, deletes durable ones | §6, §7, App. B |
//! | [`lease`] | in a cluster: which node runs the space's services above (the presence and registry watches excepted) | §8 |
//! | [`identity_sync`] | in a cluster: every node knows the identities minted on any of them | §9 |
//!
//! [`crate::space::members`] is the registry the manager writes and the backstop reads (§7 membership).

pub mod backstop;
pub mod consumers;
pub mod identity_sync;
pub mod lease;
pub mod link;
pub mod manager;
pub mod membership;
pub mod mentions;
pub mod presence;
pub mod receipts;
pub mod registry;
pub mod warden;

use crate::backoff::Backoff;
pub use crate::ops::status::{Health, ServiceStatus};

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why a service stopped working. The set logs it, shows it in `cotald status`, and restarts
/// the service after a backoff.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct ServiceError {
    /// What failed.
    pub what: String,
    /// Why.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl ServiceError {
    /// A failure described by `what`, caused by `source`.
    pub fn new(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ServiceError {
            what: what.into(),
            source: Some(source.into()),
        }
    }

    /// A failure with no underlying error.
    pub fn msg(what: impl Into<String>) -> Self {
        ServiceError {
            what: what.into(),
            source: None,
        }
    }

    /// `.map_err(ServiceError::at("opening the members registry"))`.
    pub fn at<E: Into<Box<dyn std::error::Error + Send + Sync>>>(
        what: &str,
    ) -> impl FnOnce(E) -> Self + '_ {
        move |e| ServiceError::new(what, e)
    }
}

/// A long-running part of the appliance.
pub trait Service: Send + Sync + 'static {
    /// A stable name (`manager`, `backstop`, …) shown in logs and `cotald status`.
    fn name(&self) -> &'static str;

    /// Runs until `ctx.cancelled()` resolves, then returns `Ok`. Report [`Health::Running`]
    /// once serving; return `Err` when the service cannot go on (it is restarted).
    fn run(&self, ctx: Context) -> impl Future<Output = Result<(), ServiceError>> + Send;
}

/// What a running service is handed: its cancellation and its health reporter.
#[derive(Clone)]
pub struct Context {
    token: CancellationToken,
    health: watch::Sender<Health>,
}

impl Context {
    /// Resolves when the service must stop.
    pub async fn cancelled(&self) {
        self.token.cancelled().await;
    }

    /// Whether the service must stop.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The service's cancellation token (for work it hands to helpers it awaits itself).
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Reports the service's health (logged when it changes).
    pub fn report(&self, health: Health) {
        self.health.send_if_modified(|h| {
            let changed = *h != health;
            *h = health;
            changed
        });
    }
}

/// The next item of what a service reads without end (a bucket's watch), `None` once `ctx`
/// is cancelled; an error, or the end of it, is the service's failure, named by
/// `what` (it is restarted, and reads again).
async fn next_read<T, E>(
    ctx: &Context,
    read: &mut (impl futures_util::Stream<Item = Result<T, E>> + Unpin),
    what: &str,
) -> Result<Option<T>, ServiceError>
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use futures_util::StreamExt;
    let next = tokio::select! {
        () = ctx.cancelled() => return Ok(None),
        next = read.next() => next,
    };
    match next {
        Some(Ok(item)) => Ok(Some(item)),
        Some(Err(e)) => Err(ServiceError::new(format!("{what} failed"), e)),
        None => Err(ServiceError::msg(format!("{what} ended"))),
    }
}

/// Why a service's task ended without returning: its panic message.
fn panicked(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return "its task was cancelled".to_owned();
    }
    let payload = e.into_panic();
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_owned());
    format!("panicked: {message}")
}

/// Fault injection for the integration tests, in debug builds only:
/// `COTALD_FAULT_PANIC=<service name>` makes that service's first run panic as soon as it
/// reports [`Health::Running`], so that a test sees a running service panic, be restarted,
/// and `cotald status` say so.
mod fault {
    use tokio::sync::watch;

    use super::{Health, ServiceError};

    /// Whether the service named `name` is to panic once.
    pub(super) fn asked(name: &str) -> bool {
        cfg!(debug_assertions)
            && std::env::var("COTALD_FAULT_PANIC").is_ok_and(|wanted| wanted == name)
    }

    /// Runs `run` until the service reports running, then panics.
    pub(super) async fn panic_once_running(
        run: impl std::future::Future<Output = Result<(), ServiceError>>,
        mut seen: watch::Receiver<Health>,
    ) -> Result<(), ServiceError> {
        tokio::select! {
            outcome = run => outcome,
            _ = seen.wait_for(|h| *h == Health::Running) => {
                panic!("fault injected by COTALD_FAULT_PANIC")
            }
        }
    }
}

/// A service as its set sees it.
struct Entry {
    name: &'static str,
    health: watch::Receiver<Health>,
    restarts: Arc<AtomicU32>,
    last_failure: Arc<Mutex<Option<String>>>,
}

/// The services of one scope (the appliance, or one space).
pub struct ServiceSet {
    scope: String,
    token: CancellationToken,
    tracker: TaskTracker,
    entries: Mutex<Vec<Entry>>,
}

/// How long a service may take to report [`Health::Running`] before `start` gives up on it.
pub const START_TIMEOUT: Duration = Duration::from_secs(15);

impl ServiceSet {
    /// An empty set named `scope`, cancelled with `parent`.
    pub fn new(scope: impl Into<String>, parent: &CancellationToken) -> Self {
        ServiceSet {
            scope: scope.into(),
            token: parent.child_token(),
            tracker: TaskTracker::new(),
            entries: Mutex::default(),
        }
    }

    /// The scope's name.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Starts `service` and waits until it reports [`Health::Running`]. A service that fails
    /// first (or does not report within [`START_TIMEOUT`]) is an error for the caller to
    /// report; it keeps being restarted with backoff all the same.
    pub async fn start<S: Service>(&self, service: Arc<S>) -> Result<(), ServiceError> {
        let name = service.name();
        let (health, watched) = watch::channel(Health::Starting);
        let restarts = Arc::new(AtomicU32::new(0));
        let last_failure = Arc::new(Mutex::new(None));
        if let Ok(mut entries) = self.entries.lock() {
            entries.push(Entry {
                name,
                health: watched.clone(),
                restarts: restarts.clone(),
                last_failure: last_failure.clone(),
            });
        }
        self.tracker
            .spawn(log_health(self.scope.clone(), name, watched.clone()));
        let (failed_tx, failed) = tokio::sync::oneshot::channel::<String>();
        self.tracker.spawn(supervise(
            service,
            self.scope.clone(),
            self.token.clone(),
            health,
            restarts,
            last_failure,
            failed_tx,
        ));
        until_running(name, failed, watched).await
    }

    /// Every service's status.
    pub fn status(&self) -> Vec<ServiceStatus> {
        self.entries
            .lock()
            .map(|entries| {
                entries
                    .iter()
                    .map(|e| ServiceStatus {
                        scope: self.scope.clone(),
                        name: e.name.to_owned(),
                        health: e.health.borrow().clone(),
                        restarts: e.restarts.load(Ordering::Relaxed),
                        last_failure: e.last_failure.lock().ok().and_then(|l| l.clone()),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Cancels every service and waits for them to return, at most `deadline`; a service still
    /// running after it is named in the log and abandoned.
    pub async fn shutdown(&self, deadline: Duration) {
        self.token.cancel();
        self.tracker.close();
        if tokio::time::timeout(deadline, self.tracker.wait())
            .await
            .is_err()
        {
            let running: Vec<String> = self
                .status()
                .into_iter()
                .filter(|s| s.health != Health::Stopped)
                .map(|s| s.name)
                .collect();
            tracing::warn!(
                scope = self.scope,
                ?running,
                ?deadline,
                "services did not stop in time"
            );
        }
    }
}

/// Logs a service's health as it changes; the log ends with the service.
async fn log_health(scope: String, name: &'static str, mut log: watch::Receiver<Health>) {
    while log.changed().await.is_ok() {
        match &*log.borrow_and_update() {
            Health::Degraded(reason) => {
                tracing::warn!(scope, service = name, reason, "service degraded")
            }
            // Running and stopped are the expected states: said at debug, so that `up` prints
            // its phases, not one line per service.
            other => tracing::debug!(scope, service = name, health = ?other, "service"),
        }
    }
}

/// Runs `service` until the set is cancelled, restarting it with backoff whenever it fails,
/// panics or stops on its own; the first failure is told to `failed`, every one is recorded
/// in `last_failure` and `health`, and the service is [`Health::Stopped`] at the end.
async fn supervise<S: Service>(
    service: Arc<S>,
    scope: String,
    token: CancellationToken,
    health: watch::Sender<Health>,
    restarts: Arc<AtomicU32>,
    last_failure: Arc<Mutex<Option<String>>>,
    failed: tokio::sync::oneshot::Sender<String>,
) {
    let name = service.name();
    let mut backoff = Backoff::default();
    let mut failed = Some(failed);
    loop {
        let ctx = Context {
            token: token.child_token(),
            health: health.clone(),
        };
        let started = tokio::time::Instant::now();
        // On a task of its own, so that a panic ends this run, not the set's loop.
        let running = service.clone();
        let fault = (restarts.load(Ordering::Relaxed) == 0 && fault::asked(name))
            .then(|| health.subscribe());
        let outcome = tokio::spawn(async move {
            match fault {
                Some(seen) => fault::panic_once_running(running.run(ctx), seen).await,
                None => running.run(ctx).await,
            }
        })
        .await;
        if token.is_cancelled() {
            break;
        }
        let reason = match outcome {
            Ok(Ok(())) => "stopped on its own".to_owned(),
            Ok(Err(e)) => crate::ops::error_text(&e),
            Err(e) => panicked(e),
        };
        tracing::error!(scope, service = name, reason, "service failed; restarting");
        if let Some(tx) = failed.take() {
            let _ = tx.send(reason.clone());
        }
        if let Ok(mut last) = last_failure.lock() {
            *last = Some(reason.clone());
        }
        health.send_replace(Health::Degraded(reason));
        backoff.ran_for(started.elapsed());
        tokio::select! {
            () = tokio::time::sleep(backoff.next_delay()) => {}
            () = token.cancelled() => break,
        }
        restarts.fetch_add(1, Ordering::Relaxed);
    }
    health.send_replace(Health::Stopped);
}

/// Waits until service `name` reports [`Health::Running`]: an error when it fails first
/// (`failed`), stops, or does not within [`START_TIMEOUT`].
async fn until_running(
    name: &str,
    failed: tokio::sync::oneshot::Receiver<String>,
    mut watched: watch::Receiver<Health>,
) -> Result<(), ServiceError> {
    let running = async {
        tokio::select! {
            reason = failed => Err(ServiceError::msg(format!(
                "{name} failed to start: {}",
                reason.unwrap_or_else(|_| "stopped".into())
            ))),
            seen = watched.wait_for(|h| *h == Health::Running) => seen
                .map(|_| ())
                .map_err(|_| ServiceError::msg(format!("{name} stopped before it was running"))),
        }
    };
    tokio::time::timeout(START_TIMEOUT, running)
        .await
        .unwrap_or_else(|_| {
            Err(ServiceError::msg(format!(
                "{name} did not start within {START_TIMEOUT:?}"
            )))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Panics on its first run, serves on the next.
    struct Flaky {
        runs: AtomicU32,
    }

    impl Service for Flaky {
        fn name(&self) -> &'static str {
            "flaky"
        }

        async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
            if self.runs.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("first run");
            }
            ctx.report(Health::Running);
            ctx.cancelled().await;
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_panicking_service_is_restarted_and_its_status_says_why() {
        let root = CancellationToken::new();
        let set = ServiceSet::new("test", &root);
        let first = set
            .start(Arc::new(Flaky {
                runs: AtomicU32::new(0),
            }))
            .await;
        let why = first.expect_err("the first run panicked").to_string();
        assert!(why.contains("panicked: first run"), "{why}");
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let status = &set.status()[0];
                if status.health == Health::Running {
                    assert_eq!(status.restarts, 1, "{status:?}");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("restarted after the panic");
        set.shutdown(Duration::from_secs(5)).await;
    }
}
