//! The admin socket (`run/admin.sock`): how local commands (`cotald space`, `mint`, `revoke`,
//! …) reach the running appliance. One of the two transports of [`crate::ops`]: a Unix
//! socket with mode 0600 in a 0700 data dir, so only the appliance's owner can talk to it, and
//! that owner holds every key anyway. One JSON request line per connection (`{op, args}`), one
//! [`ControlReply`] line back.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::task::TaskTracker;

use super::{Core, DaemonError};
use crate::datadir::DataDir;
use crate::ops::{OpError, Request, Transport};
use crate::protocol::ControlReply;
use crate::services::{Context, Health, Service, ServiceError};

/// The largest request accepted (a mint request with long channel lists fits easily).
const MAX_REQUEST: u64 = 64 * 1024;
/// How long a connection may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The listening side, a service of the appliance.
pub(super) struct AdminSocket {
    core: Arc<Core>,
    listener: std::sync::Mutex<Option<UnixListener>>,
    path: PathBuf,
}

impl AdminSocket {
    /// Binds the socket (owner-only). A stale socket of a crashed run is removed first: the
    /// caller holds the data dir lock, so it is ours.
    pub(super) fn bind(core: Arc<Core>) -> Result<Self, DaemonError> {
        let path = core.dir.admin_socket();
        let fail = |source| DaemonError::Admin {
            path: path.clone(),
            source,
        };
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(fail)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(fail)?;
        }
        Ok(AdminSocket {
            core,
            listener: std::sync::Mutex::new(Some(listener)),
            path,
        })
    }
}

impl Service for AdminSocket {
    fn name(&self) -> &'static str {
        "admin-socket"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let listener = match self.listener.lock().ok().and_then(|mut l| l.take()) {
            Some(l) => l,
            // A restart after a failure: bind again.
            None => UnixListener::bind(&self.path)
                .map_err(ServiceError::at("binding the admin socket"))?,
        };
        ctx.report(Health::Running);
        let connections = TaskTracker::new();
        let outcome = loop {
            tokio::select! {
                () = ctx.cancelled() => break Ok(()),
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let core = self.core.clone();
                        let token = ctx.token().clone();
                        connections.spawn(async move {
                            tokio::select! {
                                () = serve(core, stream) => {}
                                () = token.cancelled() => {}
                            }
                        });
                    }
                    Err(e) => break Err(ServiceError::new("accepting on the admin socket", e)),
                },
            }
        };
        connections.close();
        connections.wait().await;
        drop(listener);
        let _ = std::fs::remove_file(&self.path);
        outcome
    }
}

async fn serve(core: Arc<Core>, stream: UnixStream) {
    // The socket's mode already confines it; the peer's uid is checked as well.
    let own = rustix::process::geteuid().as_raw();
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
        READ_TIMEOUT,
        BufReader::new(read.take(MAX_REQUEST)).read_line(&mut line),
    )
    .await;
    if !matches!(read, Ok(Ok(_))) {
        return;
    }
    let reply = match Request::from_json(&line) {
        Err(e) => crate::ops::reply::<(), _>(Err(e)),
        Ok(req) if !req.served_on(Transport::AdminSocket) => {
            crate::ops::reply::<(), _>(Err(OpError::WrongTransport {
                op: req.op(),
                transport: "the admin socket (it is an identity's op on ctl.manager)",
            }))
        }
        Ok(req) => {
            let op = req.op();
            let result = core.execute(req).await;
            if let Err(e) = &result {
                tracing::info!(op, error = %crate::ops::error_text(e), "admin request refused");
            }
            crate::ops::reply(result)
        }
    };
    let mut text = serde_json::to_string(&reply).unwrap_or_default();
    text.push('\n');
    let _ = write.write_all(text.as_bytes()).await;
}

/// Why a call to the admin socket failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminCallError {
    /// The socket is there but the exchange failed.
    #[error("admin socket {path}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The appliance refused the request.
    #[error("{0}")]
    Refused(String),
    /// The reply is not what the protocol says.
    #[error("malformed reply from the appliance")]
    Malformed(#[source] serde_json::Error),
    /// The appliance closed the connection without answering: it stopped meanwhile.
    #[error(
        "the appliance stopped before it answered `{op}` (its log says why); nothing of it \
         can be relied on: ask again once `cotald status` says it runs"
    )]
    Closed {
        /// The op asked.
        op: &'static str,
    },
}

/// Sends one request to the appliance of `dir`: the reply's `data`, or `Ok(None)` when no
/// appliance listens there.
pub async fn call(
    dir: &DataDir,
    req: &Request,
) -> Result<Option<serde_json::Value>, AdminCallError> {
    let path = dir.admin_socket();
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
    let mut text = serde_json::to_string(req).map_err(AdminCallError::Malformed)?;
    text.push('\n');
    write.write_all(text.as_bytes()).await.map_err(io)?;
    let mut line = String::new();
    BufReader::new(read)
        .read_line(&mut line)
        .await
        .map_err(io)?;
    if line.is_empty() {
        return Err(AdminCallError::Closed { op: req.op() });
    }
    let reply: ControlReply = serde_json::from_str(&line).map_err(AdminCallError::Malformed)?;
    if reply.ok {
        Ok(Some(reply.data.unwrap_or_default()))
    } else {
        Err(AdminCallError::Refused(reply.error.unwrap_or_default()))
    }
}
