//! `cotald bench`: what cotald costs over raw NATS, measured in one run on one appliance.
//!
//! The command starts its own appliance (`cotald up` on a fresh data dir, loopback, TLS, as a
//! user would run it), mints its identities over the admin socket, and runs each case twice
//! per repetition: through cotald's client, and through a raw async-nats baseline doing the
//! same work on the same broker — interleaved, the order rotated per repetition, a warm-up
//! discarded. It reports min/median/max of each side and the ratio of the medians: for rates
//! cotald/baseline (higher is better, 1.0 = as fast as raw), for latencies and times
//! cotald/baseline as measured (lower is better). With six runs or more, each ratio comes with
//! an interval that holds the median of the run-by-run ratios with at least 95 % confidence
//! (`RatioInterval`, the sign test's): on a shared machine a ratio alone looks surer than it
//! is. It asserts nothing about time: the figures are for reading (`docs/benchmarks.md` keeps
//! the last ones with the machine described).
//!
//! Cases (`cases/`): `live_throughput`, `live_serial` (one send at a time),
//! `live_latency_p50`/`_p99`, the same on the shipped profile's durable channel with its member
//! online (`default_profile_throughput`, `default_profile_serial`,
//! `default_profile_latency_p50`/`_p99`), `latency_split_sender_p50` and
//! `latency_split_member_p50` (one half of the latency case's path through cotald's client,
//! the other raw: where its gap lies), `dm_throughput`, `dm_pipelined_100k` (no window: the
//! pair's bound is backpressure; a refused send fails it),
//! `durable_publish_100_members` (100 absent durable members vs 1), `catchup_10k` (a returning
//! durable member's backlog vs a raw pull of the same range), `replay_10k` (a late joiner's
//! history vs an ordered consumer), `durable_fanout_online_{1,10,50}` (N online members of a
//! durable channel vs the same N on a live one, messages one at a time, with the appliance's CPU
//! per message per member), `durable_end_to_end` (an online
//! member on a durable channel vs on a live one), `startup_cold`/`_warm` (`cotald up` to
//! ready vs the bundled broker alone on the config cotald rendered). The throughput cases run
//! again on an appliance whose profile syncs every write (`sync_interval = "always"`), named
//! with a `_sync_always` suffix.
//!
//! `--cluster` runs instead what a cluster of appliances costs (`cluster.rs`): the live cases on
//! R1 and on R3, and the failover time.

mod appliance;
mod cases;
mod cluster;
pub mod soak;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use self::appliance::Appliance;
use crate::client::{Client, ConnectOptions, Connection};
use crate::daemon::admin;
use crate::ops::{MintReply, Request};
use crate::protocol::JoinLink;

/// Options of `cotald bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Smaller cases (finishes within about two minutes on a small machine).
    #[arg(long)]
    quick: bool,
    /// Print one JSON document on stdout: `{"results": [{"name", "cotald", "baseline", "unit",
    /// "ratio", …}], "machine": {…}}` (the progress lines go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Repetitions of each case (after a warm-up that is not measured). With 6 or more, each
    /// ratio is printed with an interval that holds the median run-by-run ratio with at least
    /// 95 % confidence (10 runs: 98 %).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    runs: u32,
    /// Run only the cases whose name contains this (repeatable).
    #[arg(long = "case", value_name = "NAME")]
    cases: Vec<String>,
    /// Instead of the cases above: the live cases on a single appliance (R1) and on a cluster
    /// of three on this machine (R3), then the failover time after a kill -9 of the node
    /// serving the space.
    #[arg(long, conflicts_with = "cases")]
    cluster: bool,
}

/// The sizes of a bench run.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    runs: usize,
    /// Messages per throughput measurement.
    messages: usize,
    /// DMs of the pipelined DM case.
    dms: usize,
    /// One-at-a-time samples per latency measurement.
    samples: usize,
    /// Absent durable members in the crowded publish case.
    members: usize,
    /// Backlog of the returning member.
    backlog: usize,
    /// Simulated instances heartbeating in the presence case.
    instances: usize,
    /// How long the presence case holds them online after the roster converged.
    hold: Duration,
}

impl Sizes {
    fn new(quick: bool, runs: u32) -> Self {
        let runs = runs as usize;
        if quick {
            Sizes {
                runs,
                messages: 4_000,
                dms: 20_000,
                samples: 500,
                members: 100,
                backlog: 2_000,
                instances: 2_000,
                hold: Duration::from_secs(8),
            }
        } else {
            Sizes {
                runs,
                messages: 20_000,
                dms: 100_000,
                samples: 2_000,
                members: 100,
                backlog: 10_000,
                instances: 2_000,
                hold: Duration::from_secs(20),
            }
        }
    }
}

/// Whether more is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Better {
    Higher,
    Lower,
}

/// One case's figures.
#[derive(Debug, Serialize)]
struct CaseResult {
    name: String,
    unit: &'static str,
    /// The median of cotald's repetitions.
    cotald: f64,
    /// The median of the baseline's repetitions.
    baseline: f64,
    /// cotald / baseline.
    ratio: f64,
    /// Where the ratio of one run to the other side's run beside it lies, as far as the runs
    /// tell: an interval that holds the median of those ratios with at least 95 % confidence
    /// ([`RatioInterval`]); none with fewer than six runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio_interval: Option<RatioInterval>,
    better: Better,
    cotald_min: f64,
    cotald_max: f64,
    baseline_min: f64,
    baseline_max: f64,
    /// What the baseline is.
    baseline_is: &'static str,
    /// The goal the ratio is held to, in words.
    goal: &'static str,
    /// Further figures of the case (name → value).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    extra: std::collections::BTreeMap<&'static str, f64>,
}

impl CaseResult {
    fn new(
        name: &'static str,
        unit: &'static str,
        better: Better,
        (cotald, baseline): (Vec<f64>, Vec<f64>),
        baseline_is: &'static str,
        goal: &'static str,
    ) -> Self {
        let paired: Vec<f64> = cotald.iter().zip(&baseline).map(|(c, b)| c / b).collect();
        let (c_min, c_med, c_max) = spread(cotald);
        let (b_min, b_med, b_max) = spread(baseline);
        CaseResult {
            name: name.to_owned(),
            unit,
            cotald: c_med,
            baseline: b_med,
            ratio: c_med / b_med,
            ratio_interval: RatioInterval::of(paired),
            better,
            cotald_min: c_min,
            cotald_max: c_max,
            baseline_min: b_min,
            baseline_max: b_max,
            baseline_is,
            goal,
            extra: Default::default(),
        }
    }
}

/// A distribution-free confidence interval for the median of a case's run-by-run ratios.
///
/// On a shared machine one run differs from the next by more than cotald from raw NATS, so a
/// ratio printed alone looks surer than it is. Sorted, `n` ratios hold their median between
/// the `k`-th smallest and the `k`-th largest unless at least `n - k + 1` of them fall on one
/// side of it, which for independent runs is a binomial tail (the sign test's interval); `k`
/// is the largest whose two tails together stay within 5 %.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
struct RatioInterval {
    low: f64,
    high: f64,
    /// The interval's confidence, at least 0.95.
    confidence: f64,
}

impl RatioInterval {
    fn of(mut ratios: Vec<f64>) -> Option<Self> {
        ratios.retain(|r| r.is_finite());
        ratios.sort_by(f64::total_cmp);
        let n = ratios.len();
        // P(X < k) for X ~ Binomial(n, 1/2), for k = 0, 1, …
        let below = |k: usize| -> f64 {
            let mut choose = 1.0;
            let mut sum = 0.0;
            for j in 0..k {
                sum += choose;
                choose = choose * (n - j) as f64 / (j + 1) as f64;
            }
            sum / 2f64.powi(n as i32)
        };
        let k = (1..=n / 2).take_while(|&k| 2.0 * below(k) <= 0.05).last()?;
        Some(RatioInterval {
            low: ratios[k - 1],
            high: ratios[n - k],
            confidence: 1.0 - 2.0 * below(k),
        })
    }
}

/// Min, median, max.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    match (v.first(), v.get(v.len() / 2), v.last()) {
        (Some(&min), Some(&med), Some(&max)) => (min, med, max),
        _ => (f64::NAN, f64::NAN, f64::NAN),
    }
}

#[derive(Debug, Serialize)]
struct Machine {
    cores: usize,
    os: &'static str,
    arch: &'static str,
    cotald: &'static str,
    nats_server: &'static str,
    quick: bool,
    runs: usize,
}

/// What one `cotald bench` run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    results: Vec<CaseResult>,
    machine: Machine,
}

/// Runs the selected cases; progress goes to stdout, or to stderr with `--json`.
pub async fn run(args: &BenchArgs) -> anyhow::Result<Report> {
    let sizes = Sizes::new(args.quick, args.runs);
    // With --json, stdout is the document alone: progress goes to stderr.
    let progress = |line: String| {
        if args.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    let exe = std::env::current_exe().context("locating the cotald executable")?;
    let bench_dir = BenchDir::create()?;
    let tmp = bench_dir.0.clone();
    let results = match args.cluster {
        true => cluster::run(&exe, &tmp, sizes, &progress).await?,
        false => {
            let mut results = profiles(args, &exe, &tmp, sizes, &progress).await?;
            results.extend(startup(args, &exe, &tmp, sizes, &progress).await?);
            results
        }
    };
    drop(bench_dir);

    let report = Report {
        results,
        machine: Machine {
            cores: cores(),
            os: std::env::consts::OS,
            arch: std::env::consts::ARCH,
            cotald: env!("CARGO_PKG_VERSION"),
            nats_server: crate::supervisor::BUNDLED_VERSION,
            quick: args.quick,
            runs: sizes.runs,
        },
    };
    Ok(report)
}

impl BenchArgs {
    /// Whether the case `name` is selected (`--case`; every case without one).
    fn wants(&self, name: &str) -> bool {
        self.cases.is_empty() || self.cases.iter().any(|c| name.contains(c))
    }
}

/// The selected cases on the shipped profile, then the throughput cases again with every write
/// synced (`sync_interval = "always"`), named with a `_sync_always` suffix: each pass on an
/// appliance of its own.
async fn profiles(
    args: &BenchArgs,
    exe: &Path,
    tmp: &Path,
    sizes: Sizes,
    progress: &dyn Fn(String),
) -> anyhow::Result<Vec<CaseResult>> {
    let always = tmp.join("sync-always.toml");
    std::fs::write(
        &always,
        crate::profile::EMBEDDED_LOCAL
            .replace("sync_interval = \"1s\"", "sync_interval = \"always\""),
    )?;
    let mut results = Vec::new();
    for (config, suffix) in [(None, ""), (Some(always.as_path()), "_sync_always")] {
        let selected: Vec<&cases::Case> = cases::ALL
            .iter()
            .filter(|case| config.is_none() || case.throughput)
            .filter(|case| {
                case.names
                    .iter()
                    .any(|n| args.wants(&format!("{n}{suffix}")))
            })
            .collect();
        if selected.is_empty() {
            continue;
        }
        let dir = tmp.join(format!("data{suffix}"));
        let appliance = Appliance::start(exe, &dir, config, tmp).await?;
        progress(format!(
            "appliance{suffix} ready on {} ({} cores); {} repetitions per case{}",
            appliance.listen,
            cores(),
            sizes.runs,
            if args.quick { ", quick sizes" } else { "" }
        ));
        let bench = Bench::new(&appliance).await?;
        for case in selected {
            results.extend(run_case(&bench, case, sizes, suffix, progress).await?);
        }
        bench.close().await;
        appliance.stop().await;
    }
    Ok(results)
}

/// One case, its results named with `suffix`: each said as it comes, then the time it took.
async fn run_case(
    bench: &Bench,
    case: &cases::Case,
    sizes: Sizes,
    suffix: &str,
    progress: &dyn Fn(String),
) -> anyhow::Result<Vec<CaseResult>> {
    let started = Instant::now();
    let mut found = (case.run)(bench, sizes)
        .await
        .with_context(|| format!("{}{suffix}", case.names[0]))?;
    for result in &mut found {
        result.name.push_str(suffix);
        progress(format!("{}", Line(result)));
    }
    progress(format!(
        "  ({}{suffix} took {:.1} s)",
        case.names[0],
        started.elapsed().as_secs_f64()
    ));
    Ok(found)
}

/// `startup_cold` and `startup_warm`, when selected.
async fn startup(
    args: &BenchArgs,
    exe: &Path,
    tmp: &Path,
    sizes: Sizes,
    progress: &dyn Fn(String),
) -> anyhow::Result<Vec<CaseResult>> {
    if !(args.wants("startup_cold") || args.wants("startup_warm")) {
        return Ok(Vec::new());
    }
    let started = Instant::now();
    let results = cases::startup(exe, tmp, sizes).await?;
    for result in &results {
        progress(format!("{}", Line(result)));
    }
    progress(format!(
        "  (startup took {:.1} s)",
        started.elapsed().as_secs_f64()
    ));
    Ok(results)
}

/// Writes `report` as the table people read, or as one JSON document (`--json`).
pub fn write(out: &mut dyn Write, report: &Report, json: bool) -> std::io::Result<()> {
    if json {
        let doc = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
        writeln!(out, "{doc}")
    } else {
        table(out, &report.results)
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// A fresh private directory for the bench's data dirs, removed when dropped: at the end, and
/// when a case fails too.
struct BenchDir(PathBuf);

impl BenchDir {
    fn create() -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "cotald-bench-{}-{}",
            std::process::id(),
            crate::protocol::new_message_id()
        ));
        crate::files::private_dir(&dir)?;
        Ok(BenchDir(dir))
    }
}

impl Drop for BenchDir {
    /// Removes the dir. A run stopped by a signal is dropped with its appliances, each killed
    /// then; their brokers die a moment later (their parent-death signal) and may write once
    /// more meanwhile, so the removal is tried again, for at most a second.
    fn drop(&mut self) {
        for _ in 0..20 {
            if std::fs::remove_dir_all(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// One result as a progress line.
struct Line<'a>(&'a CaseResult);

impl std::fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.0;
        write!(
            f,
            "{:<40} cotald {:>10} {:<6} baseline {:>10}   ratio {:.2}",
            r.name,
            figure(r.cotald),
            r.unit,
            figure(r.baseline),
            r.ratio
        )?;
        if let Some(i) = r.ratio_interval {
            write!(f, " (paired runs' median in {:.2}-{:.2})", i.low, i.high)?;
        }
        for (name, value) in &r.extra {
            write!(f, "; {name} {}", figure(*value))?;
        }
        Ok(())
    }
}

fn figure(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn table(out: &mut dyn Write, results: &[CaseResult]) -> std::io::Result<()> {
    writeln!(out)?;
    writeln!(
        out,
        "{:<40} {:>22} {:>22} {:>6}  {:<7} goal; baseline",
        "case (median, min-max)", "cotald", "baseline", "ratio", "unit"
    )?;
    for r in results {
        let range = |med: f64, min: f64, max: f64| {
            format!("{} ({}-{})", figure(med), figure(min), figure(max))
        };
        writeln!(
            out,
            "{:<40} {:>22} {:>22} {:>6.2}  {:<7} {}; {}",
            r.name,
            range(r.cotald, r.cotald_min, r.cotald_max),
            range(r.baseline, r.baseline_min, r.baseline_max),
            r.ratio,
            r.unit,
            r.goal,
            r.baseline_is
        )?;
        if let Some(i) = r.ratio_interval {
            writeln!(
                out,
                "{:<40} the median run-by-run ratio lies in {:.2}-{:.2} ({:.0} % confidence)",
                "",
                i.low,
                i.high,
                i.confidence * 100.0
            )?;
        }
        if !r.extra.is_empty() {
            let extra: Vec<String> = r
                .extra
                .iter()
                .map(|(name, value)| format!("{name} {}", figure(*value)))
                .collect();
            writeln!(out, "{:<40} {}", "", extra.join(", "))?;
        }
    }
    writeln!(
        out,
        "ratio = cotald / baseline: for msg/s higher is better, for µs and ms lower is better"
    )
}

/// The bound on any single wait of the bench.
const TIMEOUT: Duration = Duration::from_secs(120);

/// An identity minted for the bench.
struct Minted {
    id: String,
    creds: String,
    link: JoinLink,
}

/// What every case uses: the appliance, its CA, the operator's raw connection.
struct Bench {
    dir: crate::datadir::DataDir,
    listen: SocketAddr,
    ca: PathBuf,
    /// The machine operator (unrestricted in the space): the raw baseline's identity.
    operator: Minted,
    raw: async_nats::Client,
}

/// The space every case runs in.
const SPACE: &str = "main";

impl Bench {
    async fn new(appliance: &Appliance) -> anyhow::Result<Bench> {
        let dir = appliance.dir.clone();
        let creds = std::fs::read_to_string(dir.operator_creds(SPACE))?;
        let id = crate::binding::Creds::parse(&creds)?.public_key()?;
        let link = JoinLink::parse(&format!("cotals://{}/{SPACE}", appliance.listen))?;
        let ca = dir.ca_cert();
        let operator = Minted { id, creds, link };
        let raw = raw_connect(&operator, appliance.listen, &ca).await?;
        Ok(Bench {
            dir,
            listen: appliance.listen,
            ca,
            operator,
            raw,
        })
    }

    async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.raw.drain()).await;
    }

    /// Mints `name` with the grants `args` (the JSON fields of a mint request).
    async fn mint(&self, name: &str, grants: serde_json::Value) -> anyhow::Result<Minted> {
        let mut request = serde_json::json!({"name": name, "space": SPACE});
        if let (Some(req), Some(grants)) = (request.as_object_mut(), grants.as_object()) {
            req.extend(grants.clone());
        }
        let request = Request::Mint(serde_json::from_value(request)?);
        let reply = admin::call(&self.dir, &request)
            .await?
            .context("the appliance under test stopped")?;
        let reply: MintReply = serde_json::from_value(reply)?;
        Ok(Minted {
            id: reply.record.id,
            creds: reply.creds,
            link: JoinLink::parse(&reply.link)?,
        })
    }

    /// A client endpoint of `m`; `tweak` adjusts the options.
    async fn connect(
        &self,
        m: &Minted,
        tweak: impl FnOnce(&mut ConnectOptions),
    ) -> anyhow::Result<Connection> {
        let mut opts = ConnectOptions::new(m.link.clone(), m.creds.clone());
        opts.ca = Some(self.ca.clone());
        tweak(&mut opts);
        Ok(bounded("connect", Client::connect(opts)).await??)
    }

    /// A sender's endpoint: no presence, no DMs, no backstop.
    async fn sender(&self, m: &Minted) -> anyhow::Result<Connection> {
        self.connect(m, |o| {
            o.presence = false;
            o.receive_backstop = false;
            o.receive_dms = false;
        })
        .await
    }

    /// A raw async-nats connection with `m`'s credential.
    async fn raw_as(&self, m: &Minted) -> anyhow::Result<async_nats::Client> {
        raw_connect(m, self.listen, &self.ca).await
    }
}

/// A plain async-nats connection with `m`'s credential (TLS, the appliance's CA, the inbox
/// prefix its grants allow).
async fn raw_connect(
    m: &Minted,
    listen: SocketAddr,
    ca: &Path,
) -> anyhow::Result<async_nats::Client> {
    let options = async_nats::ConnectOptions::with_credentials(&m.creds)?
        .custom_inbox_prefix(crate::binding::system::inbox_prefix(&m.id))
        .add_root_certificates(ca.to_owned())
        .require_tls(true);
    Ok(bounded("raw connect", options.connect(format!("tls://{listen}"))).await??)
}

/// `fut`, or an error naming `what` after [`TIMEOUT`].
async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .map_err(|_| anyhow::anyhow!("{what}: not done within {}s", TIMEOUT.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_interval_is_the_sign_tests_interval_for_the_median() {
        // Ten runs: the 2nd and the 9th of the sorted ratios; each tail is 11/1024.
        let ten: Vec<f64> = (1..=10).rev().map(|i| f64::from(i) / 10.0).collect();
        let i = RatioInterval::of(ten).unwrap();
        assert_eq!((i.low, i.high), (0.2, 0.9));
        assert!((i.confidence - (1.0 - 22.0 / 1024.0)).abs() < 1e-12);
        // Six runs: the extremes, each tail 1/64.
        let six = RatioInterval::of(vec![1.0, 0.5, 0.9, 0.7, 1.1, 0.8]).unwrap();
        assert_eq!((six.low, six.high), (0.5, 1.1));
        assert!((six.confidence - (1.0 - 2.0 / 64.0)).abs() < 1e-12);
        // Five runs cannot hold a median at 95 % (each tail is 1/32), nor one run.
        assert_eq!(RatioInterval::of(vec![1.0; 5]), None);
        assert_eq!(RatioInterval::of(vec![1.0]), None);
        // A run that measured nothing is not counted.
        let mut seven = vec![f64::NAN];
        seven.extend([0.9, 1.0, 1.0, 1.0, 1.0, 1.2]);
        let i = RatioInterval::of(seven).unwrap();
        assert_eq!((i.low, i.high), (0.9, 1.2));
    }
}
