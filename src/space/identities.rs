//! The identities of one space as the appliance knows them: what it minted, kept in memory and
//! in the data dir (`spaces/<space>/identities/<id>.json`). It is the **current read ACL** of §9
//! item 6: the trusted reader and the mention router authorize against these records, and a
//! re-mint or revoke updates them at once (the broker enforces the same change through the
//! account's revocations).

use std::collections::BTreeMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use super::store::{self, StoreError};
use crate::datadir::DataDir;
use crate::ops::IdentityRecord;

/// The identities minted for one space.
pub struct Identities {
    dir: DataDir,
    space: String,
    records: RwLock<BTreeMap<String, IdentityRecord>>,
    /// Ids known but not minted (kept in memory, never found by name, never revoked).
    builtin: RwLock<Vec<String>>,
    version: AtomicU64,
}

impl Identities {
    /// Loads the records of `space` from the data dir.
    pub fn load(dir: &DataDir, space: &str) -> Self {
        let records = store::identities(dir, space)
            .into_iter()
            .map(|r| (r.id.clone(), r))
            .collect();
        Identities {
            dir: dir.clone(),
            space: space.to_owned(),
            records: RwLock::new(records),
            builtin: RwLock::default(),
            version: AtomicU64::new(0),
        }
    }

    /// The space.
    pub fn space(&self) -> &str {
        &self.space
    }

    /// The record of `id`, unless it was revoked.
    pub fn get(&self, id: &str) -> Option<IdentityRecord> {
        self.read()
            .get(id)
            .filter(|r| r.revoked_at.is_none())
            .cloned()
    }

    /// The minted identity named `name` (not revoked).
    pub fn by_name(&self, name: &str) -> Option<IdentityRecord> {
        self.minted().find(|r| r.name == name)
    }

    /// The minted identity named `name` or with id `name` (not revoked).
    pub fn find(&self, name_or_id: &str) -> Option<IdentityRecord> {
        self.minted()
            .find(|r| r.id == name_or_id || r.name == name_or_id)
    }

    /// Whether `id` is a minted identity that is not revoked (not one of the appliance's own).
    pub fn is_minted(&self, id: &str) -> bool {
        let builtin = self.builtin.read().is_ok_and(|b| b.iter().any(|b| b == id));
        !builtin && self.read().get(id).is_some_and(|r| r.revoked_at.is_none())
    }

    /// Every minted identity not revoked.
    pub fn active(&self) -> Vec<IdentityRecord> {
        self.minted().collect()
    }

    /// Every minted record, revoked ones included (what a cluster's nodes share).
    pub fn records(&self) -> Vec<IdentityRecord> {
        let builtin = self.builtin.read().map(|b| b.clone()).unwrap_or_default();
        self.read()
            .values()
            .filter(|r| !builtin.contains(&r.id))
            .cloned()
            .collect()
    }

    /// The identities known but not minted (the machine operator's own user, the dashboard's
    /// observer): a cluster's nodes share them too, each node having its own.
    pub fn builtins(&self) -> Vec<IdentityRecord> {
        let builtin = self.builtin.read().map(|b| b.clone()).unwrap_or_default();
        self.read()
            .values()
            .filter(|r| builtin.contains(&r.id))
            .cloned()
            .collect()
    }

    fn minted(&self) -> impl Iterator<Item = IdentityRecord> {
        let builtin = self.builtin.read().map(|b| b.clone()).unwrap_or_default();
        self.read()
            .values()
            .filter(|r| r.revoked_at.is_none() && !builtin.contains(&r.id))
            .cloned()
            .collect::<Vec<_>>()
            .into_iter()
    }

    /// User key → the Unix second up to which its credentials are refused (the account JWT's
    /// `revocations`).
    pub fn revocations(&self) -> BTreeMap<String, i64> {
        self.read()
            .values()
            .filter_map(|r| r.revokes_before.map(|t| (r.id.clone(), t)))
            .collect()
    }

    /// Stores `record` (on disk first, then in memory).
    pub fn save(&self, record: IdentityRecord) -> Result<(), StoreError> {
        store::save_identity(&self.dir, &record)?;
        if let Ok(mut records) = self.records.write() {
            records.insert(record.id.clone(), record);
        }
        self.version.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Grows with every change: a reader caching a record re-reads it when this moved.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Adds an identity that is not minted but known (the machine operator's own user); it is
    /// kept in memory only.
    pub fn insert_builtin(&self, record: IdentityRecord) {
        if let Ok(mut builtin) = self.builtin.write() {
            builtin.push(record.id.clone());
        }
        if let Ok(mut records) = self.records.write() {
            records.insert(record.id.clone(), record);
        }
        self.version.fetch_add(1, Ordering::Release);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, IdentityRecord>> {
        self.records.read().unwrap_or_else(|e| e.into_inner())
    }
}
