//! The nats-server executable: the pinned build embedded in `cotald`, written once into the
//! data dir (verified against the embedded bytes, mode 0755) and run from there, or an external one
//! given with `--nats-server PATH`.
//!
//! The installed copy is compared byte for byte with the embedded one when it is written and
//! whenever its file changed since the last comparison: what the file was then (device, inode,
//! size, modification and change times) is kept beside the data dir's `bin`, and a start that
//! finds it unchanged skips reading 18 MB (most of what a warm start spent before the broker
//! ran). Any write to the file, a rename onto it or a `chmod` moves its change time, which no
//! one but the kernel sets.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::SupervisorError;

/// The version of the nats-server that the build bundled.
pub const BUNDLED_VERSION: &str = env!("COTALD_NATS_SERVER_VERSION");
/// The sha256 of the nats-server that the build bundled.
pub const BUNDLED_SHA256: &str = env!("COTALD_NATS_SERVER_SHA256");

/// Where the broker executable comes from.
#[derive(Debug, Clone)]
pub enum BrokerBinary {
    /// Bytes embedded in the executable, with their expected sha256.
    Embedded {
        /// The executable's bytes.
        bytes: &'static [u8],
        /// Their expected sha256 (hex).
        sha256: &'static str,
        /// The nats-server version.
        version: &'static str,
    },
    /// An executable on disk, used as it is (`--nats-server PATH`).
    External(PathBuf),
}

impl BrokerBinary {
    /// The version string, when known without running it.
    pub fn version(&self) -> Option<&'static str> {
        match self {
            BrokerBinary::Embedded { version, .. } => Some(version),
            BrokerBinary::External(_) => None,
        }
    }

    /// Returns the path to execute, writing the embedded binary into `bin_dir` when it is not
    /// there yet. An existing copy is compared with the embedded bytes unless `verified` says
    /// it was, and its file has not changed since; a mismatch is rewritten.
    pub fn install(&self, bin_dir: &Path, verified: &Path) -> Result<PathBuf, SupervisorError> {
        match self {
            BrokerBinary::External(path) => {
                let meta = fs::metadata(path).map_err(|e| SupervisorError::Binary {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
                    return Err(SupervisorError::Binary {
                        path: path.clone(),
                        reason: "not an executable file".into(),
                    });
                }
                Ok(path.clone())
            }
            BrokerBinary::Embedded {
                bytes,
                sha256,
                version,
            } => {
                // The embedded bytes were checked against the pinned sha256 when the build
                // bundled them; the installed copy is verified against those very bytes (a
                // byte comparison is both stricter and cheaper than hashing 18 MB per start).
                let path = bin_dir.join(format!("nats-server-{version}-{}", &sha256[..12]));
                let unchanged = stamp(&path, sha256)
                    .is_some_and(|now| fs::read_to_string(verified).is_ok_and(|then| then == now));
                if unchanged {
                    return Ok(path);
                }
                if !holds(&path, bytes) {
                    crate::files::write_atomic(&path, bytes, 0o755).map_err(|e| {
                        SupervisorError::Binary {
                            path: path.clone(),
                            reason: format!("cannot install the bundled nats-server: {e}"),
                        }
                    })?;
                    tracing::info!(path = %path.display(), version, "installed the bundled nats-server");
                }
                let kept = stamp(&path, sha256)
                    .map(|now| crate::files::write_atomic(verified, now.as_bytes(), 0o644));
                if !matches!(kept, Some(Ok(()))) {
                    tracing::warn!(path = %verified.display(),
                        "the broker's verification not recorded: the next start compares it again");
                }
                Ok(path)
            }
        }
    }
}

/// What the file at `path` is, for the embedded build `sha256`: its device, inode, size,
/// modification and change times.
fn stamp(path: &Path, sha256: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).ok()?;
    Some(format!(
        "{sha256} dev {} ino {} size {} mtime {}.{:09} ctime {}.{:09}\n",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    ))
}

/// Whether the file at `path` holds exactly `bytes`, compared a chunk at a time: reading the
/// whole 18 MB into one buffer cost every start of the appliance about 10 ms, most of it the
/// buffer's page faults.
fn holds(path: &Path, bytes: &[u8]) -> bool {
    use std::io::Read;
    let Ok(mut file) = fs::File::open(path) else {
        return false;
    };
    if file.metadata().map(|m| m.len()).ok() != Some(bytes.len() as u64) {
        return false;
    }
    let mut chunk = vec![0u8; 1 << 20];
    let mut at = 0;
    loop {
        let n = match file.read(&mut chunk) {
            Ok(0) => return at == bytes.len(),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        };
        if bytes.get(at..at + n) != Some(&chunk[..n]) {
            return false;
        }
        at += n;
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// An embedded "broker" of a few bytes, and those bytes.
    fn fake_embedded() -> (BrokerBinary, &'static [u8]) {
        let bytes: &'static [u8] = b"#!/bin/sh\necho fake\n";
        let sha: &'static str = Box::leak(hex(&Sha256::digest(bytes)).into_boxed_str());
        let bin = BrokerBinary::Embedded {
            bytes,
            sha256: sha,
            version: "0.0.0",
        };
        (bin, bytes)
    }

    #[test]
    fn embedded_copy_is_verified_and_repaired() {
        let tmp = tempfile::tempdir().unwrap();
        let (bin, bytes) = fake_embedded();
        let verified = tmp.path().join("bin.verified");
        let path = bin.install(tmp.path(), &verified).unwrap();
        assert_eq!(fs::read(&path).unwrap(), bytes);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o755
        );
        assert!(verified.exists(), "the comparison is recorded");
        fs::write(&path, b"tampered").unwrap();
        assert_eq!(bin.install(tmp.path(), &verified).unwrap(), path);
        assert_eq!(fs::read(&path).unwrap(), bytes);
    }

    #[test]
    fn a_copy_changed_in_place_is_compared_again_whatever_its_size_and_mtime() {
        let tmp = tempfile::tempdir().unwrap();
        let (bin, bytes) = fake_embedded();
        let verified = tmp.path().join("bin.verified");
        let path = bin.install(tmp.path(), &verified).unwrap();
        // Same size, the modification time put back: only the change time tells. File times
        // come from a coarse clock: written until the change time moved (a write within the
        // same tick as the comparison would go unseen; none can be that close in practice).
        use std::os::unix::fs::MetadataExt;
        let before = fs::metadata(&path).unwrap();
        let mtime = before.modified().unwrap();
        let mut same_size = bytes.to_vec();
        same_size[0] ^= 1;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            fs::write(&path, &same_size).unwrap();
            let now = fs::metadata(&path).unwrap();
            if (now.ctime(), now.ctime_nsec()) != (before.ctime(), before.ctime_nsec()) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the change time never moved"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert_eq!(bin.install(tmp.path(), &verified).unwrap(), path);
        assert_eq!(
            fs::read(&path).unwrap(),
            bytes,
            "compared again and repaired"
        );
        // A record that does not match the file (another machine's, garbage) is not trusted.
        fs::write(&verified, "garbage").unwrap();
        fs::write(&path, &same_size).unwrap();
        assert_eq!(bin.install(tmp.path(), &verified).unwrap(), path);
        assert_eq!(fs::read(&path).unwrap(), bytes);
    }

    #[test]
    fn a_copy_is_held_only_when_every_byte_is_the_same() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("copy");
        // Longer than a chunk, so that the last chunk is compared too.
        let bytes: Vec<u8> = (0..(3 << 20) + 17).map(|i| (i % 251) as u8).collect();
        assert!(!holds(&path, &bytes), "no file");
        fs::write(&path, &bytes).unwrap();
        assert!(holds(&path, &bytes));
        let mut last_differs = bytes.clone();
        *last_differs.last_mut().unwrap() ^= 1;
        fs::write(&path, &last_differs).unwrap();
        assert!(!holds(&path, &bytes), "one byte of the last chunk");
        fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        assert!(!holds(&path, &bytes), "one byte short");
    }

    #[test]
    fn external_must_be_executable() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("x");
        fs::write(&file, b"x").unwrap();
        assert!(
            BrokerBinary::External(file.clone())
                .install(tmp.path(), &tmp.path().join("v"))
                .is_err()
        );
        fs::set_permissions(&file, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            BrokerBinary::External(file.clone())
                .install(tmp.path(), &tmp.path().join("v"))
                .unwrap(),
            file
        );
        assert!(
            BrokerBinary::External(tmp.path().join("missing"))
                .install(tmp.path(), &tmp.path().join("v"))
                .is_err()
        );
    }
}
