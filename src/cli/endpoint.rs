//! [`EndpointArgs`]: how every endpoint command (`send`, `tail`, `join`, `leave`, `roster`,
//! `channels`, `mcp`) finds the space it talks to, and the checks of what they are given on the
//! command line.
//!
//! With no connection flag, a command on the machine running the appliance acts as the
//! machine operator of space `main`: its credential, the CA and the listen address are in the
//! data dir (`spaces/<space>/local-operator.creds`, `tls/ca.pem`, `run/state.json`). `--space`
//! picks another local space; `--as NAME` acts as an identity minted on this appliance. For a
//! remote appliance, a saved context (`cotald context`) or `COTALD_LINK`, `COTALD_CREDS`,
//! `COTALD_CA` say where and as whom. Each setting is taken from the first that gives it:
//! flag or environment variable, then the context, then the local data dir; `--space` and
//! `--as` select the local data dir, so no context applies with them.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;

use super::DataDirArg;
use crate::client::{Client, ConnectOptions};
use crate::datadir::DataDir;
use crate::ops::IdentityRecord;
use crate::protocol::{Channel, ChannelPattern, JoinLink};

/// The channel the machine operator's local link names: the one every agent joins by default.
const OPERATOR_CHANNEL: &str = crate::space::identity::DEFAULT_SUBSCRIBE;

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
    pub(super) fn minted(&self) -> Vec<IdentityRecord> {
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
