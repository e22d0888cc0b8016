//! The JetStream storage budget: how much the broker may store on this disk, and the share
//! each space holds.
//!
//! nats-server reserves every account's file quota against its own store limit when the account
//! is enabled, and refuses one that does not fit ("insufficient storage resources"). Left to
//! itself the limit is three quarters of the disk space free when the broker starts, so a
//! default space (10 GB) does not start on a small disk, a fourth space on a normal one fails
//! with a misleading error, and a disk filled by JetStream itself shrinks the limit at the next
//! start below what the spaces already hold. So cotald sets the limit itself: three quarters of
//! the free space **plus what JetStream already stores** (stable across restarts), and grants
//! each space, in the order they are served, its profile's quota or what is left of the limit,
//! whichever is smaller. A space that would get less than [`MIN_SPACE_STORE`] is refused in
//! words. Inside a space, the bounded streams are cut to fit its quota
//! (`binding::streams::Retention::fit`).

use crate::profile::human_size;
use std::collections::BTreeMap;
use std::path::Path;

/// The share of the disk (numerator, denominator) JetStream may use, as nats-server's default.
const DISK_SHARE: (u64, u64) = (3, 4);
/// The share of the broker's store limit (numerator, denominator) granted to spaces. Granting
/// all of it left a space refused at the next start ("insufficient storage resources", with
/// 10 GiB + 2 GiB granted of a 12 GiB limit): when the broker enables the accounts of its
/// resolver at start, their reservations must fit with room to spare.
const GRANT_SHARE: (i64, i64) = (9, 10);

/// What the spaces may be granted of a store limit of `limit` bytes.
pub fn grantable(limit: i64) -> i64 {
    limit / GRANT_SHARE.1 * GRANT_SHARE.0
}

/// A space is not served with less JetStream storage than this.
pub const MIN_SPACE_STORE: i64 = 32 << 20;

/// The store limit for a JetStream store at `store_dir` on the file system of `data_dir`.
pub fn store_limit(data_dir: &Path, store_dir: &Path) -> std::io::Result<i64> {
    let free = available(data_dir)?;
    let stored = disk_usage(store_dir);
    let limit = (free + stored) / DISK_SHARE.1 * DISK_SHARE.0;
    Ok(i64::try_from(limit).unwrap_or(i64::MAX))
}

/// Bytes available to an unprivileged writer on the file system of `path`.
fn available(path: &Path) -> std::io::Result<u64> {
    let stat = rustix::fs::statvfs(path)?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// The bytes of every file under `dir` (0 when it does not exist yet).
fn disk_usage(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => disk_usage(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// A space the budget has no room for.
#[derive(Debug, thiserror::Error)]
#[error(
    "space `{space}` refused: the JetStream storage budget of this disk is used up ({limit} in \
     all, three quarters of the free disk space plus what JetStream already stores; {held}). \
     Free disk space and restart cotald (the budget is measured at start), or lower \
     `max_file_store` of a space in the profile"
)]
pub struct BudgetFull {
    /// The space refused.
    pub space: String,
    /// The whole budget.
    pub limit: String,
    /// Who holds it.
    pub held: String,
}

/// The store limit and the quota granted to each served space.
#[derive(Debug)]
pub struct Budget {
    limit: i64,
    granted: BTreeMap<String, i64>,
}

impl Budget {
    /// A budget of `limit` bytes, nothing granted.
    pub fn new(limit: i64) -> Self {
        Budget {
            limit,
            granted: BTreeMap::new(),
        }
    }

    /// The whole budget.
    pub fn limit(&self) -> i64 {
        self.limit
    }

    /// Grants `space` its `wanted` quota, or what is left if less; refuses when what is left
    /// is under [`MIN_SPACE_STORE`].
    pub fn grant(&mut self, space: &str, wanted: i64) -> Result<i64, BudgetFull> {
        self.granted.remove(space);
        let left = self.limit - self.granted.values().sum::<i64>();
        let granted = wanted.min(left);
        if granted < MIN_SPACE_STORE.min(wanted) {
            let held = match self.granted.is_empty() {
                true => "nothing is left".to_owned(),
                false => self
                    .granted
                    .iter()
                    .map(|(s, b)| format!("{} reserved by `{s}`", human_size((*b).max(0) as u64)))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            return Err(BudgetFull {
                space: space.to_owned(),
                limit: human_size(self.limit.max(0) as u64),
                held,
            });
        }
        self.granted.insert(space.to_owned(), granted);
        Ok(granted)
    }

    /// Gives back what `space` held (it is not served).
    pub fn release(&mut self, space: &str) {
        self.granted.remove(space);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spaces_get_their_quota_then_what_is_left_then_a_refusal_in_words() {
        let mut b = Budget::new(25 << 30);
        assert_eq!(b.grant("main", 10 << 30).unwrap(), 10 << 30);
        assert_eq!(b.grant("lab", 10 << 30).unwrap(), 10 << 30);
        assert_eq!(b.grant("ops", 10 << 30).unwrap(), 5 << 30, "what is left");
        let refused = b.grant("more", 10 << 30).unwrap_err().to_string();
        assert!(refused.starts_with("space `more` refused: the JetStream storage budget"));
        assert!(refused.contains("25.0 GiB in all"), "{refused}");
        assert!(refused.contains("10.0 GiB reserved by `main`"), "{refused}");
        b.release("ops");
        assert_eq!(b.grant("more", 10 << 30).unwrap(), 5 << 30);
        assert_eq!(
            b.grant("main", 10 << 30).unwrap(),
            10 << 30,
            "granting again replaces"
        );
    }

    #[test]
    fn a_small_disk_still_serves_the_first_space() {
        let mut b = Budget::new(178 << 20);
        assert_eq!(b.grant("main", 10 << 30).unwrap(), 178 << 20);
        assert!(b.grant("lab", 10 << 30).is_err());
    }

    #[test]
    fn spaces_are_granted_nine_tenths_of_the_store_limit() {
        assert_eq!(grantable(10 << 30), 9 << 30);
        assert_eq!(grantable(0), 0);
        let limit = 12 << 30;
        let mut b = Budget::new(grantable(limit));
        b.grant("main", 10 << 30).unwrap();
        assert!(
            b.grant("lab", 10 << 30).unwrap() < limit - (10 << 30),
            "room is left beside the reservations"
        );
    }

    #[test]
    fn what_jetstream_already_stores_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("js");
        assert_eq!(disk_usage(&store), 0, "not created yet");
        std::fs::create_dir_all(store.join("a/b")).unwrap();
        std::fs::write(store.join("a/blk"), vec![0u8; 3 << 20]).unwrap();
        std::fs::write(store.join("a/b/idx"), vec![0u8; 1 << 20]).unwrap();
        assert_eq!(disk_usage(&store), 4 << 20);
        assert!(store_limit(dir.path(), &store).unwrap() >= 3 << 20);
    }
}
