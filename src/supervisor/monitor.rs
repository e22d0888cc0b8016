//! The broker's monitoring endpoint (loopback HTTP): readiness (`/healthz`) and identity
//! (`/varz`). A dozen lines of HTTP/1.0 are enough for two local GETs; no HTTP stack needed.

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

/// Whether `/healthz` answers 200 (the server and JetStream are up).
pub async fn healthy(addr: SocketAddr) -> bool {
    get(addr, "/healthz", Duration::from_secs(2))
        .await
        .is_ok_and(|r| r.status == 200)
}

/// The `version` reported by `/varz`.
pub async fn version(addr: SocketAddr) -> Option<String> {
    let resp = get(addr, "/varz", Duration::from_secs(2)).await.ok()?;
    let varz: serde_json::Value = serde_json::from_str(&resp.body).ok()?;
    varz.get("version")?.as_str().map(str::to_owned)
}
