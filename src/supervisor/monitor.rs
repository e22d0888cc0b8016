//! The broker's monitoring endpoint (loopback HTTP): readiness and health (`/healthz`) and
//! identity (`/varz`). A dozen lines of HTTP/1.0 are enough for two local GETs; no HTTP stack
//! needed.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One GET's outcome: status code and body.
#[derive(Debug)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// Response body.
    pub body: String,
}

/// GETs `path` from the monitoring listener at `addr`, bounded by `timeout`.
pub async fn get(addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<Response> {
    tokio::time::timeout(timeout, async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other("malformed HTTP response"))?;
        Ok(Response {
            status,
            body: body.to_owned(),
        })
    })
    .await
    .map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::TimedOut, "monitoring request timed out")
    })?
}

/// Why `/healthz` did not say healthy; the text is the reason the supervisor logs and records
/// when it restarts the broker for it.
#[derive(Debug, thiserror::Error)]
pub enum HealthFailure {
    /// The broker answered, and not with 200 (JetStream disabled after a write failed, such as
    /// a full disk, or not recovered).
    #[error("unhealthy: /healthz answered {status}: {said}")]
    Unhealthy {
        /// The HTTP status.
        status: u16,
        /// Its `error` field, else the body (at most [`SAID_MAX`] characters).
        said: String,
    },
    /// Nothing came back in time (a stopped or wedged broker: the kernel still accepts the
    /// connection on its behalf).
    #[error("unresponsive: no answer to /healthz within {timeout:?}")]
    NoAnswer {
        /// The probe's bound.
        timeout: Duration,
    },
    /// The monitoring listener could not be reached or hung up.
    #[error("unresponsive: /healthz: {0}")]
    Unreachable(std::io::Error),
}

/// How much of an unhealthy answer is kept.
pub const SAID_MAX: usize = 200;

/// What is asked: the server and its JetStream, not every account's streams
/// (`js-server-only`). An account the resolver cannot load (a damaged file in `jwt/`) or one
/// stream that cannot be recovered fails the full check, yet the broker serves everything
/// else; cotald pushes every account right after readiness (which repairs the resolver's
/// copy) and reports a space it cannot serve on its own. Restarting the broker cures neither.
const HEALTHZ: &str = "/healthz?js-server-only=true";

/// Asks `/healthz` once, bounded by `timeout`: `Ok` when it answers 200 (the server and
/// JetStream are up).
pub async fn check(addr: SocketAddr, timeout: Duration) -> Result<(), HealthFailure> {
    match get(addr, HEALTHZ, timeout).await {
        Ok(r) if r.status == 200 => Ok(()),
        Ok(r) => {
            let said = serde_json::from_str::<serde_json::Value>(&r.body)
                .ok()
                .and_then(|v| v.get("error")?.as_str().map(str::to_owned))
                .unwrap_or_else(|| r.body.trim().to_owned());
            Err(HealthFailure::Unhealthy {
                status: r.status,
                said: said.chars().take(SAID_MAX).collect(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            Err(HealthFailure::NoAnswer { timeout })
        }
        Err(e) => Err(HealthFailure::Unreachable(e)),
    }
}

/// Whether `/healthz` answers 200 within 2 s.
pub async fn healthy(addr: SocketAddr) -> bool {
    check(addr, Duration::from_secs(2)).await.is_ok()
}

/// The `version` reported by `/varz`.
pub async fn version(addr: SocketAddr) -> Option<String> {
    let resp = get(addr, "/varz", Duration::from_secs(2)).await.ok()?;
    let varz: serde_json::Value = serde_json::from_str(&resp.body).ok()?;
    varz.get("version")?.as_str().map(str::to_owned)
}
