//! What the broker says of itself, asked over the system account (`$SYS.REQ.SERVER.<id>.…`):
//! health (`HEALTHZ`), identity and load (`VARZ`), JetStream figures (`JSZ`). These are the
//! monitoring endpoint's answers without its listener: the broker's HTTP monitoring port has
//! no authentication, so anyone on the host could read every connection's user, name and
//! subscriptions from it; the system user's connection is TLS and authenticated like every
//! other (§9). The HTTP port is off unless the profile turns it on (`broker.monitor`).
//!
//! One connection serves the whole life of the appliance: it reconnects to a restarted
//! broker on the same port (quickly: [`RECONNECT_EVERY`]), never to a peer of a cluster (the
//! health asked for is this node's), and each request names the server it is connected to at
//! that moment. It is the appliance's only connection as the system user: the spaces' account
//! JWTs are pushed over it too ([`Monitor::system`]), so the start dials it once, while it
//! waits for the broker to be ready.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::binding::Creds;
use crate::dial::{DialError, nats_options};

/// How often the connection tries again while the broker is restarting.
pub const RECONNECT_EVERY: Duration = Duration::from_millis(50);

/// How long the monitor waits before its connection's `attempts`-th try: none before the
/// first (async-nats waits before every try, the first of a connect too: a fixed delay there
/// held every start of the appliance for [`RECONNECT_EVERY`] after the broker was ready), then
/// [`RECONNECT_EVERY`].
fn monitor_reconnect_delay(attempts: usize) -> Duration {
    match attempts {
        0 | 1 => Duration::ZERO,
        _ => RECONNECT_EVERY,
    }
}

/// The appliance's connection for asking the broker about itself.
#[derive(Debug, Clone)]
pub struct Monitor {
    nats: async_nats::Client,
}

/// Why the broker did not answer a question about itself.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// Nothing came back in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The request could not be sent, or nobody answers it (the connection is down).
    #[error("{0}")]
    Request(#[source] async_nats::RequestError),
    /// The broker answered with an error.
    #[error("the broker refused: {0}")]
    Refused(String),
    /// The answer was not the JSON asked for.
    #[error("an answer that is not JSON: {0}")]
    Malformed(#[source] serde_json::Error),
}

/// Why `HEALTHZ` did not say healthy; the text is the reason the supervisor logs and records
/// when it restarts the broker for it.
#[derive(Debug, thiserror::Error)]
pub enum HealthFailure {
    /// The broker answered, and not healthy (JetStream disabled after a write failed, such as
    /// a full disk, or not recovered).
    #[error("unhealthy: HEALTHZ answered {status}: {said}")]
    Unhealthy {
        /// The status code it gave.
        status: u64,
        /// Its error, else the whole answer (at most [`SAID_MAX`] characters).
        said: String,
    },
    /// Nothing came back in time (a stopped or wedged broker: the kernel still accepts the
    /// connection on its behalf).
    #[error("unresponsive: no answer to HEALTHZ within {timeout:?}")]
    NoAnswer {
        /// The probe's bound.
        timeout: Duration,
    },
    /// The question could not be asked (the connection is down).
    #[error("unresponsive: HEALTHZ: {0}")]
    Unreachable(#[source] AskError),
}

/// How much of an unhealthy answer is kept.
pub const SAID_MAX: usize = 200;

impl Monitor {
    /// Connects as the system user (`creds`) to the broker's client port `addr`, trusting `ca`.
    pub async fn connect(creds: &Creds, ca: &Path, addr: SocketAddr) -> Result<Self, DialError> {
        let nats = nats_options(creds, "cotald-system", Some(ca), true)?
            .ignore_discovered_servers()
            .reconnect_delay_callback(monitor_reconnect_delay)
            .connect(format!("tls://{addr}"))
            .await?;
        Ok(Monitor { nats })
    }

    /// The system user's connection itself, for what the appliance asks of the system
    /// account beyond the server's own state (an account JWT pushed to the resolver).
    pub fn system(&self) -> &async_nats::Client {
        &self.nats
    }

    /// Asks `$SYS.REQ.SERVER.<id>.<what>` of the server this connection is on, bounded by
    /// `timeout`; the answer's `data`.
    pub async fn ask(
        &self,
        what: &str,
        options: Value,
        timeout: Duration,
    ) -> Result<Value, AskError> {
        let id = self.nats.server_info().server_id;
        let subject = crate::binding::system::server_request(&id, what);
        let request = self.nats.request(subject, options.to_string().into());
        let reply = tokio::time::timeout(timeout, request)
            .await
            .map_err(|_| AskError::Timeout(timeout))?
            .map_err(AskError::Request)?;
        let mut answer: Value =
            serde_json::from_slice(&reply.payload).map_err(AskError::Malformed)?;
        if let Some(error) = answer.get("error").filter(|e| e.is_object()) {
            let said = error["description"]
                .as_str()
                .map_or_else(|| error.to_string(), str::to_owned);
            return Err(AskError::Refused(said));
        }
        Ok(answer["data"].take())
    }

    /// Asks `HEALTHZ` once, bounded by `timeout`: `Ok` when the server and its JetStream are
    /// up. Only those are asked (`js-server-only`): an account the resolver cannot load (a
    /// damaged file in `jwt/`) or one stream that cannot be recovered fails the full check,
    /// yet the broker serves everything else; cotald pushes every account right after
    /// readiness (which repairs the resolver's copy) and reports a space it cannot serve on
    /// its own. Restarting the broker cures neither.
    pub async fn check(&self, timeout: Duration) -> Result<(), HealthFailure> {
        let options = serde_json::json!({ "js-server-only": true });
        match self.ask("HEALTHZ", options, timeout).await {
            Ok(data) if data["status"] == "ok" => Ok(()),
            Ok(data) => {
                let said = data["error"]
                    .as_str()
                    .map_or_else(|| data.to_string(), str::to_owned);
                Err(HealthFailure::Unhealthy {
                    status: data["status_code"].as_u64().unwrap_or(0),
                    said: said.chars().take(SAID_MAX).collect(),
                })
            }
            Err(AskError::Timeout(_)) => Err(HealthFailure::NoAnswer { timeout }),
            Err(AskError::Refused(said)) => Err(HealthFailure::Unhealthy {
                status: 0,
                said: said.chars().take(SAID_MAX).collect(),
            }),
            Err(e) => Err(HealthFailure::Unreachable(e)),
        }
    }

    /// Whether `HEALTHZ` says healthy within 2 s.
    pub async fn healthy(&self) -> bool {
        self.check(Duration::from_secs(2)).await.is_ok()
    }

    /// The broker's `VARZ` (version, uptime, memory, connections …), bounded by `timeout`.
    pub async fn varz(&self, timeout: Duration) -> Result<Value, AskError> {
        self.ask("VARZ", serde_json::json!({}), timeout).await
    }

    /// The broker's `JSZ`, with each account's streams when `streams` is set, bounded by
    /// `timeout`.
    pub async fn jsz(&self, streams: bool, timeout: Duration) -> Result<Value, AskError> {
        let options = serde_json::json!({ "accounts": streams, "streams": streams });
        self.ask("JSZ", options, timeout).await
    }
}
