//! The server certificate kept valid while the appliance runs: issued at every start for the
//! profile's `certificate_lifetime` ([`crate::provision::TlsFiles`]), it is issued again when a
//! third of it is left, and the broker is told to reload (`$SYS.REQ.SERVER.<id>.RELOAD` over the
//! system account): new connections get the new certificate, connected clients keep theirs.
//! An appliance that runs longer than the lifetime therefore never reaches a cliff where every
//! client is refused. A renewal that fails is retried, and `status` says it is failing (with the
//! time the certificate ends) until one succeeds.
//!
//! The clock is the wall clock, read again at least every [`RECHECK`]: a laptop that slept
//! through the renewal time renews as soon as it wakes.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::backoff::Backoff;
use crate::provision::TlsFiles;
use crate::services::{Context, Health, Service, ServiceError};
use crate::supervisor::monitor::Monitor;

/// How long the renewal waits before it reads the clock again.
const RECHECK: Duration = Duration::from_secs(60);
/// How long the broker may take to answer a reload.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// The server certificate the broker presents, and what it is issued for.
#[derive(Debug, Clone)]
pub(crate) struct ServerCertificate {
    /// The TLS directory of the data dir (the CA's key is there).
    pub(crate) dir: PathBuf,
    /// The names it covers beyond the loopback ones.
    pub(crate) hostnames: Vec<String>,
    /// How long each one is valid.
    pub(crate) lifetime: Duration,
    /// When the one in place ends.
    pub(crate) expires: SystemTime,
}

impl ServerCertificate {
    /// When it is renewed: once a third of its lifetime is left.
    fn renew_at(&self) -> SystemTime {
        self.expires - self.lifetime / 3
    }
}

/// Renews the server certificate before it ends.
pub(super) struct CertificateRenewal {
    certificate: Mutex<ServerCertificate>,
    monitor: Monitor,
}

impl CertificateRenewal {
    pub(super) fn new(certificate: ServerCertificate, monitor: Monitor) -> Self {
        CertificateRenewal {
            certificate: Mutex::new(certificate),
            monitor,
        }
    }

    fn current(&self) -> ServerCertificate {
        self.certificate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Issues the certificate again and has the broker load it; only then is it the one in
    /// place (a reload that failed leaves the broker on the old one, and is tried again).
    async fn renew(&self) -> Result<SystemTime, ServiceError> {
        let old = self.current();
        let issued = TlsFiles::renew(&old.dir, &old.hostnames, old.lifetime)
            .map_err(ServiceError::at("issuing the server certificate again"))?;
        self.monitor
            .ask("RELOAD", serde_json::json!({}), RELOAD_TIMEOUT)
            .await
            .map_err(ServiceError::at(
                "having the broker load the renewed server certificate",
            ))?;
        self.certificate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .expires = issued.server_expires;
        Ok(issued.server_expires)
    }
}

impl Service for CertificateRenewal {
    fn name(&self) -> &'static str {
        "certificate"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let mut backoff = Backoff::default();
        loop {
            let due = self.current().renew_at();
            let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
            if !wait.is_zero() {
                ctx.report(Health::Running);
                tokio::select! {
                    () = ctx.cancelled() => return Ok(()),
                    () = tokio::time::sleep(wait.min(RECHECK)) => continue,
                }
            }
            match self.renew().await {
                Ok(expires) => {
                    backoff = Backoff::default();
                    tracing::info!(
                        expires = %crate::provision::rfc3339(unix_secs(expires)),
                        "server certificate renewed"
                    );
                }
                Err(e) => {
                    let ends = crate::provision::rfc3339(unix_secs(self.current().expires));
                    let reason = crate::ops::error_text(&e);
                    tracing::warn!(ends, reason, "the server certificate could not be renewed");
                    ctx.report(Health::Degraded(format!(
                        "the server certificate could not be renewed (the one in place ends \
                         {ends}): {reason}"
                    )));
                    tokio::select! {
                        () = ctx.cancelled() => return Ok(()),
                        () = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }
}

fn unix_secs(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
