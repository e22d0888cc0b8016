//! The broker's log, kept by the appliance so that no client can erase it. The broker writes
//! its log to stderr; the supervisor reads every line, shapes it, and writes it to
//! `log/nats-server.log` (rotated at [`LOG_SIZE_LIMIT`], at most [`LOG_MAX_FILES`] files) and to
//! cotald's own log (so a journald or Docker user reads the same lines).
//!
//! Shaping bounds what one client can make the broker say. The broker logs each refused
//! publish or subscription with its subject, quoted, and a subject may be as long as the
//! control line (256 KiB, kept that high because permissions ride the CONNECT line): written as
//! they come, 70 such refusals pushed every earlier line out of a 50 MiB log. So:
//! - a quoted text longer than [`MAX_QUOTED`] bytes is cut, with its length, and a line longer
//!   than [`MAX_LINE`] bytes too;
//! - the refusals ("… Violation …") of one user (or of one connection, when the line names no
//!   user) are written as they come for the first [`REFUSALS_SHOWN`] of each minute; the rest of
//!   that minute is counted, and one line says how many were left out. One identity's refusals
//!   cost at most about 12 KiB of log a minute, however fast it sends them.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The log is rotated once it exceeds this many bytes: room for thousands of starts of an
/// ordinary broker's log (a start logs a few KiB).
pub const LOG_SIZE_LIMIT: u64 = 10 * 1024 * 1024;
/// How many log files are kept, the active one included (`nats-server.log`, then
/// `nats-server.log.1`, the newest backup, to `.4`).
pub const LOG_MAX_FILES: u64 = 5;
/// The longest quoted text (a subject, a client's name) kept whole in a line.
pub const MAX_QUOTED: usize = 256;
/// The longest line written (bytes, before the note of its length).
pub const MAX_LINE: usize = 1024;
/// How many refusals of one user are written as they come in each window.
pub const REFUSALS_SHOWN: u32 = 10;
/// The window over which one user's refusals are counted.
pub(super) const REFUSAL_WINDOW: Duration = Duration::from_secs(60);

/// One user's refusals in the current window.
struct Refusals {
    since: Instant,
    shown: u32,
    left_out: u32,
    /// How the last refusal left out named its client, for the summary.
    who: String,
}

/// The broker's log file and what it is shaping.
pub struct BrokerLog {
    path: PathBuf,
    file: Option<File>,
    written: u64,
    refusals: HashMap<String, Refusals>,
}

impl BrokerLog {
    /// The log at `path` (appended to; created with its directory on first write).
    pub fn open(path: &Path) -> BrokerLog {
        let written = std::fs::metadata(path).map_or(0, |m| m.len());
        BrokerLog {
            path: path.to_owned(),
            file: None,
            written,
            refusals: HashMap::new(),
        }
    }

    /// Takes one line the broker wrote; returns what it wrote for it: the line as shaped
    /// (nothing when it is counted instead), after the summary of its user's window when that
    /// window ended.
    pub fn line(&mut self, raw: &str, now: Instant) -> Vec<String> {
        let shaped = shape(raw);
        let mut said = Vec::new();
        if let Some(key) = refused_by(raw) {
            let ended = self
                .refusals
                .get(&key)
                .is_some_and(|r| now.duration_since(r.since) >= REFUSAL_WINDOW);
            if ended {
                said.extend(self.end_window(&key));
            }
            let entry = self.refusals.entry(key).or_insert(Refusals {
                since: now,
                shown: 0,
                left_out: 0,
                who: String::new(),
            });
            if entry.shown >= REFUSALS_SHOWN {
                entry.left_out += 1;
                entry.who = client_of(&shaped);
                return said;
            }
            entry.shown += 1;
        }
        self.write(&shaped);
        said.push(shaped);
        said
    }

    /// Writes the summary of every window that ended, and forgets it; returns what it wrote.
    pub fn summarize(&mut self, now: Instant) -> Vec<String> {
        let ended: Vec<String> = self
            .refusals
            .iter()
            .filter(|(_, r)| now.duration_since(r.since) >= REFUSAL_WINDOW)
            .map(|(key, _)| key.clone())
            .collect();
        ended
            .iter()
            .filter_map(|key| self.end_window(key))
            .collect()
    }

    /// Forgets `key`'s window; writes and returns how many of its refusals were left out, if
    /// any were.
    fn end_window(&mut self, key: &str) -> Option<String> {
        let r = self.refusals.remove(key)?;
        if r.left_out == 0 {
            return None;
        }
        let line = format!(
            "[cotald] {} more refused operations of {} ({key}) in the last {} s were not logged \
             one by one",
            r.left_out,
            r.who,
            REFUSAL_WINDOW.as_secs()
        );
        self.write(&line);
        Some(line)
    }

    fn write(&mut self, line: &str) {
        let len = line.len() as u64 + 1;
        if self.written > 0 && self.written + len > LOG_SIZE_LIMIT {
            self.rotate();
        }
        if self.file.is_none() {
            if let Some(dir) = self.path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            self.file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .ok();
        }
        if let Some(file) = &mut self.file
            && writeln!(file, "{line}").is_ok()
        {
            self.written += len;
        }
    }

    /// `nats-server.log` becomes `.1`, `.1` becomes `.2`, …; the oldest beyond
    /// [`LOG_MAX_FILES`] is deleted.
    fn rotate(&mut self) {
        self.file = None;
        let backup = |n: u64| PathBuf::from(format!("{}.{n}", self.path.display()));
        let _ = std::fs::remove_file(backup(LOG_MAX_FILES - 1));
        for n in (1..LOG_MAX_FILES - 1).rev() {
            let _ = std::fs::rename(backup(n), backup(n + 1));
        }
        let _ = std::fs::rename(&self.path, backup(1));
        self.written = 0;
    }
}

/// The line with every quoted text longer than [`MAX_QUOTED`] cut (its length said), then the
/// whole cut to [`MAX_LINE`].
pub(super) fn shape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len().min(MAX_LINE + 64));
    let mut rest = raw;
    while let Some(open) = rest.find('"') {
        out.push_str(&rest[..=open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('"') else {
            rest = after;
            break;
        };
        let quoted = &after[..close];
        if quoted.len() > MAX_QUOTED {
            out.push_str(cut(quoted, MAX_QUOTED));
            out.push_str(&format!("…({} bytes)", quoted.len()));
        } else {
            out.push_str(quoted);
        }
        out.push('"');
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    if out.len() > MAX_LINE {
        let total = out.len();
        let mut line = cut(&out, MAX_LINE).to_owned();
        line.push_str(&format!(" …(line of {total} bytes)"));
        return line;
    }
    out
}

/// The first `max` bytes of `text`, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Whose refusal a broker line reports: its user's key (`…/jwt:<user>`), else its connection
/// (`cid:<n>`); `None` for any other line. nats-server writes a refusal as
/// `[ERR] <addr> - cid:<n> - "<client>" - "<account>/<…>/jwt:<user>" - Publish Violation - …`.
fn refused_by(line: &str) -> Option<String> {
    if !line.contains(" Violation") {
        return None;
    }
    if let Some(at) = line.find("/jwt:") {
        let user: String = line[at + 5..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        if !user.is_empty() {
            return Some(user);
        }
    }
    let at = line.find("cid:")?;
    let cid: String = line[at..].chars().take_while(|c| *c != ' ').collect();
    Some(cid)
}

/// The client a line names (its first quoted text), for the summary.
fn client_of(line: &str) -> String {
    line.split('"').nth(1).unwrap_or("a client").to_owned()
}

/// The level the broker gave a line (`[INF]`, `[WRN]`, `[ERR]`, `[FTL]`, `[DBG]`, `[TRC]`), and
/// the line after it (cotald's own log has its own time).
pub(super) fn level(line: &str) -> (tracing::Level, &str) {
    for (tag, level) in [
        ("[INF] ", tracing::Level::INFO),
        ("[WRN] ", tracing::Level::WARN),
        ("[ERR] ", tracing::Level::ERROR),
        ("[FTL] ", tracing::Level::ERROR),
        ("[DBG] ", tracing::Level::DEBUG),
        ("[TRC] ", tracing::Level::TRACE),
    ] {
        if let Some(at) = line.find(tag) {
            return (level, &line[at + tag.len()..]);
        }
    }
    (tracing::Level::WARN, line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(user: &str, subject: &str) -> String {
        format!(
            "[9] 2026/12/04 06:17:30.071563 [ERR] 127.0.0.1:50566 - cid:45 - \"v0.51.0:rust:cotal:flood\" \
             - \"ACV2/main/jwt:{user}\" - Publish Violation - Subject \"{subject}\""
        )
    }

    #[test]
    fn a_long_subject_is_cut_with_its_length() {
        let subject = "x".repeat(200 * 1024);
        let line = shape(&refusal("UALICE", &subject));
        assert!(line.len() < MAX_LINE + 64, "{}", line.len());
        assert!(
            line.contains(&format!("…({} bytes)\"", subject.len())),
            "{line}"
        );
        assert!(line.contains("Publish Violation"), "{line}");
        let short = refusal("UALICE", "cotal.main.chat.x.general");
        assert_eq!(shape(&short), short, "short lines are kept whole");
        let wide = "é".repeat(2000);
        assert!(shape(&wide).ends_with(&format!(" …(line of {} bytes)", wide.len())));
    }

    #[test]
    fn one_users_refusals_are_counted_after_the_first_ones_of_a_minute() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("log/nats-server.log");
        let mut log = BrokerLog::open(&path);
        let start = Instant::now();
        assert!(
            !log.line("[9] 2026/12/04 [INF] Server is ready", start)
                .is_empty()
        );
        let written: usize = (0..1000)
            .filter(|i| {
                !log.line(&refusal("UALICE", &format!("s{i}")), start)
                    .is_empty()
            })
            .count();
        assert_eq!(written, REFUSALS_SHOWN as usize);
        assert!(
            !log.line(&refusal("UBOB", "s"), start).is_empty(),
            "bob has his own share"
        );
        assert!(log.summarize(start + Duration::from_secs(30)).is_empty());
        let said = log.summarize(start + REFUSAL_WINDOW);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("990 more refused operations of v0.51.0:rust:cotal:flood (UALICE)")
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("[9] 2026/12/04 [INF] Server is ready\n"));
        assert_eq!(text.lines().count(), 1 + 10 + 1 + 1);
    }

    #[test]
    fn the_log_rotates_into_numbered_backups_and_keeps_five_files() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("nats-server.log");
        let mut log = BrokerLog::open(&path);
        let line = "y".repeat(MAX_LINE);
        let lines = (LOG_SIZE_LIMIT as usize / MAX_LINE) * 7;
        for _ in 0..lines {
            log.line(&line, Instant::now());
        }
        let mut names: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "nats-server.log",
                "nats-server.log.1",
                "nats-server.log.2",
                "nats-server.log.3",
                "nats-server.log.4"
            ]
        );
        for name in names {
            let len = std::fs::metadata(tmp.path().join(&name)).unwrap().len();
            assert!(len <= LOG_SIZE_LIMIT, "{name}: {len}");
        }
    }

    #[test]
    fn the_broker_level_becomes_ours() {
        let (said, rest) = level("[9] 2026/12/04 06:17:30.071563 [WRN] slow consumer");
        assert_eq!((said, rest), (tracing::Level::WARN, "slow consumer"));
        assert_eq!(level("panic: boom").0, tracing::Level::WARN);
    }
}
