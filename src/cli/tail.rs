//! `cotald tail`: what reaches an endpoint, printed as it arrives: the channels it joins (with
//! their history), its DMs, anycast for a role. Each delivery is acknowledged once printed
//! (§8), a change of the connection is said on stderr, and what came from the wire is made safe
//! for a terminal first ([`super::terminal`]).

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use tokio::task::JoinHandle;

use super::endpoint::{EndpointArgs, unknown_channel_refused};
use super::terminal::terminal_safe;
use crate::client::deliver::Event;
use crate::client::{
    Client, ConnectOptions, ConnectionState, Deliveries, Delivery, JoinError, Notice, Replay,
};
use crate::protocol::{Channel, ChannelPattern};

/// Options of `cotald tail`.
#[derive(Debug, Args)]
pub struct TailArgs {
    #[command(flatten)]
    pub(super) endpoint: EndpointArgs,
    /// Join this channel or pattern (repeatable) [default: the link's channels]
    #[arg(long = "channel", value_name = "CH")]
    channels: Vec<String>,
    /// Also receive DMs (binds dm_<id>).
    #[arg(long)]
    dm: bool,
    /// Also receive anycast for this role (binds svc_<role>).
    #[arg(long, value_name = "ROLE")]
    service: Option<String>,
    /// Do not replay channel history on join.
    #[arg(long, conflicts_with = "resume")]
    no_history: bool,
    /// Pick up where this identity left off, as an agent's next session does: on a durable
    /// channel it is a member of, its backlog only (not the history again); on a live channel,
    /// the history after what an earlier `--resume` (or agent session) had read, which the
    /// appliance keeps: recorded once the joins are done and nothing more arrived for a
    /// second (what `--count` leaves unprinted is not marked read).
    #[arg(long)]
    resume: bool,
    /// Exit after this many messages.
    #[arg(long, value_name = "N")]
    count: Option<usize>,
    /// One JSON object per message: id, kind, historical, durable, channel, from, parts, ts.
    #[arg(long)]
    json: bool,
    /// Join a --channel that has no config and no messages yet (without it, such a channel is
    /// refused as a likely typo, naming the closest channel: on a durable channel, joining
    /// makes a membership).
    #[arg(long)]
    new: bool,
}

pub(super) async fn tail(args: TailArgs) -> anyhow::Result<ExitCode> {
    let mut opts = args.endpoint.options()?;
    opts.receive_dms = args.dm;
    opts.role = args.service.clone();
    let channels = channels(&args, &opts)?;
    let readable = super::membership::readable_channels(&opts);
    let conn = Client::connect(opts).await?;
    let (client, mut deliveries) = (conn.client, conn.deliveries);
    if !args.new
        && let Err(e) = refuse_typos(&client, &args.channels, &readable).await
    {
        client.close().await;
        return Err(e);
    }
    let replay = match (args.no_history, args.resume) {
        (true, _) => Replay::Off,
        (false, true) => Replay::Resume,
        (false, false) => Replay::AsConfigured,
    };
    // Joins surface history as they go: they run beside the loop that drains it.
    let joiner = client.clone();
    let mut joins = tokio::spawn(async move {
        for channel in &channels {
            let report = joiner.join(channel, replay).await?;
            eprintln!("{}", report.summary());
        }
        Ok::<(), JoinError>(())
    });
    let result = print_deliveries(&client, &mut deliveries, &mut joins, &args).await;
    joins.abort();
    client.close().await;
    result.map(|()| ExitCode::SUCCESS)
}

/// The channels to join: those given (each a valid pattern), else the link's; refused when
/// there is nothing to tail at all.
fn channels(args: &TailArgs, opts: &ConnectOptions) -> anyhow::Result<Vec<String>> {
    let channels: Vec<String> = if args.channels.is_empty() {
        opts.link.channels().to_vec()
    } else {
        for c in &args.channels {
            ChannelPattern::from_policy(c).with_context(|| format!("invalid --channel {c:?}"))?;
        }
        args.channels.clone()
    };
    if channels.is_empty() && !args.dm && args.service.is_none() {
        bail!(
            "nothing to tail: the link names no channel; give --channel CH (repeatable), --dm \
             or --service ROLE"
        );
    }
    Ok(channels)
}

/// Refuses a channel the space knows nothing of among those `typed`: only a concrete channel
/// typed on the command line, that the credential may read (`readable`), may be a typo (one it
/// may not read is refused by the broker, in those words).
async fn refuse_typos(
    client: &Client,
    typed: &[String],
    readable: &[String],
) -> anyhow::Result<()> {
    let typed = typed.iter().filter_map(|c| Channel::new(c).ok());
    for c in typed.filter(|c| super::membership::may_read(readable, c)) {
        unknown_channel_refused(client, &c, "pass --new to join it").await?;
    }
    Ok(())
}

/// Prints the deliveries as they come, until `--count` of them, the end of the deliveries, a
/// closed connection, a failed join or an interrupt: each acknowledged once printed (§8), a
/// notice or a change of the connection said on stderr, and with `--resume` what was printed
/// marked read once the stream is quiet.
async fn print_deliveries(
    client: &Client,
    deliveries: &mut Deliveries,
    joins: &mut JoinHandle<Result<(), JoinError>>,
    args: &TailArgs,
) -> anyhow::Result<()> {
    let mut joining = true;
    // Connection changes are surfaced, never silent: a reader must know when it may miss
    // live messages.
    let mut state = client.state();
    let mut lost_at: Option<std::time::Instant> = None;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut printed = 0;
    // With --resume, what was printed is marked read once the stream is quiet.
    let quiet = tokio::time::sleep(MARK_EVERY);
    tokio::pin!(quiet);
    let mut unmarked = false;
    loop {
        if args.count.is_some_and(|n| printed >= n) {
            break Ok(());
        }
        tokio::select! {
            joined = &mut *joins, if joining => {
                joining = false;
                match joined {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => break Err(e.into()),
                    Err(e) => break Err(anyhow::anyhow!("join task failed: {e}")),
                }
            }
            next = deliveries.next_event() => match next {
                Some(Event::Message(delivery)) => {
                    if let Err(e) = print(&delivery, args.json) {
                        break Err(e);
                    }
                    // Acked only once printed (§8).
                    if let Err(e) = delivery.ack().await {
                        break Err(e.into());
                    }
                    printed += 1;
                    unmarked = args.resume;
                    quiet.as_mut().reset(tokio::time::Instant::now() + MARK_EVERY);
                }
                Some(Event::Notice(notice)) => eprintln!("{}", notice_line(notice)),
                None => break Ok(()),
            },
            changed = state.changed() => {
                if changed.is_err() {
                    break Ok(());
                }
                let now = *state.borrow_and_update();
                if let Err(e) = connection_changed(now, &mut lost_at) {
                    break Err(e);
                }
            }
            () = &mut quiet, if unmarked && !joining => {
                unmarked = false;
                mark_read(client).await;
            }
            _ = &mut interrupted => break Ok(()),
        }
    }
}

/// How long `tail --resume` waits after the last message before it records what it printed.
const MARK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Records that everything printed was read (`tail --resume`); a failure only means the next
/// `--resume` replays more.
async fn mark_read(client: &Client) {
    if let Err(e) = client.mark_read().await {
        tracing::debug!(error = %e, "replay mark not recorded");
    }
}

/// What `tail` says of a notice, on stderr.
fn notice_line(notice: Notice) -> String {
    match notice {
        Notice::Rejected(a) => format!(
            "rejected {} ({}): {}",
            a.subject,
            a.reason.as_str(),
            a.detail
        ),
        Notice::ChannelDropped { channel } => format!("the broker refused {channel}; dropped"),
        Notice::ConsumerLost { durable, reason } => format!("{durable}: {reason}; rebinding"),
        Notice::Gap { channel, .. } => format!(
            "#{channel}: the connection dropped and its history may not be read: live messages \
             of that moment may be missed"
        ),
    }
}

/// Says on stderr that the connection was lost or is back (a reader must know when it may
/// miss live messages); a closed connection ends `tail`.
fn connection_changed(
    now: ConnectionState,
    lost_at: &mut Option<std::time::Instant>,
) -> anyhow::Result<()> {
    match now {
        ConnectionState::Reconnecting => {
            if lost_at.is_none() {
                *lost_at = Some(std::time::Instant::now());
                eprintln!("connection to the appliance lost; reconnecting");
            }
        }
        ConnectionState::Connected => {
            if let Some(at) = lost_at.take() {
                eprintln!("reconnected after {:.1} s", at.elapsed().as_secs_f64());
            }
        }
        ConnectionState::Disconnected => {
            bail!("the connection to the appliance is closed");
        }
    }
    Ok(())
}

/// Writes one delivery to stdout; a closed pipe (`tail | head`) is an error, not a panic.
/// Without `--json`, whatever came from the wire passes [`terminal_safe`] first.
fn print(d: &Delivery, json: bool) -> anyhow::Result<()> {
    let line = if json {
        let parts = serde_json::to_value(&d.message.parts)?;
        let from = serde_json::to_value(&d.message.from)?;
        let doc = serde_json::json!({
            "id": d.message.id,
            "kind": d.kind.as_str(),
            "historical": d.historical,
            "durable": d.durable,
            "channel": d.channel,
            "from": from,
            "parts": parts,
            "ts": serde_json::to_value(&d.message.ts)?,
        });
        doc.to_string()
    } else {
        let text: Vec<String> = d
            .message
            .parts
            .iter()
            .map(|p| match serde_json::to_value(p) {
                Ok(v) => v
                    .get("text")
                    .and_then(|t| t.as_str())
                    .map_or_else(|| v.to_string(), str::to_owned),
                Err(_) => String::new(),
            })
            .collect();
        let place = d.channel.as_deref().map_or_else(
            || d.kind.as_str().to_owned(),
            |c| format!("#{}", terminal_safe(c, false)),
        );
        let history = if d.historical { " (history)" } else { "" };
        format!(
            "{place} {}{history}: {}",
            terminal_safe(&d.message.from.name, false),
            terminal_safe(&text.join(" "), true)
        )
    };
    super::stdout(|out| writeln!(out, "{line}"))
}
