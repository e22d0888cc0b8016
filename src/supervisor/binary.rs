//! The nats-server executable: the pinned build embedded in `cotald`, written once into the
//! data dir (verified against the embedded bytes, mode 0755) and run from there, or an external one
//! given with `--nats-server PATH`.

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
    /// there yet. An existing copy is verified every time; a mismatch is rewritten.
    pub fn install(&self, bin_dir: &Path) -> Result<PathBuf, SupervisorError> {
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
                if holds(&path, bytes) {
                    return Ok(path);
                }
                crate::files::write_atomic(&path, bytes, 0o755).map_err(|e| {
                    SupervisorError::Binary {
                        path: path.clone(),
                        reason: format!("cannot install the bundled nats-server: {e}"),
                    }
                })?;
                tracing::info!(path = %path.display(), version, "installed the bundled nats-server");
                Ok(path)
            }
        }
    }
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

    #[test]
    fn embedded_copy_is_verified_and_repaired() {
        let tmp = tempfile::tempdir().unwrap();
        let bytes: &'static [u8] = b"#!/bin/sh\necho fake\n";
        let sha: &'static str = Box::leak(hex(&Sha256::digest(bytes)).into_boxed_str());
        let bin = BrokerBinary::Embedded {
            bytes,
            sha256: sha,
            version: "0.0.0",
        };
        let path = bin.install(tmp.path()).unwrap();
        assert_eq!(fs::read(&path).unwrap(), bytes);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o755
        );
        fs::write(&path, b"tampered").unwrap();
        assert_eq!(bin.install(tmp.path()).unwrap(), path);
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
                .install(tmp.path())
                .is_err()
        );
        fs::set_permissions(&file, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            BrokerBinary::External(file.clone())
                .install(tmp.path())
                .unwrap(),
            file
        );
        assert!(
            BrokerBinary::External(tmp.path().join("missing"))
                .install(tmp.path())
                .is_err()
        );
    }
}
