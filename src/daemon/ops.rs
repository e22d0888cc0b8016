//! The operations the admin socket serves (the table is in [`crate::ops`]), executed against
//! the running appliance; and `mint` against the data dir alone when no appliance runs — the
//! same operation on the same identities, whose durables the next `cotald up` creates.

use std::sync::Arc;

use serde_json::Value;

use super::{Core, DaemonError, Served, join_link};
use crate::datadir::DataDir;
use crate::ops::{
    ChannelsSet, IdentityRecord, MintReply, MintRequest, OpError, Request, Revoke, SpaceAdd,
    SpaceInfo, Stopping,
};
use crate::profile::SpaceConfig;
use crate::provision::{KeyStore, now_secs};
use crate::services::identity_sync;
use crate::space::{Identities, identity, store};

fn json<T: serde::Serialize>(value: T) -> Result<Value, DaemonError> {
    serde_json::to_value(value).map_err(DaemonError::Reply)
}

impl Core {
    /// Executes a request of the machine operator.
    pub(crate) async fn execute(self: &Arc<Self>, req: Request) -> Result<Value, DaemonError> {
        match req {
            Request::SpaceAdd(add) => json(self.add_space(add).await?),
            Request::SpaceList => json(self.list_spaces().await?),
            Request::Shutdown => {
                tracing::info!("shutdown requested on the admin socket");
                self.stop.cancel();
                json(Stopping {
                    pid: std::process::id(),
                })
            }
            Request::BrokerHealth => json(self.broker_health().await),
            Request::Delivery => json(self.delivery().await),
            Request::Backup(req) => json(self.backup(req).await?),
            Request::Mint(req) => json(self.mint(&req).await?),
            Request::Revoke(req) => json(self.revoke(&req).await?),
            Request::ChannelsSet(req) => json(self.channels_set(req).await?),
            Request::ChannelsRm(req) => {
                let space = req
                    .space
                    .clone()
                    .ok_or(DaemonError::NeedsSpace("channels-rm"))?;
                let served = self.served(&space).await?;
                json(served.space.remove_channel(&req.channel, req.purge).await?)
            }
            other => Err(OpError::WrongTransport {
                op: other.op(),
                transport: "the admin socket",
            }
            .into()),
        }
    }

    /// `broker-health`: `HEALTHZ` and `VARZ`, each bounded by a second.
    async fn broker_health(&self) -> crate::ops::BrokerHealth {
        let timeout = std::time::Duration::from_secs(1);
        let (health, varz) = tokio::join!(self.monitor.check(timeout), self.monitor.varz(timeout));
        crate::ops::BrokerHealth {
            healthy: health.is_ok(),
            reason: health.err().map(|e| e.to_string()),
            version: varz
                .ok()
                .and_then(|v| v["version"].as_str().map(str::to_owned)),
        }
    }

    /// `delivery`: each served space's refusals, and its online durable members' delivery.
    async fn delivery(&self) -> crate::ops::status::DeliveryReport {
        let mut report = crate::ops::status::DeliveryReport::new();
        for (name, served) in self.spaces.all().await {
            let backstop = served.manager.backstop();
            report.insert(
                name,
                crate::ops::status::SpaceDelivery {
                    refused: served.space.refusals().counts(),
                    stall_after_secs: backstop.stall_after().as_secs(),
                    members: backstop.delivery().await,
                },
            );
        }
        report
    }

    /// `space-add`: serve a new space at once; it is remembered (and served at every later
    /// start) only once it is served.
    async fn add_space(self: &Arc<Self>, add: SpaceAdd) -> Result<SpaceInfo, DaemonError> {
        let name = add.name.as_str();
        crate::profile::validate_space_name(name).map_err(DaemonError::SpaceName)?;
        if self.spaces.holds_name(name).await {
            return Err(DaemonError::SpaceExists(name.to_owned()));
        }
        let info = self
            .serve_space(name, SpaceConfig::with_profile(add.profile), None)
            .await?;
        store::add_runtime_space(&self.dir, name, add.profile)?;
        self.state.write()?;
        self.record_served().await?;
        tracing::info!(space = name, profile = ?add.profile, "space added");
        Ok(info)
    }

    /// In a cluster: puts an identity record into the space's shared bucket at once, so that
    /// whichever node holds the space's lease knows it before the credential is used.
    async fn share(&self, served: &Served, record: &IdentityRecord) -> Result<(), DaemonError> {
        if self.cluster.is_none() {
            return Ok(());
        }
        identity_sync::share(&served.space, record)
            .await
            .map_err(|source| DaemonError::Service {
                space: served.space.name().to_owned(),
                source,
            })
    }

    /// A served space, by name; the map of spaces is not held past the lookup, so that no
    /// operation holds it across a broker round trip.
    async fn served(&self, space: &str) -> Result<Arc<Served>, DaemonError> {
        self.spaces
            .get(space)
            .await
            .ok_or_else(|| DaemonError::UnknownSpace(space.to_owned()))
    }

    /// `space-list`.
    async fn list_spaces(&self) -> Result<Vec<SpaceInfo>, DaemonError> {
        let spaces = self.spaces.all().await;
        spaces
            .iter()
            .map(|(_, s)| self.space_info(&s.space))
            .collect()
    }

    /// `mint`: sign, remember, pre-create the identity's durables; a re-mint's revocation of
    /// the replaced credential is pushed to the broker at once.
    async fn mint(&self, req: &MintRequest) -> Result<MintReply, DaemonError> {
        let served = self.served(&req.space).await?;
        let _changing = served.changing.lock().await;
        let served = served.as_ref();
        let keys = self.keys.space(&req.space)?;
        let minted = identity::mint_identity(&keys, &served.identities, req)?;
        served.space.provision(&minted.record).await?;
        // The new record and, after a re-mint with a new key, the replaced one as revoked.
        let changed: Vec<&str> = std::iter::once(minted.record.id.as_str())
            .chain(minted.replaced.iter().map(|old| old.id.as_str()))
            .collect();
        for record in served.identities.records() {
            if changed.contains(&record.id.as_str()) {
                self.share(served, &record).await?;
            }
        }
        if let Some(old) = &minted.replaced {
            self.push_served(&keys, served).await?;
            if old.id != minted.record.id {
                served.space.deprovision(old).await?;
            }
        }
        tracing::info!(space = %req.space, id = %minted.record.id, name = %minted.record.name,
            profile = ?minted.record.profile, replaced = minted.replaced.is_some(), "minted");
        Ok(MintReply {
            link: self.link(&req.space, &minted.record.subscribe)?.to_string(),
            creds: minted.creds.render(),
            record: minted.record,
            provisioned: true,
            replaced: minted.replaced.is_some(),
        })
    }

    /// `revoke`: the identity's credentials are refused from now on (its connections are
    /// closed), its key forgotten, its durables, DM backlog, durable memberships and backstop
    /// backlog deleted.
    async fn revoke(&self, req: &Revoke) -> Result<IdentityRecord, DaemonError> {
        let served = self.served(&req.space).await?;
        let _changing = served.changing.lock().await;
        let served = served.as_ref();
        let record =
            served
                .identities
                .find(&req.name)
                .ok_or_else(|| DaemonError::UnknownIdentity {
                    name: req.name.clone(),
                    space: req.space.clone(),
                })?;
        let now = now_secs();
        let revoked = IdentityRecord {
            revoked_at: Some(now),
            revokes_before: Some(now),
            ..record
        };
        served.identities.save(revoked.clone())?;
        self.share(served, &revoked).await?;
        let keys = self.keys.space(&req.space)?;
        self.push_served(&keys, served).await?;
        keys.delete_user_key(&revoked.id)?;
        served.space.deprovision(&revoked).await?;
        served
            .manager
            .forget(&revoked.id)
            .await
            .map_err(|e| DaemonError::Service {
                space: req.space.clone(),
                source: crate::services::ServiceError::new("ending the memberships", e),
            })?;
        tracing::info!(space = %req.space, id = %revoked.id, name = %revoked.name, "revoked");
        Ok(revoked)
    }

    /// `channels-set` from the machine operator.
    async fn channels_set(&self, req: ChannelsSet) -> Result<Value, DaemonError> {
        let space = req
            .space
            .clone()
            .ok_or(DaemonError::NeedsSpace("channels-set"))?;
        let served = self.served(&space).await?;
        json(served.space.set_channel(&req.channel, &req.config).await?)
    }
}

/// Executes a request with no appliance running: only `mint` can be, on the data dir alone
/// (holding its lock proves no appliance is starting meanwhile).
pub fn execute_offline(dir: &DataDir, req: &Request) -> Result<Value, DaemonError> {
    let Request::Mint(req) = req else {
        return Err(OpError::NotAllowed {
            op: req.op(),
            reason: format!(
                "no cotald is running on {}; start it with `cotald up`",
                dir.root().display()
            ),
        }
        .into());
    };
    let _lock = dir.lock()?;
    let keys = KeyStore::open(&dir.keys())?;
    let space = keys
        .space(&req.space)
        .map_err(|_| DaemonError::UnknownSpace(req.space.clone()))?;
    let identities = Identities::load(dir, &req.space);
    let minted = identity::mint_identity(&space, &identities, req)?;
    // Where the appliance listened last time (and will again), else the default profile's.
    let link_host = match dir.read_last_served() {
        Some(last) => last.link_host,
        None => crate::profile::Profile::embedded()
            .map_err(DaemonError::EmbeddedProfile)?
            .broker
            .listen
            .to_string(),
    };
    json(MintReply {
        link: join_link(&link_host, &req.space, &minted.record.subscribe)?.to_string(),
        creds: minted.creds.render(),
        replaced: minted.replaced.is_some(),
        record: minted.record,
        provisioned: false,
    })
}
