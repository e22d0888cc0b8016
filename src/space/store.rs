//! What the data dir remembers about spaces beyond the profile: spaces added at runtime
//! (`spaces/<space>/space.toml`) and the identities minted for each space
//! (`spaces/<space>/identities/<id>.json`), so that a restart serves the same spaces and
//! re-creates the durables every minted agent binds.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::identity::IdentityRecord;
use crate::datadir::DataDir;
use crate::profile::{DeploymentProfile, SpaceConfig};

/// Why the space store could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// I/O.
    #[error("I/O error at {path} while {action}: {source}")]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A stored file is malformed.
    #[error("{path} is malformed: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

fn io(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_owned();
    move |source| StoreError::Io {
        path,
        action,
        source,
    }
}

/// A space added at runtime: only its deployment profile is chosen; the rest is default.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct RuntimeSpace {
    profile: DeploymentProfile,
}

fn runtime_file(dir: &DataDir, space: &str) -> PathBuf {
    dir.space(space).join("space.toml")
}

/// Records a space added at runtime.
pub fn add_runtime_space(
    dir: &DataDir,
    space: &str,
    profile: DeploymentProfile,
) -> Result<(), StoreError> {
    let path = runtime_file(dir, space);
    let parent = dir.space(space);
    private_dir(&parent)?;
    let text = toml::to_string(&RuntimeSpace { profile }).unwrap_or_default();
    write_atomic(
        &path,
        format!("# Added with `cotald space add`.\n{text}").as_bytes(),
    )
}

/// The spaces added at runtime, by name.
pub fn runtime_spaces(dir: &DataDir) -> Result<BTreeMap<String, SpaceConfig>, StoreError> {
    let mut out = BTreeMap::new();
    let root = dir.root().join("spaces");
    let Ok(entries) = fs::read_dir(&root) else {
        return Ok(out);
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = runtime_file(dir, &name);
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        if let Err(reason) = crate::profile::validate_space_name(&name) {
            tracing::warn!(path = %path.display(), reason, "not a space directory; skipped");
            continue;
        }
        let space: RuntimeSpace = toml::from_str(&text).map_err(|e| StoreError::Malformed {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        out.insert(name, SpaceConfig::with_profile(space.profile));
    }
    Ok(out)
}

/// Creates `dir` (and its parents) owner-only, like everything else in the data dir.
fn private_dir(dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir, "creating"))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = crate::datadir::temp_path(path);
    fs::write(&tmp, bytes).map_err(io(&tmp, "writing"))?;
    fs::rename(&tmp, path).map_err(io(path, "renaming into place"))
}

/// Records a minted identity.
pub fn save_identity(dir: &DataDir, record: &IdentityRecord) -> Result<(), StoreError> {
    let parent = dir.space(&record.space).join("identities");
    private_dir(&parent)?;
    let path = parent.join(format!("{}.json", record.id));
    write_atomic(
        &path,
        &serde_json::to_vec_pretty(record).unwrap_or_default(),
    )
}

/// Every identity minted for `space`.
pub fn identities(dir: &DataDir, space: &str) -> Result<Vec<IdentityRecord>, StoreError> {
    let parent = dir.space(space).join("identities");
    let Ok(entries) = fs::read_dir(&parent) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let bytes = fs::read(&path).map_err(io(&path, "reading"))?;
        out.push(
            serde_json::from_slice(&bytes).map_err(|e| StoreError::Malformed {
                path: path.clone(),
                reason: e.to_string(),
            })?,
        );
    }
    out.sort_by(|a: &IdentityRecord, b| a.id.cmp(&b.id));
    Ok(out)
}
