//! The broker dies with cotald, on every platform (see "The child dies with cotald" in the
//! parent module for why SIGKILL).
//!
//! - **Linux** (and Android): the kernel does it. The child asks for `PR_SET_PDEATHSIG` =
//!   SIGKILL between fork and exec, then checks that cotald is still its parent, since a parent
//!   that died before the `prctl` would never send the signal.
//! - **Elsewhere** (macOS, the BSDs: no parent-death signal): a lifeline. cotald holds, for its
//!   whole life, the only write end of a pipe; nobody writes to it, so its read end sees EOF
//!   exactly when cotald is gone, however it ended (a crash, SIGKILL). Between fork and exec
//!   the child forks a watcher that keeps nothing but the read end and waits on it: at EOF it
//!   kills the broker (its parent) with SIGKILL. When the broker ends first (a restart, an
//!   orderly stop), the watcher is reparented, notices within a second that the broker is no
//!   longer its parent and exits, so it never signals a pid that was reused.
//!
//! The lifeline is portable POSIX (`pipe`, `fork`, `poll`, `read`, `kill`, `getppid`, all
//! async-signal-safe, as code between fork and exec must be); it is built and tested on every
//! Unix, and used where the kernel offers nothing better.

use std::io;
use std::os::fd::RawFd;

use tokio::process::Command;

/// Makes the child that `cmd` spawns die with this process.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(super) fn arrange(cmd: &mut Command) -> io::Result<()> {
    use rustix::process::{Pid, Signal};
    let parent = i32::try_from(std::process::id())
        .ok()
        .and_then(Pid::from_raw);
    // SAFETY: rustix makes these two system calls directly, which is async-signal-safe; the
    // closure allocates nothing (an `Errno` becomes an OS error code, not a boxed error).
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // cotald died between the fork and the prctl: the signal will never come.
            if rustix::process::getppid() != parent {
                return Err(rustix::io::Errno::SRCH.into());
            }
            Ok(())
        });
    }
    Ok(())
}

/// Makes the child that `cmd` spawns die with this process.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(super) fn arrange(cmd: &mut Command) -> io::Result<()> {
    let lifeline = lifeline()?;
    let last_fd = last_fd();
    // SAFETY: start_watcher makes only async-signal-safe calls and allocates nothing.
    unsafe {
        cmd.pre_exec(move || start_watcher(lifeline, last_fd));
    }
    Ok(())
}

/// The read end of this process's lifeline, created on first use and kept open (both ends,
/// close-on-exec) until the process ends.
#[cfg_attr(any(target_os = "linux", target_os = "android"), allow(dead_code))]
fn lifeline() -> io::Result<RawFd> {
    use std::os::fd::AsRawFd;
    static LIFELINE: std::sync::Mutex<Option<(io::PipeReader, io::PipeWriter)>> =
        std::sync::Mutex::new(None);
    let mut held = LIFELINE.lock().unwrap_or_else(|e| e.into_inner());
    if held.is_none() {
        *held = Some(io::pipe()?);
    }
    Ok(held.as_ref().map_or(-1, |(read, _)| read.as_raw_fd()))
}

/// The highest descriptor number this process can hold, read before the fork (`getrlimit`
/// is not async-signal-safe).
#[cfg_attr(any(target_os = "linux", target_os = "android"), allow(dead_code))]
fn last_fd() -> libc::c_int {
    match rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
        Some(limit) => libc::c_int::try_from(limit).unwrap_or(libc::c_int::MAX) - 1,
        None => 1 << 20,
    }
}

/// In the child, between fork and exec: forks the watcher of `lifeline`. The child goes on to
/// exec the broker.
///
/// # Safety
/// Call only between fork and exec (it forks the calling process).
#[cfg_attr(any(target_os = "linux", target_os = "android"), allow(dead_code))]
unsafe fn start_watcher(lifeline: RawFd, last_fd: libc::c_int) -> io::Result<()> {
    // SAFETY: getpid and fork are async-signal-safe; the watcher never returns into the
    // caller's code.
    unsafe {
        let broker = libc::getpid();
        match libc::fork() {
            -1 => Err(io::Error::last_os_error()),
            0 => watch(lifeline, broker, last_fd),
            _ => Ok(()),
        }
    }
}

/// The watcher: keeps only `lifeline` open (any other descriptor would keep a socket or the
/// data dir lock of cotald's alive), kills `broker` at the lifeline's EOF, exits when the
/// broker is no longer its parent.
///
/// # Safety
/// Only in a freshly forked process; it ends that process.
#[cfg_attr(any(target_os = "linux", target_os = "android"), allow(dead_code))]
unsafe fn watch(lifeline: RawFd, broker: libc::pid_t, last_fd: libc::c_int) -> ! {
    // SAFETY: close, poll, read, getppid, kill and _exit are async-signal-safe; the pollfd
    // and the byte live on this stack.
    unsafe {
        for fd in 0..=last_fd {
            if fd != lifeline {
                libc::close(fd);
            }
        }
        let mut waiting = libc::pollfd {
            fd: lifeline,
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            let ready = libc::poll(&mut waiting, 1, 1000);
            if libc::getppid() != broker {
                // The broker is gone: nothing left to guard.
                libc::_exit(0);
            }
            if ready > 0 {
                let mut byte = 0u8;
                match libc::read(lifeline, (&raw mut byte).cast(), 1) {
                    // EOF: cotald, the only writer, is gone.
                    0 => {
                        if libc::getppid() == broker {
                            libc::kill(broker, libc::SIGKILL);
                        }
                        libc::_exit(0);
                    }
                    -1 if *errno() == libc::EINTR => {}
                    -1 => libc::_exit(1),
                    _ => {}
                }
            }
        }
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
#[allow(dead_code)] // used by the lifeline, which Linux needs only in its tests
fn errno() -> *mut libc::c_int {
    // SAFETY: the thread's errno location; always valid.
    unsafe { libc::__errno_location() }
}

#[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
fn errno() -> *mut libc::c_int {
    // SAFETY: the thread's errno location; always valid.
    unsafe { libc::__error() }
}

#[cfg(any(target_os = "netbsd", target_os = "openbsd"))]
fn errno() -> *mut libc::c_int {
    // SAFETY: the thread's errno location; always valid.
    unsafe { libc::__errno() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::time::{Duration, Instant};

    /// The portable lifeline, on whatever Unix the tests run: a child guarded by a pipe whose
    /// write end the test holds is killed once that end closes, as when cotald dies.
    #[test]
    fn the_child_is_killed_when_the_lifeline_breaks() {
        let (read, write) = io::pipe().unwrap();
        let lifeline = read.as_raw_fd();
        let last = last_fd();
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30");
        // SAFETY: start_watcher is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || start_watcher(lifeline, last));
        }
        let mut child = cmd.spawn().unwrap();
        // Alive while the lifeline holds.
        std::thread::sleep(Duration::from_millis(200));
        assert!(child.try_wait().unwrap().is_none(), "killed too early");

        drop(write);
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "the child outlived its lifeline");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        drop(read);
    }

    #[test]
    fn the_lifeline_is_one_pipe_for_the_process() {
        let first = lifeline().unwrap();
        assert!(first >= 0);
        assert_eq!(lifeline().unwrap(), first);
    }
}
