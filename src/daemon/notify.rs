//! Readiness notification to a service manager: the `sd_notify` protocol behind systemd's
//! `Type=notify` (see `sd_notify(3)`), so `systemctl start cotald` returns once clients can
//! connect, and units ordered `After=cotald.service` start only then.
//!
//! The protocol is one Unix datagram per notification, sent to the socket named by
//! `$NOTIFY_SOCKET`, holding newline-separated `KEY=value` assignments. cotald sends:
//!
//! - `STATUS=…` while it starts (what `systemctl status` shows);
//! - `READY=1` with a `STATUS=` line, only once the broker answers `HEALTHZ`, every space is
//!   served and the ready banner is printed (the end of [`Appliance::start`](super::Appliance));
//! - `STOPPING=1` when its teardown begins, whatever asked for it (a signal, `cotald down`).
//!
//! Why the socket directly rather than a crate: the protocol is a datagram to an address, which
//! the standard library sends in a few lines on every Unix; there is nothing else to carry. The
//! address is a path or, on Linux, an abstract name (`@…`); any other form (`vsock:…`) is
//! logged and ignored. Without `$NOTIFY_SOCKET` every call does nothing, so a terminal, Docker
//! or launchd run is unchanged. A notification that cannot be sent is logged, never fatal:
//! the appliance serves either way, and the manager's start timeout reports a missing `READY`.
//!
//! The broker child must not inherit the variable (it is not the main process of the unit,
//! and a manager with `NotifyAccess=all` would take its messages for ours): the supervisor
//! removes it from the child's environment.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The environment variable naming the service manager's socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Where notifications go; nowhere when no service manager asked for them.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
}

impl Notifier {
    /// The notifier `$NOTIFY_SOCKET` asks for, or one that sends nothing.
    pub fn from_env() -> Self {
        let Some(value) = std::env::var_os(NOTIFY_SOCKET) else {
            return Self::none();
        };
        let target = parse_address(value.as_encoded_bytes()).and_then(|addr| {
            let socket = UnixDatagram::unbound()?;
            Ok((socket, addr))
        });
        match target {
            Ok(target) => Self {
                target: Some(target),
            },
            Err(e) => {
                tracing::warn!(
                    socket = %value.to_string_lossy(),
                    error = %e,
                    "NOTIFY_SOCKET is not usable; the service manager will not be told of readiness"
                );
                Self::none()
            }
        }
    }

    /// A notifier that sends nothing.
    pub fn none() -> Self {
        Self { target: None }
    }

    /// What the appliance is doing, for `systemctl status`.
    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }

    /// The appliance serves: clients can connect to every served space.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// The appliance has begun to stop.
    pub fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=stopping");
    }

    fn send(&self, message: &str) {
        let Some((socket, addr)) = &self.target else {
            return;
        };
        if let Err(e) = socket.send_to_addr(message.as_bytes(), addr) {
            tracing::warn!(error = %e, message, "cannot notify the service manager");
        }
    }
}

/// A `$NOTIFY_SOCKET` value as a socket address: an absolute path, or `@name` for a Linux
/// abstract socket.
fn parse_address(value: &[u8]) -> std::io::Result<SocketAddr> {
    match value.first() {
        Some(b'/') => {
            let path = std::path::Path::new(std::ffi::OsStr::from_bytes(value));
            SocketAddr::from_pathname(path)
        }
        Some(b'@') => abstract_address(&value[1..]),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "only a socket path or an @abstract name is supported",
        )),
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn abstract_address(name: &[u8]) -> std::io::Result<SocketAddr> {
    #[cfg(target_os = "android")]
    use std::os::android::net::SocketAddrExt;
    #[cfg(target_os = "linux")]
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name)
}

/// Abstract sockets are a Linux namespace; elsewhere no service manager names one.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn abstract_address(_name: &[u8]) -> std::io::Result<SocketAddr> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "abstract socket names exist only on Linux",
    ))
}

/// A newline would start a new assignment: a status is one line.
fn one_line(status: &str) -> String {
    status.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receiver() -> (tempfile::TempDir, std::path::PathBuf, UnixDatagram) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        (dir, path, socket)
    }

    fn received(socket: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    fn notifier_for(path: &std::path::Path) -> Notifier {
        Notifier {
            target: Some((
                UnixDatagram::unbound().unwrap(),
                parse_address(path.as_os_str().as_bytes()).unwrap(),
            )),
        }
    }

    #[test]
    fn sends_each_notification_as_one_datagram_to_a_path() {
        let (_dir, path, socket) = receiver();
        let notifier = notifier_for(&path);
        notifier.status("starting the broker");
        notifier.ready("serving 1 space\non 127.0.0.1:4222");
        notifier.stopping();
        assert_eq!(received(&socket), "STATUS=starting the broker");
        assert_eq!(
            received(&socket),
            "READY=1\nSTATUS=serving 1 space on 127.0.0.1:4222"
        );
        assert_eq!(received(&socket), "STOPPING=1\nSTATUS=stopping");
    }

    #[test]
    fn a_relative_or_foreign_address_is_refused() {
        for value in ["relative.sock", "vsock:2:1234", ""] {
            let err = parse_address(value.as_bytes()).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::Unsupported, "{value}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_abstract_name_is_reached_on_linux() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("cotald-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        socket
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let notifier = Notifier {
            target: Some((
                UnixDatagram::unbound().unwrap(),
                parse_address(format!("@{name}").as_bytes()).unwrap(),
            )),
        };
        notifier.stopping();
        assert_eq!(received(&socket), "STOPPING=1\nSTATUS=stopping");
    }
}
