//! A broker of this data dir that outlived its cotald: `up` ends it before starting its own.
//!
//! The parent-death signal (SIGKILL, see the parent module) makes this rare, but not
//! impossible: a broker started by an earlier cotald that asked for SIGTERM may still be
//! shutting down its JetStream, and a broker can be started by hand on the data dir's config.
//! Such a process holds the ports and the JetStream store, so the next start would fail with
//! "port in use" or fight over the store.
//!
//! The candidates are the pids the brokers of this data dir recorded themselves: the ports
//! files (`<argv0>_<pid>.ports`) in the ports file dir, which a broker deletes only at the very
//! end of its shutdown and cotald only right before spawning a child. A pid is ours only when
//! `/proc/<pid>` shows our executable (its `exe` link or its `argv[0]`) run with `-c` and our
//! config path: pids are reused, and a process that is not ours is never signalled. The check
//! is repeated through a pidfd, which pins the process, so the signals cannot reach a process
//! that took the pid meanwhile. The leftover gets SIGTERM (it may flush), then SIGKILL after
//! [`STOP_DEADLINE`]: it is already the remains of a crash, and `up` must not hang on it.
//!
//! A broker killed with its cotald a moment ago may still be in its exit: its command line is
//! gone (it can no longer be told to be ours) while its files, its listening sockets among
//! them, are still being closed, so an `up` right after the kill found the port taken. A
//! recorded pid whose process is exiting is therefore waited for (never signalled), at most
//! [`KILL_WAIT`].
//!
//! Where there is no `/proc` and no pidfd (macOS, the BSDs), a recorded pid cannot be told
//! from a process that reused it, so nothing is signalled: a live recorded pid is reported,
//! and a start that then finds its port taken says so (the lifeline of `parent_death.rs`
//! makes such a leftover the rarer there).

#[cfg(any(target_os = "linux", target_os = "android"))]
use std::os::fd::OwnedFd;
use std::path::Path;
#[cfg(any(target_os = "linux", target_os = "android"))]
use std::path::PathBuf;
#[cfg(any(target_os = "linux", target_os = "android"))]
use std::time::Duration;

#[cfg(any(target_os = "linux", target_os = "android"))]
use rustix::process::Signal;
#[cfg(any(target_os = "linux", target_os = "android"))]
use tokio::io::unix::AsyncFd;

#[cfg(any(target_os = "linux", target_os = "android"))]
/// How long a leftover broker may take to stop after SIGTERM before it is killed.
const STOP_DEADLINE: Duration = Duration::from_secs(5);
#[cfg(any(target_os = "linux", target_os = "android"))]
/// How long to wait for a killed leftover to be gone.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Ends every broker that `executable -c conf` left running, as recorded in `ports_dir`.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(super) async fn end_leftovers(ports_dir: &Path, executable: &Path, conf: &Path) {
    for pid in recorded_pids(ports_dir) {
        if pid == std::process::id() {
            continue;
        }
        let ended = if is_our_broker(pid, executable, conf) {
            end(pid, executable, conf).await
        } else if is_exiting(pid) {
            // A broker killed with its cotald (the parent-death signal) is still closing its
            // files, its listening sockets among them, after its command line is gone: it
            // cannot be told to be ours any more, yet holds the ports a moment longer. Nothing
            // is sent to it; only its end is awaited.
            exited(pid).await
        } else {
            continue;
        };
        if let Err(e) = ended {
            tracing::warn!(
                pid,
                error = %e,
                "cannot end the nats-server of this data dir that was left running"
            );
        }
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
/// `PF_EXITING` of `/proc/<pid>/stat`'s flags: the process has begun its exit.
const PF_EXITING: u64 = 0x4;

#[cfg(any(target_os = "linux", target_os = "android"))]
/// Whether `pid` is a process in its exit: `PF_EXITING` in its flags, or already a zombie.
fn is_exiting(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The fields after the command name, which is in parentheses and may hold anything: the
    // state (field 3 of proc(5)) first, the flags (field 9) seventh.
    let Some((_, fields)) = stat.rsplit_once(')') else {
        return false;
    };
    let fields: Vec<&str> = fields.split_whitespace().collect();
    let zombie = matches!(fields.first(), Some(&"Z" | &"X"));
    let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0);
    zombie || flags & PF_EXITING != 0
}

#[cfg(any(target_os = "linux", target_os = "android"))]
/// Waits, through a pidfd, until `pid` has exited (its files closed), at most [`KILL_WAIT`].
async fn exited(pid: u32) -> std::io::Result<()> {
    match pin(pid)? {
        Some(exited) => gone(&exited, "still exiting").await,
        None => Ok(()),
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
/// Waits until the process of `pidfd` has exited, at most [`KILL_WAIT`]; after that, an error
/// saying it is `still` there.
async fn gone(pidfd: &AsyncFd<OwnedFd>, still: &str) -> std::io::Result<()> {
    let _exited = tokio::time::timeout(KILL_WAIT, pidfd.readable())
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{still} (waited {KILL_WAIT:?})"),
            )
        })??;
    Ok(())
}

#[cfg(any(target_os = "linux", target_os = "android"))]
/// A pidfd of `pid`, readable once it has exited; `None` when there is no such process.
fn pin(pid: u32) -> std::io::Result<Option<AsyncFd<OwnedFd>>> {
    use rustix::process::{Pid, PidfdFlags};
    let Some(pinned) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return Ok(None);
    };
    let pidfd = match rustix::process::pidfd_open(pinned, PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    // SAFETY: the AsyncFd owns the descriptor from here on; an OwnedFd always names it.
    let registered =
        unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }?;
    Ok(Some(registered))
}

/// Reports the live pids that brokers of this data dir recorded: without `/proc` they cannot be
/// checked to be ours, so they are left alone.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(super) async fn end_leftovers(ports_dir: &Path, _executable: &Path, conf: &Path) {
    for pid in recorded_pids(ports_dir) {
        // SAFETY: signal 0 sends nothing; it asks whether the pid exists.
        let alive = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .is_some_and(|pid| rustix::process::test_kill_process(pid).is_ok());
        if pid != std::process::id() && alive {
            tracing::warn!(
                pid,
                conf = %conf.display(),
                "a process runs with the pid a nats-server of this data dir recorded; cotald \
                 cannot check on this system that it is that broker, so it is left alone \
                 (stop it if it is)"
            );
        }
    }
}

/// The pids named by the ports files in `dir`.
fn recorded_pids(dir: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".ports")?
                .rsplit_once('_')?
                .1
                .parse()
                .ok()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

#[cfg(any(target_os = "linux", target_os = "android"))]
/// Whether `pid` runs `executable` (its `exe`, or its `argv[0]`) with `-c conf`: a broker of
/// this data dir. Relative paths on its command line are taken from its working directory.
fn is_our_broker(pid: u32, executable: &Path, conf: &Path) -> bool {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let Ok(cmdline) = std::fs::read(proc.join("cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .collect();
    let cwd = std::fs::read_link(proc.join("cwd")).ok();
    let resolve = |arg: &[u8]| {
        use std::os::unix::ffi::OsStrExt;
        let path = Path::new(std::ffi::OsStr::from_bytes(arg));
        canonical(&match &cwd {
            Some(cwd) if path.is_relative() => cwd.join(path),
            _ => path.to_owned(),
        })
    };
    let executable = canonical(executable);
    let exe_matches = std::fs::read_link(proc.join("exe")).is_ok_and(|exe| {
        // A binary replaced since it was started shows as "<path> (deleted)".
        let text = exe.to_string_lossy();
        canonical(Path::new(text.strip_suffix(" (deleted)").unwrap_or(&text))) == executable
    });
    let argv0_matches = args.first().is_some_and(|a| resolve(a) == executable);
    let conf = canonical(conf);
    let conf_matches = args
        .windows(2)
        .any(|w| w[0] == b"-c" && resolve(w[1]) == conf);
    (exe_matches || argv0_matches) && conf_matches
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
}

#[cfg(any(target_os = "linux", target_os = "android"))]
/// SIGTERM, then SIGKILL after [`STOP_DEADLINE`], through a pidfd. A pid that is gone, or
/// turns out not to be ours once pinned, is left alone.
async fn end(pid: u32, executable: &Path, conf: &Path) -> std::io::Result<()> {
    let Some(exited) = pin(pid)? else {
        return Ok(());
    };
    if !is_our_broker(pid, executable, conf) {
        return Ok(());
    }
    tracing::warn!(
        pid,
        conf = %conf.display(),
        "a nats-server of this data dir was left running; stopping it (SIGTERM)"
    );
    send(&exited, Signal::TERM)?;
    if tokio::time::timeout(STOP_DEADLINE, exited.readable())
        .await
        .is_ok()
    {
        tracing::info!(pid, "the nats-server left running has stopped");
        return Ok(());
    }
    tracing::warn!(
        pid,
        deadline = ?STOP_DEADLINE,
        "the nats-server left running ignored SIGTERM; killing it"
    );
    send(&exited, Signal::KILL)?;
    gone(&exited, "still there after SIGKILL").await?;
    tracing::info!(pid, "the nats-server left running was killed");
    Ok(())
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn send(pidfd: &AsyncFd<OwnedFd>, signal: Signal) -> std::io::Result<()> {
    match rustix::process::pidfd_send_signal(pidfd.get_ref(), signal) {
        // Exited meanwhile: what we wanted.
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_process_that_is_not_our_broker_is_not_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let conf = tmp.path().join("nats-server.conf");
        std::fs::write(&conf, "").unwrap();
        let me = std::process::id();
        let exe = std::env::current_exe().unwrap();
        // Our own executable, but not run with our config.
        assert!(!is_our_broker(me, &exe, &conf));
        // Another executable.
        assert!(!is_our_broker(me, Path::new("/usr/bin/nats-server"), &conf));
        // No such process (pid 0 has no /proc entry).
        assert!(!is_our_broker(0, &exe, &conf));
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn a_process_in_its_exit_is_exiting_and_a_running_one_is_not() {
        use rustix::process::{Pid, WaitId, WaitIdOptions, waitid};
        assert!(!is_exiting(std::process::id()), "this test is running");
        assert!(!is_exiting(0), "no such process");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = Pid::from_raw(child.id() as i32).unwrap();
        // Waits for its exit without reaping it: a zombie until `wait` below.
        waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        )
        .unwrap();
        assert!(is_exiting(child.id()), "an exited, unreaped child");
        child.wait().unwrap();
        assert!(!is_exiting(child.id()), "reaped: no such process");
    }

    #[test]
    fn recorded_pids_are_read_from_ports_file_names() {
        let tmp = tempfile::tempdir().unwrap();
        for name in [
            "nats-server_12.ports",
            "nats_server_7.ports",
            "x_abc.ports",
            "nats-server_9.conf",
        ] {
            std::fs::write(tmp.path().join(name), "{}").unwrap();
        }
        assert_eq!(recorded_pids(tmp.path()), [7, 12]);
        assert!(recorded_pids(&tmp.path().join("missing")).is_empty());
    }
}
