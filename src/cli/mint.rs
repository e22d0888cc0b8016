//! `cotald mint`: a credential for an agent, observer or admin of one space.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use super::DataDirArg;
use crate::daemon::admin::{self, AdminRequest};
use crate::daemon::{MintReply, join_link};
use crate::datadir::DataDir;
use crate::provision::KeyStore;
use crate::space::store;
use crate::space::{CredentialProfile, MintRequest, identity};

/// Options of `cotald mint`.
#[derive(Debug, Args)]
pub struct MintArgs {
    /// Display name of the identity (the credential's name).
    name: String,
    /// The space it belongs to.
    #[arg(long)]
    space: String,
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
    /// Print one JSON object: {"id","name","space","creds","link","ca"}.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    data_dir: DataDirArg,
}

pub(super) async fn run(args: MintArgs) -> anyhow::Result<ExitCode> {
    let dir = args.data_dir.resolve()?;
    if let Some(out) = args.out.as_ref().filter(|o| o.exists()) {
        bail!(
            "{} exists; cotald never overwrites credentials",
            out.display()
        );
    }
    let req = MintRequest {
        name: args.name.clone(),
        space: args.space.clone(),
        profile: Some(args.profile),
        subscribe: args.subscribe.clone(),
        allow_subscribe: args.allow_subscribe.clone(),
        allow_publish: args.allow_publish.clone(),
        role: args.role.clone(),
        expires: args.expires.clone(),
    };
    let reply = match admin::call(&dir, &AdminRequest::Mint(req.clone())).await? {
        Some(value) => {
            serde_json::from_value::<MintReply>(value).context("malformed mint reply")?
        }
        None => offline(&dir, &req)?,
    };
    let out = args.out.clone().unwrap_or_else(|| {
        dir.space(&req.space).join("creds").join(format!(
            "{}-{}.creds",
            reply.record.name,
            &reply.record.id[..8]
        ))
    });
    write_new_secret(&out, &reply.creds)?;
    let ca = dir.ca_cert();
    if args.json {
        let doc = serde_json::json!({
            "id": reply.record.id,
            "name": reply.record.name,
            "space": reply.record.space,
            "creds": out,
            "link": reply.link,
            "ca": ca,
        });
        println!("{doc}");
    } else {
        println!(
            "minted {} {} in space {}",
            format!("{:?}", reply.record.profile).to_lowercase(),
            reply.record.name,
            reply.record.space
        );
        println!("  id     {}", reply.record.id);
        println!("  creds  {}", out.display());
        println!("  link   {}", reply.link);
        println!("  ca     {}", ca.display());
        if !reply.provisioned {
            println!(
                "cotald is not running on {}: the identity's durables are created at its next start",
                dir.root().display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Mints from the data dir when no appliance runs: the key store signs, the identity is
/// remembered, and the next `cotald up` pre-creates its durables.
fn offline(dir: &DataDir, req: &MintRequest) -> anyhow::Result<MintReply> {
    // Holding the lock proves no appliance is starting: one that is would read the identities
    // before this one is recorded, and create its durables only at the start after.
    let _lock = dir.lock().map_err(|e| match e {
        crate::datadir::DataDirError::Locked { .. } => anyhow::anyhow!(
            "cotald is starting on {} (its admin socket is not open yet); retry in a moment",
            dir.root().display()
        ),
        other => other.into(),
    })?;
    let keys = KeyStore::open(&dir.keys())?;
    let space = keys.space(&req.space).map_err(|_| {
        anyhow::anyhow!(
            "unknown space `{}` in data dir {}",
            req.space,
            dir.root().display()
        )
    })?;
    let minted = identity::mint(&space, req)?;
    store::save_identity(dir, &minted.record)?;
    let listen = crate::profile::Profile::embedded()?.broker.listen;
    Ok(MintReply {
        link: join_link(&listen.to_string(), &req.space, &minted.record.subscribe)?,
        creds: minted.creds.render(),
        record: minted.record,
        provisioned: false,
    })
}

fn write_new_secret(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
