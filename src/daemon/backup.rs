//! `cotald backup`: one archive of everything a space needs on another machine, taken while
//! the appliance serves; and, at the first start after `cotald restore`, its streams put back
//! before the space is bootstrapped.
//!
//! **What an archive holds** (a tar, owner-only: it carries every key and every message):
//! - `cotald-backup.json`, the [`BackupManifest`];
//! - `profile.toml`, the profile the appliance runs;
//! - `datadir/…`, the parts of the data dir in [`DATA_DIR_PARTS`]: the keys (operator,
//!   accounts, users), TLS (the CA clients trust), the account JWTs, each space's identities
//!   and records, the dashboard's token. Not the store (below), the runtime files, the logs or
//!   the broker executable (the next start makes those), nor a cluster's routes (a restore is
//!   a single node);
//! - `streams/<space>/<stream>.snap` and `.json`: each stream and bucket of each space as the
//!   broker snapshots it (messages, and consumers with their positions: a durable member's DM
//!   consumer, a role's task queue), and the request that restores it.
//!
//! **Consistent enough to lose nothing.** The broker takes each snapshot without stopping
//! publishes, one stream at a time. The buckets go first, the members registry before any
//! stream: a durable member's saved position (§7) is then never past what the copy of CHAT
//! holds, so a restored member is handed everything after it again (at-least-once, §4),
//! never less. The presence bucket is not copied: it holds only heartbeats of the last 6 s.
//!
//! **Restore** (`cotald restore`) unpacks the archive into a new data dir, the
//! streams under `restore/`; the first `cotald up` restores each space's streams through the
//! JetStream API before bootstrapping the space (each stream's files removed once it is back,
//! so an interrupted restore goes on where it stopped), with the replicas of this node.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value;

use super::{Core, DaemonError};
use crate::binding::SpaceNames;
use crate::datadir::DataDir;
use crate::files::FileError;
use crate::ops::{BackupManifest, BackupReport, BackupRequest, SpaceCopy, StreamCopy};
use crate::space::Space;
use crate::space::snapshot::{self, SnapshotError};

/// The archive's layout version.
pub const FORMAT: u32 = 1;
/// The manifest's name in the archive (and in `restore/` of a restored data dir).
pub const MANIFEST: &str = "cotald-backup.json";
/// The profile's name in the archive (and in a restored data dir).
pub const PROFILE: &str = "profile.toml";
/// Where the data dir's parts are in the archive.
pub const DATA_DIR: &str = "datadir";
/// Where the streams are in the archive.
pub const STREAMS: &str = "streams";
/// The parts of the data dir an archive holds (see the module doc).
pub const DATA_DIR_PARTS: &[&str] = &["keys", "tls", "jwt", "spaces", "dashboard.token"];

/// Why a backup, or the restore of one at start, failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The archive path is relative (the appliance does not run where the command does).
    #[error("the archive path {0} is relative; give an absolute one")]
    Relative(PathBuf),
    /// Something is at the archive path already.
    #[error("{0} exists; a backup never writes over a file: choose another name")]
    Exists(PathBuf),
    /// A stream could not be copied out or back.
    #[error("space `{space}`")]
    Stream {
        /// The space.
        space: String,
        /// Why.
        #[source]
        source: SnapshotError,
    },
    /// The archive could not be written.
    #[error("writing the archive {path}")]
    Archive {
        /// The archive.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file of a restore is not the JSON a backup writes.
    #[error("{path} is not the JSON a backup writes")]
    Restore {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A stream's snapshot request could not be written as JSON.
    #[error("writing the snapshot request of stream `{stream}`")]
    Request {
        /// The stream.
        stream: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The task writing the archive ended without an answer (it panicked or was cancelled).
    #[error("the archive writer ended without finishing")]
    Writer(#[source] tokio::task::JoinError),
}

/// The streams of a space an archive holds, in the order they are copied and restored, and
/// whether each is copied with its consumers (a bucket's are only watchers, made again by
/// whoever watches).
fn streams_of(names: &SpaceNames) -> Vec<(String, bool)> {
    vec![
        (SpaceNames::kv_stream(&names.members_bucket()), false),
        (SpaceNames::kv_stream(&names.membership_bucket()), false),
        (SpaceNames::kv_stream(&names.channels_bucket()), false),
        (names.chat_stream(), true),
        (names.dm_stream(), true),
        (names.task_stream(), true),
        (names.backstop_stream(), true),
    ]
}

impl Core {
    /// `backup`: every served space copied into the archive `req.out`.
    pub(super) async fn backup(&self, req: BackupRequest) -> Result<BackupReport, DaemonError> {
        let started = Instant::now();
        let out = req.out;
        if !out.is_absolute() {
            return Err(BackupError::Relative(out).into());
        }
        let parts = PathBuf::from(format!("{}.parts", out.display()));
        for taken in [&out, &parts] {
            if taken.symlink_metadata().is_ok() {
                return Err(BackupError::Exists(taken.clone()).into());
            }
        }
        crate::files::private_dir(&parts)?;
        // Removed however this ends: written, failed, or abandoned by a stop.
        let scratch = Scratch(vec![parts.clone(), partial(&out)]);
        let manifest = self.backup_into(&out, &parts).await;
        drop(scratch);
        let manifest = manifest?;
        let bytes = std::fs::metadata(&out)
            .map_err(FileError::at(&out, "reading metadata of"))?
            .len();
        tracing::info!(archive = %out.display(), bytes, spaces = manifest.spaces.len(), "backup written");
        Ok(BackupReport {
            path: out,
            bytes,
            millis: started.elapsed().as_millis() as u64,
            manifest,
        })
    }

    /// Snapshots every stream into `parts`, then packs `parts`, the data dir's parts and the
    /// profile into `out`.
    async fn backup_into(&self, out: &Path, parts: &Path) -> Result<BackupManifest, DaemonError> {
        let spaces = self.spaces.spaces().await;
        let mut manifest = BackupManifest {
            format: FORMAT,
            cotald: env!("CARGO_PKG_VERSION").to_owned(),
            nats_server: crate::supervisor::BUNDLED_VERSION.to_owned(),
            created: crate::provision::rfc3339(crate::provision::now_secs()),
            spaces: Vec::new(),
        };
        for space in spaces {
            let dir = parts.join(STREAMS).join(space.name());
            crate::files::private_dir(&dir)?;
            let mut copy = SpaceCopy {
                name: space.name().to_owned(),
                streams: Vec::new(),
            };
            for (stream, consumers) in streams_of(space.names()) {
                let snap = dir.join(format!("{stream}.snap"));
                let taken = snapshot::snapshot(&space.nats(), &stream, consumers, &snap)
                    .await
                    .map_err(|source| BackupError::Stream {
                        space: space.name().to_owned(),
                        source,
                    })?;
                let request = serde_json::to_vec_pretty(&taken.request).map_err(|source| {
                    BackupError::Request {
                        stream: stream.clone(),
                        source,
                    }
                })?;
                crate::files::write_atomic(&dir.join(format!("{stream}.json")), &request, 0o600)?;
                copy.streams.push(StreamCopy {
                    stream,
                    messages: taken.messages,
                    bytes: taken.bytes,
                });
            }
            manifest.spaces.push(copy);
        }
        let root = self.dir.root().to_owned();
        let profile = self.profile_text.clone();
        let (out, parts) = (out.to_owned(), parts.to_owned());
        let packed = manifest.clone();
        tokio::task::spawn_blocking(move || pack(&out, &parts, &root, &packed, &profile))
            .await
            .map_err(BackupError::Writer)??;
        Ok(manifest)
    }
}

/// Restores the streams a `cotald restore` left for `space` in the data dir, if any.
///
/// A stream is restored with `replicas` (the node's, not the archive's: a backup of a single
/// node restores into a cluster and back).
pub(super) async fn restore_pending(
    data_dir: &DataDir,
    replicas: usize,
    space: &Space,
) -> Result<(), DaemonError> {
    let dir = data_dir.restore();
    let manifest_path = dir.join(MANIFEST);
    let Ok(text) = std::fs::read(&manifest_path) else {
        return Ok(());
    };
    let manifest: BackupManifest =
        serde_json::from_slice(&text).map_err(|source| BackupError::Restore {
            path: manifest_path.clone(),
            source,
        })?;
    let Some(copy) = manifest.spaces.iter().find(|s| s.name == space.name()) else {
        return Ok(());
    };
    let streams = dir.join(STREAMS).join(space.name());
    for stream in &copy.streams {
        let request_path = streams.join(format!("{}.json", stream.stream));
        let snap = streams.join(format!("{}.snap", stream.stream));
        // Restored by an earlier start that was interrupted.
        let Ok(request) = std::fs::read(&request_path) else {
            continue;
        };
        let mut request: Value =
            serde_json::from_slice(&request).map_err(|source| BackupError::Restore {
                path: request_path.clone(),
                source,
            })?;
        request["config"]["num_replicas"] = replicas.into();
        let messages = snapshot::restore(&space.nats(), &stream.stream, &request, &snap)
            .await
            .map_err(|source| BackupError::Stream {
                space: space.name().to_owned(),
                source,
            })?;
        std::fs::remove_file(&request_path).map_err(FileError::at(&request_path, "removing"))?;
        let _ = std::fs::remove_file(&snap);
        tracing::info!(
            space = space.name(),
            stream = stream.stream,
            messages,
            "stream restored from the backup"
        );
    }
    let _ = std::fs::remove_dir_all(&streams);
    let left = std::fs::read_dir(dir.join(STREAMS))
        .map(|d| d.flatten().count())
        .unwrap_or(0);
    if left == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// Writes the archive: first to `<out>.partial` (owner-only), then renamed.
fn pack(
    out: &Path,
    parts: &Path,
    root: &Path,
    manifest: &BackupManifest,
    profile: &str,
) -> Result<(), BackupError> {
    use std::os::unix::fs::OpenOptionsExt;
    let partial = partial(out);
    let failed = |source| BackupError::Archive {
        path: out.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .map_err(failed)?;
    let written = (|| {
        let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
        tar.mode(tar::HeaderMode::Complete);
        let manifest = serde_json::to_vec_pretty(manifest).map_err(std::io::Error::other)?;
        append_bytes(&mut tar, MANIFEST, &manifest)?;
        append_bytes(&mut tar, PROFILE, profile.as_bytes())?;
        for part in DATA_DIR_PARTS {
            let path = root.join(part);
            let name = Path::new(DATA_DIR).join(part);
            if path.is_dir() {
                tar.append_dir_all(&name, &path)?;
            } else if path.is_file() {
                tar.append_path_with_name(&path, &name)?;
            }
        }
        tar.append_dir_all(STREAMS, parts.join(STREAMS))?;
        let file = tar.into_inner()?.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()
    })();
    match written.and_then(|()| std::fs::rename(&partial, out)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(failed(e))
        }
    }
}

/// Where the archive `out` is written before it is renamed into place.
fn partial(out: &Path) -> PathBuf {
    PathBuf::from(format!("{}.partial", out.display()))
}

/// Files and directories of a backup in progress, removed when it ends in any way (the task
/// that takes it is dropped when the appliance stops).
struct Scratch(Vec<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_dir_all(path).or_else(|_| std::fs::remove_file(path));
        }
    }
}

/// One file of `bytes` named `name` (owner-only).
fn append_bytes<W: std::io::Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    bytes: &[u8],
) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o600);
    header.set_mtime(crate::provision::now_secs().max(0) as u64);
    header.set_cksum();
    tar.append_data(&mut header, name, bytes)
}
