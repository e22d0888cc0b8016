//! What the data dir remembers about spaces beyond the profile: spaces added at runtime
//! (`spaces/<space>/space.toml`) and the identities minted for each space
//! (`spaces/<space>/identities/<id>.json`), so that a restart serves the same spaces and
//! re-creates the durables every minted agent binds.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use serde::Deserialize;

use crate::datadir::{DataDir, UnservedSpace};
use crate::files::{self, FileError};
use crate::ops::IdentityRecord;
use crate::profile::{DeploymentProfile, SpaceConfig};

/// Why the space store could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// I/O.
    #[error(transparent)]
    File(#[from] FileError),
    /// A stored file is malformed.
    #[error("{path} is malformed: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

/// A space added at runtime: only its deployment profile is chosen; the rest is default.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct RuntimeSpace {
    profile: DeploymentProfile,
}

/// Records a space added at runtime.
pub fn add_runtime_space(
    dir: &DataDir,
    space: &str,
    profile: DeploymentProfile,
) -> Result<(), StoreError> {
    files::private_dir(&dir.space(space))?;
    let text = toml::to_string(&RuntimeSpace { profile }).unwrap_or_default();
    Ok(files::write_atomic(
        &dir.runtime_space(space),
        format!("# Added with `cotald space add`.\n{text}").as_bytes(),
        0o600,
    )?)
}

/// The spaces added at runtime, by name; a record that cannot be read is returned apart with
/// its reason (one damaged file must not keep the other spaces from being served).
pub fn runtime_spaces(dir: &DataDir) -> (BTreeMap<String, SpaceConfig>, Vec<UnservedSpace>) {
    let mut out = BTreeMap::new();
    let mut unreadable = Vec::new();
    let Ok(entries) = fs::read_dir(dir.spaces()) else {
        return (out, unreadable);
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = dir.runtime_space(&name);
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        if let Err(reason) = crate::profile::validate_space_name(&name) {
            tracing::warn!(path = %path.display(), reason, "not a space directory; skipped");
            continue;
        }
        match toml::from_str::<RuntimeSpace>(&text) {
            Ok(space) => {
                out.insert(name, SpaceConfig::with_profile(space.profile));
            }
            Err(e) => unreadable.push(UnservedSpace {
                name,
                reason: format!("{} is malformed: {e}", path.display()),
            }),
        }
    }
    (out, unreadable)
}

/// Records a minted identity.
pub fn save_identity(dir: &DataDir, record: &IdentityRecord) -> Result<(), StoreError> {
    let parent = dir.identities(&record.space);
    files::private_dir(&parent)?;
    let path = parent.join(format!("{}.json", record.id));
    Ok(files::write_atomic(
        &path,
        &serde_json::to_vec_pretty(record).unwrap_or_default(),
        0o600,
    )?)
}

/// Every identity minted for `space`. A record that cannot be read is skipped and reported in
/// the log: one damaged file must not keep the space (or the appliance) from starting.
pub fn identities(dir: &DataDir, space: &str) -> Vec<IdentityRecord> {
    let parent = dir.identities(space);
    let Ok(entries) = fs::read_dir(&parent) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let read = fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<IdentityRecord>(&b).map_err(|e| e.to_string()));
        match read {
            Ok(record) if record.space == space => out.push(record),
            Ok(record) => tracing::error!(path = %path.display(), space = record.space,
                "identity record of another space; skipped"),
            Err(reason) => {
                tracing::error!(path = %path.display(), reason, "unreadable identity record; skipped")
            }
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}
