//! Phase 5: each space's account JWT, signed with the operator key and pushed to the broker's
//! resolver over the appliance's system connection (`$SYS.REQ.CLAIMS.UPDATE`), and again
//! whenever what it says changes: an identity minted or revoked (its revocations), a sender
//! held or released by the warden (its mappings, `space/holds.rs`).
//!
//! [`Accounts`] owns what a push needs and what it remembers: the system connection, the
//! operator's keys, one push at a time, what each space's last push said. The warden reaches it
//! through [`SpaceAccount`], the [`AccountPush`] of one served space.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::profile::SpaceConfig;
use crate::provision::{JetStreamLimits, KeyStore, ProvisionError, SpaceKeys};
use crate::services::warden::AccountPush;
use crate::space::{Identities, Space};

/// How long the broker may take to answer a push.
const PUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a space's account JWT is not in the broker.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// It could not be signed.
    #[error("signing the account of space `{space}`")]
    Sign {
        /// The space.
        space: String,
        /// Why.
        #[source]
        source: ProvisionError,
    },
    /// The broker did not answer.
    #[error("the broker did not answer the account of space `{space}` within {PUSH_TIMEOUT:?}")]
    NoAnswer {
        /// The space.
        space: String,
    },
    /// The request failed.
    #[error("pushing the account of space `{space}`")]
    Request {
        /// The space.
        space: String,
        /// Why.
        #[source]
        source: async_nats::RequestError,
    },
    /// The broker's answer is not JSON.
    #[error("the broker's answer to the account of space `{space}` is not JSON")]
    Answer {
        /// The space.
        space: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The broker refused it, in its words.
    #[error("the broker refused the account of space `{space}`: {said}")]
    Refused {
        /// The space.
        space: String,
        /// The broker's `error`, as it said it.
        said: String,
    },
    /// The space is no longer served (a warden's push after its space was taken down).
    #[error("space `{0}` is no longer served")]
    NotServed(String),
}

/// Whether an account is pushed when it says what the last push said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Push {
    /// Only when it changed (an operator's mint or revoke, a space served).
    IfChanged,
    /// Whatever was pushed before: the warden pushes its holds again until the broker has
    /// them (another node of a cluster, or a push the broker ignored, may have left it without).
    Always,
}

/// What a space's account JWT says beyond its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AccountState {
    limits: JetStreamLimits,
    revocations: BTreeMap<String, i64>,
    mappings: BTreeMap<String, String>,
}

/// Signs and pushes the spaces' account JWTs, one at a time, remembering what each said.
pub(super) struct Accounts {
    system: async_nats::Client,
    keys: Arc<KeyStore>,
    /// A node of a cluster pushes even what it pushed before: another node may have pushed
    /// another state since.
    clustered: bool,
    /// Held while an account JWT is signed and pushed.
    pushing: tokio::sync::Mutex<()>,
    /// What each space's account JWT last pushed said.
    pushed: std::sync::Mutex<BTreeMap<String, AccountState>>,
    /// The broker's resolver store (`jwt/`), where an earlier start left what it pushed.
    resolver: PathBuf,
}

impl Accounts {
    /// Pushes over `system` (the appliance's SYS connection, the monitor's: it lives as long
    /// as the broker's supervisor), signing with `keys`.
    pub(super) fn new(
        system: async_nats::Client,
        keys: Arc<KeyStore>,
        clustered: bool,
        resolver: PathBuf,
    ) -> Self {
        Accounts {
            system,
            keys,
            clustered,
            pushing: tokio::sync::Mutex::new(()),
            pushed: std::sync::Mutex::new(BTreeMap::new()),
            resolver,
        }
    }

    /// Signs and pushes a space's account JWT: its JetStream limits, the revocations of its
    /// identities (a revoked credential is refused from then on) and the mappings of its held
    /// senders (`space/holds.rs`; none before the space is served).
    pub(super) async fn push(
        &self,
        keys: &SpaceKeys,
        config: &SpaceConfig,
        identities: &Identities,
        served: Option<&Space>,
        push: Push,
    ) -> Result<(), PushError> {
        // One at a time, so that they reach the broker in the order they were signed: it
        // ignores an account JWT issued before the one it has. The state is read once the
        // turn comes, so a burst of requests costs one push of the latest state, and those
        // after it find nothing changed.
        let _pushing = self.pushing.lock().await;
        let wanted = AccountState {
            limits: JetStreamLimits {
                mem_storage: config.jetstream.max_memory_store,
                disk_storage: config.jetstream.max_file_store,
                streams: -1,
                consumer: -1,
            },
            revocations: identities.revocations(),
            mappings: served
                .map(|s| s.holds().mappings(s.names()))
                .unwrap_or_default(),
        };
        let space = keys.name();
        // A push rebuilds the account's JetStream API import in the broker: its agents' requests
        // of that instant find no responder. So nothing is pushed that the broker has already.
        let unchanged = push == Push::IfChanged
            && (self.pushed().get(space).is_some_and(|last| *last == wanted)
                || self.on_file(keys, &wanted));
        if unchanged && !self.clustered {
            tracing::debug!(space, "account unchanged; not pushed");
            return Ok(());
        }
        let jwt = self
            .keys
            .space_account_jwt(keys, wanted.limits, &wanted.revocations, &wanted.mappings)
            .map_err(|source| PushError::Sign {
                space: space.to_owned(),
                source,
            })?;
        self.send(space, jwt).await?;
        self.pushed().insert(space.to_owned(), wanted);
        Ok(())
    }

    /// Whether the broker holds `wanted` already: a single node's resolver store keeps the
    /// account JWT pushed at an earlier start, which the broker loaded as it started (a warm
    /// start then pushes nothing, and the space's connection made meanwhile is used at once).
    /// Looked at until the space's first push since the start; recorded as pushed when it says
    /// the same.
    fn on_file(&self, keys: &SpaceKeys, wanted: &AccountState) -> bool {
        if self.clustered || self.pushed().contains_key(keys.name()) {
            return false;
        }
        let file = self.resolver.join(format!("{}.jwt", keys.account_public()));
        let Ok(jwt) = std::fs::read_to_string(file) else {
            return false;
        };
        let same = self.keys.space_account_jwt_says(
            &jwt,
            keys,
            wanted.limits,
            &wanted.revocations,
            &wanted.mappings,
        );
        if same {
            self.pushed().insert(keys.name().to_owned(), wanted.clone());
        }
        same
    }

    fn pushed(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, AccountState>> {
        self.pushed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One `CLAIMS.UPDATE` request, and the broker's verdict.
    async fn send(&self, space: &str, jwt: String) -> Result<(), PushError> {
        let space_owned = || space.to_owned();
        let reply = tokio::time::timeout(
            PUSH_TIMEOUT,
            self.system
                .request(crate::binding::system::CLAIMS_UPDATE, jwt.into()),
        )
        .await
        .map_err(|_| PushError::NoAnswer {
            space: space_owned(),
        })?
        .map_err(|source| PushError::Request {
            space: space_owned(),
            source,
        })?;
        let body: serde_json::Value =
            serde_json::from_slice(&reply.payload).map_err(|source| PushError::Answer {
                space: space_owned(),
                source,
            })?;
        if let Some(said) = body.get("error") {
            return Err(PushError::Refused {
                space: space_owned(),
                said: said.to_string(),
            });
        }
        tracing::debug!(space, reply = %body, "account pushed");
        Ok(())
    }
}

/// One served space's account, as the warden pushes it again for its holds. The space's keys
/// are loaded once: a hold is pushed while its sender may be flooding.
pub(super) struct SpaceAccount {
    accounts: Arc<Accounts>,
    keys: SpaceKeys,
    config: SpaceConfig,
    identities: Arc<Identities>,
    /// Not kept alive by its warden: a space taken down is no longer pushed.
    space: Weak<Space>,
}

impl SpaceAccount {
    pub(super) fn new(
        accounts: Arc<Accounts>,
        keys: SpaceKeys,
        space: &Arc<Space>,
        identities: Arc<Identities>,
    ) -> Self {
        SpaceAccount {
            accounts,
            keys,
            config: space.config().clone(),
            identities,
            space: Arc::downgrade(space),
        }
    }
}

impl AccountPush for SpaceAccount {
    fn push_again(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<(), crate::services::warden::PushFailed>> + Send + '_>>
    {
        Box::pin(async move {
            let space = self
                .space
                .upgrade()
                .ok_or_else(|| PushError::NotServed(self.keys.name().to_owned()))?;
            self.accounts
                .push(
                    &self.keys,
                    &self.config,
                    &self.identities,
                    Some(&space),
                    Push::Always,
                )
                .await?;
            Ok(())
        })
    }
}
