//! `cotald mint`: a credential for an agent, observer or admin of one space.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use super::DataDirArg;
use crate::daemon::{DaemonError, execute_offline};
use crate::datadir::DataDirError;
use crate::ops::{CredentialProfile, MintReply, MintRequest, Request};

/// Options of `cotald mint`.
#[derive(Debug, Args)]
pub struct MintArgs {
    /// Display name of the identity (the credential's name).
    name: String,
    /// The space it belongs to [default: main].
    #[arg(long, value_name = "SPACE")]
    pub(super) space: Option<String>,
    /// agent: reads within --allow-subscribe, posts within --allow-publish, DMs and anycast;
    /// observer: reads chat, history, presence; admin: observer plus DM history and the whole
    /// space's live traffic. Observers and admins publish nothing.
    #[arg(long, value_enum, default_value = "agent")]
    profile: CredentialProfile,
    /// Channels joined at boot (comma-separated; must be within --allow-subscribe)
    /// [default: general, when no channel flag is given]
    #[arg(long, value_delimiter = ',', value_name = "CH,...")]
    subscribe: Vec<String>,
    /// Read ACL: channels or subtrees (`team.>`) it may read [default: --subscribe]
    #[arg(long, value_delimiter = ',', value_name = "CH,...")]
    allow_subscribe: Vec<String>,
    /// Post ACL: channels it may publish to [default: none]
    #[arg(long, value_delimiter = ',', value_name = "CH,...")]
    allow_publish: Vec<String>,
    /// Anycast role it serves (receives `toService` messages for it).
    #[arg(long)]
    role: Option<String>,
    /// Make the credential expire after this long (`90s`, `12h`, `30d`) [default: never]
    #[arg(long, value_name = "DURATION")]
    expires: Option<String>,
    /// Where to write the `.creds` file (0600; never overwritten)
    /// [default: <data-dir>/spaces/<space>/creds/<name>-<id>.creds]
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Re-issue the credential of an identity of this name: it keeps its id, memberships and
    /// backlog, and its current credential is revoked. Without it, a name that exists is
    /// refused.
    #[arg(long)]
    replace: bool,
    /// Print one JSON object: {"id","name","space","creds","link","ca"}.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) data_dir: DataDirArg,
}

pub(super) async fn run(args: MintArgs) -> anyhow::Result<ExitCode> {
    // Before anything else: minting without the appliance creates and locks the data dir
    // before the library sees the request.
    crate::space::identity::validate_name(&args.name)?;
    let dir = args.data_dir.resolve()?;
    if let Some(out) = args.out.as_ref().filter(|o| o.exists()) {
        bail!(
            "{} exists; cotald never overwrites credentials",
            out.display()
        );
    }
    if let Some(out) = &args.out {
        check_writable(out)?;
    }
    let req = Request::Mint(MintRequest {
        name: args.name.clone(),
        space: args
            .space
            .clone()
            .unwrap_or_else(|| super::DEFAULT_SPACE.to_owned()),
        profile: Some(args.profile),
        subscribe: args.subscribe.clone(),
        allow_subscribe: args.allow_subscribe.clone(),
        allow_publish: args.allow_publish.clone(),
        role: args.role.clone(),
        expires: args.expires.clone(),
        replace: args.replace,
    });
    let value = match super::admin_call(&dir, &req).await? {
        Some(value) => value,
        // Nothing to mint from (and nothing is written there): no appliance ever ran here.
        None if !dir.keys().is_dir() => bail!(
            "no appliance was ever started on data dir {}: start one with `cotald up` (or give \
             the data dir it uses with --data-dir)",
            dir.root().display()
        ),
        None => execute_offline(&dir, &req).map_err(|e| match e {
            DaemonError::DataDir(DataDirError::Locked { .. }) => anyhow::anyhow!(
                "cotald is starting on {} (its admin socket is not open yet); retry in a moment",
                dir.root().display()
            ),
            other => other.into(),
        })?,
    };
    let reply: MintReply = serde_json::from_value(value).context("malformed mint reply")?;
    let out = args.out.clone().unwrap_or_else(|| {
        dir.creds(&reply.record.space).join(format!(
            "{}-{}.creds",
            reply.record.name,
            &reply.record.id[..8]
        ))
    });
    if reply.replaced && out.exists() {
        // A re-mint of the same identity on the default path: the old file holds a revoked
        // credential, so it is replaced.
        crate::files::write_atomic(&out, reply.creds.as_bytes(), 0o600)?;
    } else {
        crate::files::write_new(&out, reply.creds.as_bytes(), 0o600)?;
    }
    print_minted(&reply, &out, &dir, args.json)?;
    Ok(ExitCode::SUCCESS)
}

/// What `mint` says of the identity it minted: its credential, link and CA (one JSON object
/// with `--json`).
fn print_minted(
    reply: &MintReply,
    out: &std::path::Path,
    dir: &crate::datadir::DataDir,
    json: bool,
) -> anyhow::Result<()> {
    let ca = dir.ca_cert();
    if json {
        let doc = serde_json::json!({
            "id": reply.record.id,
            "name": reply.record.name,
            "space": reply.record.space,
            "creds": out,
            "link": reply.link,
            "ca": ca,
            "replaced": reply.replaced,
        });
        super::stdout(|w| writeln!(w, "{doc}"))?;
    } else {
        super::stdout(|w| {
            writeln!(
                w,
                "{} {} {} in space {}",
                if reply.replaced {
                    "re-minted"
                } else {
                    "minted"
                },
                format!("{:?}", reply.record.profile).to_lowercase(),
                reply.record.name,
                reply.record.space
            )?;
            writeln!(w, "  id     {}", reply.record.id)?;
            writeln!(w, "  creds  {}", out.display())?;
            writeln!(w, "  link   {}", reply.link)?;
            writeln!(w, "  ca     {}", ca.display())?;
            if reply.replaced {
                writeln!(
                    w,
                    "the previous credential of {} is revoked",
                    reply.record.name
                )?;
            }
            if !reply.provisioned {
                writeln!(
                    w,
                    "cotald is not running on {}: the identity's durables are created at its next start",
                    dir.root().display()
                )?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Refuses an `--out` whose directory cannot take the file before anything is minted: an
/// identity minted for a credential that was never written would only be in the way.
fn check_writable(out: &std::path::Path) -> anyhow::Result<()> {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let refused = |e: std::io::Error| {
        anyhow::anyhow!(
            "--out {}: cannot write there ({e}); nothing was minted",
            out.display()
        )
    };
    std::fs::create_dir_all(parent).map_err(refused)?;
    let probe = parent.join(format!(".cotald-mint-{}.probe", std::process::id()));
    std::fs::File::create(&probe).map_err(refused)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}
