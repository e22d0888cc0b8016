//! The churn and faults of a soak, on a schedule drawn from its seed: each kind at least once,
//! spread over the run after a quiet warm-up and before a quiet end, and what the soak does to
//! the broker for the kinds that touch it.

use std::time::Duration;

use anyhow::{Context, bail};
use rustix::process::{Pid, Signal, kill_process};
use serde::Serialize;
use serde_json::json;

use crate::datadir::DataDir;
use crate::supervisor::monitor::Monitor;

/// A fault or a change of the team.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub(super) enum Fault {
    /// An agent leaves the team channel and comes back a few seconds later.
    LeaveAndReturn,
    /// An agent's host restarts: a new session of the same identity.
    HostRestart,
    /// A new identity is minted and joins.
    Mint,
    /// An identity's credential is issued again; its agent reconnects with it.
    Reissue,
    /// An identity is revoked; its agent is gone.
    Revoke,
    /// A channel's config changes.
    ChannelConfig,
    /// The services' connection to the broker is cut (the broker kicks it).
    ServicesCut,
    /// The broker is killed (SIGKILL); the appliance starts it again.
    BrokerKill,
    /// The broker stops answering for a while (SIGSTOP, then SIGCONT): delivery stalls.
    BrokerStall,
    /// The appliance is stopped and started again.
    ApplianceRestart,
}

impl Fault {
    pub(super) const ALL: [Fault; 10] = [
        Fault::LeaveAndReturn,
        Fault::HostRestart,
        Fault::Mint,
        Fault::Reissue,
        Fault::Revoke,
        Fault::ChannelConfig,
        Fault::ServicesCut,
        Fault::BrokerKill,
        Fault::BrokerStall,
        Fault::ApplianceRestart,
    ];

    /// The kinds a soak carries out: every one on an appliance it started; on a linked one,
    /// all but the appliance's restart (the soak does not know how it was started).
    pub(super) fn kinds(linked: bool) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|f| !linked || *f != Fault::ApplianceRestart)
            .collect()
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Fault::LeaveAndReturn => "leave and return",
            Fault::HostRestart => "host restart",
            Fault::Mint => "mint",
            Fault::Reissue => "re-issue",
            Fault::Revoke => "revoke",
            Fault::ChannelConfig => "channel config",
            Fault::ServicesCut => "services cut",
            Fault::BrokerKill => "broker kill -9",
            Fault::BrokerStall => "broker stall",
            Fault::ApplianceRestart => "appliance restart",
        }
    }
}

/// When each fault happens, as offsets from the start: every kind once in turn (shuffled by
/// the seed), again and again while the run lasts, one per `every`, between a fifth of the
/// run and its last tenth.
pub(super) fn schedule(
    rng: &mut fastrand::Rng,
    run: Duration,
    every: Duration,
    kinds: &[Fault],
) -> Vec<(Duration, Fault)> {
    let (first, last) = (run / 5, run - run / 10);
    let mut out = Vec::new();
    let mut at = first;
    let mut round = Vec::new();
    while at < last {
        if round.is_empty() {
            round = kinds.to_vec();
            rng.shuffle(&mut round);
        }
        let jitter = Duration::from_millis(rng.u64(0..=every.as_millis() as u64 / 4));
        out.push((at + jitter, round.pop().unwrap_or(Fault::Mint)));
        at += every;
    }
    out
}

/// How often faults come so that every kind happens `rounds` times in the faulted part of
/// the run (at least one per 5 s).
pub(super) fn pace(run: Duration, rounds: u32, kinds: usize) -> Duration {
    let faulted = run - run / 5 - run / 10;
    (faulted / (kinds.max(1) as u32 * rounds.max(1))).max(Duration::from_secs(5))
}

/// The broker's pid, as the appliance's runtime state says it.
fn broker(dir: &DataDir) -> anyhow::Result<Pid> {
    let state = dir.read_state()?.context("the appliance is not running")?;
    i32::try_from(state.broker_pid)
        .ok()
        .and_then(Pid::from_raw)
        .context("no broker pid")
}

/// Kills the broker (SIGKILL).
pub(super) fn kill_broker(dir: &DataDir) -> anyhow::Result<()> {
    kill_process(broker(dir)?, Signal::KILL).context("killing the broker")
}

/// Stops the broker (SIGSTOP) for `stall`, then lets it go on (SIGCONT), unless the appliance
/// found it unresponsive and replaced it meanwhile.
pub(super) async fn stall_broker(dir: &DataDir, stall: Duration) -> anyhow::Result<()> {
    let pid = broker(dir)?;
    kill_process(pid, Signal::STOP).context("stopping the broker")?;
    tokio::time::sleep(stall).await;
    match kill_process(pid, Signal::CONT) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(e).context("letting the broker go on"),
    }
}

/// Has the broker close the space's services connection (`cotald-manager-<space>`), as a
/// network cut would: `CONNZ` finds it, `KICK` closes it.
pub(super) async fn cut_services(monitor: &Monitor, space: &str) -> anyhow::Result<()> {
    let name = format!("cotald-manager-{space}");
    let connz = monitor
        .ask("CONNZ", json!({ "limit": 4096 }), Duration::from_secs(5))
        .await
        .context("CONNZ")?;
    let cids: Vec<u64> = connz["connections"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["name"] == name.as_str())
        .filter_map(|c| c["cid"].as_u64())
        .collect();
    if cids.is_empty() {
        bail!("no connection named {name}");
    }
    for cid in cids {
        monitor
            .ask("KICK", json!({ "cid": cid }), Duration::from_secs(5))
            .await
            .context("KICK")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_comes_in_the_faulted_part_and_the_seed_decides_the_order() {
        let run = Duration::from_secs(120);
        let kinds = Fault::kinds(false);
        let every = pace(run, 1, kinds.len());
        let a = schedule(&mut fastrand::Rng::with_seed(7), run, every, &kinds);
        let b = schedule(&mut fastrand::Rng::with_seed(7), run, every, &kinds);
        let c = schedule(&mut fastrand::Rng::with_seed(8), run, every, &kinds);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut kinds: Vec<Fault> = a.iter().map(|(_, f)| *f).collect();
        kinds.sort();
        kinds.dedup();
        assert_eq!(kinds.len(), Fault::ALL.len(), "{a:?}");
        assert!(a.iter().all(|(at, _)| *at >= run / 5 && *at < run));
        let linked = Fault::kinds(true);
        assert!(!linked.contains(&Fault::ApplianceRestart));
        let every = pace(run, 1, linked.len());
        let d = schedule(&mut fastrand::Rng::with_seed(7), run, every, &linked);
        assert!(
            d.iter().all(|(_, f)| *f != Fault::ApplianceRestart),
            "{d:?}"
        );
    }
}
