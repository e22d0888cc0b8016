//! Where the log goes: stderr while it can be written, and never at the cost of the appliance.
//!
//! A terminal that closed (`cotald up &`, then the shell exits) fails every write with EIO,
//! and a pipe whose reader left with EPIPE. `eprintln!` panics on such a write, and the log
//! library reported its own failed write with `eprintln!`: each request that logged panicked
//! the appliance's task, so `down` and `mint` failed with "the appliance stopped before it
//! answered". Every log line goes through [`LogWriter`] instead, which never fails: once stderr
//! fails, the appliance's log goes to the data dir's `log/cotald.log` (said in its first line
//! there), and a command that has no such file drops what it cannot write.
//!
//! An appliance started as a background job of a terminal (`cotald up &`) logs to that file
//! from the start: the terminal is the user's, for the commands that follow, and may close.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where log lines go now, and where they go once stderr fails.
struct Sink {
    to: To,
    fallback: Option<PathBuf>,
}

enum To {
    Stderr,
    File(File),
    Nowhere,
}

static SINK: Mutex<Sink> = Mutex::new(Sink {
    to: To::Stderr,
    fallback: None,
});

fn sink() -> std::sync::MutexGuard<'static, Sink> {
    SINK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The writer of every log line: it never fails (see the module doc).
pub(super) struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        let mut sink = sink();
        if let To::Stderr = sink.to {
            let Err(e) = io::stderr().write_all(line) else {
                return Ok(line.len());
            };
            sink.to = match sink.fallback.as_deref().map(open) {
                Some(Ok(mut file)) => {
                    let _ = writeln!(file, "stderr failed ({e}); the log goes on here");
                    To::File(file)
                }
                _ => To::Nowhere,
            };
        }
        if let To::File(file) = &mut sink.to {
            let _ = file.write_all(line);
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// From now on, a failed write to stderr sends the log to `path`.
pub(super) fn fall_back_to(path: &Path) {
    sink().fallback = Some(path.to_owned());
}

/// Sends the log to `path` now.
pub(super) fn to_file(path: &Path) -> io::Result<()> {
    let file = open(path)?;
    let mut sink = sink();
    sink.to = To::File(file);
    sink.fallback = Some(path.to_owned());
    Ok(())
}

/// Whether this process is a background job of the terminal on stderr (`cotald up &`).
pub(super) fn background_job() -> bool {
    // Not a terminal, or no foreground group: not a job of one.
    rustix::termios::tcgetpgrp(std::io::stderr())
        .is_ok_and(|terminal| terminal != rustix::process::getpgrp())
}

/// The log file, appended to, owner-only.
fn open(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}
