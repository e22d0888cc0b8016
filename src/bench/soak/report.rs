//! A soak's report: the table an operator reads, the JSON CI reads, and the verdict.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

use super::SoakArgs;
use super::ledger::Tally;
use super::watch::{HealthTally, Resources, slope_per_hour};

/// Growth is judged only on runs at least this long: shorter ones are all warm-up.
const JUDGE_GROWTH_FROM: Duration = Duration::from_secs(600);

/// One resource over the run.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Growth {
    pub(super) resource: &'static str,
    /// After the warm-up (the first fifth of the run), then at the end.
    pub(super) first: u64,
    pub(super) last: u64,
    /// Least-squares slope after the warm-up, per hour; absent with too few samples.
    pub(super) per_hour: Option<f64>,
    /// Whether it grows without a bound in sight: judged on runs of 10 minutes or more, for
    /// what must stay flat (memory, descriptors, consumers); stored and log bytes are bounded
    /// by retention and rotation, the broker's block cache by the blocks in use, and reported
    /// only (so is the broker's RSS, which follows that cache, once its heap could be read).
    pub(super) unbounded: Option<bool>,
}

/// Everything a soak found.
#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) agents: u32,
    pub(super) seed: u64,
    pub(super) duration_secs: u64,
    pub(super) rate_per_hour: f64,
    pub(super) ran_secs: f64,
    /// How long what was owed took to arrive once traffic stopped.
    pub(super) settle_secs: f64,
    pub(super) delivery: Tally,
    /// Some of what was lost, read again (a duplicate too), or read across a boundary, in
    /// words.
    pub(super) missing: Vec<String>,
    pub(super) health: HealthTally,
    pub(super) certificate_renewals: u64,
    /// The data dir of the appliance soaked, when the soak did not start it (`--link`).
    pub(super) linked: Option<std::path::PathBuf>,
    pub(super) faults: BTreeMap<&'static str, u32>,
    pub(super) fault_errors: Vec<String>,
    pub(super) growth: Vec<Growth>,
    pub(super) samples: Vec<Resources>,
    pub(super) failures: Vec<String>,
}

/// At-least-once allows duplicates; a soak fails when they pass one in this many of the owed
/// deliveries (each copy is deduplicated by its id, §4: what remains comes from faults).
const DUPLICATES_PER_OWED: u64 = 100;

impl Report {
    #[allow(clippy::too_many_arguments)] // the parts of a report, each named where it is made
    pub(super) fn new(
        args: &SoakArgs,
        seed: u64,
        ran: Duration,
        settled: Duration,
        delivery: Tally,
        missing: Vec<String>,
        health: HealthTally,
        samples: Vec<Resources>,
        certificate_renewals: u64,
        faults: BTreeMap<&'static str, u32>,
        fault_errors: Vec<String>,
    ) -> Report {
        let growth = growth(&samples, args.duration);
        let mut report = Report {
            agents: args.agents,
            seed,
            duration_secs: args.duration.as_secs(),
            rate_per_hour: args.rate * 3600.0,
            ran_secs: ran.as_secs_f64(),
            settle_secs: settled.as_secs_f64(),
            delivery,
            missing,
            health,
            certificate_renewals,
            linked: args.link.clone(),
            faults,
            fault_errors,
            growth,
            samples,
            failures: Vec::new(),
        };
        report.failures = report.judge();
        report
    }

    fn judge(&self) -> Vec<String> {
        let d = &self.delivery;
        let mut failures = Vec::new();
        let mut fail = |bad: bool, what: String| {
            if bad {
                failures.push(what);
            }
        };
        fail(d.lost > 0, format!("{} owed deliveries lost", d.lost));
        fail(
            d.reread > 0,
            format!("{} messages read again by a resumed session", d.reread),
        );
        fail(
            d.duplicates > d.owed / DUPLICATES_PER_OWED,
            format!(
                "{} duplicates, over one in {DUPLICATES_PER_OWED} of the {} owed deliveries",
                d.duplicates, d.owed
            ),
        );
        fail(
            d.across_leave > 0,
            format!("{} posts delivered across a leave", d.across_leave),
        );
        fail(
            d.after_revoke > 0,
            format!("{} messages delivered after a revocation", d.after_revoke),
        );
        fail(
            self.health.false_green > 0,
            format!(
                "status said healthy {} times while delivery had stalled over 10 s",
                self.health.false_green
            ),
        );
        fail(
            !self.fault_errors.is_empty(),
            format!("faults not carried out: {}", self.fault_errors.join("; ")),
        );
        fail(
            self.linked.is_none() && self.certificate_renewals == 0,
            "the server certificate was never renewed".into(),
        );
        for g in &self.growth {
            fail(
                g.unbounded == Some(true),
                format!("{} grows without bound", g.resource),
            );
        }
        failures
    }

    pub(super) fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The report as a table.
    pub(super) fn table(&self) -> String {
        let mut t = format!(
            "cotald soak: {} agents, {}s at {:.0} msg/h, seed {}\n\n",
            self.agents, self.duration_secs, self.rate_per_hour, self.seed
        );
        if let Some(dir) = &self.linked {
            let _ = writeln!(
                t,
                "appliance    linked: {} (not restarted, its certificate not shortened)\n",
                dir.display()
            );
        }
        self.delivery_lines(&mut t);
        let h = &self.health;
        let _ = writeln!(
            t,
            "health       {} status samples; delivery stalled {} times, said degraded in {} \
             (slowest after {:.1}s), {} over 10 s",
            h.samples, h.stalls_seen, h.stalls_detected, h.worst_detection_secs, h.stalls
        );
        let _ = writeln!(
            t,
            "             false green {}, false red {}",
            h.false_green, h.false_red
        );
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(f, n)| format!("{f} {n}"))
            .collect();
        let _ = writeln!(t, "faults       {}", faults.join(", "));
        let _ = writeln!(
            t,
            "certificate  renewed {} times",
            self.certificate_renewals
        );
        self.growth_lines(&mut t);
        self.verdict_lines(&mut t);
        t
    }

    fn delivery_lines(&self, t: &mut String) {
        let d = &self.delivery;
        let sent: Vec<String> = d.sent.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(
            t,
            "delivery     sent {} ({}); sends failed or unknown {}",
            d.sent.values().sum::<u64>(),
            sent.join(", "),
            d.send_failed
        );
        let _ = writeln!(
            t,
            "             owed {}, lost {}, settled in {:.1}s",
            d.owed, d.lost, self.settle_secs
        );
        if d.unjudged > 0 {
            let _ = writeln!(
                t,
                "             not judged {}: unread by agents whose next session could not \
                 start (see the faults not carried out)",
                d.unjudged
            );
        }
        let _ = writeln!(
            t,
            "             duplicates {}, read again after a resume {} (and {} its client could \
             not confirm: allowed), across a leave {}, after a revocation {}",
            d.duplicates, d.reread, d.reread_unconfirmed, d.across_leave, d.after_revoke
        );
    }

    fn growth_lines(&self, t: &mut String) {
        let _ = writeln!(
            t,
            "\n{:<16} {:>14} {:>14} {:>16}  judged",
            "resource", "after warm-up", "at the end", "per hour"
        );
        for g in &self.growth {
            let slope = g.per_hour.map_or("–".to_owned(), |s| format!("{s:+.0}"));
            let judged = match g.unbounded {
                Some(true) => "GROWS",
                Some(false) => "flat",
                None => "–",
            };
            let _ = writeln!(
                t,
                "{:<16} {:>14} {:>14} {:>16}  {judged}",
                g.resource, g.first, g.last, slope
            );
        }
    }

    fn verdict_lines(&self, t: &mut String) {
        if self.failures.is_empty() {
            let _ = writeln!(t, "\nverdict      PASS");
            return;
        }
        let _ = writeln!(t, "\nverdict      FAIL");
        for f in &self.failures {
            let _ = writeln!(t, "  - {f}");
        }
        for m in &self.missing {
            let _ = writeln!(t, "    {m}");
        }
    }
}

/// Each resource after the warm-up and at the end, with its slope.
fn growth(samples: &[Resources], run: Duration) -> Vec<Growth> {
    let warm = run.as_secs_f64() / 5.0;
    let after: Vec<Resources> = samples.iter().filter(|s| s.at >= warm).copied().collect();
    let judged = run >= JUDGE_GROWTH_FROM;
    type Read = fn(&Resources) -> u64;
    // The broker's RSS follows its block cache, bounded by the blocks in use (`heap.rs`): when
    // its heap profile was read, what must stay flat is the rest of its heap; else its RSS.
    let heap_known = after.iter().any(|r| r.broker_heap > 0);
    // (name, value, a floor of growth per hour below which it is noise, judged)
    let resources: [(&str, Read, f64, bool); 9] = [
        ("cotald RSS", |r| r.cotald_rss, 16.0 * 1048576.0, true),
        (
            "broker RSS",
            |r| r.broker_rss,
            32.0 * 1048576.0,
            !heap_known,
        ),
        (
            "broker heap",
            |r| r.broker_heap,
            16.0 * 1048576.0,
            heap_known,
        ),
        ("broker blocks", |r| r.broker_blocks, 0.0, false),
        ("cotald fds", |r| r.cotald_fds, 20.0, true),
        ("broker fds", |r| r.broker_fds, 20.0, true),
        ("consumers", |r| r.consumers, 10.0, true),
        ("stream bytes", |r| r.stream_bytes, 0.0, false),
        ("log bytes", |r| r.log_bytes, 0.0, false),
    ];
    resources
        .into_iter()
        .map(|(resource, value, floor, flat)| {
            let per_hour = slope_per_hour(&after, value);
            let first = after.first().map_or(0, value);
            let mean =
                after.iter().map(|r| value(r) as f64).sum::<f64>() / after.len().max(1) as f64;
            let unbounded =
                (judged && flat).then(|| per_hour.is_some_and(|s| s > floor.max(mean / 4.0)));
            Growth {
                resource,
                first,
                last: after.last().map_or(0, value),
                per_hour,
                unbounded,
            }
        })
        .collect()
}
