//! `cotald bench --cluster`: what replication costs, and how long a failover takes.
//!
//! It runs the live publish cases ([`cases::live_throughput`], [`cases::live_latency`]) on a
//! single appliance (every stream R1) and on a cluster of three appliances on this machine
//! (formed with `cotald cluster init` / `join`, every stream R3, measured through the first
//! node), and reports cotald's figures side by side: "cotald" is the R3 cluster, "baseline" the
//! R1 appliance. Then, `runs` times, it kills (SIGKILL, the broker following) the node holding
//! the space's lease and measures the time until the space's manager answers again on a
//! surviving node (`cluster_failover`, against the lease's TTL, the bound by design), and
//! restarts the killed node before the next round.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};

use super::{Appliance, Bench, Better, CaseResult, Sizes, cases, spread};
use crate::ops::Request;
use crate::services::lease::LEASE_TTL;

/// R3 beside R1 for one case: the cotald side of each run.
fn compare(r3: &CaseResult, r1: &CaseResult) -> CaseResult {
    CaseResult {
        name: format!("r3_{}", r1.name),
        unit: r1.unit,
        cotald: r3.cotald,
        baseline: r1.cotald,
        ratio: r3.cotald / r1.cotald,
        ratio_interval: None,
        better: r1.better,
        cotald_min: r3.cotald_min,
        cotald_max: r3.cotald_max,
        baseline_min: r1.cotald_min,
        baseline_max: r1.cotald_max,
        baseline_is: "the same through a single appliance (R1)",
        goal: "(the price of three copies)",
        extra: Default::default(),
    }
}

/// The live cases on one appliance (through `appliance`).
async fn live(appliance: &Appliance, sizes: Sizes) -> anyhow::Result<Vec<CaseResult>> {
    let bench = Bench::new(appliance).await?;
    let mut out = cases::live_throughput(&bench, sizes, cases::LIVE).await?;
    out.extend(cases::live_latency(&bench, sizes, cases::LIVE).await?);
    bench.close().await;
    Ok(out)
}

/// Runs `cotald ARGS… --data-dir DIR` to completion.
async fn cotald(exe: &Path, dir: &Path, args: &[String]) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(exe)
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "cotald {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A port nothing listens on now.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Three data dirs joined into one cluster.
async fn prepare(exe: &Path, tmp: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let dirs: Vec<PathBuf> = ["a", "b", "c"].iter().map(|n| tmp.join(n)).collect();
    let routes = (0..3)
        .map(|_| free_port().map(|p| format!("127.0.0.1:{p}")))
        .collect::<Result<Vec<_>, _>>()?;
    let bundle = tmp.join("bundle.json");
    for (i, dir) in dirs.iter().enumerate() {
        let mut args: Vec<String> = match i {
            0 => ["cluster", "init", "--name", "bench", "--out"]
                .map(String::from)
                .into_iter()
                .chain([bundle.display().to_string()])
                .collect(),
            _ => vec![
                "cluster".into(),
                "join".into(),
                bundle.display().to_string(),
            ],
        };
        args.extend(["--listen".into(), routes[i].clone()]);
        for (j, route) in routes.iter().enumerate() {
            if j != i {
                args.extend(["--route".into(), route.clone()]);
            }
        }
        cotald(exe, dir, &args).await?;
    }
    Ok(dirs)
}

/// Starts a node (its log beside its data dir).
async fn node(exe: &Path, dir: &Path) -> anyhow::Result<Appliance> {
    let logs = dir.with_extension("logs");
    crate::files::private_dir(&logs)?;
    Appliance::start(exe, dir, None, &logs).await
}

/// Which node holds the lease of the bench's space, as the nodes record it.
async fn holder(nodes: &[Option<Appliance>]) -> anyhow::Result<usize> {
    super::bounded("a lease holder", async {
        loop {
            for (i, n) in nodes.iter().enumerate() {
                let Some(n) = n else { continue };
                let Some(state) = n.dir.read_state().ok().flatten() else {
                    continue;
                };
                if state
                    .leases
                    .get(super::SPACE)
                    .is_some_and(|l| l.mine && l.holder.is_some())
                {
                    return i;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

/// Kills the lease holder `runs` times; the time until the manager answers again.
async fn failover(
    exe: &Path,
    dirs: &[PathBuf],
    nodes: &mut [Option<Appliance>],
    sizes: Sizes,
    progress: &dyn Fn(String),
) -> anyhow::Result<CaseResult> {
    let mut times = Vec::new();
    for round in 0..sizes.runs {
        let h = holder(nodes).await?;
        let survivor = (h + 1) % nodes.len();
        let bench = Bench::new(nodes[survivor].as_ref().context("survivor")?).await?;
        let probe = bench
            .mint(&format!("failover-{round}"), serde_json::json!({}))
            .await?;
        let conn = bench.sender(&probe).await?;
        // The manager answers before the kill.
        super::bounded(
            "the manager",
            conn.client
                .manager::<serde_json::Value>(&Request::Memberships),
        )
        .await??;
        let dead = nodes[h].take().context("holder")?;
        let killed = dead.kill().await?;
        let answered = super::bounded("the manager after the kill", async {
            loop {
                let asked = tokio::time::timeout(
                    Duration::from_millis(500),
                    conn.client
                        .manager::<serde_json::Value>(&Request::Memberships),
                )
                .await;
                if matches!(asked, Ok(Ok(_))) {
                    return killed.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await?;
        progress(format!(
            "  failover {round}: the manager answered again {:.0} ms after the kill",
            answered.as_secs_f64() * 1000.0
        ));
        times.push(answered.as_secs_f64() * 1000.0);
        conn.client.close().await;
        bench.close().await;
        // The killed broker follows its parent; then the node comes back for the next round.
        nodes[h] = Some(node(exe, &dirs[h]).await?);
    }
    let ttl = LEASE_TTL.as_secs_f64() * 1000.0;
    let (min, med, max) = spread(times);
    Ok(CaseResult {
        name: "cluster_failover".into(),
        unit: "ms",
        cotald: med,
        baseline: ttl,
        ratio: med / ttl,
        ratio_interval: None,
        better: Better::Lower,
        cotald_min: min,
        cotald_max: max,
        baseline_min: ttl,
        baseline_max: ttl,
        baseline_is: "the lease's TTL (a dead holder's lease expires after it)",
        goal: "a few seconds",
        extra: Default::default(),
    })
}

/// The cluster cases.
pub(super) async fn run(
    exe: &Path,
    tmp: &Path,
    sizes: Sizes,
    progress: &dyn Fn(String),
) -> anyhow::Result<Vec<CaseResult>> {
    let single = tmp.join("r1");
    let appliance = node(exe, &single).await?;
    progress(format!("R1 appliance ready on {}", appliance.listen));
    let r1 = live(&appliance, sizes).await?;
    appliance.stop().await;

    let dirs = prepare(exe, tmp).await?;
    let started = futures_util::future::try_join_all(dirs.iter().map(|d| node(exe, d))).await?;
    let mut nodes: Vec<Option<Appliance>> = started.into_iter().map(Some).collect();
    progress("R3 cluster of three appliances ready".to_owned());
    let r3 = live(nodes[0].as_ref().context("node a")?, sizes).await?;
    let mut out: Vec<CaseResult> = r3.iter().zip(&r1).map(|(r3, r1)| compare(r3, r1)).collect();
    for r in &out {
        progress(format!("{}", super::Line(r)));
    }
    out.push(failover(exe, &dirs, &mut nodes, sizes, progress).await?);
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
    Ok(out)
}
