//! `cotald soak`: a team's week in an hour. A fresh appliance (or a running one, `--link`, in a
//! space of its own), a team of agents on it (most on the client library, a third through
//! `cotald mcp` sessions) sending what a team sends (durable and live posts, DMs, mentions,
//! tasks to roles, replies in threads), and churn and
//! faults on a schedule drawn from the seed (`faults.rs`). Throughout, it judges what the
//! product reports against what it knows: every message owed delivered, nothing across a leave
//! or to a revoked identity, nothing read again by a resumed session (`ledger.rs`); `status`
//! degraded within 10 s of a stall of delivery and healthy while delivery progresses, the
//! growth of what the appliance and its broker hold (`watch.rs`). It exits non-zero on any loss,
//! false green, read-again, duplicates past one in a hundred, or unbounded growth; the broker's
//! memory is judged from its own heap profile (`heap.rs`).

mod agents;
mod faults;
mod heap;
mod ledger;
mod report;
mod team;
mod traffic;
mod watch;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

/// Options of `cotald soak`.
#[derive(Debug, Args)]
pub struct SoakArgs {
    /// How many agents (a third of them through `cotald mcp` sessions).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(3..=200))]
    agents: u32,
    /// How long traffic runs (`90s`, `10m`, `1h`); delivery is then given up to two minutes to
    /// settle before the verdict.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    duration: Duration,
    /// Messages per hour, all agents together (`30000/h`, or per minute: `500/m`).
    #[arg(long, default_value = "30000/h", value_parser = parse_rate)]
    rate: f64,
    /// The seed of the traffic and the fault schedule (printed when not given).
    #[arg(long)]
    seed: Option<u64>,
    /// Print the report as JSON on stdout (progress stays on stderr).
    #[arg(long)]
    json: bool,
    /// Keep the appliance's data dir here (it must not exist yet) instead of a temporary one.
    #[arg(long, value_name = "DIR", conflicts_with = "link")]
    keep: Option<PathBuf>,
    /// Soak the appliance already running from this data dir instead of starting one: the
    /// soak adds a space of its own there (`soak-<seed>`, left behind, its identities revoked
    /// at the end), and its faults hit that appliance's broker (kill -9, a stall) as they
    /// would a fresh one's; it does not restart the appliance nor shorten its certificate, so
    /// neither is judged.
    #[arg(long, value_name = "DATA_DIR")]
    link: Option<PathBuf>,
}

/// Runs the soak and prints its report; exit 0 only when nothing failed. `stop` (a signal)
/// ends it early, cleaned up as at its end.
pub async fn run(args: SoakArgs, stop: impl Future<Output = ()>) -> anyhow::Result<ExitCode> {
    let report = team::Soak::run(&args, stop).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(match report.passed() {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    })
}

/// `90s`, `10m`, `1h`, `2h30m` is not taken: one number and one unit.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let number: u64 = text[..digits]
        .parse()
        .map_err(|_| format!("{text:?}: a number and a unit, such as 90s, 10m or 1h"))?;
    let unit = match &text[digits..] {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        other => return Err(format!("{text:?}: unknown unit {other:?} (s, m or h)")),
    };
    match number * unit {
        0..30 => Err(format!("{text:?}: a soak runs at least 30s")),
        secs => Ok(Duration::from_secs(secs)),
    }
}

/// `30000/h` or `500/m`: messages per second.
fn parse_rate(text: &str) -> Result<f64, String> {
    let (count, per) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?}: a count per hour or minute, such as 30000/h"))?;
    let count: f64 = count
        .parse()
        .map_err(|_| format!("{text:?}: {count:?} is not a number"))?;
    let seconds = match per {
        "h" => 3600.0,
        "m" => 60.0,
        "s" => 1.0,
        other => return Err(format!("{text:?}: per {other:?}? use /h, /m or /s")),
    };
    match count / seconds {
        rate if rate > 0.0 && rate <= 500.0 => Ok(rate),
        _ => Err(format!("{text:?}: between 1/h and 500/s")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_rates_read_as_written_and_nonsense_is_refused_in_words() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("10").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("5s").unwrap_err().contains("at least"));
        assert!((parse_rate("30000/h").unwrap() - 30000.0 / 3600.0).abs() < 1e-9);
        assert!((parse_rate("600/m").unwrap() - 10.0).abs() < 1e-9);
        assert!(parse_rate("30000").is_err());
        assert!(parse_rate("0/h").is_err());
    }
}
