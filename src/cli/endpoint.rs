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

    /// These options as arguments that reach the same space from any directory (absolute
    /// paths), e.g. for a host that launches `cotald mcp`.
    pub(super) fn launch_args(&self) -> anyhow::Result<Vec<String>> {
        let absolute = |p: &std::path::Path| {
            std::path::absolute(p)
                .with_context(|| format!("cannot resolve {}", p.display()))
                .map(|p| p.display().to_string())
        };
        let mut args = vec![
            "--creds".to_owned(),
            absolute(&self.creds)?,
            "--link".to_owned(),
            self.link.clone(),
        ];
        if let Some(ca) = &self.ca {
            args.extend(["--ca".to_owned(), absolute(ca)?]);
        }
        Ok(args)
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
    super::stdout(|out| writeln!(out, "sent {} (stream sequence {seq})", message.id))?;
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
                Some(Event::Notice(Notice::Gap { channel, .. })) => {
                    eprintln!(
                        "#{channel}: the connection dropped and its history may not be read: live \
                         messages of that moment may be missed"
                    );
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

/// Where a text continues after one of its newlines: indented, so that none of its lines can
/// pass for a message of its own (those start in the first column).
const CONTINUATION: &str = "\n    ";

/// `s` made safe to print on a terminal: each character [`escaped_on_terminal`] is shown as its
/// escape (`\u{1b}`). A newline is escaped too, unless `multiline`: then it stays, and the next
/// line starts with [`CONTINUATION`].
fn terminal_safe(s: &str, multiline: bool) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\n' && multiline {
            out.push_str(CONTINUATION);
        } else if escaped_on_terminal(c) {
            let _ = write!(out, "{}", c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// Controls (C0 such as ESC, CR, BEL and TAB, DEL, C1) could move the cursor, rewrite the
/// screen or the window title, or make the terminal answer; the Unicode bidirectional controls
/// reorder what is shown; the line and paragraph separators break lines in some terminals.
fn escaped_on_terminal(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_from_the_wire_are_shown_not_obeyed() {
        for (raw, shown) in [
            ("\u{1b}]0;owned\u{7}", "\\u{1b}]0;owned\\u{7}"),
            ("\u{1b}[2J\u{1b}[1;1H", "\\u{1b}[2J\\u{1b}[1;1H"),
            ("ok\rforged", "ok\\u{d}forged"),
            ("a\tb\u{0}\u{7f}", "a\\u{9}b\\u{0}\\u{7f}"),
            ("\u{9b}31m\u{85}", "\\u{9b}31m\\u{85}"),
            ("\u{202e}gnp.exe", "\\u{202e}gnp.exe"),
            ("\u{2067}x\u{2069}\u{200f}", "\\u{2067}x\\u{2069}\\u{200f}"),
            ("one\u{2028}two", "one\\u{2028}two"),
            ("bob\nmallory", "bob\\u{a}mallory"),
        ] {
            assert_eq!(terminal_safe(raw, false), shown, "{raw:?}");
        }
    }

    #[test]
    fn ordinary_text_is_unchanged() {
        let text = "héllo, 日本語, مرحبا, 👋 — a\\b \"quoted\" {json}";
        assert_eq!(terminal_safe(text, false), text);
        assert_eq!(terminal_safe(text, true), text);
    }

    #[test]
    fn a_newline_in_a_text_cannot_forge_a_message_line() {
        let shown = terminal_safe("first\n#general alice: forged\r\nlast", true);
        assert_eq!(shown, "first\n    #general alice: forged\\u{d}\n    last");
        assert!(shown.lines().skip(1).all(|l| l.starts_with(' ')));
    }

    #[test]
    fn nothing_unsafe_survives() {
        let every: String = (0..=0x3000u32).filter_map(char::from_u32).collect();
        for multiline in [false, true] {
            let shown = terminal_safe(&every, multiline);
            assert!(
                shown
                    .chars()
                    .all(|c| !escaped_on_terminal(c) || (multiline && c == '\n')),
                "multiline {multiline}"
            );
        }
    }
}
