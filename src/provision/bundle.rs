//! The cluster join bundle: the signing material every node of a cluster of appliances must
//! share, and nothing more.
//!
//! One trust chain serves the whole cluster: a credential minted on any node must be accepted by
//! every node's broker, an account JWT pushed by one node must verify on the others (the `full`
//! resolver replicates it), and the routes between nodes authenticate each other with the same
//! CA. So the bundle holds:
//!
//! - the operator seed (signs account JWTs, and its public key names the trust chain);
//! - the SYS account seed (signs the system users each node makes for itself);
//! - each space's account seed and signing key (the account JWT, and the users minted on any
//!   node);
//! - the TLS CA certificate and key (each node issues its own server certificate for its own
//!   names, which clients and the other nodes' routes verify);
//! - the cluster's name.
//!
//! It does **not** hold any user seed (the appliance's own system user, the provisioner, the
//! machine operator, minted identities): each node makes its own, and a minted identity's seed
//! stays with the identity. The file is written owner-only (0600) and refused when group or
//! others can read it; it is as sensitive as the key store itself, so it is meant to be copied
//! over a channel the operator trusts (scp) and deleted after the join.
//!
//! Importing writes the files in the key store's own layout; a node that already has a key store
//! must share the bundle's operator (then only the spaces it lacks are added: the way to hand a
//! space created after the join to the other nodes).

use std::collections::BTreeMap;
use std::path::Path;

use nkeys::KeyPair;
use serde::{Deserialize, Serialize};

use super::ProvisionError;
use super::files::read_private;
use crate::files::{FileError, private_dir, write_atomic, write_new};

/// The version of the bundle format.
const VERSION: u32 = 1;

/// What `cotald cluster init` writes and `cotald cluster join` reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinBundle {
    /// The format's version.
    pub version: u32,
    /// The cluster's name.
    pub cluster: String,
    /// The operator seed.
    pub operator: String,
    /// The SYS account seed.
    pub system_account: String,
    /// Each space's account seed and signing seed.
    pub spaces: BTreeMap<String, SpaceSeeds>,
    /// The CA certificate (PEM).
    pub ca_cert: String,
    /// The CA key (PEM).
    pub ca_key: String,
}

/// One space's account keys.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpaceSeeds {
    /// The account seed.
    pub account: String,
    /// The account's signing key seed.
    pub signing: String,
}

/// What an import did.
#[derive(Debug, Clone, Default)]
pub struct Imported {
    /// Whether the operator, SYS and CA were written (a fresh data dir).
    pub trust_chain: bool,
    /// The spaces whose keys were written.
    pub spaces: Vec<String>,
}

fn seed(keys: &Path, rel: &str) -> Result<String, ProvisionError> {
    Ok(read_private(&keys.join(rel))?.trim().to_owned())
}

impl JoinBundle {
    /// Reads the trust chain of the data dir whose key store is `keys` and TLS dir is `tls`.
    pub fn export(keys: &Path, tls: &Path, cluster: &str) -> Result<Self, ProvisionError> {
        if !keys.join("operator.nk").exists() {
            return Err(ProvisionError::Missing(keys.to_owned()));
        }
        let mut spaces = BTreeMap::new();
        let dir = keys.join("spaces");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !entry.path().join("account.nk").exists() {
                    continue;
                }
                spaces.insert(
                    name.clone(),
                    SpaceSeeds {
                        account: seed(keys, &format!("spaces/{name}/account.nk"))?,
                        signing: seed(keys, &format!("spaces/{name}/signing.nk"))?,
                    },
                );
            }
        }
        Ok(JoinBundle {
            version: VERSION,
            cluster: cluster.to_owned(),
            operator: seed(keys, "operator.nk")?,
            system_account: seed(keys, "system/account.nk")?,
            spaces,
            ca_cert: std::fs::read_to_string(tls.join("ca.pem"))
                .map_err(FileError::at(&tls.join("ca.pem"), "reading"))?,
            ca_key: read_private(&tls.join("ca.key"))?,
        })
    }

    /// Writes the bundle to `path`, owner-only; an existing file is not overwritten.
    pub fn write(&self, path: &Path) -> Result<(), ProvisionError> {
        let text = serde_json::to_vec_pretty(self).unwrap_or_default();
        Ok(write_new(path, &text, 0o600)?)
    }

    /// Reads a bundle, refusing one that group or others can read.
    pub fn read(path: &Path) -> Result<Self, ProvisionError> {
        let text = read_private(path)?;
        let bundle: JoinBundle =
            serde_json::from_str(&text).map_err(|e| ProvisionError::BadSeed {
                path: path.to_owned(),
                kind: "join bundle",
                reason: e.to_string(),
            })?;
        if bundle.version != VERSION {
            return Err(ProvisionError::BadSeed {
                path: path.to_owned(),
                kind: "join bundle",
                reason: format!("format version {} (expected {VERSION})", bundle.version),
            });
        }
        let check = |what: &'static str, seed: &str, prefix: &str| {
            KeyPair::from_seed(seed)
                .ok()
                .filter(|_| seed.starts_with(prefix))
                .map(|_| ())
                .ok_or_else(|| ProvisionError::BadSeed {
                    path: path.to_owned(),
                    kind: what,
                    reason: "not a valid seed".into(),
                })
        };
        check("operator", &bundle.operator, "SO")?;
        check("account", &bundle.system_account, "SA")?;
        for s in bundle.spaces.values() {
            check("account", &s.account, "SA")?;
            check("account", &s.signing, "SA")?;
        }
        Ok(bundle)
    }

    /// The operator's public key.
    pub fn operator_public(&self) -> String {
        KeyPair::from_seed(&self.operator)
            .map(|k| k.public_key())
            .unwrap_or_default()
    }

    /// Writes the bundle's keys into the key store `keys` and the CA into `tls`. A fresh data
    /// dir gets the whole trust chain and a system user of its own; one that has a key store
    /// must have the same operator, and gets only the spaces it lacks.
    pub fn import(&self, keys: &Path, tls: &Path) -> Result<Imported, ProvisionError> {
        let mut imported = Imported::default();
        let write = |rel: &str, text: &str| -> Result<(), ProvisionError> {
            let path = keys.join(rel);
            if let Some(parent) = path.parent() {
                private_dir(parent)?;
            }
            Ok(write_atomic(&path, format!("{text}\n").as_bytes(), 0o600)?)
        };
        if keys.join("operator.nk").exists() {
            let ours = seed(keys, "operator.nk")?;
            let ours = KeyPair::from_seed(&ours)
                .map(|k| k.public_key())
                .unwrap_or_default();
            if ours != self.operator_public() {
                return Err(ProvisionError::OwnTrustChain { ours });
            }
        } else {
            private_dir(keys)?;
            private_dir(tls)?;
            write("operator.nk", &self.operator)?;
            write("system/account.nk", &self.system_account)?;
            let user = KeyPair::new_user()
                .seed()
                .map_err(|e| ProvisionError::Sign(e.into()))?;
            write("system/cotald.nk", &user)?;
            write_atomic(&tls.join("ca.key"), self.ca_key.as_bytes(), 0o600)?;
            write_atomic(&tls.join("ca.pem"), self.ca_cert.as_bytes(), 0o644)?;
            imported.trust_chain = true;
        }
        for (name, s) in &self.spaces {
            crate::profile::validate_space_name(name).map_err(ProvisionError::BadSpaceName)?;
            if keys.join(format!("spaces/{name}/account.nk")).exists() {
                continue;
            }
            write(&format!("spaces/{name}/account.nk"), &s.account)?;
            write(&format!("spaces/{name}/signing.nk"), &s.signing)?;
            imported.spaces.push(name.clone());
        }
        Ok(imported)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::provision::{KeyStore, TlsFiles};

    #[test]
    fn a_joined_store_shares_the_trust_chain_and_no_user_seed() {
        let first = tempfile::tempdir().unwrap();
        let keys = KeyStore::load_or_create(&first.path().join("keys")).unwrap();
        keys.ensure_space("main").unwrap();
        let year = std::time::Duration::from_secs(365 * 24 * 3600);
        TlsFiles::ensure(&first.path().join("tls"), &[], year).unwrap();
        let bundle = JoinBundle::export(
            &first.path().join("keys"),
            &first.path().join("tls"),
            "team",
        )
        .unwrap();
        let path = first.path().join("bundle.json");
        bundle.write(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("\"SU"), "no user seed in the bundle");
        assert!(bundle.write(&path).is_err(), "never overwritten");

        let second = tempfile::tempdir().unwrap();
        let read = JoinBundle::read(&path).unwrap();
        let done = read
            .import(&second.path().join("keys"), &second.path().join("tls"))
            .unwrap();
        assert!(done.trust_chain);
        assert_eq!(done.spaces, ["main"]);
        let joined = KeyStore::open(&second.path().join("keys")).unwrap();
        assert_eq!(joined.operator_public(), keys.operator_public());
        assert_eq!(
            joined.space("main").unwrap().account_public(),
            keys.space("main").unwrap().account_public()
        );
        assert_ne!(
            joined.system_user_creds().unwrap().public_key().unwrap(),
            keys.system_user_creds().unwrap().public_key().unwrap(),
            "each node has its own system user"
        );
        // A second import adds nothing; a foreign store is refused.
        let again = read
            .import(&second.path().join("keys"), &second.path().join("tls"))
            .unwrap();
        assert!(!again.trust_chain && again.spaces.is_empty());
        let foreign = tempfile::tempdir().unwrap();
        KeyStore::load_or_create(&foreign.path().join("keys")).unwrap();
        assert!(
            read.import(&foreign.path().join("keys"), &foreign.path().join("tls"))
                .is_err()
        );
        // A bundle others can read is refused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(JoinBundle::read(&path).is_err());
    }
}
