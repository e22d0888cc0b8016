//! The broker's ports file (`<argv0>_<pid>.ports`): where a child that was told port 0 listens,
//! and the first sign that it does (the server writes it once its listeners are bound).
//!
//! A start waits for that file: on Linux the ports dir is watched with inotify, so the file is
//! read the moment the server closes it, not at the next turn of a poll (a warm start is a few
//! tens of milliseconds, and a poll of [`POLL`] waited up to its length and the timer's next
//! tick). Elsewhere, and if the watch cannot be made, the dir is read every [`POLL`].

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use super::ServerConf;

/// How often the ports dir is read when nothing tells of a write, and how often the start
/// checks that the child still runs.
pub(super) const POLL: Duration = Duration::from_millis(2);

/// Reads `<anything>_<pid>.ports` in `dir`: `{"nats": [url, …], "monitoring": [url]}` (the
/// latter only when the HTTP monitoring port is on). The server lists one client URL per
/// interface; the port is what counts, the host is ours.
pub(super) fn read(
    dir: &Path,
    conf: &ServerConf,
    pid: u32,
) -> Option<(SocketAddr, Option<SocketAddr>)> {
    let suffix = format!("_{pid}.ports");
    let entry = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(&suffix))?;
    let ports: serde_json::Value =
        serde_json::from_slice(&std::fs::read(entry.path()).ok()?).ok()?;
    let port = |key: &str| -> Option<u16> {
        let url = ports.get(key)?.get(0)?.as_str()?;
        url.rsplit_once(':')?.1.parse().ok()
    };
    let http_monitor = conf
        .monitor
        .and_then(|m| Some(SocketAddr::new(m.ip(), port("monitoring")?)));
    Some((SocketAddr::new(conf.host, port("nats")?), http_monitor))
}

/// Removes every ports file in `dir`.
pub(super) fn remove_all(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().ends_with(".ports") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Wakes when a file was written into the ports dir, or after [`POLL`] at most.
pub(super) struct Written {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    inotify: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
}

impl Written {
    /// Starts watching `dir`; made before the child is spawned, so no write is missed.
    pub(super) fn watch(dir: &Path) -> Written {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            let inotify = inotify(dir)
                .map_err(|e| tracing::debug!(dir = %dir.display(), error = %e, "ports dir not watched; read every 2 ms"))
                .ok();
            Written { inotify }
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = dir;
            Written {}
        }
    }

    /// Returns once a file in the dir was closed after writing or moved in since the last
    /// call ([`Wake::Written`]), or after [`POLL`] ([`Wake::Polled`]), whichever comes first.
    pub(super) async fn next(&mut self) -> Wake {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Some(fd) = &self.inotify {
            let written = async {
                let Ok(mut ready) = fd.readable().await else {
                    return std::future::pending().await;
                };
                // What was written does not matter, only that something was: the events are
                // read off and dropped.
                let mut buf = [0u8; 1024];
                while rustix::io::read(fd.get_ref(), &mut buf).is_ok_and(|n| n > 0) {}
                ready.clear_ready();
            };
            return match tokio::time::timeout(POLL, written).await {
                Ok(()) => Wake::Written,
                Err(_) => Wake::Polled,
            };
        }
        tokio::time::sleep(POLL).await;
        Wake::Polled
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
impl Drop for Written {
    /// Closes the watch on a blocking thread: the kernel ends an inotify instance only after a
    /// grace period of its own (`synchronize_srcu`), which measured 10 to 20 ms here, and a
    /// start must not wait for it.
    fn drop(&mut self) {
        if let Some(fd) = self.inotify.take() {
            let fd = fd.into_inner();
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || drop(fd))),
                Err(_) => drop(fd),
            }
        }
    }
}

/// Why [`Written::next`] returned.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Wake {
    /// A file was written into the dir.
    Written,
    /// [`POLL`] passed first (or the dir is not watched).
    Polled,
}

#[cfg(any(target_os = "linux", target_os = "android"))]
/// A non-blocking inotify descriptor watching `dir` for files closed after writing or moved in.
fn inotify(dir: &Path) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    use rustix::fs::inotify::{CreateFlags, WatchFlags, add_watch, init};
    let fd = init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?;
    add_watch(&fd, dir, WatchFlags::CLOSE_WRITE | WatchFlags::MOVED_TO)?;
    // SAFETY: the AsyncFd owns the descriptor from here on; an OwnedFd always names it.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    }?;
    Ok(registered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[tokio::test]
    async fn a_file_written_into_the_dir_wakes_the_watch() {
        let dir = tempfile::tempdir().unwrap();
        let mut written = Written::watch(dir.path());
        assert_eq!(written.next().await, Wake::Polled, "nothing was written");
        std::fs::write(dir.path().join("nats-server_1.ports"), b"{}").unwrap();
        assert_eq!(written.next().await, Wake::Written);
        // The events were taken: the next call waits again.
        assert_eq!(
            written.next().await,
            Wake::Polled,
            "an old write woke it again"
        );
        // Written elsewhere (a dir inside is not watched), then moved in.
        std::fs::create_dir(dir.path().join("elsewhere")).unwrap();
        let outside = dir.path().join("elsewhere/x");
        std::fs::write(&outside, b"{}").unwrap();
        assert_eq!(
            written.next().await,
            Wake::Polled,
            "a write elsewhere woke it"
        );
        std::fs::rename(&outside, dir.path().join("nats-server_2.ports")).unwrap();
        assert_eq!(written.next().await, Wake::Written, "a file moved in");
    }
}
