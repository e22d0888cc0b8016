//! The members registry (`cotal_members_<space>`, §7): one privileged record per (member,
//! channel) holding the member's durable membership of that channel: the join cursor, the
//! leave cursor once it left, a generation that grows with every join (kept with the record
//! once its last interval is delivered), and earlier intervals
//! whose backlog is still being delivered. Beside them, one `mark.<member>` record per member:
//! how far it has read each `live` channel it replays, so that its next session replays only
//! what came after (a live channel has no membership; the mark is the nearest thing). Agents cannot write it (Appendix B grants no
//! publish on the bucket); only the manager does, through this module.
//!
//! Every write is a compare-and-set on the key's revision, so concurrent joins and leaves of one
//! member are ordered by the bucket, never lost to a race. The manager is the only writer of a
//! space, so the registry is also kept in memory for the readers (the trusted reader, the
//! membership feed).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use async_nats::jetstream::kv::{self, Store};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::ops::Membership;

/// One delivery interval of a membership: sequences `join_cursor < seq ≤ leave_cursor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interval {
    /// The join's generation.
    pub generation: u64,
    /// The CHAT frontier at join.
    pub join_cursor: u64,
    /// The CHAT frontier at leave; `None` while open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leave_cursor: Option<u64>,
    /// The member's saved position: every entry of the interval up to this stream sequence is
    /// handled (delivered and acknowledged, or not due). Saved when its session ends, and as
    /// the member confirms progress on a range of its backlog that it reads itself.
    #[serde(default)]
    pub delivered: u64,
}

impl Interval {
    /// Whether stream sequence `seq` is inside the interval.
    pub fn contains(&self, seq: u64) -> bool {
        seq > self.join_cursor && self.leave_cursor.is_none_or(|leave| seq <= leave)
    }
}

/// The record of one (member, channel): its intervals whose backlog may still be due, oldest
/// first. The last one is open while the member is durable-joined; closed ones are removed once
/// their backlog is delivered, and the record with its last interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRecord {
    /// The member's instance id.
    pub member: String,
    /// The concrete channel.
    pub channel: String,
    /// The intervals, oldest first.
    pub intervals: Vec<Interval>,
    /// The generation of the latest join (kept when intervals are removed, so a rejoin after a
    /// drained leave still gets a new one).
    pub generation: u64,
}

impl MemberRecord {
    /// The open interval, if the member is durable-joined now.
    pub fn open(&self) -> Option<&Interval> {
        self.intervals.last().filter(|i| i.leave_cursor.is_none())
    }

    /// The reply shape of the ops (`ops::Membership`): the latest interval.
    pub fn membership(&self) -> Option<Membership> {
        self.intervals.last().map(|i| Membership {
            member: self.member.clone(),
            channel: self.channel.clone(),
            generation: i.generation,
            join_cursor: i.join_cursor,
            leave_cursor: i.leave_cursor,
        })
    }
}

/// Why the registry could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum MembersError {
    /// A JetStream KV operation failed.
    #[error("members registry: {action} {key}")]
    Kv {
        /// What was being done.
        action: &'static str,
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A stored record is not a member record.
    #[error("members registry: {key} holds no member record")]
    Malformed {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// Another writer kept winning the compare-and-set.
    #[error("members registry: {key} kept changing; retry")]
    Contended {
        /// The key.
        key: String,
    },
}

/// The prefix of a member's marks record (`mark.<id>`); an instance id never starts so.
const MARKS: &str = "mark.";

/// The key of a (member, channel): `<id>.<channel>` (both are valid KV key tokens).
pub fn key(member: &str, channel: &str) -> String {
    format!("{member}.{channel}")
}

/// The members registry of one space.
pub struct Members {
    space: Arc<super::Space>,
    records: RwLock<BTreeMap<String, (MemberRecord, u64)>>,
    changed: Arc<Notify>,
    /// Grows with every change of the records held.
    version: std::sync::atomic::AtomicU64,
}

const CAS_ATTEMPTS: usize = 8;

impl Members {
    /// Opens the registry of `space` and loads every record.
    pub async fn open(space: &Arc<super::Space>) -> Result<Self, MembersError> {
        let bucket = space.names().members_bucket();
        let fail = |action, source: Box<dyn std::error::Error + Send + Sync>| MembersError::Kv {
            action,
            key: bucket.clone(),
            source,
        };
        let kv = space
            .key_value(&bucket)
            .await
            .map_err(|e| fail("opening", e.into()))?;
        let mut records = BTreeMap::new();
        let mut keys = kv.keys().await.map_err(|e| fail("listing", e.into()))?;
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| fail("listing", e.into()))?;
            if key.starts_with(MARKS) {
                continue;
            }
            if let Some((record, revision)) = read(&kv, &key).await? {
                records.insert(key, (record, revision));
            }
        }
        Ok(Members {
            space: space.clone(),
            records: RwLock::new(records),
            changed: Arc::default(),
            version: Default::default(),
        })
    }

    /// The bucket, over the space's connection as it is now.
    async fn kv(&self) -> Result<Store, MembersError> {
        let bucket = self.space.names().members_bucket();
        self.space
            .key_value(&bucket)
            .await
            .map_err(|e| MembersError::Kv {
                action: "opening",
                key: bucket,
                source: e.into(),
            })
    }

    /// Reads every record again: a cluster node that takes over a space's services was not
    /// the registry's writer until then, so what it loaded at its start is stale.
    pub async fn reload(&self) -> Result<(), MembersError> {
        let kv = self.kv().await?;
        let fail = |action, source: Box<dyn std::error::Error + Send + Sync>| MembersError::Kv {
            action,
            key: kv.name.clone(),
            source,
        };
        let mut records = BTreeMap::new();
        let mut keys = match kv.keys().await {
            Ok(keys) => keys,
            Err(e) => return Err(fail("listing", e.into())),
        };
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| fail("listing", e.into()))?;
            if key.starts_with(MARKS) {
                continue;
            }
            if let Some((record, revision)) = read(&kv, &key).await? {
                records.insert(key, (record, revision));
            }
        }
        if let Ok(mut held) = self.records.write() {
            *held = records;
        }
        self.version
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.changed.notify_waiters();
        Ok(())
    }

    /// How far `member` has read each live channel it replays (stream sequences of CHAT).
    pub async fn marks(&self, member: &str) -> Result<BTreeMap<String, u64>, MembersError> {
        let key = format!("{MARKS}{member}");
        let entry = self
            .kv()
            .await?
            .get(&key)
            .await
            .map_err(|e| MembersError::Kv {
                action: "reading",
                key: key.clone(),
                source: e.into(),
            })?;
        match entry {
            Some(bytes) if !bytes.is_empty() => serde_json::from_slice(&bytes)
                .map_err(|source| MembersError::Malformed { key, source }),
            _ => Ok(BTreeMap::new()),
        }
    }

    /// Records that `member` has read `marks` (channel → stream sequence); a mark only moves
    /// forward. The member's own marks are its only writer, one session at a time: a lost
    /// race costs a replayed message, never a skipped one.
    pub async fn mark(
        &self,
        member: &str,
        marks: &BTreeMap<String, u64>,
    ) -> Result<(), MembersError> {
        let mut merged = self.marks(member).await?;
        for (channel, seq) in marks {
            let at = merged.entry(channel.clone()).or_default();
            *at = (*at).max(*seq);
        }
        let key = format!("{MARKS}{member}");
        let bytes = serde_json::to_vec(&merged).map_err(|source| MembersError::Malformed {
            key: key.clone(),
            source,
        })?;
        self.kv()
            .await?
            .put(&key, bytes.into())
            .await
            .map_err(|e| MembersError::Kv {
                action: "writing",
                key,
                source: e.into(),
            })?;
        Ok(())
    }

    /// Resolves when a record changed (the trusted reader then re-reads its member's).
    pub fn changed(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    /// Grows with every change: a reader caching a record re-reads it when this moved.
    pub fn version(&self) -> u64 {
        self.version.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The records of `member`.
    pub fn of(&self, member: &str) -> Vec<MemberRecord> {
        let prefix = format!("{member}.");
        self.read()
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(_, (r, _))| r.clone())
            .collect()
    }

    /// The record of (member, channel).
    pub fn get(&self, member: &str, channel: &str) -> Option<MemberRecord> {
        self.read()
            .get(&key(member, channel))
            .map(|(r, _)| r.clone())
    }

    /// One interval of (member, channel), by generation; `None` once it is gone.
    pub fn interval(&self, member: &str, channel: &str, generation: u64) -> Option<Interval> {
        self.read().get(&key(member, channel)).and_then(|(r, _)| {
            r.intervals
                .iter()
                .find(|i| i.generation == generation)
                .cloned()
        })
    }

    /// Every record.
    pub fn all(&self) -> Vec<MemberRecord> {
        self.read().values().map(|(r, _)| r.clone()).collect()
    }

    /// Changes the record of (member, channel) with `change` (given the stored record, it
    /// returns the new one, or `None` to delete it), as a compare-and-set retried on conflict.
    /// Returns what was stored.
    pub async fn update(
        &self,
        member: &str,
        channel: &str,
        mut change: impl FnMut(Option<MemberRecord>) -> Option<MemberRecord>,
    ) -> Result<Option<MemberRecord>, MembersError> {
        let stored = self
            .try_update::<std::convert::Infallible>(member, channel, |r| Ok(change(r)))
            .await?;
        Ok(stored.unwrap_or_else(|never| match never {}))
    }

    /// Removes one interval of (member, channel) (its backlog is delivered). The record stays
    /// when it was the last, with no interval and its generation: a rejoin then gets the next
    /// one. (A generation names the interval's consumer and its saved position; a record
    /// made anew would give a rejoin the generation of the interval just removed, and a pump
    /// or a position of that one would then be taken for the new one's.)
    pub async fn remove_interval(
        &self,
        member: &str,
        channel: &str,
        generation: u64,
    ) -> Result<(), MembersError> {
        self.update(member, channel, |stored| {
            stored.map(|mut r| {
                r.intervals.retain(|i| i.generation != generation);
                r
            })
        })
        .await
        .map(drop)
    }

    /// [`Members::update`] with a change that may refuse (`Err` is returned as it is, nothing
    /// written).
    pub async fn try_update<E>(
        &self,
        member: &str,
        channel: &str,
        mut change: impl FnMut(Option<MemberRecord>) -> Result<Option<MemberRecord>, E>,
    ) -> Result<Result<Option<MemberRecord>, E>, MembersError> {
        let key = key(member, channel);
        // The first try starts from the record held in memory, not from a read: the manager
        // is the registry's writer, so it is the stored one unless another wrote meanwhile (a
        // cluster node handing the space over). A write made from it is checked by its
        // revision all the same; a refusal, or nothing to write, is decided again on the
        // stored record.
        let mut held = Some(self.read().get(&key).cloned());
        for _ in 0..CAS_ATTEMPTS {
            let kv = self.kv().await?;
            let (stored, from_memory) = match held.take() {
                Some(held) => (held, true),
                None => (read(&kv, &key).await?, false),
            };
            let revision = stored.as_ref().map(|(_, rev)| *rev);
            let next = match change(stored.map(|(r, _)| r)) {
                Ok(next) => next,
                Err(_) if from_memory => continue,
                Err(e) => return Ok(Err(e)),
            };
            if from_memory && next.is_none() && revision.is_none() {
                continue;
            }
            let written = match (&next, revision) {
                (Some(record), rev) => {
                    let bytes = serde_json::to_vec(record).unwrap_or_default();
                    match rev {
                        Some(rev) => kv.update(&key, bytes.into(), rev).await.map_err(|e| {
                            (e.kind() == kv::UpdateErrorKind::WrongLastRevision, e.into())
                        }),
                        None => kv.create(&key, bytes.into()).await.map_err(|e| {
                            (e.kind() == kv::CreateErrorKind::AlreadyExists, e.into())
                        }),
                    }
                }
                (None, Some(rev)) => kv
                    .delete_expect_revision(&key, Some(rev))
                    .await
                    .map(|()| 0)
                    .map_err(|e| (e.kind() == kv::UpdateErrorKind::WrongLastRevision, e.into())),
                (None, None) => Ok(0),
            };
            match written {
                Ok(revision) => {
                    if let Ok(mut records) = self.records.write() {
                        match &next {
                            Some(r) => records.insert(key.clone(), (r.clone(), revision)),
                            None => records.remove(&key),
                        };
                    }
                    self.version
                        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    self.changed.notify_waiters();
                    return Ok(Ok(next));
                }
                Err((true, _)) => continue,
                Err((false, source)) => {
                    return Err(MembersError::Kv {
                        action: "writing",
                        key,
                        source,
                    });
                }
            }
        }
        Err(MembersError::Contended { key })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, (MemberRecord, u64)>> {
        self.records.read().unwrap_or_else(|e| e.into_inner())
    }
}

async fn read(kv: &Store, key: &str) -> Result<Option<(MemberRecord, u64)>, MembersError> {
    let entry = kv.entry(key).await.map_err(|e| MembersError::Kv {
        action: "reading",
        key: key.to_owned(),
        source: e.into(),
    })?;
    match entry {
        Some(e) if e.operation == kv::Operation::Put => {
            let record =
                serde_json::from_slice(&e.value).map_err(|source| MembersError::Malformed {
                    key: key.to_owned(),
                    source,
                })?;
            Ok(Some((record, e.revision)))
        }
        // Deleted (a marker) or absent: no record. A marker's revision still orders a
        // later create, which `create` handles.
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_bound_delivery_on_both_sides() {
        let open = Interval {
            generation: 1,
            join_cursor: 10,
            leave_cursor: None,
            delivered: 0,
        };
        assert!(!open.contains(10));
        assert!(open.contains(11));
        assert!(open.contains(u64::MAX));
        let closed = Interval {
            leave_cursor: Some(20),
            ..open
        };
        assert!(closed.contains(20));
        assert!(!closed.contains(21));
    }

    #[test]
    fn records_keep_their_wire_names() {
        let r = MemberRecord {
            member: "UABC".into(),
            channel: "team.backend".into(),
            intervals: vec![Interval {
                generation: 2,
                join_cursor: 5,
                leave_cursor: None,
                delivered: 0,
            }],
            generation: 2,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["intervals"][0]["joinCursor"], 5);
        assert_eq!(key("UABC", "team.backend"), "UABC.team.backend");
        assert_eq!(r.membership().unwrap().generation, 2);
        assert!(r.open().is_some());
    }
}
