//! Keys and trust chain (§2, §9): the operator, the SYS account, one account per space with
//! a signing key, user JWTs and their `.creds` ([`crate::binding::Creds`]), and the TLS CA and
//! server certificate.
//!
//! Everything secret lives under `<data-dir>/keys` and `<data-dir>/tls` with mode 0600, is
//! created once and reused on every restart, so credentials already handed out stay valid. A
//! key store that is half present or readable by other users is refused, never repaired
//! silently: a partial store means something deleted keys, and regenerating would invalidate
//! every credential minted so far.

mod bundle;
mod claims;
mod files;
mod keystore;
mod tls;

pub use bundle::{Imported, JoinBundle, SpaceSeeds};
pub use claims::{AccountLimits, JetStreamLimits, now_secs, rfc3339};
pub use keystore::{KeyStore, SpaceKeys};
pub use tls::{MIN_CERTIFICATE_LIFETIME, TlsFiles, validate_hostname};

use std::path::PathBuf;

/// Why provisioning failed. Each variant says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// A file or directory could not be read or written.
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    /// Some key files exist and others do not.
    #[error(
        "the key store is incomplete: {present} exists but {missing} does not. Restore the \
         missing file from a backup, or move the whole directory {dir} away to start over \
         (every credential minted from it will stop working)"
    )]
    HalfPresent {
        dir: PathBuf,
        present: PathBuf,
        missing: PathBuf,
    },
    /// A secret file is readable or writable by group or others.
    #[error(
        "{path} has mode {mode:o}: secrets must be private to their owner. Fix it with \
         `chmod 600 {path}` (and `chmod 700` on its directory)"
    )]
    TooOpen { path: PathBuf, mode: u32 },
    /// A seed file does not hold a seed of the expected kind.
    #[error("{path} does not hold a valid {kind} seed: {reason}")]
    BadSeed {
        path: PathBuf,
        kind: &'static str,
        reason: String,
    },
    /// The key store does not exist (only `open`, which never creates, reports this).
    #[error("no key store at {0}: start the appliance once with `cotald up` to create it")]
    Missing(PathBuf),
    /// A space was asked for that has no keys.
    #[error("space `{0}` has no account keys in this data dir")]
    UnknownSpace(String),
    /// A cluster bundle is imported into a data dir that has a trust chain of its own.
    #[error(
        "this data dir already has a trust chain of its own (operator {ours}); a node joins a \
         cluster with a fresh data dir"
    )]
    OwnTrustChain { ours: String },
    /// A cluster bundle names a space that is not a valid name.
    #[error("the bundle names an invalid space: {0}")]
    BadSpaceName(String),
    /// Signing a JWT failed.
    #[error("signing failed")]
    Sign(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A name for the server certificate is neither a DNS name nor an IP address.
    #[error(
        "hostname {0:?} is not a DNS name or an IP address: use dot-separated labels of 1 to 63 \
         letters, digits and `-` (not first or last; 253 characters in all), or an IPv4 or IPv6 \
         address"
    )]
    Hostname(String),
    /// A server certificate lifetime too short to be renewed before it ends.
    #[error(
        "a server certificate lifetime of {0:?} is too short: it is renewed when a third of it \
         is left, so give at least {MIN_CERTIFICATE_LIFETIME:?}"
    )]
    Lifetime(std::time::Duration),
    /// Generating or signing the TLS material failed.
    #[error("TLS material: {0}")]
    Tls(#[from] rcgen::Error),
}
