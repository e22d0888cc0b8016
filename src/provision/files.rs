//! Writing and reading secret files: owner-only modes, atomic replace, refusal of loose modes.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::ProvisionError;

/// Creates `dir` (and parents) with mode 0700 if it does not exist.
pub(crate) fn private_dir(dir: &Path) -> Result<(), ProvisionError> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| io(dir, "creating a private directory", source))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` with `mode`, atomically (temp file + rename) and synced, so a
/// crash never leaves a truncated or lost key behind.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ProvisionError> {
    write_replace(path, bytes, mode, true)
}

/// Like [`write_atomic`], but not synced: for files regenerated at every start.
pub(crate) fn write_regenerable(
    path: &Path,
    bytes: &[u8],
    mode: u32,
) -> Result<(), ProvisionError> {
    write_replace(path, bytes, mode, false)
}

fn write_replace(path: &Path, bytes: &[u8], mode: u32, sync: bool) -> Result<(), ProvisionError> {
    let tmp = crate::datadir::temp_path(path);
    let _ = fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|source| io(&tmp, "creating", source))?;
    f.write_all(bytes)
        .and_then(|()| if sync { f.sync_all() } else { Ok(()) })
        .map_err(|source| io(&tmp, "writing", source))?;
    fs::rename(&tmp, path).map_err(|source| io(path, "renaming into place", source))
}

/// Reads a secret file, refusing it when group or others may read or write it.
pub(crate) fn read_private(path: &Path) -> Result<String, ProvisionError> {
    let meta = fs::metadata(path).map_err(|source| io(path, "reading metadata of", source))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(ProvisionError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    fs::read_to_string(path).map_err(|source| io(path, "reading", source))
}

pub(crate) fn io(path: &Path, action: &'static str, source: std::io::Error) -> ProvisionError {
    ProvisionError::Io {
        path: path.to_owned(),
        action,
        source,
    }
}
