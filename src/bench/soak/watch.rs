//! What the soak watches while it runs: whether `status` tells the truth about delivery (a
//! canary DM every second shows whether delivery progresses), and what the appliance and its
//! broker hold over time (memory, descriptors, consumers, stored bytes, log bytes), with the
//! slope of each per hour.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::ledger::Ledger;
use crate::datadir::DataDir;
use crate::supervisor::monitor::Monitor;

/// How long delivery may stall before `status` must say `DEGRADED`.
pub(super) const DEGRADED_WITHIN: Duration = Duration::from_secs(10);
/// Delivery progresses while a canary arrived within this.
pub(super) const PROGRESS_WINDOW: Duration = Duration::from_secs(5);
/// A `DEGRADED` while delivery progresses is reported when it lasts longer than this.
const FALSE_RED_AFTER: Duration = Duration::from_secs(30);

/// Verdicts of `status` against delivery, sample by sample.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct HealthTally {
    /// Samples taken.
    pub(super) samples: u64,
    /// Stalls of delivery a sample saw (no canary for over [`PROGRESS_WINDOW`]).
    pub(super) stalls_seen: u64,
    /// Of those, the ones `status` said degraded during.
    pub(super) stalls_detected: u64,
    /// Stalls of delivery longer than [`DEGRADED_WITHIN`].
    pub(super) stalls: u64,
    /// Samples where delivery had stalled for over [`DEGRADED_WITHIN`] and `status` said
    /// healthy.
    pub(super) false_green: u64,
    /// Spans over [`FALSE_RED_AFTER`] where delivery progressed and `status` said degraded.
    pub(super) false_red: u64,
    /// The longest a stall went before `status` said `DEGRADED`, in seconds.
    pub(super) worst_detection_secs: f64,
}

/// Judges each `status` sample against the canary.
#[derive(Debug, Default)]
pub(super) struct HealthJudge {
    pub(super) tally: HealthTally,
    /// When the current stall began (the last canary + the progress window).
    stall: Option<Instant>,
    detected: bool,
    /// The current stall has passed [`DEGRADED_WITHIN`] (and is counted).
    long: bool,
    red_since: Option<Instant>,
    red_reported: bool,
}

impl HealthJudge {
    /// A sample: `healthy` as `status` said it at `now`, the last canary at `canary`.
    pub(super) fn sample(&mut self, healthy: bool, canary: Instant, now: Instant) {
        self.tally.samples += 1;
        let progressing = now.saturating_duration_since(canary) <= PROGRESS_WINDOW;
        if progressing {
            self.stall = None;
            self.detected = false;
            self.long = false;
        } else {
            if self.stall.is_none() {
                self.tally.stalls_seen += 1;
            }
            let began = *self.stall.get_or_insert(canary + PROGRESS_WINDOW);
            let stalled = now.saturating_duration_since(began);
            if !healthy && !self.detected {
                self.detected = true;
                self.tally.stalls_detected += 1;
                self.tally.worst_detection_secs =
                    self.tally.worst_detection_secs.max(stalled.as_secs_f64());
            }
            if stalled > DEGRADED_WITHIN {
                if !self.long {
                    self.long = true;
                    self.tally.stalls += 1;
                }
                if healthy {
                    self.tally.false_green += 1;
                }
            }
        }
        if progressing && !healthy {
            let since = *self.red_since.get_or_insert(now);
            if now.saturating_duration_since(since) > FALSE_RED_AFTER && !self.red_reported {
                self.red_reported = true;
                self.tally.false_red += 1;
            }
        } else {
            self.red_since = None;
            self.red_reported = false;
        }
    }
}

/// What the appliance and its broker hold at one moment.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(super) struct Resources {
    /// Seconds since the soak began.
    pub(super) at: f64,
    pub(super) cotald_rss: u64,
    pub(super) broker_rss: u64,
    pub(super) cotald_fds: u64,
    pub(super) broker_fds: u64,
    /// The broker's live heap outside its block cache, and in it (0: unknown; `heap.rs`).
    pub(super) broker_heap: u64,
    pub(super) broker_blocks: u64,
    pub(super) consumers: u64,
    pub(super) stream_bytes: u64,
    pub(super) log_bytes: u64,
}

impl Resources {
    /// Measures them now; what cannot be read is 0 (the appliance between a stop and a start).
    pub(super) async fn measure(dir: &DataDir, monitor: Option<&Monitor>, at: f64) -> Resources {
        let state = dir.read_state().ok().flatten();
        let (cotald, broker) = state.map_or((0, 0), |s| (s.pid, s.broker_pid));
        let (consumers, stream_bytes) = match monitor {
            Some(m) => stored(m).await,
            None => (0, 0),
        };
        let heap = match monitor {
            Some(m) => super::heap::broker_heap(m).await.unwrap_or_default(),
            None => super::heap::BrokerHeap::default(),
        };
        Resources {
            at,
            cotald_rss: rss(cotald),
            broker_rss: rss(broker),
            cotald_fds: fds(cotald),
            broker_fds: fds(broker),
            broker_heap: heap.rest,
            broker_blocks: heap.blocks,
            consumers,
            stream_bytes,
            log_bytes: bytes_under(&dir.log()),
        }
    }
}

/// Every account's consumers and stored bytes, from the broker's `JSZ`.
async fn stored(monitor: &Monitor) -> (u64, u64) {
    let Ok(jsz) = monitor.jsz(false, Duration::from_secs(2)).await else {
        return (0, 0);
    };
    let consumers = jsz["consumers"].as_u64().unwrap_or(0);
    let bytes = jsz["bytes"].as_u64().unwrap_or(0);
    (consumers, bytes)
}

fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

fn bytes_under(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum()
    })
}

/// The least-squares slope of `value` over `at` (seconds), per hour; `None` with fewer than
/// three samples.
pub(super) fn slope_per_hour(
    samples: &[Resources],
    value: impl Fn(&Resources) -> u64,
) -> Option<f64> {
    if samples.len() < 3 {
        return None;
    }
    let n = samples.len() as f64;
    let mean_t = samples.iter().map(|s| s.at).sum::<f64>() / n;
    let mean_v = samples.iter().map(|s| value(s) as f64).sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for s in samples {
        num += (s.at - mean_t) * (value(s) as f64 - mean_v);
        den += (s.at - mean_t).powi(2);
    }
    (den > 0.0).then(|| num / den * 3600.0)
}

/// Asks `cotald status` every 2 s and judges each answer against the canary when it comes: a
/// status that is slow to answer (a stalled broker) does not hold up the next question.
pub(super) async fn watch_health(
    exe: PathBuf,
    data: DataDir,
    canary: Arc<Mutex<Instant>>,
    judge: Arc<Mutex<HealthJudge>>,
    stop: CancellationToken,
) {
    let mut asked = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let (exe, root) = (exe.clone(), data.root().to_owned());
        let (canary, judge) = (canary.clone(), judge.clone());
        asked.spawn(async move {
            let healthy = status_healthy(&exe, &root).await;
            let last = *canary.lock().unwrap_or_else(|e| e.into_inner());
            judge
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .sample(healthy, last, Instant::now());
        });
        while asked.try_join_next().is_some() {}
    }
    asked.shutdown().await;
}

/// Whether `cotald status --json` says healthy (a status that does not answer says no).
async fn status_healthy(exe: &Path, data: &Path) -> bool {
    let asked = tokio::process::Command::new(exe)
        .args(["status", "--json", "--data-dir"])
        .arg(data)
        .output();
    match tokio::time::timeout(Duration::from_secs(10), asked).await {
        Ok(Ok(out)) => serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .is_ok_and(|v| v["healthy"] == true),
        _ => false,
    }
}

/// Measures the appliance's resources every `every`, and counts the server certificates seen.
pub(super) async fn watch_resources(
    data: DataDir,
    monitor: Monitor,
    every: Duration,
    samples: Arc<Mutex<Vec<Resources>>>,
    renewals: Arc<AtomicU64>,
    started: Instant,
    stop: CancellationToken,
) {
    let certificate = data.tls().join("server.pem");
    let mut seen = std::fs::read(&certificate).unwrap_or_default();
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = Resources::measure(&data, Some(&monitor), started.elapsed().as_secs_f64()).await;
        samples.lock().unwrap_or_else(|e| e.into_inner()).push(now);
        let current = std::fs::read(&certificate).unwrap_or_default();
        if !current.is_empty() && current != seen {
            renewals.fetch_add(1, Ordering::Relaxed);
            seen = current;
        }
    }
}

/// A line on stderr every 10 s: elapsed, sent, lost so far, current memory.
pub(super) async fn progress(
    ledger: Arc<Mutex<Ledger>>,
    samples: Arc<Mutex<Vec<Resources>>>,
    started: Instant,
    run: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    tick.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        // What had a minute to arrive and did not is lost so far.
        let settled = Instant::now()
            .checked_sub(Duration::from_secs(60))
            .unwrap_or(started);
        let tally = ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tally(settled);
        let last = samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last()
            .copied()
            .unwrap_or_default();
        eprintln!(
            "soak: {:>5.0}s of {}s  sent {}  lost so far {}  cotald {} MiB  broker {} MiB",
            started.elapsed().as_secs_f64(),
            run.as_secs(),
            tally.sent.values().sum::<u64>(),
            tally.lost,
            last.cotald_rss >> 20,
            last.broker_rss >> 20,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_said_healthy_past_the_bound_is_a_false_green_and_one_said_degraded_is_not() {
        let t0 = Instant::now();
        let mut judge = HealthJudge::default();
        // Delivery stops after t0: the stall begins at t0 + 5 s.
        for s in 0..=20 {
            judge.sample(s < 12, t0, t0 + Duration::from_secs(s));
        }
        assert_eq!(
            judge.tally.false_green, 0,
            "degraded from 12 s: within 10 s of 5 s"
        );
        assert!((judge.tally.worst_detection_secs - 7.0).abs() < 0.01);
        let mut late = HealthJudge::default();
        for s in 0..=20 {
            late.sample(s < 18, t0, t0 + Duration::from_secs(s));
        }
        assert!(
            late.tally.false_green > 0,
            "healthy 16 and 17 s: 11 and 12 s into the stall"
        );
    }

    #[test]
    fn a_long_degraded_while_delivery_progresses_is_one_false_red() {
        let t0 = Instant::now();
        let mut judge = HealthJudge::default();
        for s in 0..60 {
            let now = t0 + Duration::from_secs(s);
            judge.sample(false, now, now);
        }
        assert_eq!(judge.tally.false_red, 1);
        assert_eq!(judge.tally.false_green, 0);
    }

    #[test]
    fn the_slope_is_per_hour() {
        let samples: Vec<Resources> = (0..10)
            .map(|i| Resources {
                at: f64::from(i) * 60.0,
                cotald_rss: 1000 + u64::from(i as u32) * 10,
                ..Resources::default()
            })
            .collect();
        let slope = slope_per_hour(&samples, |r| r.cotald_rss).unwrap();
        assert!((slope - 600.0).abs() < 1e-6, "{slope}");
        assert!(slope_per_hour(&samples[..2], |r| r.cotald_rss).is_none());
    }
}
