//! The identities of one space as the appliance knows them: what it minted, kept in memory and
//! in the data dir (`spaces/<space>/identities/<id>.json`). It is the **current read ACL** of §9
//! item 6: the trusted reader and the mention router authorize against these records, and a
//! re-mint or revoke updates them at once (the broker enforces the same change through the
//! account's revocations).

use std::collections::BTreeMap;
use std::sync::RwLock;

use super::store::{self, StoreError};
use crate::datadir::DataDir;
use crate::ops::IdentityRecord;

/// The identities minted for one space.
pub struct Identities {
    dir: DataDir,
    space: String,
    records: RwLock<BTreeMap<String, IdentityRecord>>,
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

    /// The identity named `name` (not revoked).
    pub fn by_name(&self, name: &str) -> Option<IdentityRecord> {
        self.read()
            .values()
            .find(|r| r.revoked_at.is_none() && r.name == name)
            .cloned()
    }

    /// The identity named `name` or with id `name` (not revoked).
    pub fn find(&self, name_or_id: &str) -> Option<IdentityRecord> {
        self.get(name_or_id).or_else(|| self.by_name(name_or_id))
    }

    /// Every identity not revoked.
    pub fn active(&self) -> Vec<IdentityRecord> {
        self.read()
            .values()
            .filter(|r| r.revoked_at.is_none())
            .cloned()
            .collect()
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
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, IdentityRecord>> {
        self.records.read().unwrap_or_else(|e| e.into_inner())
    }
}
