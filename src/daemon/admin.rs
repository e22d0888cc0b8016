//! The admin socket (`run/admin.sock`): how local commands (`cotald space add|list`,
//! `cotald mint`) reach the running appliance. A Unix socket with mode 0600 in a 0700 data
//! dir: only the appliance's owner can talk to it, and that owner holds every key anyway.
//! One JSON request per connection, one JSON reply line back.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use super::{Core, DaemonError};
use crate::datadir::DataDir;
use crate::profile::DeploymentProfile;
use crate::space::MintRequest;

/// A request to the running appliance.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AdminRequest {
    /// Add and serve a space.
    SpaceAdd {
        /// The space name.
        name: String,
        /// Its deployment profile.
        profile: DeploymentProfile,
    },
    /// List the served spaces.
    SpaceList,
    /// Mint a credential.
    Mint(MintRequest),
}

/// The reply: `data` on success, `error` otherwise.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AdminReply {
    /// Whether the request succeeded.
    pub ok: bool,
    /// The result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The admin socket path of a data dir.
pub fn socket_path(dir: &DataDir) -> PathBuf {
    dir.run().join("admin.sock")
}

/// The listening side, owned by the appliance.
pub(crate) struct AdminServer {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    path: PathBuf,
}

impl AdminServer {
    pub(crate) fn start(core: Arc<Core>) -> Result<Self, DaemonError> {
        let path = socket_path(&core.dir);
        let fail = |reason: String| DaemonError::Admin {
            path: path.clone(),
            reason,
        };
        // A stale socket from a crashed run: we hold the data dir lock, so it is ours to remove.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| fail(e.to_string()))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| fail(e.to_string()))?;
        }
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = token.cancelled() => break,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            tokio::spawn(serve(core.clone(), stream));
                        }
                        Err(e) => tracing::warn!(error = %e, "admin socket accept failed"),
                    },
                }
            }
        });
        Ok(AdminServer { cancel, task, path })
    }

    pub(crate) async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The largest request accepted (a mint request with long channel lists fits easily).
const MAX_REQUEST: u64 = 64 * 1024;

async fn serve(core: Arc<Core>, stream: UnixStream) {
    // The socket's mode already confines it; the peer's uid is checked as well.
    // SAFETY: geteuid has no preconditions and cannot fail.
    let own = unsafe { libc::geteuid() };
    match stream.peer_cred() {
        Ok(cred) if cred.uid() == own => {}
        other => {
            tracing::warn!(peer = ?other, "admin socket: refused a connection from another user");
            return;
        }
    }
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        BufReader::new(read.take(MAX_REQUEST)).read_line(&mut line),
    )
    .await;
    if !matches!(read, Ok(Ok(_))) {
        return;
    }
    let reply = match serde_json::from_str::<AdminRequest>(&line) {
        Err(e) => failure(format!("malformed admin request: {e}")),
        Ok(req) => match handle(&core, req).await {
            Ok(data) => AdminReply {
                ok: true,
                data: Some(data),
                error: None,
            },
            Err(e) => failure(e.to_string()),
        },
    };
    let mut text = serde_json::to_string(&reply).unwrap_or_default();
    text.push('\n');
    let _ = write.write_all(text.as_bytes()).await;
}

fn failure(error: String) -> AdminReply {
    AdminReply {
        ok: false,
        data: None,
        error: Some(error),
    }
}

async fn handle(core: &Core, req: AdminRequest) -> Result<serde_json::Value, DaemonError> {
    let value = match req {
        AdminRequest::SpaceAdd { name, profile } => {
            serde_json::to_value(core.add_space(&name, profile).await?)
        }
        AdminRequest::SpaceList => serde_json::to_value(core.list_spaces().await?),
        AdminRequest::Mint(req) => serde_json::to_value(core.mint(&req).await?),
    };
    value.map_err(|e| DaemonError::Invalid(e.to_string()))
}

/// Why a call to the admin socket failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminCallError {
    /// The socket is there but the exchange failed.
    #[error("admin socket {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The appliance refused the request.
    #[error("{0}")]
    Refused(String),
    /// The reply is not what the protocol says.
    #[error("malformed reply from the appliance: {0}")]
    Malformed(String),
}

/// Sends one request to the appliance of `dir`. `Ok(None)` when no appliance listens there.
pub async fn call(
    dir: &DataDir,
    req: &AdminRequest,
) -> Result<Option<serde_json::Value>, AdminCallError> {
    let path = socket_path(dir);
    let stream = match UnixStream::connect(&path).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(source) => return Err(AdminCallError::Io { path, source }),
    };
    let io = |source| AdminCallError::Io {
        path: path.clone(),
        source,
    };
    let (read, mut write) = stream.into_split();
    let mut text =
        serde_json::to_string(req).map_err(|e| AdminCallError::Malformed(e.to_string()))?;
    text.push('\n');
    write.write_all(text.as_bytes()).await.map_err(io)?;
    let mut line = String::new();
    BufReader::new(read)
        .read_line(&mut line)
        .await
        .map_err(io)?;
    let reply: AdminReply =
        serde_json::from_str(&line).map_err(|e| AdminCallError::Malformed(e.to_string()))?;
    if reply.ok {
        Ok(Some(reply.data.unwrap_or_default()))
    } else {
        Err(AdminCallError::Refused(reply.error.unwrap_or_default()))
    }
}
