//! `cotald join` and `cotald leave`: a durable membership (§7) from the command line.
//!
//! `join` subscribes to the channel (the live half, broker-confirmed) and asks the manager for
//! durable membership from that moment (the join cursor); then it exits. Exiting is not
//! leaving: the backlog of a durable channel is kept for the member from the join cursor on,
//! and delivered at its next connection (`cotald tail`). `leave` is the only thing that ends a
//! durable membership, and it works after the credential's read ACL narrowed.

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use super::endpoint::EndpointArgs;
use crate::binding::{Creds, SpaceNames};
use crate::client::{Client, ConnectOptions, DurableState, JoinError, Replay};
use crate::mcp::Grants;

/// Options of `cotald join`.
#[derive(Debug, Args)]
pub struct JoinArgs {
    #[command(flatten)]
    pub(super) endpoint: EndpointArgs,
    /// The concrete channel (within the credential's read ACL).
    channel: String,
    /// Join a channel that has no config and no messages yet (without it, such a channel is
    /// refused as a likely typo, naming the closest channel).
    #[arg(long)]
    new: bool,
}

/// Options of `cotald leave`.
#[derive(Debug, Args)]
pub struct LeaveArgs {
    #[command(flatten)]
    pub(super) endpoint: EndpointArgs,
    /// The channel.
    channel: String,
}

pub(super) async fn join(args: JoinArgs) -> anyhow::Result<ExitCode> {
    let channel = super::endpoint::concrete_channel("channel", &args.channel)?;
    let mut opts = args.endpoint.options()?;
    opts.receive_dms = false;
    opts.receive_backstop = false;
    let readable = readable_channels(&opts);
    let conn = Client::connect(opts).await?;
    // A channel outside the read ACL is refused by the broker, in those words (below); one
    // inside it that the space knows nothing of is taken for a typo.
    if !args.new
        && may_read(&readable, &channel)
        && let Err(e) = super::endpoint::unknown_channel_refused(
            &conn.client,
            &channel,
            "pass --new to join it",
        )
        .await
    {
        conn.client.close().await;
        return Err(e);
    }
    let joined = conn.client.join(&args.channel, Replay::Off).await;
    conn.client.clone().close().await;
    let report = match joined {
        Err(e @ JoinError::Refused { .. }) => bail!(
            "cannot join {}: {e}; this credential may read {}",
            args.channel,
            if readable.is_empty() {
                "no channel".to_owned()
            } else {
                readable.join(", ")
            }
        ),
        joined => joined.with_context(|| format!("cannot join {}", args.channel))?,
    };
    println!("{}", report.summary());
    Ok(match report.durable {
        DurableState::Established | DurableState::NotApplicable => ExitCode::SUCCESS,
        DurableState::Unavailable(_) => ExitCode::FAILURE,
    })
}

pub(super) async fn leave(args: LeaveArgs) -> anyhow::Result<ExitCode> {
    super::endpoint::concrete_channel("channel", &args.channel)?;
    let mut opts = args.endpoint.options()?;
    opts.receive_dms = false;
    opts.receive_backstop = false;
    opts.presence = false;
    let conn = Client::connect(opts).await?;
    let left = conn.client.durable_leave(&args.channel).await;
    conn.client.clone().close().await;
    let membership = left.with_context(|| format!("cannot leave {}", args.channel))?;
    println!(
        "left durable {} (leave cursor {})",
        membership.channel,
        membership.leave_cursor.unwrap_or(membership.join_cursor)
    );
    Ok(ExitCode::SUCCESS)
}

/// The channels the credential of `opts` may read (its `allowSubscribe`, as its grants say);
/// empty when they cannot be read from it.
/// Whether the read ACL `readable` covers `channel`.
pub(super) fn may_read(readable: &[String], channel: &crate::protocol::Channel) -> bool {
    readable.iter().any(|r| {
        crate::protocol::ChannelPattern::from_policy(r)
            .is_ok_and(|p| crate::protocol::is_covered(&[p], channel))
    })
}

pub(super) fn readable_channels(opts: &ConnectOptions) -> Vec<String> {
    let names = SpaceNames::new(opts.link.space());
    Creds::parse(&opts.creds)
        .and_then(|c| c.claims())
        .map(|claims| Grants::of(&claims.permissions, &names, &claims.subject).read)
        .unwrap_or_default()
}
