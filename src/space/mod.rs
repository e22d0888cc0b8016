//! A served space on a running broker (§1: one space = one account): its provisioner
//! connection, the idempotent bootstrap of its streams and buckets (§8), the identities minted
//! for it (Appendix B) and the durables pre-created for them.
//!
//! The provisioner connects as the space's `manager` user (allow-all within the account, as
//! Appendix B has it in v0); agents never hold its credentials.

pub mod bootstrap;
pub mod identity;
pub mod store;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use async_nats::jetstream;

use crate::binding::{SpaceNames, streams};
use crate::profile::SpaceConfig;
use crate::provision::SpaceKeys;

pub use bootstrap::{BootstrapError, BootstrapReport, bootstrap};
pub use identity::{CredentialProfile, IdentityRecord, MintError, MintRequest, Minted};

/// Why a space could not be served.
#[derive(Debug, thiserror::Error)]
pub enum SpaceError {
    /// The provisioner could not connect.
    #[error("space `{space}`: the provisioner cannot connect to {addr}: {reason}")]
    Connect {
        space: String,
        addr: SocketAddr,
        reason: String,
    },
    /// Bootstrap failed.
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    /// Keys.
    #[error(transparent)]
    Provision(#[from] crate::provision::ProvisionError),
    /// A durable could not be created.
    #[error("space `{space}`: cannot create durable {durable}: {reason}")]
    Durable {
        space: String,
        durable: String,
        reason: String,
    },
}

/// One served space.
pub struct Space {
    names: SpaceNames,
    config: SpaceConfig,
    account: String,
    client: async_nats::Client,
    js: jetstream::Context,
}

impl Space {
    /// Connects the space's provisioner over TLS.
    pub async fn connect(
        keys: &SpaceKeys,
        config: SpaceConfig,
        addr: SocketAddr,
        ca: &Path,
    ) -> Result<Self, SpaceError> {
        let space = keys.name().to_owned();
        let fail = |reason: String| SpaceError::Connect {
            space: space.clone(),
            addr,
            reason,
        };
        let creds = keys.own_user_creds("manager")?;
        let client = async_nats::ConnectOptions::with_credentials(&creds.render())
            .map_err(|e| fail(e.to_string()))?
            .name(format!("cotald-manager-{space}"))
            .add_root_certificates(ca.to_owned())
            .require_tls(true)
            .connection_timeout(Duration::from_secs(10))
            .connect(format!("tls://{addr}"))
            .await
            .map_err(|e| fail(e.to_string()))?;
        let js = jetstream::new(client.clone());
        Ok(Space {
            names: SpaceNames::new(&space),
            config,
            account: keys.account_public(),
            client,
            js,
        })
    }

    /// The space name.
    pub fn name(&self) -> &str {
        self.names.space()
    }

    /// The space's JetStream names.
    pub fn names(&self) -> &SpaceNames {
        &self.names
    }

    /// The space's profile.
    pub fn config(&self) -> &SpaceConfig {
        &self.config
    }

    /// The account public key.
    pub fn account(&self) -> &str {
        &self.account
    }

    /// Creates what is missing, reports drift (§8).
    pub async fn bootstrap(&self) -> Result<BootstrapReport, SpaceError> {
        let report = bootstrap(
            &self.js,
            &self.names,
            &self.config.retention(),
            &self.config.registry_entries(),
        )
        .await?;
        tracing::info!(
            space = self.name(),
            created = report.created.len(),
            drift = report.drift.len(),
            registry_written = report.registry_written.len(),
            "space bootstrapped"
        );
        Ok(report)
    }

    /// Pre-creates the durables an identity binds: `dm_<id>` for every agent and `svc_<role>`
    /// when it has a role (Appendix B: agents bind, never create). Idempotent.
    pub async fn provision(&self, record: &IdentityRecord) -> Result<(), SpaceError> {
        if record.profile != CredentialProfile::Agent {
            return Ok(());
        }
        self.ensure_consumer(
            self.names.dm_stream(),
            streams::dm_consumer(&self.names, &record.id),
        )
        .await?;
        if let Some(role) = &record.role {
            self.ensure_consumer(
                self.names.task_stream(),
                streams::svc_consumer(&self.names, role),
            )
            .await?;
        }
        Ok(())
    }

    async fn ensure_consumer(
        &self,
        stream: String,
        config: jetstream::consumer::pull::Config,
    ) -> Result<(), SpaceError> {
        let durable = config.durable_name.clone().unwrap_or_default();
        let fail = |reason: String| SpaceError::Durable {
            space: self.name().to_owned(),
            durable: durable.clone(),
            reason,
        };
        let stream = self
            .js
            .get_stream(&stream)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let mut consumer = stream
            .get_or_create_consumer(&durable, config.clone())
            .await
            .map_err(|e| fail(e.to_string()))?;
        // An existing durable is bound by agents as it is: it must be the §8 one.
        let actual = consumer
            .info()
            .await
            .map_err(|e| fail(e.to_string()))?
            .config
            .clone();
        if actual.filter_subject != config.filter_subject
            || actual.deliver_subject.is_some()
            || actual.ack_policy != config.ack_policy
        {
            return Err(fail(format!(
                "it exists with filter {:?}, deliver subject {:?}, ack policy {:?}; expected \
                 filter {:?}, pull, explicit ack",
                actual.filter_subject,
                actual.deliver_subject,
                actual.ack_policy,
                config.filter_subject
            )));
        }
        Ok(())
    }

    /// Closes the provisioner connection.
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.client.drain()).await;
    }
}
