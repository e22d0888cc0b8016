//! The identities of a space, shared by the nodes of a cluster.
//!
//! An identity is minted (or revoked) on one node, into that node's data dir; the node that
//! holds the space's lease must know it all the same (the manager answers only identities the
//! appliance minted, the trusted reader authorizes against their records: §9 item 6). So each
//! node mirrors its records into the space's `cotald_identities_<space>` bucket (replicated like
//! the space's streams) and applies what the others put there.
//!
//! Records are merged, not overwritten: of two versions of one identity the one with the later
//! change wins ([`change_time`]: issued, revoked, revoked-before), so a node that was down
//! during a revoke cannot bring the revoked record back when it returns. The bucket holds no
//! secret (a record is the identity's grants and dates; seeds stay where they were minted).
//!
//! A node's built-in identities (its machine operator, its dashboard's observer) are shared
//! too, under `builtin.<id>`: each node has its own, and the holder's manager must answer them
//! (`cotald channels set` on any node). They are kept in memory on the other nodes, never
//! written to their data dirs as minted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use futures_util::StreamExt;

use super::{Context, Health, Service, ServiceError};
use crate::ops::IdentityRecord;
use crate::space::{Identities, Space};

/// How often local changes (a mint, a revoke) are looked for.
const LOCAL_POLL: Duration = Duration::from_millis(250);

/// The identities bucket of a space.
pub fn bucket_name(space: &str) -> String {
    format!("cotald_identities_{space}")
}

/// The key prefix of a node's built-in identities (its machine operator, its dashboard's
/// observer): known on every node, never written to another node's data dir as minted.
const BUILTIN: &str = "builtin.";

/// Applies the record stored under `key` when it is newer than what `identities` has; whether
/// it was applied.
fn apply(identities: &Identities, key: &str, record: &IdentityRecord) -> bool {
    if let Some(id) = key.strip_prefix(BUILTIN) {
        if id != record.id || identities.get(id).is_some() {
            return false;
        }
        identities.insert_builtin(record.clone());
        return true;
    }
    if key != record.id {
        return false;
    }
    let local = identities.records().into_iter().find(|r| r.id == key);
    if local.is_some_and(|l| change_time(record) <= change_time(&l)) {
        return false;
    }
    match identities.save(record.clone()) {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(id = record.id, error = %e, "cannot store an identity record from another node");
            false
        }
    }
}

/// When a record last changed: the later of its issue, its revocation and its revoked-before.
pub fn change_time(r: &IdentityRecord) -> (i64, i64, i64) {
    (
        r.issued_at,
        r.revoked_at.unwrap_or(0),
        r.revokes_before.unwrap_or(0),
    )
}

/// Applies every record of the space's identities bucket that is newer than the local one;
/// how many were applied. A node starting after a revoke it missed learns of it here, before
/// it pushes the space's account JWT (whose revocations it builds from its records): pushing
/// first would lift the revoke for the whole cluster. No bucket yet: nothing to apply.
pub async fn pull(space: &Space, identities: &Identities) -> Result<usize, ServiceError> {
    let Ok(kv) = space
        .jetstream()
        .get_key_value(bucket_name(space.name()))
        .await
    else {
        return Ok(0);
    };
    let mut keys = kv
        .keys()
        .await
        .map_err(ServiceError::at("listing the identities bucket"))?;
    let mut applied = 0;
    while let Some(key) = keys.next().await {
        let key = key.map_err(ServiceError::at("listing the identities bucket"))?;
        let Some(bytes) = kv
            .get(&key)
            .await
            .map_err(ServiceError::at("reading the identities bucket"))?
        else {
            continue;
        };
        let Ok(record) = serde_json::from_slice::<IdentityRecord>(&bytes) else {
            continue;
        };
        if record.space == space.name() && apply(identities, &key, &record) {
            applied += 1;
        }
    }
    Ok(applied)
}

/// Puts `record` into the space's identities bucket at once (a mint or revoke on this node, so
/// that the lease holder knows it before the caller hands the credential out).
pub async fn share(space: &Space, record: &IdentityRecord) -> Result<(), ServiceError> {
    let kv = space
        .key_value(&bucket_name(space.name()))
        .await
        .map_err(ServiceError::at("opening the identities bucket"))?;
    let bytes = serde_json::to_vec(record).unwrap_or_default();
    kv.put(&record.id, bytes.into())
        .await
        .map_err(ServiceError::at("sharing an identity record"))?;
    Ok(())
}

/// The record of `id` from the space's identities bucket, applied locally when it is newer:
/// for a request from an identity minted on another node a moment ago (before the watch
/// brought its record). `None` when the space has no such bucket (a single appliance) or no
/// such record.
pub async fn fetch(space: &Space, identities: &Identities, id: &str) -> Option<IdentityRecord> {
    let kv = space.key_value(&bucket_name(space.name())).await.ok()?;
    for key in [id.to_owned(), format!("{BUILTIN}{id}")] {
        let Ok(Some(bytes)) = kv.get(&key).await else {
            continue;
        };
        let Ok(record) = serde_json::from_slice::<IdentityRecord>(&bytes) else {
            continue;
        };
        if record.space == space.name() {
            apply(identities, &key, &record);
        }
    }
    identities.get(id)
}

/// Opens a bucket of the cluster's own (identities, lease), creating it when absent and
/// scaling its replicas in place when the cluster's changed (as the space's bootstrap does for
/// its streams).
pub async fn ensure_bucket(
    js: &async_nats::jetstream::Context,
    config: kv::Config,
) -> Result<kv::Store, ServiceError> {
    let stream = format!("KV_{}", config.bucket);
    // One `STREAM.INFO` says whether it exists and how it is replicated.
    let existing = js
        .get_stream_no_info(&stream)
        .await
        .map_err(ServiceError::at("naming a cluster bucket"))?;
    match existing.get_info().await {
        Ok(info) => {
            if info.config.num_replicas != config.num_replicas {
                let mut scaled = info.config.clone();
                scaled.num_replicas = config.num_replicas;
                js.update_stream(scaled)
                    .await
                    .map_err(ServiceError::at("scaling a cluster bucket"))?;
            }
            js.get_key_value(&config.bucket)
                .await
                .map_err(ServiceError::at("opening a cluster bucket"))
        }
        Err(_) => js
            .create_key_value(config)
            .await
            .map_err(ServiceError::at("creating a cluster bucket")),
    }
}

/// Mirrors a space's identity records through the cluster.
pub struct IdentitySync {
    space: Arc<Space>,
    identities: Arc<Identities>,
    replicas: usize,
}

impl IdentitySync {
    /// The sync of `space`'s `identities`.
    pub fn new(space: Arc<Space>, identities: Arc<Identities>, replicas: usize) -> Self {
        IdentitySync {
            space,
            identities,
            replicas,
        }
    }

    async fn bucket(&self) -> Result<kv::Store, ServiceError> {
        ensure_bucket(
            &self.space.jetstream(),
            kv::Config {
                bucket: bucket_name(self.space.name()),
                history: 1,
                num_replicas: self.replicas.max(1),
                storage: async_nats::jetstream::stream::StorageType::File,
                ..Default::default()
            },
        )
        .await
    }

    /// Puts every local record the bucket does not have in a version at least as recent.
    async fn push(
        &self,
        kv: &kv::Store,
        known: &mut BTreeMap<String, IdentityRecord>,
    ) -> Result<(), ServiceError> {
        let minted = self
            .identities
            .records()
            .into_iter()
            .map(|r| (r.id.clone(), r));
        let builtin = self
            .identities
            .builtins()
            .into_iter()
            .map(|r| (format!("{BUILTIN}{}", r.id), r));
        for (key, record) in minted.chain(builtin) {
            let newer = known
                .get(&key)
                .is_none_or(|k| change_time(&record) > change_time(k));
            if !newer {
                continue;
            }
            let bytes = serde_json::to_vec(&record).unwrap_or_default();
            kv.put(&key, bytes.into())
                .await
                .map_err(ServiceError::at("sharing an identity record"))?;
            known.insert(key, record);
        }
        Ok(())
    }

    /// Applies a record from the bucket when it is newer than the local one.
    fn apply(
        &self,
        key: &str,
        record: IdentityRecord,
        known: &mut BTreeMap<String, IdentityRecord>,
    ) {
        if record.space != self.space.name() {
            return;
        }
        if apply(&self.identities, key, &record) {
            tracing::info!(
                space = self.space.name(),
                id = record.id,
                name = record.name,
                revoked = record.revoked_at.is_some(),
                "identity record from another node"
            );
        }
        let keep = known
            .get(key)
            .is_none_or(|k| change_time(&record) >= change_time(k));
        if keep {
            known.insert(key.to_owned(), record);
        }
    }
}

impl Service for IdentitySync {
    fn name(&self) -> &'static str {
        "identity-sync"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let kv = self.bucket().await?;
        let mut known = BTreeMap::new();
        // What the bucket holds first (the watch delivers the last value of every key, then
        // what changes), then what this node has that is newer.
        let mut watch = kv
            .watch_with_history(">")
            .await
            .map_err(ServiceError::at("watching the identities bucket"))?;
        let mut seen_version = self.identities.version();
        let mut caught_up = false;
        let mut poll = tokio::time::interval(LOCAL_POLL);
        loop {
            tokio::select! {
                () = ctx.cancelled() => return Ok(()),
                entry = watch.next() => {
                    let entry = entry
                        .ok_or_else(|| ServiceError::msg("the identities watch ended"))?
                        .map_err(ServiceError::at("watching the identities bucket"))?;
                    if entry.operation == Operation::Put
                        && let Ok(record) = serde_json::from_slice::<IdentityRecord>(&entry.value)
                    {
                        self.apply(&entry.key, record, &mut known);
                    }
                    if !caught_up && entry.delta == 0 {
                        caught_up = true;
                        self.push(&kv, &mut known).await?;
                        seen_version = self.identities.version();
                        ctx.report(Health::Running);
                    }
                }
                _ = poll.tick() => {
                    if !caught_up {
                        // An empty bucket delivers nothing to the watch.
                        let empty = kv.status().await.map(|s| s.values() == 0).unwrap_or(false);
                        if empty {
                            caught_up = true;
                            self.push(&kv, &mut known).await?;
                            seen_version = self.identities.version();
                            ctx.report(Health::Running);
                        }
                        continue;
                    }
                    let version = self.identities.version();
                    if version != seen_version {
                        seen_version = version;
                        self.push(&kv, &mut known).await?;
                    }
                }
            }
        }
    }
}
