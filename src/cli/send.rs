//! `cotald send`: one message from the command line, on a channel, to a peer or to a role.
//!
//! Peers are named by their display name where an id would be needed (`--to`, `--mention`):
//! the roster (§6) resolves a name to one instance, preferring those online; a name nobody
//! online carries is looked up among the identities the local appliance minted.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::Args;

use super::endpoint::{Endpoint, EndpointArgs, concrete_channel, unknown_channel_refused};
use crate::client::{Client, ClientError, ResolveError};
use crate::ops::Receipt;
use crate::protocol::{Channel, CotalMessage, InstanceId, Routing};

/// How long a command waits for the roster before resolving a name.
const ROSTER_WAIT: Duration = Duration::from_secs(5);

/// Options of `cotald send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    #[command(flatten)]
    pub(super) endpoint: EndpointArgs,
    /// Multicast on this channel (concrete, within the credential's allowPublish) [default:
    /// the link's first channel]
    #[arg(long, group = "route")]
    channel: Option<String>,
    /// Unicast to this peer: a display name (from the roster or minted here) or an instance id.
    #[arg(long, group = "route", value_name = "NAME|ID")]
    to: Option<String>,
    /// Anycast to one holder of this role.
    #[arg(long, group = "route")]
    service: Option<String>,
    /// Mention a peer by name or id (repeatable).
    #[arg(long = "mention", value_name = "NAME|ID")]
    mentions: Vec<String>,
    /// Post to a --channel that has no config and no messages yet, creating it (without it
    /// such a post is refused as a likely typo, naming the closest channel).
    #[arg(long)]
    new: bool,
    /// Print one JSON object: id, sequence, delivered (in words) and receipt (the counts:
    /// tier, durable_members, durable_away, live_now, target, target_online, role_holders,
    /// role_online; a count the appliance could not establish is absent).
    #[arg(long)]
    json: bool,
    /// The text to send.
    text: String,
}

/// Where the message goes, as given (a peer still by name).
enum Route<'a> {
    Channel(Channel),
    To(&'a str),
    Service(&'a str),
}

impl<'a> Route<'a> {
    /// The route the flags name, else the link's first channel.
    fn of(args: &'a SendArgs, endpoint: &Endpoint) -> anyhow::Result<Self> {
        Ok(match (&args.channel, &args.to, &args.service) {
            (Some(c), _, _) => Route::Channel(concrete_channel("--channel", c)?),
            (None, Some(to), _) => Route::To(to),
            (None, None, Some(role)) => Route::Service(role),
            (None, None, None) => match endpoint.options.link.channels().first() {
                Some(c) => Route::Channel(concrete_channel("the link's channel", c)?),
                None => bail!(
                    "say where to send: --channel CH, --to NAME or --service ROLE (the link names \
                     no channel)"
                ),
            },
        })
    }
}

pub(super) async fn send(args: SendArgs) -> anyhow::Result<ExitCode> {
    if args.text.trim().is_empty() {
        bail!("nothing to send: the text is empty");
    }
    let endpoint = args.endpoint.resolve()?;
    let route = Route::of(&args, &endpoint)?;
    if let Route::Service(role) = route {
        refuse_unheld_role(&endpoint, role)?;
    }
    let needs_roster = !args.mentions.is_empty()
        || match route {
            Route::Channel(_) | Route::Service(_) => false,
            Route::To(to) => InstanceId::from_user_nkey(to).is_err(),
        };
    let mut opts = endpoint.options.clone();
    opts.receive_dms = false;
    opts.presence = needs_roster;
    opts.announce = false;
    opts.receive_backstop = false;
    let conn = Client::connect(opts).await?;
    let sent = post(&conn.client, &args, &endpoint, &route).await;
    conn.client.clone().close().await;
    let (message, seq, receipt) = sent?;
    report(args.json, &message, seq, &receipt)?;
    Ok(ExitCode::SUCCESS)
}

/// The warden discards tasks for a role no agent of the space holds (§8 TASK): where the
/// identities are known, such a task is refused before it is sent, not sent to be lost.
fn refuse_unheld_role(endpoint: &Endpoint, role: &str) -> anyhow::Result<()> {
    if endpoint.local.is_some()
        && !endpoint.minted().iter().any(|r| {
            r.profile == crate::ops::CredentialProfile::Agent && r.role.as_deref() == Some(role)
        })
    {
        bail!(
            "no agent of this space holds role {role}, so a task for it would be discarded; mint \
             one with `cotald mint NAME --role {role}` before sending tasks to it"
        );
    }
    Ok(())
}

/// Sends the text on `route`, the peer and the mentions resolved by name first; the message,
/// its stream sequence, and where it went.
async fn post(
    client: &Client,
    args: &SendArgs,
    endpoint: &Endpoint,
    route: &Route<'_>,
) -> anyhow::Result<(CotalMessage, u64, Result<Receipt, ClientError>)> {
    // Only a channel typed on the command line may be a typo (the link's is the appliance's own
    // default).
    if let Route::Channel(c) = route
        && args.channel.is_some()
        && !args.new
    {
        unknown_channel_refused(client, c, "pass --new to create it by posting").await?;
    }
    let routing = match route {
        Route::Channel(c) => Routing::channel(c),
        Route::To(to) => Routing::to(&resolve_peer(client, endpoint, "--to", to).await?.0),
        Route::Service(role) => Routing::to_service(role.to_string()),
    };
    let mut mentions = Vec::new();
    for m in &args.mentions {
        mentions.push(resolve_peer(client, endpoint, "--mention", m).await?.1);
    }
    let parts = vec![crate::protocol::Part::text(&args.text)];
    let (message, seq) = client.send(routing.clone(), parts, &mentions).await?;
    Ok((message, seq, client.receipt(&routing).await))
}

/// Says what was sent and where it went: one line, or one JSON object (`--json`).
fn report(
    json: bool,
    message: &CotalMessage,
    seq: u64,
    receipt: &Result<Receipt, ClientError>,
) -> anyhow::Result<()> {
    let delivered = match receipt {
        Ok(r) => r.words(),
        Err(e) => format!("where it went is unknown: {}", crate::ops::error_text(e)),
    };
    super::stdout(|out| match json {
        true => {
            let line = serde_json::json!({
                "id": message.id,
                "sequence": seq,
                "delivered": delivered,
                "receipt": receipt.as_ref().ok(),
            });
            writeln!(out, "{line}")
        }
        false => writeln!(
            out,
            "sent {} (stream sequence {seq}): {delivered}",
            message.id
        ),
    })
}

/// The instance `who` names: an id, a display name in the roster, or (for one not there) an
/// identity the local appliance minted. The roster is read to its end first.
async fn resolve_peer(
    client: &Client,
    endpoint: &Endpoint,
    flag: &str,
    who: &str,
) -> anyhow::Result<(InstanceId, String)> {
    if let Ok(id) = InstanceId::from_user_nkey(who) {
        let name = client
            .roster()
            .peer(id.as_str())
            .map(|p| p.presence.card.name)
            .or_else(|| {
                endpoint
                    .minted()
                    .into_iter()
                    .find(|r| r.id == who)
                    .map(|r| r.name)
            })
            .unwrap_or_else(|| who.to_owned());
        return Ok((id, name));
    }
    let _ = tokio::time::timeout(ROSTER_WAIT, client.roster().loaded()).await;
    match client.roster().resolve(who) {
        Ok(id) => Ok((id, who.to_owned())),
        Err(ResolveError::Unknown { known, .. }) => {
            let minted = endpoint.minted();
            if let Some(record) = minted.iter().find(|r| r.name == who) {
                return Ok((InstanceId::from_user_nkey(&record.id)?, who.to_owned()));
            }
            let mut names: Vec<String> = known.into_iter().collect();
            names.extend(minted.into_iter().map(|r| r.name));
            names.sort();
            names.dedup();
            bail!(
                "{flag} {who}: nobody named `{who}` is in space {} (neither in its roster nor \
                 minted here){}",
                client.space(),
                if names.is_empty() {
                    String::new()
                } else {
                    format!("; known names: {}", names.join(", "))
                }
            )
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("{flag} {who}"))),
    }
}
