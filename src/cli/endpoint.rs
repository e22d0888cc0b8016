//! `cotald send` and `cotald tail`: the client endpoint driven from the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use crate::client::deliver::Event;
use crate::client::{Client, ConnectOptions, Delivery, Notice, Replay};
use crate::protocol::{Channel, InstanceId, JoinLink, Routing};

/// How to reach a space as an endpoint.
#[derive(Debug, Args)]
pub struct EndpointArgs {
    /// The `.creds` file (from `cotald mint`).
    #[arg(long, value_name = "FILE")]
    creds: PathBuf,
    /// The join link, e.g. cotals://127.0.0.1:4222/main
    #[arg(long, value_name = "LINK")]
    link: String,
    /// The CA certificate to trust (the appliance's tls/ca.pem).
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
}

impl EndpointArgs {
    pub(super) fn options(&self) -> anyhow::Result<ConnectOptions> {
        let link =
            JoinLink::parse(&self.link).with_context(|| format!("invalid link {}", self.link))?;
        let creds = std::fs::read_to_string(&self.creds)
            .with_context(|| format!("cannot read {}", self.creds.display()))?;
        let mut opts = ConnectOptions::new(link, creds);
        opts.ca = self.ca.clone();
        Ok(opts)
    }
}

/// Options of `cotald send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    #[command(flatten)]
    endpoint: EndpointArgs,
    /// Multicast on this channel (concrete, within the credential's allowPublish).
    #[arg(long, group = "route", required_unless_present_any = ["to", "service"])]
    channel: Option<String>,
    /// Unicast to this instance id.
    #[arg(long, group = "route")]
    to: Option<String>,
    /// Anycast to one holder of this role.
    #[arg(long, group = "route")]
    service: Option<String>,
    /// Mention a peer by name (repeatable).
    #[arg(long = "mention", value_name = "NAME")]
    mentions: Vec<String>,
    /// The text to send.
    text: String,
}

pub(super) async fn send(args: SendArgs) -> anyhow::Result<ExitCode> {
    let routing = match (&args.channel, &args.to, &args.service) {
        (Some(c), None, None) => Routing::channel(&Channel::new(c).context("invalid --channel")?),
        (None, Some(t), None) => {
            Routing::to(&InstanceId::from_user_nkey(t).context("invalid --to")?)
        }
        (None, None, Some(s)) => Routing::to_service(s.clone()),
        _ => bail!("give exactly one of --channel, --to, --service"),
    };
    let mut opts = args.endpoint.options()?;
    opts.receive_dms = false;
    opts.presence = false;
    opts.receive_backstop = false;
    let conn = Client::connect(opts).await?;
    let sent = conn
        .client
        .send(
            routing,
            vec![crate::protocol::Part::text(&args.text)],
            &args.mentions,
        )
        .await;
    conn.client.clone().close().await;
    let (message, seq) = sent?;
    println!("sent {} (stream sequence {seq})", message.id);
    Ok(ExitCode::SUCCESS)
}

/// Options of `cotald tail`.
#[derive(Debug, Args)]
pub struct TailArgs {
    #[command(flatten)]
    endpoint: EndpointArgs,
    /// Join this channel or pattern (repeatable; default: the link's channels).
    #[arg(long = "channel", value_name = "CH")]
    channels: Vec<String>,
    /// Also receive DMs (binds dm_<id>).
    #[arg(long)]
    dm: bool,
    /// Also receive anycast for this role (binds svc_<role>).
    #[arg(long, value_name = "ROLE")]
    service: Option<String>,
    /// Do not replay channel history on join.
    #[arg(long)]
    no_history: bool,
    /// Exit after this many messages.
    #[arg(long, value_name = "N")]
    count: Option<usize>,
    /// One JSON object per message: id, kind, historical, durable, channel, from, parts, ts.
    #[arg(long)]
    json: bool,
}

pub(super) async fn tail(args: TailArgs) -> anyhow::Result<ExitCode> {
    let mut opts = args.endpoint.options()?;
    opts.receive_dms = args.dm;
    opts.role = args.service.clone();
    let channels = if args.channels.is_empty() {
        opts.link.channels().to_vec()
    } else {
        args.channels.clone()
    };
    let conn = Client::connect(opts).await?;
    let (client, mut deliveries) = (conn.client, conn.deliveries);
    let replay = if args.no_history {
        Replay::Off
    } else {
        Replay::AsConfigured
    };
    // Joins surface history as they go: they run beside the loop that drains it.
    let joiner = client.clone();
    let mut joins = tokio::spawn(async move {
        for channel in &channels {
            let report = joiner.join(channel, replay).await?;
            eprintln!("{}", report.summary());
        }
        Ok::<(), crate::client::JoinError>(())
    });
    let mut joining = true;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut printed = 0;
    let result: anyhow::Result<()> = loop {
        if args.count.is_some_and(|n| printed >= n) {
            break Ok(());
        }
        tokio::select! {
            joined = &mut joins, if joining => {
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
                }
                Some(Event::Notice(Notice::Rejected(a))) => {
                    eprintln!("rejected {} ({}): {}", a.subject, a.reason.as_str(), a.detail);
                }
                Some(Event::Notice(Notice::ChannelDropped { channel })) => {
                    eprintln!("the broker refused {channel}; dropped");
                }
                Some(Event::Notice(Notice::ConsumerLost { durable, reason })) => {
                    eprintln!("{durable}: {reason}; rebinding");
                }
                None => break Ok(()),
            },
            _ = &mut interrupted => break Ok(()),
        }
    };
    joins.abort();
    client.close().await;
    result.map(|()| ExitCode::SUCCESS)
}

/// Writes one delivery to stdout; a closed pipe (`tail | head`) is an error, not a panic.
fn print(d: &Delivery, json: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if json {
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
        writeln!(out, "{doc}")?;
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
        let place = d
            .channel
            .as_deref()
            .map(|c| format!("#{c}"))
            .unwrap_or_else(|| d.kind.as_str().to_owned());
        let history = if d.historical { " (history)" } else { "" };
        println!(
            "{place} {}{history}: {}",
            d.message.from.name,
            text.join(" ")
        );
    }
    Ok(())
}
