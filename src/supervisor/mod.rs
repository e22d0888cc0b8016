//! The child nats-server: spawn it from the rendered config, wait until it is ready, watch its
//! health, restart it with capped backoff when it dies or stops being healthy, stop it
//! gracefully (SIGTERM, then SIGKILL after a deadline).
//!
//! Readiness is the ports file (`<argv0>_<pid>.ports`, written once the listeners are bound)
//! followed by `HEALTHZ` answering healthy (the server and JetStream are up; accounts are not
//! asked about, see [`Monitor::check`]), asked over the system account by the supervisor's own
//! connection ([`Monitor`]): the broker has no HTTP monitoring listener unless the profile asks
//! for one, since that listener answers anyone on the host. After the first start the actual
//! ports are written into the config, so a restarted child listens where clients reconnect.
//!
//! # Health
//!
//! A broker can be alive and useless: JetStream disabled after a failed write (a full disk;
//! `HEALTHZ` then answers 503 with the reason), or a process that no longer runs (stopped,
//! wedged; the kernel still accepts connections on its listening sockets, so clients hang
//! instead of failing over). Once ready, the child's `HEALTHZ` is probed every
//! [`PROBE_INTERVAL`] (2 s), each probe bounded by [`PROBE_TIMEOUT`] (1 s); after
//! [`PROBE_FAILURES`] (3) failures in a row it is killed with SIGKILL (which also ends a stopped
//! process) and restarted like a child that exited, with the same backoff, on the same ports.
//! Why these numbers: a healthy broker answers `HEALTHZ` on loopback in milliseconds, so 1 s
//! is generous even on a loaded machine; one failure can be a pause (a stalled fsync, a
//! garbage collection), three in a row mean the broker has not answered for more than 4 s, far
//! beyond any pause, and a failure is acted on within about 7 s. Clients pay for a restart with
//! a reconnect of about a second, so a blip must not cause one; an unresponsive broker costs
//! them far more, as their own pings notice it only after minutes. The reason
//! (`exited: …`, `unhealthy: HEALTHZ answered 503: …`, `unresponsive: no answer to HEALTHZ
//! within 1s`) is logged and published with the status ([`BrokerRestart`]), which
//! `cotald status` shows. A broker that keeps failing is retried with the capped backoff (at
//! most 10 s apart, plus the start's own ready timeout), never in a tight loop; a run counts as
//! stable only up to the first probe of the failing streak.
//!
//! # The child dies with cotald
//!
//! The child runs in its own process group (a terminal's Ctrl-C reaches cotald, which then
//! stops the child in order) and is killed with SIGKILL if cotald dies without its orderly
//! shutdown: `PR_SET_PDEATHSIG` on Linux, a lifeline pipe and a watcher elsewhere (see
//! `parent_death.rs`). SIGTERM would ask for a graceful stop that nobody bounds any more, and
//! a JetStream shutdown with many consumers can hold the port for more than 20 s, so the next
//! `up` failed with "port in use". A SIGKILL adds no new risk:
//! cotald dying unannounced is already a crash, which the JetStream store must survive anyway
//! (the health watch above kills the broker too).
//!
//! A broker may still outlive its cotald (one started by an earlier version that asked for
//! SIGTERM, or by hand on the data dir's config). [`claim`], run before a start, therefore ends
//! any broker of the same executable and config that the ports files name: checked through
//! `/proc`, SIGTERM, then SIGKILL after 5 s; a process that is not ours is never touched (see
//! `leftover.rs`).
//!
//! The broker logs to its stderr; the supervisor keeps its log ([`BrokerLog`]): every line is
//! shaped (long quoted texts cut, one user's refusals counted past the first of each minute),
//! written to `log/nats-server.log` (rotated, bounded) and to cotald's own log at the
//! broker's level. A failed start reports the broker's last lines.

mod binary;
mod conf;
mod leftover;
mod log;
pub mod monitor;
mod parent_death;
mod ports;

pub use binary::{BUNDLED_SHA256, BUNDLED_VERSION, BrokerBinary};
pub use conf::{ClusterConf, LeafRemote, MAX_CONTROL_LINE, ServerConf};
pub use log::{BrokerLog, LOG_MAX_FILES, LOG_SIZE_LIMIT, MAX_LINE, MAX_QUOTED, REFUSALS_SHOWN};

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::files::FileError;
pub use crate::ops::status::BrokerRestart;
use monitor::{HealthFailure, Monitor};

/// Why the broker could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The executable is missing, not executable, or fails verification.
    #[error("nats-server at {path}: {reason}")]
    Binary { path: PathBuf, reason: String },
    /// The client or monitoring address is taken.
    #[error(
        "{addr} is already in use (another cotald or nats-server?). Stop it, or choose \
         another address with --listen HOST:PORT"
    )]
    PortInUse { addr: SocketAddr },
    /// The process could not be spawned.
    #[error("cannot start {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The process exited before it was ready.
    #[error("nats-server exited during startup ({status}); its last output ({log}):\n{tail}")]
    Exited {
        status: String,
        log: PathBuf,
        tail: String,
    },
    /// The process did not become ready in time.
    #[error("nats-server was not ready after {timeout:?}; its last output ({log}):\n{tail}")]
    NotReady {
        timeout: Duration,
        log: PathBuf,
        tail: String,
    },
    /// A file could not be read or written, or the child could not be waited for.
    #[error(transparent)]
    File(#[from] crate::files::FileError),
}

/// How to run the broker.
#[derive(Debug, Clone)]
pub struct BrokerSpec {
    /// The executable to run.
    pub executable: PathBuf,
    /// The configuration to render.
    pub conf: ServerConf,
    /// Where to write it.
    pub conf_path: PathBuf,
    /// The broker's log file (written and rotated by the broker).
    pub log_path: PathBuf,
    /// How the supervisor asks the broker about its health.
    pub access: BrokerAccess,
    /// How long a start may take before it is a failure.
    pub ready_timeout: Duration,
    /// How long a graceful stop may take before SIGKILL.
    pub stop_deadline: Duration,
}

/// The running broker, as last observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerStatus {
    /// The child's pid.
    pub pid: u32,
    /// Client listener.
    pub client: SocketAddr,
    /// The HTTP monitoring listener, when the profile turns it on.
    pub http_monitor: Option<SocketAddr>,
    /// Restarts after unexpected exits and failed health checks.
    pub restarts: u32,
    /// The last restart, if there was one.
    pub last_restart: Option<BrokerRestart>,
}

/// Owns the child nats-server for the lifetime of the appliance.
pub struct Supervisor {
    status: watch::Receiver<BrokerStatus>,
    monitor: Monitor,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

const TAIL_LINES: usize = 30;
/// Time between two health probes of a ready broker.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(2);
/// How long one probe waits for `HEALTHZ`.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Ends any broker that the data dir of `run_dir` left running (see `leftover.rs`), then
/// checks that each address to listen on (port 0: any) is free. Run before anything is
/// generated, so that a taken port is reported at once and costs nothing.
pub async fn claim(
    run_dir: &Path,
    executable: &Path,
    conf_path: &Path,
    addrs: &[SocketAddr],
) -> Result<(), SupervisorError> {
    leftover::end_leftovers(run_dir, executable, conf_path).await;
    for &addr in addrs.iter().filter(|a| a.port() != 0) {
        if let Err(e) = std::net::TcpListener::bind(addr)
            && e.kind() == std::io::ErrorKind::AddrInUse
        {
            return Err(SupervisorError::PortInUse { addr });
        }
    }
    Ok(())
}

/// Consecutive failed probes after which the broker is killed and restarted.
pub const PROBE_FAILURES: u32 = 3;
/// How long one readiness question waits.
const READY_ASK: Duration = Duration::from_millis(500);

/// The system user's credential and the CA its TLS is verified against: what the supervisor
/// asks the broker about its health with ([`Monitor`]).
#[derive(Clone)]
pub struct BrokerAccess {
    /// The system user.
    pub creds: crate::binding::Creds,
    /// The appliance's CA certificate.
    pub ca: PathBuf,
}

impl std::fmt::Debug for BrokerAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerAccess")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

/// The address to dial the broker's client listener `client` at from this machine: loopback
/// when it listens on every interface.
pub fn local_addr(client: SocketAddr) -> SocketAddr {
    match client.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), client.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), client.port())
        }
        _ => client,
    }
}

/// Whether the broker listening at `client` answers `HEALTHZ` healthy; connects `monitor`
/// first when there is none yet (the first start).
async fn ready(access: &BrokerAccess, client: SocketAddr, monitor: &mut Option<Monitor>) -> bool {
    if monitor.is_none() {
        let connect = Monitor::connect(&access.creds, &access.ca, local_addr(client));
        match tokio::time::timeout(READY_ASK, connect).await {
            Ok(Ok(m)) => *monitor = Some(m),
            Ok(Err(e)) => {
                tracing::trace!(error = %e, "the broker's monitor is not connected yet");
                return false;
            }
            Err(_) => return false,
        }
    }
    match monitor {
        Some(m) => m.check(READY_ASK).await.is_ok(),
        None => false,
    }
}

/// How long a SIGKILLed child may take to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(10);

impl Supervisor {
    /// Starts the broker and returns once it is ready; `listening` is told where clients
    /// connect as soon as the broker listens, before it is ready (what does not depend on its
    /// readiness starts then). The caller has run [`claim`] first.
    pub async fn start(
        mut spec: BrokerSpec,
        listening: oneshot::Sender<SocketAddr>,
    ) -> Result<Self, SupervisorError> {
        let log = Arc::new(Mutex::new(BrokerLog::open(&spec.log_path)));
        let mut monitor = None;
        let child = Running::spawn(&spec, &log, &mut monitor, Some(listening)).await?;
        let monitor = monitor.unwrap_or_else(|| unreachable!("ready implies a monitor"));
        spec.conf.port = Some(child.client.port());
        spec.conf.monitor = child.http_monitor;
        let (tx, status) = watch::channel(child.status(0, None));
        let cancel = CancellationToken::new();
        let task = tokio::spawn(supervise(
            spec,
            log,
            child,
            monitor.clone(),
            tx,
            cancel.clone(),
        ));
        Ok(Supervisor {
            status,
            monitor,
            cancel,
            task,
        })
    }

    /// The connection that asks the broker about itself (health, figures), for the life of
    /// the appliance.
    pub fn monitor(&self) -> Monitor {
        self.monitor.clone()
    }

    /// The broker's status; changes when the child is restarted.
    pub fn status(&self) -> watch::Receiver<BrokerStatus> {
        self.status.clone()
    }

    /// Stops the child gracefully and waits for it.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        let _ = (&mut self.task).await;
    }
}

impl Drop for Supervisor {
    /// Dropped without [`Supervisor::stop`] (a failed or interrupted startup): the supervising
    /// task still stops the child gracefully, as long as the runtime lives.
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn supervise(
    spec: BrokerSpec,
    log: Arc<Mutex<BrokerLog>>,
    mut child: Running,
    monitor: Monitor,
    status: watch::Sender<BrokerStatus>,
    cancel: CancellationToken,
) {
    let mut restarts = 0;
    let mut backoff = Backoff::default();
    loop {
        let started = Instant::now();
        // What ended the child, and how long it ran well (to its exit, or to the first probe
        // of the failing streak).
        let (reason, lasted) = tokio::select! {
            () = cancel.cancelled() => {
                child.stop(spec.stop_deadline).await;
                return;
            }
            exit = child.process.wait() => {
                let exit = exit.map_or_else(|e| e.to_string(), describe);
                tracing::warn!(pid = child.pid, status = %exit, "nats-server exited unexpectedly");
                (format!("exited: {exit}"), started.elapsed())
            }
            (failure, since) = failing_health(&monitor) => {
                tracing::warn!(
                    pid = child.pid,
                    reason = %failure,
                    probes = PROBE_FAILURES,
                    "nats-server failed its health probes; killing it"
                );
                child.kill().await;
                (failure.to_string(), since.saturating_duration_since(started))
            }
        };
        let at = crate::provision::rfc3339(crate::provision::now_secs());
        backoff.ran_for(lasted);
        child = loop {
            let delay = backoff.next_delay();
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            let mut kept = Some(monitor.clone());
            let attempt = tokio::select! {
                () = cancel.cancelled() => return,
                attempt = Running::spawn(&spec, &log, &mut kept, None) => attempt,
            };
            match attempt {
                Ok(next) => break next,
                Err(e) => {
                    tracing::error!(error = %e, %reason, "nats-server restart failed; retrying")
                }
            }
        };
        restarts += 1;
        tracing::info!(pid = child.pid, restarts, %reason, %at, "nats-server restarted");
        let _ = status.send(child.status(restarts, Some(BrokerRestart { reason, at })));
    }
}

/// Probes `HEALTHZ` every [`PROBE_INTERVAL`] and returns once [`PROBE_FAILURES`] probes in a
/// row failed: the last failure, and when the first of them was sent.
async fn failing_health(monitor: &Monitor) -> (HealthFailure, Instant) {
    let mut probes =
        tokio::time::interval_at(tokio::time::Instant::now() + PROBE_INTERVAL, PROBE_INTERVAL);
    probes.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut first_failure = None;
    let mut failures = 0;
    loop {
        probes.tick().await;
        let sent = Instant::now();
        match monitor.check(PROBE_TIMEOUT).await {
            Ok(()) => {
                if failures > 0 {
                    tracing::info!(failures, "nats-server answers its health probe again");
                }
                failures = 0;
                first_failure = None;
            }
            Err(failure) => {
                failures += 1;
                let since = *first_failure.get_or_insert(sent);
                if failures >= PROBE_FAILURES {
                    return (failure, since);
                }
                tracing::warn!(
                    reason = %failure,
                    failures,
                    of = PROBE_FAILURES,
                    "nats-server health probe failed"
                );
            }
        }
    }
}

/// Why a child exited before it was ready: a listener's address taken (named from the
/// child's last words), or whatever it said last.
fn exited_early(spec: &BrokerSpec, status: ExitStatus, tail: String) -> SupervisorError {
    if let Some(line) = tail.lines().find(|l| l.contains("address already in use")) {
        let monitor = spec.conf.monitor;
        let route = spec
            .conf
            .cluster
            .as_ref()
            .map(|c| SocketAddr::new(c.host, c.port));
        let addr = match (monitor, route) {
            (Some(m), _) if m.port() != 0 && line.contains(&m.to_string()) => m,
            (_, Some(r)) if line.contains(&r.to_string()) => r,
            _ => SocketAddr::new(spec.conf.host, spec.conf.port.unwrap_or(0)),
        };
        return SupervisorError::PortInUse { addr };
    }
    SupervisorError::Exited {
        status: describe(status),
        log: spec.log_path.clone(),
        tail,
    }
}

/// One spawned child.
struct Running {
    process: Child,
    pid: u32,
    client: SocketAddr,
    http_monitor: Option<SocketAddr>,
}

/// A child just started: its process, its pid, the tasks pumping its output into the log,
/// and its last lines (a failed start reports them).
struct Launched {
    process: Child,
    pid: u32,
    pumps: Vec<JoinHandle<()>>,
    tail: Arc<Mutex<VecDeque<String>>>,
}

impl Running {
    /// Writes the config and starts the child, its output pumped into `log`. The config is
    /// not synced: it is rendered anew before every start of the child, so a crash leaves
    /// nothing of it that is read again.
    fn launch(spec: &BrokerSpec, log: &Arc<Mutex<BrokerLog>>) -> Result<Launched, SupervisorError> {
        crate::files::write_replacing(&spec.conf_path, spec.conf.render().as_bytes(), 0o600)?;
        // A crashed child leaves its ports file behind, and pids repeat (containers): only the
        // file this child writes may count.
        ports::remove_all(&spec.conf.ports_file_dir);
        let mut cmd = Command::new(&spec.executable);
        cmd.arg("-c")
            .arg(&spec.conf_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0)
            // A service manager hears from cotald alone, never from its child (sd_notify).
            .env_remove("NOTIFY_SOCKET");
        parent_death::arrange(&mut cmd).map_err(|source| SupervisorError::Spawn {
            path: spec.executable.clone(),
            source,
        })?;
        let mut process = cmd.spawn().map_err(|source| SupervisorError::Spawn {
            path: spec.executable.clone(),
            source,
        })?;
        let pid = process.id().unwrap_or(0);
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
        let mut pumps = Vec::with_capacity(2);
        if let Some(out) = process.stdout.take() {
            pumps.push(tokio::spawn(pump(out, tail.clone(), log.clone())));
        }
        if let Some(err) = process.stderr.take() {
            pumps.push(tokio::spawn(pump(err, tail.clone(), log.clone())));
        }
        Ok(Launched {
            process,
            pid,
            pumps,
            tail,
        })
    }

    /// Spawns the child and waits until it is ready: its ports file written (`listening` told
    /// the client address then), then `HEALTHZ` answered healthy through `monitor` (connected
    /// here on the first start, and kept).
    async fn spawn(
        spec: &BrokerSpec,
        log: &Arc<Mutex<BrokerLog>>,
        monitor: &mut Option<Monitor>,
        mut listening: Option<oneshot::Sender<SocketAddr>>,
    ) -> Result<Self, SupervisorError> {
        let ports_dir = &spec.conf.ports_file_dir;
        let mut written = ports::Written::watch(ports_dir);
        let Launched {
            mut process,
            pid,
            pumps,
            tail,
        } = Running::launch(spec, log)?;
        let tail_text = || {
            let lines: Vec<String> = tail
                .lock()
                .map(|t| t.iter().cloned().collect())
                .unwrap_or_default();
            lines.join("\n")
        };

        let deadline = Instant::now() + spec.ready_timeout;
        let mut addrs = None;
        loop {
            if let Some(status) = process
                .try_wait()
                .map_err(FileError::at(&spec.executable, "waiting for"))?
            {
                // The pumps end at EOF: wait for them so the tail holds the child's last words.
                for pump in pumps {
                    let _ = tokio::time::timeout(Duration::from_secs(2), pump).await;
                }
                return Err(exited_early(spec, status, tail_text()));
            }
            if addrs.is_none()
                && let Some(found) = ports::read(ports_dir, &spec.conf, pid)
            {
                if let Some(listening) = listening.take() {
                    let _ = listening.send(local_addr(found.0));
                }
                addrs = Some(found);
            }
            if let Some((client, _)) = addrs
                && ready(&spec.access, client, monitor).await
            {
                break;
            }
            if Instant::now() >= deadline {
                let _ = process.kill().await;
                return Err(SupervisorError::NotReady {
                    timeout: spec.ready_timeout,
                    log: spec.log_path.clone(),
                    tail: tail_text(),
                });
            }
            match addrs {
                None => {
                    written.next().await;
                }
                Some(_) => tokio::time::sleep(ports::POLL).await,
            }
        }
        let (client, http_monitor) = addrs.unwrap_or_else(|| unreachable!("ready implies ports"));
        tracing::debug!(pid, %client, ?http_monitor, "nats-server ready");
        Ok(Running {
            process,
            pid,
            client,
            http_monitor,
        })
    }

    fn status(&self, restarts: u32, last_restart: Option<BrokerRestart>) -> BrokerStatus {
        BrokerStatus {
            pid: self.pid,
            client: self.client,
            http_monitor: self.http_monitor,
            restarts,
            last_restart,
        }
    }

    /// SIGKILL (it ends a stopped process too) and reap, bounded by [`KILL_WAIT`].
    async fn kill(&mut self) {
        let _ = self.process.start_kill();
        match tokio::time::timeout(KILL_WAIT, self.process.wait()).await {
            Ok(status) => {
                let status = status.map_or_else(|e| e.to_string(), describe);
                tracing::info!(pid = self.pid, %status, "nats-server killed");
            }
            // Stuck in the kernel (a hung disk): the restart then finds its ports taken and
            // retries with backoff; tokio reaps the process whenever it ends.
            Err(_) => tracing::error!(
                pid = self.pid,
                after = ?KILL_WAIT,
                "nats-server is still there after SIGKILL"
            ),
        }
    }

    async fn stop(mut self, deadline: Duration) {
        // Our own child's pid, which is not reaped yet: it names no other process.
        if let Some(pid) = i32::try_from(self.pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            && let Err(e) = rustix::process::kill_process(pid, rustix::process::Signal::TERM)
        {
            tracing::warn!(pid = self.pid, error = %e, "nats-server could not be sent SIGTERM");
        }
        match tokio::time::timeout(deadline, self.process.wait()).await {
            Ok(status) => {
                let status = status.map_or_else(|e| e.to_string(), describe);
                tracing::info!(pid = self.pid, %status, "nats-server stopped");
            }
            Err(_) => {
                tracing::warn!(
                    pid = self.pid,
                    ?deadline,
                    "nats-server ignored SIGTERM; killing it"
                );
                let _ = self.process.kill().await;
            }
        }
    }
}

/// Reads the broker's lines from `stream` into its log ([`BrokerLog`]) and cotald's own, and
/// keeps the last [`TAIL_LINES`] for a failed start's report. Every [`SUMMARY_EVERY`], the
/// counts of refusals left out of windows that ended are written.
async fn pump(
    stream: impl AsyncRead + Unpin,
    tail: Arc<Mutex<VecDeque<String>>>,
    log: Arc<Mutex<BrokerLog>>,
) {
    let mut lines = BufReader::new(stream).lines();
    let mut summaries = tokio::time::interval(SUMMARY_EVERY);
    loop {
        let said = tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => log
                    .lock()
                    .map(|mut l| l.line(&line, Instant::now()))
                    .unwrap_or_default(),
                _ => return,
            },
            _ = summaries.tick() => log
                .lock()
                .map(|mut l| l.summarize(Instant::now()))
                .unwrap_or_default(),
        };
        for line in said {
            emit(&line);
            if let Ok(mut t) = tail.lock() {
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(line);
            }
        }
    }
}

/// How often the counts of refusals left out are looked at.
const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// One broker line in cotald's own log, at the broker's level.
fn emit(line: &str) {
    match log::level(line) {
        (tracing::Level::ERROR, text) => tracing::error!(target: "nats_server", "{text}"),
        (tracing::Level::WARN, text) => tracing::warn!(target: "nats_server", "{text}"),
        (tracing::Level::INFO, text) => tracing::info!(target: "nats_server", "{text}"),
        (tracing::Level::DEBUG, text) => tracing::debug!(target: "nats_server", "{text}"),
        (_, text) => tracing::trace!(target: "nats_server", "{text}"),
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => status.to_string(),
    }
}
