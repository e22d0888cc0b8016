//! `cotald send` and `cotald tail`: the client endpoint driven from the command line, and
//! [`EndpointArgs`], how every endpoint command finds the space it talks to.
//!
//! With no connection flag, a command on the machine running the appliance acts as the
//! machine operator of space `main`: its credential, the CA and the listen address are in the
//! data dir (`spaces/<space>/local-operator.creds`, `tls/ca.pem`, `run/state.json`). `--space`
//! picks another local space; `--as NAME` acts as an identity minted on this appliance. For a
//! remote appliance, a saved context (`cotald context`) or `COTALD_LINK`, `COTALD_CREDS`,
//! `COTALD_CA` say where and as whom. Each setting is taken from the first that gives it:
//! flag or environment variable, then the context, then the local data dir; `--space` and
//! `--as` select the local data dir, so no context applies with them.
//!
//! Peers are named by their display name where an id would be needed (`--to`, `--mention`):
//! the roster (§6) resolves a name to one instance, preferring those online; a name nobody
//! online carries is looked up among the identities the local appliance minted.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use super::DataDirArg;
use crate::client::deliver::Event;
use crate::client::{
    Client, ConnectOptions, ConnectionState, Delivery, Notice, Replay, ResolveError,
};
use crate::datadir::DataDir;
use crate::ops::IdentityRecord;
use crate::protocol::{Channel, ChannelPattern, InstanceId, JoinLink, Routing};

/// The channel the machine operator's local link names: the one every agent joins by default.
const OPERATOR_CHANNEL: &str = crate::space::identity::DEFAULT_SUBSCRIBE;

/// How long a command waits for the roster before resolving a name.
const ROSTER_WAIT: Duration = Duration::from_secs(5);

/// How to reach a space as an endpoint. Every endpoint command flattens it.
#[derive(Debug, Clone, Args)]
pub(super) struct EndpointArgs {
    /// The join link, e.g. cotals://host:4222/main?channel=general [default: the context's,
    /// else the local appliance's]
    #[arg(long, env = "COTALD_LINK", value_name = "LINK", global = true)]
    link: Option<String>,
    /// The `.creds` file (from `cotald mint`) [default: the context's, else the local machine
    /// operator's, or that of --as]
    #[arg(long, env = "COTALD_CREDS", value_name = "FILE", global = true)]
    creds: Option<PathBuf>,
    /// The CA certificate to trust (the appliance's tls/ca.pem) [default: the context's, else
    /// the local data dir's]
    #[arg(long, env = "COTALD_CA", value_name = "FILE", global = true)]
    ca: Option<PathBuf>,
    /// Use this saved context (`cotald context ls`) [default: the current one]
    #[arg(long, env = "COTALD_CONTEXT", value_name = "NAME", global = true)]
    context: Option<String>,
    /// The local space to act in [default: the link's space, else main]
    #[arg(long, value_name = "SPACE", global = true)]
    space: Option<String>,
    /// Act as this identity minted on the local appliance (`cotald identities`), found by
    /// name.
    #[arg(long = "as", value_name = "NAME", global = true)]
    as_name: Option<String>,
    #[command(flatten)]
    data_dir: DataDirArg,
}

impl EndpointArgs {
    /// Takes the connection options given before the command for those not given after it.
    pub(super) fn inherit(&mut self, before: &super::Before<'_>) {
        let leading = before.leading;
        before.fill(&mut self.link, "link", &leading.link);
        before.fill(&mut self.creds, "creds", &leading.creds);
        before.fill(&mut self.ca, "ca", &leading.ca);
        before.fill(&mut self.context, "context", &leading.context);
        before.fill(&mut self.space, "space", &leading.space);
        before.fill(&mut self.as_name, "as_name", &leading.as_name);
        self.data_dir.inherit(before);
    }
}

/// What [`EndpointArgs`] resolved to.
#[derive(Debug)]
pub(super) struct Endpoint {
    /// How to connect.
    pub options: ConnectOptions,
    /// The local data dir, when it holds the space of the link: its minted identities resolve
    /// names of peers that are not online.
    pub local: Option<DataDir>,
}

impl Endpoint {
    /// The identities known by name on this machine, (id, name): what the local appliance
    /// minted for the link's space and its machine operator (none when remote).
    pub(super) fn directory(&self) -> Vec<(String, String)> {
        let mut known: Vec<(String, String)> =
            self.minted().into_iter().map(|r| (r.id, r.name)).collect();
        let operator = self.local.as_ref().and_then(|dir| {
            let text =
                std::fs::read_to_string(dir.operator_creds(self.options.link.space())).ok()?;
            crate::binding::Creds::parse(&text).ok()?.public_key().ok()
        });
        known.extend(operator.map(|id| (id, crate::ops::OPERATOR.to_owned())));
        known
    }

    /// The identities the local appliance minted for the link's space (none when remote).
    fn minted(&self) -> Vec<IdentityRecord> {
        self.local
            .as_ref()
            .map(|dir| {
                crate::space::store::identities(dir, self.options.link.space())
                    .into_iter()
                    .filter(|r| r.revoked_at.is_none())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl EndpointArgs {
    /// The connect options: see the module doc for where each setting comes from.
    pub(super) fn options(&self) -> anyhow::Result<ConnectOptions> {
        Ok(self.resolve()?.options)
    }

    /// These options as arguments that reach the same space from any directory (absolute
    /// paths, the data dir named), e.g. for a host that launches `cotald mcp`.
    pub(super) fn launch_args(&self) -> anyhow::Result<Vec<String>> {
        let absolute = |p: &Path| {
            std::path::absolute(p)
                .with_context(|| format!("cannot resolve {}", p.display()))
                .map(|p| p.display().to_string())
        };
        let mut args = Vec::new();
        let mut flag = |name: &str, value: String| args.extend([name.to_owned(), value]);
        if let Some(link) = &self.link {
            flag("--link", link.clone());
        }
        if let Some(creds) = &self.creds {
            flag("--creds", absolute(creds)?);
        }
        if let Some(ca) = &self.ca {
            flag("--ca", absolute(ca)?);
        }
        if let Some(context) = &self.context {
            flag("--context", context.clone());
        }
        if let Some(space) = &self.space {
            flag("--space", space.clone());
        }
        if let Some(name) = &self.as_name {
            flag("--as", name.clone());
        }
        flag("--data-dir", absolute(self.data_dir.resolve()?.root())?);
        Ok(args)
    }

    /// The connect options and what else is known about the space (see [`Endpoint`]).
    pub(super) fn resolve(&self) -> anyhow::Result<Endpoint> {
        let local_selected = self.space.is_some() || self.as_name.is_some();
        let context = if local_selected {
            None
        } else {
            super::context::selected(self.context.as_deref())?
        };
        let saved = context.as_ref().map(|(_, c)| c);
        let link_text = self.link.clone().or_else(|| saved.map(|c| c.link.clone()));
        let link = match &link_text {
            Some(text) => {
                Some(JoinLink::parse(text).with_context(|| format!("invalid link {text}"))?)
            }
            None => None,
        };
        let creds_path = self
            .creds
            .clone()
            .or_else(|| saved.map(|c| c.creds.clone()));
        let dir = self.data_dir.resolve()?;
        let space = self
            .space
            .clone()
            .or_else(|| link.as_ref().map(|l| l.space().to_owned()))
            .unwrap_or_else(|| super::DEFAULT_SPACE.to_owned());
        // The local appliance fills in what flags, environment and context left open.
        let identity = match (&self.as_name, &creds_path) {
            (Some(name), None) => Some(local_identity(&dir, &space, name)?),
            _ => None,
        };
        let link = match link {
            Some(link) => link,
            None => {
                let channels = match &identity {
                    Some(record) => record.subscribe.clone(),
                    None => vec![OPERATOR_CHANNEL.to_owned()],
                };
                local_link(&dir, &space, &channels)?
            }
        };
        let creds_path = match (creds_path, &identity) {
            (Some(path), _) => path,
            (None, Some(record)) => identity_creds(&dir, record)?,
            (None, None) => operator_creds(&dir, &space)?,
        };
        let creds = std::fs::read_to_string(&creds_path)
            .with_context(|| format!("cannot read the credential {}", creds_path.display()))?;
        let ca = match self.ca.clone().or_else(|| saved.and_then(|c| c.ca.clone())) {
            Some(ca) => Some(ca),
            None => Some(dir.ca_cert()).filter(|ca| ca.exists()),
        };
        if let Some(ca) = &ca {
            check_ca(ca)?;
        }
        let mut options = ConnectOptions::new(link, creds);
        options.ca = ca;
        let local = Some(dir).filter(|d| d.space(options.link.space()).is_dir());
        Ok(Endpoint { options, local })
    }
}

/// The minted identity `name` of `space` in the local data dir.
fn local_identity(dir: &DataDir, space: &str, name: &str) -> anyhow::Result<IdentityRecord> {
    let minted: Vec<IdentityRecord> = crate::space::store::identities(dir, space)
        .into_iter()
        .filter(|r| r.revoked_at.is_none())
        .collect();
    if let Some(record) = minted.iter().find(|r| r.name == name) {
        return Ok(record.clone());
    }
    let names: Vec<&str> = minted.iter().map(|r| r.name.as_str()).collect();
    bail!(
        "--as {name}: no identity named `{name}` was minted in space {space} on data dir {} \
         ({}); mint one with `cotald mint {name} --space {space}`",
        dir.root().display(),
        if names.is_empty() {
            "none is".to_owned()
        } else {
            format!("minted: {}", names.join(", "))
        }
    )
}

/// Where `cotald mint` wrote the credential of `record` by default.
pub(super) fn default_creds_path(dir: &DataDir, record: &IdentityRecord) -> PathBuf {
    dir.creds(&record.space)
        .join(format!("{}-{}.creds", record.name, &record.id[..8]))
}

fn identity_creds(dir: &DataDir, record: &IdentityRecord) -> anyhow::Result<PathBuf> {
    let path = default_creds_path(dir, record);
    if !path.exists() {
        bail!(
            "--as {}: its credential is not at {} (was it minted with --out?); pass \
             --creds FILE",
            record.name,
            path.display()
        );
    }
    Ok(path)
}

fn operator_creds(dir: &DataDir, space: &str) -> anyhow::Result<PathBuf> {
    let path = dir.operator_creds(space);
    if path.exists() {
        return Ok(path);
    }
    if !dir.spaces().is_dir() {
        bail!(
            "no appliance was ever started on data dir {}, and nothing says where to connect: \
             start one with `cotald up`, or give --link, --creds and --ca (or save a context \
             with `cotald context add`)",
            dir.root().display()
        );
    }
    bail!(
        "space `{space}` does not exist on data dir {} (spaces: {}); add it with `cotald space \
         add {space}`",
        dir.root().display(),
        local_spaces(dir).join(", ")
    )
}

fn local_spaces(dir: &DataDir) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir.spaces())
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.path()
                .join(format!("{}.creds", crate::ops::OPERATOR))
                .exists()
        })
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect();
    out.sort();
    out
}

/// The link of `space` on the appliance running on `dir`, naming `channels`.
fn local_link(dir: &DataDir, space: &str, channels: &[String]) -> anyhow::Result<JoinLink> {
    let Some(state) = super::started_state(dir)? else {
        bail!(
            "no cotald is running on data dir {}: start it with `cotald up`, or say where to \
             connect (--link and --creds, COTALD_LINK and COTALD_CREDS, or a context: `cotald \
             context add`)",
            dir.root().display()
        );
    };
    if !state.spaces.iter().any(|s| s == space) {
        bail!(
            "space `{space}` is not served by the appliance on {} (served: {})",
            dir.root().display(),
            state.spaces.join(", ")
        );
    }
    let mut addr = state.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok(crate::daemon::join_link(
        &addr.to_string(),
        space,
        channels,
    )?)
}

/// Refuses a `--ca` that is not a PEM certificate, naming what it looks like instead.
pub(super) fn check_ca(path: &Path) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(path).with_context(|| format!("cannot read --ca {}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    if text.contains("-----BEGIN CERTIFICATE-----") {
        return Ok(());
    }
    let looks_like = if text.contains("BEGIN NATS USER JWT") {
        " (it is a .creds file)"
    } else if text.contains("PRIVATE KEY") {
        " (it is a private key)"
    } else {
        ""
    };
    bail!(
        "--ca {} is not a PEM certificate{looks_like}; pass the appliance's CA certificate, \
         <data-dir>/tls/ca.pem",
        path.display()
    )
}

/// A concrete channel given on the command line: validated like `cotald mint` validates
/// channels, refused rather than rewritten.
pub(super) fn concrete_channel(flag: &str, raw: &str) -> anyhow::Result<Channel> {
    ChannelPattern::from_policy(raw)
        .and_then(|p| p.to_channel())
        .with_context(|| format!("invalid {flag} {raw:?}"))
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

pub(super) async fn send(args: SendArgs) -> anyhow::Result<ExitCode> {
    if args.text.trim().is_empty() {
        bail!("nothing to send: the text is empty");
    }
    let endpoint = args.endpoint.resolve()?;
    /// Where the message goes, as given (a peer still by name).
    enum Route<'a> {
        Channel(Channel),
        To(&'a str),
        Service(&'a str),
    }
    let route = match (&args.channel, &args.to, &args.service) {
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
    };
    // The warden discards tasks for a role no agent of the space holds (§8 TASK): where the
    // identities are known, such a task is refused before it is sent, not sent to be lost.
    if let Route::Service(role) = route
        && endpoint.local.is_some()
        && !endpoint.minted().iter().any(|r| {
            r.profile == crate::ops::CredentialProfile::Agent && r.role.as_deref() == Some(role)
        })
    {
        bail!(
            "no agent of this space holds role {role}, so a task for it would be discarded; mint \
             one with `cotald mint NAME --role {role}` before sending tasks to it"
        );
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
    let sent = async {
        // Only a channel typed on the command line may be a typo (the link's is the
        // appliance's own default).
        if let Route::Channel(c) = &route
            && args.channel.is_some()
            && !args.new
        {
            unknown_channel_refused(&conn.client, c, "pass --new to create it by posting").await?;
        }
        let routing = match &route {
            Route::Channel(c) => Routing::channel(c),
            Route::To(to) => {
                Routing::to(&resolve_peer(&conn.client, &endpoint, "--to", to).await?.0)
            }
            Route::Service(role) => Routing::to_service(role.to_string()),
        };
        let mut mentions = Vec::new();
        for m in &args.mentions {
            mentions.push(
                resolve_peer(&conn.client, &endpoint, "--mention", m)
                    .await?
                    .1,
            );
        }
        let parts = vec![crate::protocol::Part::text(&args.text)];
        let (message, seq) = conn.client.send(routing.clone(), parts, &mentions).await?;
        Ok::<_, anyhow::Error>((message, seq, conn.client.receipt(&routing).await))
    }
    .await;
    conn.client.clone().close().await;
    let (message, seq, receipt) = sent?;
    let delivered = match &receipt {
        Ok(r) => r.words(),
        Err(e) => format!("where it went is unknown: {}", crate::ops::error_text(e)),
    };
    super::stdout(|out| match args.json {
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
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Refuses `channel` when the space knows nothing of it (no config, no message), naming the
/// closest it knows: naming it would otherwise create it by a typo (`what` says what the
/// refusal spares the caller, or how to create it).
pub(super) async fn unknown_channel_refused(
    client: &Client,
    channel: &Channel,
    what: &str,
) -> anyhow::Result<()> {
    match client.known_channel(channel).await {
        Err(e @ crate::client::ClientError::UnknownChannel { .. }) => bail!(
            "{}; {what} (`cotald channels` lists the channels)",
            crate::ops::error_text(&e)
        ),
        _ => Ok(()),
    }
}

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
    let readable = super::membership::readable_channels(&opts);
    let conn = Client::connect(opts).await?;
    let (client, mut deliveries) = (conn.client, conn.deliveries);
    // Only a concrete channel typed on the command line, that the credential may read, may be
    // a typo (one it may not read is refused by the broker, in those words).
    if !args.new {
        let typed = args.channels.iter().filter_map(|c| Channel::new(c).ok());
        for c in typed.filter(|c| super::membership::may_read(&readable, c)) {
            if let Err(e) = unknown_channel_refused(&client, &c, "pass --new to join it").await {
                client.close().await;
                return Err(e);
            }
        }
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
        Ok::<(), crate::client::JoinError>(())
    });
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
                mark_read(&client).await;
            }
            _ = &mut interrupted => break Ok(()),
        }
    };
    joins.abort();
    client.close().await;
    result.map(|()| ExitCode::SUCCESS)
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

/// Where a text continues after one of its newlines: indented, so that none of its lines can
/// pass for a message of its own (those start in the first column).
const CONTINUATION: &str = "\n    ";

/// `s` made safe to print on a terminal: each character [`escaped_on_terminal`] is shown as its
/// escape (`\u{1b}`). A newline is escaped too, unless `multiline`: then it stays, and the next
/// line starts with [`CONTINUATION`].
pub(super) fn terminal_safe(s: &str, multiline: bool) -> String {
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
