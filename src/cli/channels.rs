//! `cotald channels`: the channels of a space with their effective config (§7); `cotald
//! channels set`, which writes one channel's registry value through the manager
//! (`channels-set`), and `cotald channels rm`, which removes it and, with `--purge`, the
//! channel's history (`channels-rm`). The manager grants both to admin identities; of those,
//! only the machine operator may publish the request (minted admins publish nothing,
//! Appendix B).

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

use super::endpoint::EndpointArgs;
use crate::client::{ChannelInfo, Client, ClientError};
use crate::ops::{ChannelRemoved, ChannelsRm, ChannelsSet, Request};
use crate::protocol::{
    ChannelConfig, ChannelDescription, ChannelInstructions, ChannelPattern, DeliveryClass,
    ReplayWindow,
};

/// Options of `cotald channels`.
#[derive(Debug, Args)]
pub struct ChannelsArgs {
    #[command(subcommand)]
    command: Option<ChannelsCommand>,
    #[command(flatten)]
    pub(super) endpoint: EndpointArgs,
    /// One JSON array of {"channel","class","replay","replayWindow","description",
    /// "instructions","configured","messages","lastActivity"}.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum ChannelsCommand {
    /// Write a channel's config (admin only): the flags given change the stored value, the
    /// others keep theirs.
    Set(SetArgs),
    /// Remove a channel's config (admin only); with --purge, delete every message posted on it
    /// too, so that it no longer shows anywhere. Durable memberships of it stay.
    Rm(RmArgs),
}

#[derive(Debug, Args)]
struct RmArgs {
    /// The concrete channel.
    channel: String,
    /// Delete its history too: every message stored on it, for every member. Cannot be undone.
    #[arg(long)]
    purge: bool,
}

/// The delivery class of a channel (§4, §7).
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Class {
    /// At most once, to whoever is connected and joined.
    Live,
    /// Live, plus an at-least-once backlog for durable members.
    Durable,
}

#[derive(Debug, Args)]
struct SetArgs {
    /// The concrete channel.
    channel: String,
    /// Replay history to those who join.
    #[arg(long, overrides_with = "no_replay")]
    replay: bool,
    /// Do not replay history on join.
    #[arg(long, overrides_with = "replay")]
    no_replay: bool,
    /// How far back a join replays (`90s`, `30m`, `24h`, `7d`).
    #[arg(long, value_name = "DURATION")]
    window: Option<String>,
    /// The delivery class.
    #[arg(long, value_enum)]
    class: Option<Class>,
    /// A one-line purpose (at most 200 characters).
    #[arg(long)]
    description: Option<String>,
    /// Advisory usage text for agents (at most 2000 characters).
    #[arg(long)]
    instructions: Option<String>,
}

pub(super) async fn run(args: ChannelsArgs) -> anyhow::Result<ExitCode> {
    let mut opts = args.endpoint.options()?;
    opts.receive_dms = false;
    opts.receive_backstop = false;
    opts.presence = false;
    let conn = Client::connect(opts).await?;
    let client = conn.client;
    let result = match &args.command {
        None => list(&client, args.json).await,
        Some(ChannelsCommand::Set(set)) => write(&client, set).await,
        Some(ChannelsCommand::Rm(rm)) => remove(&client, rm).await,
    };
    client.close().await;
    result.map(|()| ExitCode::SUCCESS)
}

async fn list(client: &Client, json: bool) -> anyhow::Result<()> {
    let channels = client
        .channels()
        .await
        .context("cannot read the channels")?;
    let rows: Vec<serde_json::Value> = channels.iter().map(row).collect();
    let counted = channels.iter().all(|c| c.messages.is_some());
    super::stdout(|out| {
        if json {
            return writeln!(out, "{}", serde_json::Value::from(rows));
        }
        if rows.is_empty() {
            return writeln!(
                out,
                "no channel in space {} is configured or used yet",
                client.space()
            );
        }
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => super::terminal::terminal_safe(s, false),
            serde_json::Value::Null => "-".to_owned(),
            other => other.to_string(),
        };
        let width = rows
            .iter()
            .map(|r| text(&r["channel"]).len())
            .max()
            .unwrap_or(7)
            .max(7);
        writeln!(
            out,
            "{:width$}  {:7}  {:6}  {:6}  {:8}  {:20}  DESCRIPTION",
            "CHANNEL", "CLASS", "REPLAY", "WINDOW", "MESSAGES", "LAST ACTIVITY"
        )?;
        for r in &rows {
            writeln!(
                out,
                "{:width$}  {:7}  {:6}  {:6}  {:8}  {:20}  {}",
                text(&r["channel"]),
                text(&r["class"]),
                text(&r["replay"]),
                text(&r["replayWindow"]),
                text(&r["messages"]),
                text(&r["lastActivity"]),
                text(&r["description"]),
            )?;
        }
        if !counted {
            writeln!(
                out,
                "(message counts need read access to the space's CHAT stream, which this \
                 credential lacks)"
            )?;
        }
        Ok(())
    })
}

fn row(c: &ChannelInfo) -> serde_json::Value {
    let config = c.config.as_ref();
    serde_json::json!({
        "channel": c.channel.as_str(),
        "class": c.effective.delivery_class,
        "replay": c.effective.replay,
        "replayWindow": c.effective.replay_window.as_ref().map(|w| w.as_str()),
        "description": config.and_then(|c| c.description.as_ref()).map(|d| d.as_str()),
        "instructions": config.and_then(|c| c.instructions.as_ref()).map(|i| i.as_str()),
        "configured": config.is_some(),
        "messages": c.messages,
        "lastActivity": c.last_activity.map(crate::provision::rfc3339),
    })
}

async fn write(client: &Client, set: &SetArgs) -> anyhow::Result<()> {
    let channel = ChannelPattern::from_policy(&set.channel)
        .and_then(|p| p.to_channel())
        .with_context(|| format!("invalid channel {:?}", set.channel))?;
    let mut config: ChannelConfig = client.channel_config(&channel).await?.unwrap_or_default();
    if set.replay {
        config.replay = Some(true);
    }
    if set.no_replay {
        config.replay = Some(false);
    }
    if let Some(window) = &set.window {
        config.replay_window = Some(
            ReplayWindow::parse(window).with_context(|| format!("invalid --window {window:?}"))?,
        );
    }
    if let Some(class) = set.class {
        config.delivery_class = Some(match class {
            Class::Live => DeliveryClass::Live,
            Class::Durable => DeliveryClass::Durable,
        });
    }
    if let Some(d) = &set.description {
        config.description =
            Some(ChannelDescription::new(d.clone()).context("invalid --description")?);
    }
    if let Some(i) = &set.instructions {
        config.instructions =
            Some(ChannelInstructions::new(i.clone()).context("invalid --instructions")?);
    }
    let stored: ChannelConfig = client
        .manager(&Request::ChannelsSet(ChannelsSet {
            space: None,
            channel: channel.as_str().to_owned(),
            config,
        }))
        .await
        .map_err(|e| match e {
            // A manager that refuses the op, or a broker that refuses the request (admins and
            // observers publish nothing): either way the caller is not the one who may.
            ClientError::Refused { .. } | ClientError::PublishRefused { .. } => {
                anyhow::Error::new(e).context(format!(
                    "cannot configure channel {channel}: only the machine operator may (run \
                     it on the appliance's machine, with no --as, --creds or context)"
                ))
            }
            other => {
                anyhow::Error::new(other).context(format!("cannot configure channel {channel}"))
            }
        })?;
    super::stdout(|out| {
        writeln!(
            out,
            "channel {channel} configured: {}",
            serde_json::to_string(&stored).unwrap_or_default()
        )
    })
}

async fn remove(client: &Client, rm: &RmArgs) -> anyhow::Result<()> {
    let channel = ChannelPattern::from_policy(&rm.channel)
        .and_then(|p| p.to_channel())
        .with_context(|| format!("invalid channel {:?}", rm.channel))?;
    super::endpoint::unknown_channel_refused(client, &channel, "nothing to remove").await?;
    let removed: ChannelRemoved = client
        .manager(&Request::ChannelsRm(ChannelsRm {
            space: None,
            channel: channel.as_str().to_owned(),
            purge: rm.purge,
        }))
        .await
        .map_err(|e| match e {
            ClientError::Refused { .. } | ClientError::PublishRefused { .. } => {
                anyhow::Error::new(e).context(format!(
                    "cannot remove channel {channel}: only the machine operator may (run it on \
                     the appliance's machine, with no --as, --creds or context)"
                ))
            }
            other => anyhow::Error::new(other).context(format!("cannot remove channel {channel}")),
        })?;
    let config = match removed.config_removed {
        true => "its config removed",
        false => "it had no config",
    };
    super::stdout(|out| match rm.purge {
        true => writeln!(
            out,
            "channel {channel}: {config}, {} stored messages deleted",
            removed.purged
        ),
        false => writeln!(
            out,
            "channel {channel}: {config}; its messages are kept (--purge deletes them)"
        ),
    })
}
