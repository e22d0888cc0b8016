//! Writing the appliance's files: one way to replace a file, one way to create a file that
//! must not exist yet, one way to make a directory only its owner can enter.
//!
//! Every write goes to `<name>.tmp` beside the target, is synced, then renamed into place, so
//! a crash leaves either the old file or the new one, never a truncated key, credential or
//! record. The mode is set when the file is created, so a secret is never readable by others,
//! not even for an instant.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A file or directory that could not be read or written, and what was being done.
#[derive(Debug, thiserror::Error)]
#[error("I/O error at {path} while {action}: {source}")]
pub struct FileError {
    /// The path.
    pub path: PathBuf,
    /// What was being done (`"creating"`, `"writing"`, …).
    pub action: &'static str,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

impl FileError {
    /// An error at `path` while doing `action`.
    pub fn new(path: &Path, action: &'static str, source: std::io::Error) -> Self {
        FileError {
            path: path.to_owned(),
            action,
            source,
        }
    }

    /// A `map_err` adapter: `.map_err(FileError::at(path, "reading"))`.
    pub fn at(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_owned();
        move |source| FileError {
            path,
            action,
            source,
        }
    }
}

/// Creates `dir` and its missing parents with mode 0700; an existing directory is left as it is.
pub fn private_dir(dir: &Path) -> Result<(), FileError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(FileError::at(dir, "creating a private directory"))
}

/// Replaces `path` with `bytes` atomically: written to `<name>.tmp` with `mode`, synced, renamed.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    replace(path, bytes, mode, Synced::Yes)
}

/// Writes a file whole under a temporary name and renames it into place, not synced: for what
/// describes a running process (the runtime state), worthless once the machine went down, which
/// a sync would only slow (a few milliseconds of every start). A reader sees the old file or
/// the new one, never a part.
pub fn write_replacing(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    replace(path, bytes, mode, Synced::No)
}

/// Whether a file written is synced before it counts as written.
#[derive(Clone, Copy)]
enum Synced {
    Yes,
    No,
}

/// Writes `<name>.tmp` with `mode` and renames it over `path`.
fn replace(path: &Path, bytes: &[u8], mode: u32, synced: Synced) -> Result<(), FileError> {
    let tmp = temp_path(path);
    let _ = fs::remove_file(&tmp);
    create(&tmp, bytes, mode, synced)?;
    fs::rename(&tmp, path).map_err(FileError::at(path, "renaming into place"))
}

/// Writes a file that must not exist yet (a handed-out credential is never overwritten),
/// creating its parent directory owner-only.
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        private_dir(parent)?;
    }
    create(path, bytes, mode, Synced::Yes)
}

/// Writes a file that must not exist yet.
fn create(path: &Path, bytes: &[u8], mode: u32, synced: Synced) -> Result<(), FileError> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(FileError::at(path, "creating"))?;
    f.write_all(bytes)
        .and_then(|()| match synced {
            Synced::Yes => f.sync_all(),
            Synced::No => Ok(()),
        })
        .map_err(FileError::at(path, "writing"))
}

/// The temporary name a file is written under before it is renamed into place:
/// `<name>.tmp` beside it (so `ca.pem` and `ca.key` never share one).
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn atomic_writes_replace_with_the_given_mode_and_leave_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        let file = dir.join("secret");
        write_atomic(&file, b"one", 0o600).unwrap();
        write_atomic(&file, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"two");
        assert_eq!(mode(&file), 0o600);
        assert!(!temp_path(&file).exists());
    }

    #[test]
    fn new_files_are_never_overwritten() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("creds/alice.creds");
        write_new(&file, b"first", 0o600).unwrap();
        assert_eq!(mode(file.parent().unwrap()), 0o700);
        let err = write_new(&file, b"second", 0o600).unwrap_err();
        assert_eq!(err.source.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&file).unwrap(), b"first");
    }
}
