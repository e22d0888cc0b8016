//! `cotald status`: is the appliance of this data dir running and healthy?

use std::io::Write;
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;

use super::DataDirArg;
use crate::daemon::admin;
use crate::datadir::RuntimeState;
use crate::ops::status::DeliveryReport;
use crate::ops::{BrokerHealth, Request};
use crate::services::{Health, ServiceStatus};

/// How long the appliance may take to say how its broker is.
const ASK_WITHIN: std::time::Duration = std::time::Duration::from_secs(3);

/// Options of `cotald status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub(super) data_dir: DataDirArg,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Wait until the appliance is running and healthy, at most SECS (30 when no value is
    /// given), then answer as without it: for scripts that start `cotald up &` and go on.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "30")]
    wait: Option<u64>,
}

#[derive(Serialize)]
struct Report {
    running: bool,
    /// Running, the broker healthy, every service running and no online member stalled:
    /// delivery progresses.
    healthy: bool,
    data_dir: String,
    #[serde(flatten)]
    state: Option<RuntimeState>,
    /// Whether the broker and its JetStream say they are healthy.
    broker_healthy: bool,
    /// The version the broker reports about itself (`VARZ`).
    reported_version: Option<String>,
    /// Why the broker is not healthy, as it says (or why it could not be asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    unhealthy: Option<String>,
    /// Each space's refusals and online durable members, as the appliance says; `None` when
    /// it could not be asked (then it is not healthy: delivery is unknown).
    delivery: Option<DeliveryReport>,
    /// Why it is not healthy, each reason once (empty when it is).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    degraded: Vec<String>,
}

pub(super) async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let dir = args.data_dir.resolve()?;
    let deadline =
        tokio::time::Instant::now() + std::time::Duration::from_secs(args.wait.unwrap_or(0));
    let report = loop {
        let report = report(&dir).await?;
        if (report.running && report.healthy) || tokio::time::Instant::now() >= deadline {
            break report;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let printed = if args.json {
        let doc = serde_json::to_string_pretty(&report)?;
        super::stdout(|out| writeln!(out, "{doc}"))
    } else {
        super::stdout(|out| print_text(out, &report))
    };
    // The exit code is the answer: it stands when the reader closed the pipe early.
    match printed {
        Err(e) if !super::stdout_closed(&e) => Err(e),
        _ if report.running && report.healthy => Ok(ExitCode::SUCCESS),
        _ => Ok(ExitCode::FAILURE),
    }
}

/// What the data dir says of its appliance, what its broker says of itself, and how delivery
/// goes: healthy only when all of it is well.
async fn report(dir: &crate::datadir::DataDir) -> anyhow::Result<Report> {
    let running = dir.is_locked()?;
    let state = if running { dir.read_state()? } else { None };
    let (health, delivery) = match &state {
        Some(s) if process_alive(s.broker_pid) => {
            tokio::join!(broker_health(dir), delivery(dir))
        }
        Some(s) => (
            BrokerHealth {
                healthy: false,
                reason: Some(format!("nats-server (pid {}) is not running", s.broker_pid)),
                version: None,
            },
            None,
        ),
        None => (
            BrokerHealth {
                healthy: false,
                reason: None,
                version: None,
            },
            None,
        ),
    };
    let degraded = match &state {
        Some(s) if running => degraded(s, &health, delivery.as_ref()),
        _ => Vec::new(),
    };
    Ok(Report {
        running,
        healthy: running && state.is_some() && degraded.is_empty(),
        data_dir: dir.root().display().to_string(),
        state,
        broker_healthy: health.healthy,
        reported_version: health.version,
        unhealthy: health.reason,
        delivery,
        degraded,
    })
}

/// Every reason the appliance is not serving as it should: the broker, a service that is not
/// running, delivery that could not be asked about, an online member whose delivery stalled.
fn degraded(
    state: &RuntimeState,
    broker: &BrokerHealth,
    delivery: Option<&DeliveryReport>,
) -> Vec<String> {
    let mut why = Vec::new();
    if !broker.healthy {
        why.push(format!(
            "broker: {}",
            broker.reason.as_deref().unwrap_or("unhealthy")
        ));
    }
    why.extend(crate::ops::status::services_degraded(&state.services));
    match delivery {
        None => why.push("delivery: the appliance did not say how it goes (unknown)".into()),
        Some(report) => {
            for (space, d) in report {
                for m in d.members.iter().filter(|m| m.stalled) {
                    why.push(format!("{space} delivery stalled: {}", m.stall()));
                }
            }
        }
    }
    why.dedup();
    why
}

/// How delivery goes in each space, as the appliance says (`None` when it does not answer
/// within [`ASK_WITHIN`]).
async fn delivery(dir: &crate::datadir::DataDir) -> Option<DeliveryReport> {
    let asked = tokio::time::timeout(ASK_WITHIN, admin::call(dir, &Request::Delivery)).await;
    match asked {
        Ok(Ok(Some(data))) => serde_json::from_value(data).ok(),
        _ => None,
    }
}

/// What the broker says of itself, asked by the appliance over the system account (the
/// broker has no unauthenticated listener to ask), bounded by [`ASK_WITHIN`].
async fn broker_health(dir: &crate::datadir::DataDir) -> BrokerHealth {
    let asked = tokio::time::timeout(ASK_WITHIN, admin::call(dir, &Request::BrokerHealth)).await;
    let unanswered = |reason: String| BrokerHealth {
        healthy: false,
        reason: Some(reason),
        version: None,
    };
    match asked {
        Ok(Ok(Some(data))) => serde_json::from_value(data)
            .unwrap_or_else(|e| unanswered(format!("a malformed answer: {e}"))),
        Ok(Ok(None)) => unanswered("the admin socket is not there".into()),
        Ok(Err(e)) => unanswered(format!("the admin socket: {e}")),
        Err(_) => unanswered(format!(
            "the appliance did not answer within {ASK_WITHIN:?}"
        )),
    }
}

fn print_text(out: &mut dyn Write, r: &Report) -> std::io::Result<()> {
    match (&r.state, r.running, r.healthy) {
        (_, false, _) => writeln!(
            out,
            "cotald is not running (data dir {}); start it with `cotald up`",
            r.data_dir
        ),
        (None, true, _) => writeln!(out, "cotald is starting (data dir {})", r.data_dir),
        (Some(s), true, healthy) => {
            let verdict = match healthy {
                true => "healthy",
                false => "DEGRADED",
            };
            writeln!(out, "cotald is running (pid {}): {verdict}", s.pid)?;
            for why in &r.degraded {
                writeln!(out, "  degraded    {why}")?;
            }
            writeln!(
                out,
                "  broker      {}",
                match (
                    &r.unhealthy,
                    healthy || r.degraded.iter().all(|d| !d.starts_with("broker"))
                ) {
                    (_, true) => "healthy".to_owned(),
                    (Some(why), false) => format!("UNHEALTHY ({why})"),
                    (None, false) => "UNHEALTHY".to_owned(),
                }
            )?;
            writeln!(out, "  listen      {} (TLS)", s.listen)?;
            writeln!(
                out,
                "  nats-server {} (pid {}, restarts {})",
                r.reported_version.as_deref().unwrap_or(&s.broker_version),
                s.broker_pid,
                s.broker_restarts
            )?;
            if let Some(last) = &s.broker_last_restart {
                writeln!(out, "  last restart {} ({})", last.at, last.reason)?;
            }
            writeln!(out, "  spaces      {}", s.spaces.join(", "))?;
            if let Some(url) = &s.dashboard {
                writeln!(out, "  dashboard   {url}")?;
            }
            for space in &s.unserved {
                writeln!(out, "  NOT SERVED  {}: {}", space.name, space.reason)?;
            }
            for line in service_lines(&s.services) {
                writeln!(out, "  {line}")?;
            }
            for line in delivery_lines(r.delivery.as_ref()) {
                writeln!(out, "  {line}")?;
            }
            for line in cluster_lines(s) {
                writeln!(out, "  {line}")?;
            }
            writeln!(out, "  data dir    {}", r.data_dir)
        }
    }
}

/// Per space: `delivery    main: 2 durable members online, 3 unacknowledged (oldest waiting
/// 1 s); 1 away, 340 messages waiting (oldest stored 2 h ago); refused 2 (malformed-header 2)`,
/// then a line for each stalled member.
fn delivery_lines(delivery: Option<&DeliveryReport>) -> Vec<String> {
    let Some(report) = delivery else {
        return vec!["delivery    unknown (the appliance did not say)".to_owned()];
    };
    let mut lines = Vec::new();
    for (space, d) in report {
        let (online, away): (Vec<_>, Vec<_>) = d.members.iter().partition(|m| m.online);
        let unacked: u64 = online.iter().map(|m| m.unacknowledged).sum();
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        let mut line = format!(
            "delivery    {space}: {} durable member{} online, {unacked} unacknowledged",
            online.len(),
            plural(online.len())
        );
        if unacked > 0 {
            let oldest = online.iter().map(|m| m.waiting_secs).max().unwrap_or(0);
            line.push_str(&format!(" (oldest waiting {oldest} s)"));
        }
        if !away.is_empty() {
            let backlog: Option<u64> = away.iter().map(|m| m.backlog).sum();
            let oldest = away.iter().filter_map(|m| m.oldest_pending_secs).max();
            line.push_str(&format!("; {} away, ", away.len()));
            line.push_str(&match backlog {
                Some(n) => format!("{n} messages waiting"),
                None => "messages waiting: unknown".to_owned(),
            });
            if let Some(oldest) = oldest {
                line.push_str(&format!(" (oldest stored {oldest} s ago)"));
            }
        }
        let refused: u64 = d.refused.values().sum();
        if refused > 0 {
            let by: Vec<String> = d.refused.iter().map(|(r, n)| format!("{r} {n}")).collect();
            line.push_str(&format!("; refused {refused} ({})", by.join(", ")));
        }
        lines.push(line);
        for m in d.members.iter().filter(|m| m.stalled) {
            lines.push(format!(
                "  STALLED   {} (threshold {} s)",
                m.stall(),
                d.stall_after_secs
            ));
        }
    }
    lines
}

/// One line per scope: `services    main: presence running, backstop DEGRADED (why), …`.
fn service_lines(services: &[ServiceStatus]) -> Vec<String> {
    let mut scopes: Vec<(&str, Vec<String>)> = Vec::new();
    for s in services {
        let state = match &s.health {
            Health::Running => "running".to_owned(),
            Health::Starting => "starting".to_owned(),
            Health::Stopped => "stopped".to_owned(),
            Health::Degraded(why) => format!("DEGRADED ({why})"),
        };
        let restarts = match (s.restarts, &s.last_failure) {
            (0, _) => String::new(),
            (1, Some(why)) => format!(", restarted once (last: {why})"),
            (n, Some(why)) => format!(", {n} restarts (last: {why})"),
            (n, None) => format!(", {n} restarts"),
        };
        let entry = format!("{} {state}{restarts}", s.name);
        match scopes.iter_mut().find(|(scope, _)| *scope == s.scope) {
            Some((_, entries)) => entries.push(entry),
            None => scopes.push((&s.scope, vec![entry])),
        }
    }
    scopes
        .into_iter()
        .map(|(scope, entries)| format!("services    {scope}: {}", entries.join(", ")))
        .collect()
}

/// A clustered node's view: nodes, who holds each space's lease, each stream's leader.
fn cluster_lines(s: &RuntimeState) -> Vec<String> {
    let mut lines = Vec::new();
    let Some(c) = &s.cluster else {
        return lines;
    };
    let nodes: Vec<String> = c
        .nodes
        .iter()
        .map(|n| {
            let mut tags = Vec::new();
            if n.name == c.node {
                tags.push("this node");
            }
            if n.name == c.meta_leader {
                tags.push("meta leader");
            }
            if !n.current {
                tags.push("NOT CURRENT");
            }
            match tags.is_empty() {
                true => n.name.clone(),
                false => format!("{} ({})", n.name, tags.join(", ")),
            }
        })
        .collect();
    lines.push(format!("cluster     {}", nodes.join(", ")));
    for (space, lease) in &s.leases {
        let holder = match (&lease.holder, lease.mine) {
            (Some(h), true) => format!("{h} (this node)"),
            (Some(h), false) => h.clone(),
            (None, _) => "nobody (being taken over)".to_owned(),
        };
        lines.push(format!("lease       {space}: {holder}"));
    }
    for stream in &c.streams {
        let lagging: Vec<&str> = stream
            .followers
            .iter()
            .filter(|f| !f.current)
            .map(|f| f.name.as_str())
            .collect();
        let leader = match stream.leader.as_str() {
            "" => "NO LEADER",
            l => l,
        };
        let mut line = format!("stream      {}: leader {leader}", stream.stream);
        if !lagging.is_empty() {
            line.push_str(&format!(", behind: {}", lagging.join(", ")));
        }
        lines.push(line);
    }
    lines
}

fn process_alive(pid: u32) -> bool {
    // Signal 0: whether the process exists (and may be signalled by this user).
    i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|pid| rustix::process::test_kill_process(pid).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datadir::{ClusterNode, ClusterState, StreamLeader};
    use crate::services::lease::LeaseView;

    #[test]
    fn a_cluster_node_shows_nodes_leases_and_stream_leaders() {
        let node = |name: &str, current| ClusterNode {
            name: name.into(),
            current,
        };
        let mut state: RuntimeState = serde_json::from_value(serde_json::json!({
            "pid": 1, "broker_pid": 2, "broker_version": "x", "listen": "127.0.0.1:1",
            "monitor": "127.0.0.1:2", "spaces": ["main"], "broker_restarts": 0
        }))
        .unwrap();
        assert!(
            cluster_lines(&state).is_empty(),
            "a single appliance shows none"
        );
        state.cluster = Some(ClusterState {
            node: "a".into(),
            meta_leader: "b".into(),
            nodes: vec![node("a", true), node("b", true), node("c", false)],
            streams: vec![StreamLeader {
                stream: "CHAT_main".into(),
                leader: "b".into(),
                followers: vec![node("a", true), node("c", false)],
            }],
        });
        state.leases.insert(
            "main".into(),
            LeaseView {
                holder: Some("a".into()),
                mine: true,
            },
        );
        assert_eq!(
            cluster_lines(&state),
            [
                "cluster     a (this node), b (meta leader), c (NOT CURRENT)",
                "lease       main: a (this node)",
                "stream      CHAT_main: leader b, behind: c",
            ]
        );
    }
}
