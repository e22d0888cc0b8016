//! `cotald identities`: what this appliance minted for a space, read from the data dir (it
//! works with the appliance stopped). Revoked identities are listed as revoked, with when.

use std::process::ExitCode;

use clap::Args;

use super::DataDirArg;
use crate::ops::IdentityRecord;

/// Options of `cotald identities`.
#[derive(Debug, Args)]
pub struct IdentitiesArgs {
    /// The space [default: main].
    #[arg(long, value_name = "SPACE")]
    pub(super) space: Option<String>,
    /// One JSON array of {"name","id","profile","role","subscribe","allowSubscribe",
    /// "allowPublish","expiresAt","issuedAt","revokedAt","creds"}.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(super) data_dir: DataDirArg,
}

pub(super) async fn run(args: IdentitiesArgs) -> anyhow::Result<ExitCode> {
    let space = args.space.as_deref().unwrap_or(super::DEFAULT_SPACE);
    let dir = args.data_dir.resolve()?;
    if !dir.space(space).is_dir() {
        anyhow::bail!(
            "space `{}` does not exist on data dir {}",
            space,
            dir.root().display()
        );
    }
    let mut records: Vec<IdentityRecord> = crate::space::store::identities(&dir, space);
    records.sort_by(|a, b| a.name.cmp(&b.name).then(a.issued_at.cmp(&b.issued_at)));
    let creds = |r: &IdentityRecord| {
        Some(super::endpoint::default_creds_path(&dir, r)).filter(|p| p.exists())
    };
    super::stdout(|out| {
        if args.json {
            let doc: Vec<serde_json::Value> = records
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "name": r.name,
                        "id": r.id,
                        "profile": r.profile,
                        "role": r.role,
                        "subscribe": r.subscribe,
                        "allowSubscribe": r.allow_subscribe,
                        "allowPublish": r.allow_publish,
                        "expiresAt": r.expires_at.map(crate::provision::rfc3339),
                        "issuedAt": crate::provision::rfc3339(r.issued_at),
                        "revokedAt": r.revoked_at.map(crate::provision::rfc3339),
                        "creds": creds(r),
                    })
                })
                .collect();
            return writeln!(out, "{}", serde_json::Value::from(doc));
        }
        if records.is_empty() {
            return writeln!(
                out,
                "no identities minted in space {}; mint one with `cotald mint NAME --space {}`",
                space, space
            );
        }
        let name_width = records
            .iter()
            .map(|r| r.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        writeln!(
            out,
            "{:name_width$}  {:56}  {:8}  {:20}  {:28}  GRANTS",
            "NAME", "ID", "PROFILE", "ISSUED", "EXPIRES"
        )?;
        for r in &records {
            writeln!(
                out,
                "{:name_width$}  {:56}  {:8}  {:20}  {:28}  {}",
                r.name,
                r.id,
                format!("{:?}", r.profile).to_lowercase(),
                crate::provision::rfc3339(r.issued_at),
                match r.revoked_at {
                    Some(at) => format!("REVOKED {}", crate::provision::rfc3339(at)),
                    None => r
                        .expires_at
                        .map_or_else(|| "never".to_owned(), crate::provision::rfc3339),
                },
                grants(r)
            )?;
        }
        Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The grants of an agent in one line; observers and admins have fixed grants.
fn grants(r: &IdentityRecord) -> String {
    if r.profile != crate::ops::CredentialProfile::Agent {
        return "fixed by the profile".to_owned();
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.join(",")
        }
    };
    let mut out = format!(
        "read {} post {}",
        list(&r.allow_subscribe),
        list(&r.allow_publish)
    );
    if let Some(role) = &r.role {
        out.push_str(&format!(" role {role}"));
    }
    out
}
