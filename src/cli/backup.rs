//! `cotald backup` and `cotald restore`: a running appliance's spaces written to one archive,
//! and that archive made into a new data dir on this or another machine (the layout and the
//! guarantees are in [`crate::daemon::backup`]).

use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;

use super::DataDirArg;
use crate::daemon::backup::{DATA_DIR, MANIFEST, PROFILE, STREAMS};
use crate::datadir::DataDir;
use crate::ops::{BackupManifest, BackupReport, BackupRequest, Request};

/// Options of `cotald backup`.
#[derive(Debug, Args)]
pub struct BackupArgs {
    #[command(flatten)]
    pub(super) data_dir: DataDirArg,
    /// The archive to write (a new file; it is owner-only: it holds every key and message).
    #[arg(value_name = "OUT")]
    out: PathBuf,
}

/// Options of `cotald restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub(super) data_dir: DataDirArg,
    /// An archive written by `cotald backup`.
    #[arg(value_name = "ARCHIVE")]
    archive: PathBuf,
}

pub(super) async fn backup(args: BackupArgs) -> anyhow::Result<ExitCode> {
    let dir = args.data_dir.resolve()?;
    let out = std::path::absolute(&args.out)
        .with_context(|| format!("cannot make {} absolute", args.out.display()))?;
    let request = Request::Backup(BackupRequest { out });
    let Some(data) = super::admin_call(&dir, &request).await? else {
        bail!(
            "cotald is not running (data dir {}): a backup is taken from a running appliance; \
             start it with `cotald up`",
            dir.root().display()
        );
    };
    let report: BackupReport = serde_json::from_value(data).context("malformed reply")?;
    let streams: usize = report.manifest.spaces.iter().map(|s| s.streams.len()).sum();
    let messages: u64 = report
        .manifest
        .spaces
        .iter()
        .flat_map(|s| &s.streams)
        .map(|s| s.messages)
        .sum();
    println!(
        "backup written: {} ({}, {} spaces, {streams} streams, {messages} messages, {} ms)",
        report.path.display(),
        crate::profile::human_size(report.bytes),
        report.manifest.spaces.len(),
        report.millis
    );
    println!(
        "restore it with: cotald restore {} --data-dir NEW_DIR",
        report.path.display()
    );
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn restore(args: RestoreArgs) -> anyhow::Result<ExitCode> {
    let dir = args.data_dir.resolve()?;
    let archive = args.archive.clone();
    let target = dir.clone();
    let manifest = tokio::task::spawn_blocking(move || unpack(&archive, &target))
        .await
        .context("the archive reader failed")??;
    let spaces: Vec<&str> = manifest.spaces.iter().map(|s| s.name.as_str()).collect();
    println!(
        "restored {} into {} (taken {} by cotald {}): spaces {}",
        args.archive.display(),
        dir.root().display(),
        manifest.created,
        manifest.cotald,
        spaces.join(", ")
    );
    println!(
        "the streams go back into the broker at the first start: cotald up --data-dir {} \
         --config {}",
        dir.root().display(),
        dir.root().join(PROFILE).display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Unpacks `archive` into the new data dir `dir`: the data dir's parts at its root, the
/// profile beside them, the streams and the manifest under `restore/`.
fn unpack(archive: &Path, dir: &DataDir) -> anyhow::Result<BackupManifest> {
    let root = dir.root();
    let fresh = match std::fs::read_dir(root) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", root.display())),
    };
    if !fresh {
        bail!(
            "{} is not empty: a restore makes a new data dir (nothing is merged into one in \
             use); name a new or empty directory with --data-dir",
            root.display()
        );
    }
    let file = std::fs::File::open(archive)
        .with_context(|| format!("cannot open {}", archive.display()))?;
    crate::files::private_dir(root)?;
    let mut manifest = None;
    let mut tar = tar::Archive::new(std::io::BufReader::new(file));
    tar.set_preserve_permissions(true);
    let entries = tar
        .entries()
        .with_context(|| format!("{} is not an archive of cotald backup", archive.display()))?;
    for entry in entries {
        let mut entry =
            entry.with_context(|| format!("a damaged entry in {}", archive.display()))?;
        let name = entry.path()?.into_owned();
        let Some(to) = destination(&name, dir) else {
            bail!(
                "{} holds {}, which no archive of cotald backup holds",
                archive.display(),
                name.display()
            );
        };
        if name == Path::new(MANIFEST) {
            let mut text = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut text)?;
            manifest = Some(
                serde_json::from_slice::<BackupManifest>(&text)
                    .with_context(|| format!("{MANIFEST} in {}", archive.display()))?,
            );
            crate::files::private_dir(&dir.restore())?;
            crate::files::write_atomic(&to, &text, 0o600)?;
            continue;
        }
        if let Some(parent) = to.parent() {
            crate::files::private_dir(parent)?;
        }
        entry
            .unpack(&to)
            .with_context(|| format!("cannot write {}", to.display()))?;
    }
    let manifest = manifest.with_context(|| {
        format!(
            "{} has no {MANIFEST}: it is not an archive of cotald backup",
            archive.display()
        )
    })?;
    if manifest.format != crate::daemon::backup::FORMAT {
        bail!(
            "{} is an archive of layout {}, this cotald reads layout {}",
            archive.display(),
            manifest.format,
            crate::daemon::backup::FORMAT
        );
    }
    Ok(manifest)
}

/// Where an archive entry goes in the new data dir; `None` for a name no archive holds (one
/// that climbs out with `..`, or is absolute).
fn destination(name: &Path, dir: &DataDir) -> Option<PathBuf> {
    if name
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return None;
    }
    if name == Path::new(MANIFEST) {
        return Some(dir.restore().join(MANIFEST));
    }
    if name == Path::new(PROFILE) {
        return Some(dir.root().join(PROFILE));
    }
    if let Ok(rest) = name.strip_prefix(DATA_DIR) {
        return Some(dir.root().join(rest));
    }
    if name.starts_with(STREAMS) {
        return Some(dir.restore().join(name));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_land_where_the_restore_reads_them_and_nowhere_else() {
        let dir = DataDir::new("/d");
        let at = |name: &str| destination(Path::new(name), &dir);
        assert_eq!(
            at("cotald-backup.json"),
            Some("/d/restore/cotald-backup.json".into())
        );
        assert_eq!(at("profile.toml"), Some("/d/profile.toml".into()));
        assert_eq!(
            at("datadir/keys/operator.nk"),
            Some("/d/keys/operator.nk".into())
        );
        assert_eq!(
            at("streams/main/CHAT_main.snap"),
            Some("/d/restore/streams/main/CHAT_main.snap".into())
        );
        assert_eq!(at("datadir/../../etc/passwd"), None);
        assert_eq!(at("/etc/passwd"), None);
        assert_eq!(at("elsewhere/x"), None);
    }
}
