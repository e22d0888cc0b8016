//! The one connect sequence of cotald, for its own connections (the system user that pushes
//! accounts and asks the broker for its health, each space's provisioner, the trusted readers)
//! and for every client: the credential, TLS verified against the appliance's CA, a bounded
//! connect timeout (§2, §9: every connection is authenticated and encrypted).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::binding::Creds;

/// Why dialing the broker failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The credential's seed is not a valid nkey seed.
    #[error("the credential cannot be loaded")]
    Credentials(#[source] nkeys::error::Error),
    /// The connection failed (unreachable, TLS, authorization).
    #[error(transparent)]
    Connect(#[from] async_nats::ConnectError),
}

/// The connect options every connection starts from: the credential, TLS verified against
/// `ca`, a bounded connect timeout.
///
/// The credential is handed over as its JWT and a signer of the server's nonce, not as
/// `.creds` text: the library would parse that text back with a regular expression it
/// compiles at its first use, about a millisecond of every process's first connect.
pub fn nats_options(
    creds: &Creds,
    name: impl Into<String>,
    ca: Option<&Path>,
    require_tls: bool,
) -> Result<async_nats::ConnectOptions, DialError> {
    let key = Arc::new(nkeys::KeyPair::from_seed(&creds.seed).map_err(DialError::Credentials)?);
    let sign = move |nonce: Vec<u8>| {
        let key = key.clone();
        async move { key.sign(&nonce).map_err(async_nats::AuthError::new) }
    };
    let mut options = async_nats::ConnectOptions::with_jwt(creds.jwt.clone(), sign)
        .name(name.into())
        .connection_timeout(Duration::from_secs(10))
        .require_tls(require_tls);
    if let Some(ca) = ca {
        options = options.add_root_certificates(ca.to_owned());
    }
    Ok(options)
}

/// Dials the appliance's own broker at `addr` (TLS, trusting `ca`) as `creds`.
pub async fn dial(
    creds: &Creds,
    name: impl Into<String>,
    ca: &Path,
    addr: SocketAddr,
) -> Result<async_nats::Client, DialError> {
    Ok(nats_options(creds, name, Some(ca), true)?
        .connect(format!("tls://{addr}"))
        .await?)
}
