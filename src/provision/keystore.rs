//! The on-disk key store under `<data-dir>/keys`:
//!
//! ```text
//! keys/operator.nk                       operator seed (signs accounts)
//! keys/system/account.nk                 SYS account seed
//! keys/system/cotald.nk                  the appliance's own SYS user
//! keys/spaces/<space>/account.nk         the space's account seed (§9: account = space)
//! keys/spaces/<space>/signing.nk         the account signing key (signs user JWTs)
//! keys/spaces/<space>/local-operator.nk  the machine operator's own user in that space
//! keys/spaces/<space>/manager.nk         the appliance's provisioner in that space
//! keys/spaces/<space>/users/<id>.nk      each minted identity's seed, so that a re-mint keeps
//!                                        its id (and with it its durable state)
//! ```
//!
//! All files are 0600, their directories 0700.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use nkeys::KeyPair;

use super::ProvisionError;
use super::claims::{self, AccountLimits, JetStreamLimits, UserJwt, now_secs};
use super::files::read_private;
use crate::binding::{Creds, UserPermissions};
use crate::files::{FileError, private_dir, write_atomic};
use crate::protocol::InstanceId;

/// The operator and SYS keys, loaded from (or created in) a data dir.
pub struct KeyStore {
    dir: PathBuf,
    operator: KeyPair,
    system: KeyPair,
    system_user: KeyPair,
}

/// One space's account keys.
pub struct SpaceKeys {
    name: String,
    dir: PathBuf,
    account: KeyPair,
    signing: KeyPair,
}

#[derive(Clone, Copy)]
enum Kind {
    Operator,
    Account,
    User,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Operator => "operator",
            Kind::Account => "account",
            Kind::User => "user",
        }
    }

    fn generate(self) -> KeyPair {
        match self {
            Kind::Operator => KeyPair::new_operator(),
            Kind::Account => KeyPair::new_account(),
            Kind::User => KeyPair::new_user(),
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Kind::Operator => "SO",
            Kind::Account => "SA",
            Kind::User => "SU",
        }
    }
}

impl KeyStore {
    /// Loads the key store in `dir`, creating it when the directory holds none of it.
    pub fn load_or_create(dir: &Path) -> Result<Self, ProvisionError> {
        let files = [
            (dir.join("operator.nk"), Kind::Operator),
            (dir.join("system/account.nk"), Kind::Account),
            (dir.join("system/cotald.nk"), Kind::User),
        ];
        let [operator, system, system_user] = load_group(dir, &files, true)?;
        Ok(KeyStore {
            dir: dir.to_owned(),
            operator,
            system,
            system_user,
        })
    }

    /// Loads an existing key store; never creates one.
    pub fn open(dir: &Path) -> Result<Self, ProvisionError> {
        if !dir.join("operator.nk").exists() {
            return Err(ProvisionError::Missing(dir.to_owned()));
        }
        Self::load_or_create(dir)
    }

    /// The operator JWT (self-signed) naming the SYS account.
    pub fn operator_jwt(&self) -> Result<String, ProvisionError> {
        claims::operator_jwt(&self.operator, &self.system.public_key())
    }

    /// The operator's public key.
    pub fn operator_public(&self) -> String {
        self.operator.public_key()
    }

    /// The SYS account's public key.
    pub fn system_account(&self) -> String {
        self.system.public_key()
    }

    /// The SYS account JWT (JetStream disabled).
    pub fn system_account_jwt(&self) -> Result<String, ProvisionError> {
        let none = BTreeMap::new();
        let says = claims::Account {
            name: "SYS",
            signing_key: None,
            limits: &AccountLimits::with_jetstream(JetStreamLimits::DISABLED),
            revocations: &BTreeMap::new(),
            mappings: &none,
        };
        claims::account_jwt(&self.operator, &self.system, &says)
    }

    /// The appliance's own SYS-account user: it pushes account JWTs to the resolver.
    pub fn system_user_creds(&self) -> Result<Creds, ProvisionError> {
        let jwt = claims::user_jwt(
            &self.system,
            &self.system.public_key(),
            UserJwt {
                user_public: self.system_user.public_key(),
                name: "cotald-system",
                issued_at: now_secs(),
                expires: None,
            },
            &UserPermissions::unrestricted(),
        )?;
        seed_creds(jwt, &self.system_user)
    }

    /// A SYS-account user with `permissions`, on a key made for this one connection (nothing is
    /// stored): the appliance's scoped daemons (the membership feed reads one account's
    /// connections and nothing else).
    pub fn system_daemon_creds(
        &self,
        name: &str,
        permissions: impl FnOnce(&InstanceId) -> UserPermissions,
    ) -> Result<Creds, ProvisionError> {
        let user = KeyPair::new_user();
        let id = InstanceId::from_user_nkey(&user.public_key())
            .map_err(|e| ProvisionError::Sign(e.into()))?;
        let jwt = claims::user_jwt(
            &self.system,
            &self.system.public_key(),
            UserJwt {
                user_public: user.public_key(),
                name,
                issued_at: now_secs(),
                expires: None,
            },
            &permissions(&id),
        )?;
        seed_creds(jwt, &user)
    }

    /// Loads a space's keys, creating them when the space is new.
    pub fn ensure_space(&self, space: &str) -> Result<SpaceKeys, ProvisionError> {
        self.load_space(space, true)
    }

    /// Loads an existing space's keys.
    pub fn space(&self, space: &str) -> Result<SpaceKeys, ProvisionError> {
        self.load_space(space, false)
    }

    /// Signs the account JWT of a space. `revocations` maps a user key to the Unix second up
    /// to which that user's JWTs are refused; `mappings` maps a subject to the one the broker
    /// delivers its messages to instead (the DM holds, `space/holds.rs`).
    pub fn space_account_jwt(
        &self,
        space: &SpaceKeys,
        jetstream: JetStreamLimits,
        revocations: &BTreeMap<String, i64>,
        mappings: &BTreeMap<String, String>,
    ) -> Result<String, ProvisionError> {
        let limits = AccountLimits::with_jetstream(jetstream);
        let says = space.account_says(&limits, revocations, mappings);
        claims::account_jwt(&self.operator, &space.account, &says)
    }

    /// Whether `jwt` says what [`KeyStore::space_account_jwt`] would sign now with these
    /// arguments (its issue time aside).
    pub fn space_account_jwt_says(
        &self,
        jwt: &str,
        space: &SpaceKeys,
        jetstream: JetStreamLimits,
        revocations: &BTreeMap<String, i64>,
        mappings: &BTreeMap<String, String>,
    ) -> bool {
        let limits = AccountLimits::with_jetstream(jetstream);
        let says = space.account_says(&limits, revocations, mappings);
        claims::account_jwt_says(jwt, &self.operator, &space.account, &says)
    }

    fn load_space(&self, space: &str, create: bool) -> Result<SpaceKeys, ProvisionError> {
        let dir = self.dir.join("spaces").join(space);
        if !create && !dir.join("account.nk").exists() {
            return Err(ProvisionError::UnknownSpace(space.to_owned()));
        }
        let files = [
            (dir.join("account.nk"), Kind::Account),
            (dir.join("signing.nk"), Kind::Account),
        ];
        let [account, signing] = load_group(&dir, &files, create)?;
        Ok(SpaceKeys {
            name: space.to_owned(),
            dir,
            account,
            signing,
        })
    }
}

impl SpaceKeys {
    /// The space name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What its account JWT says: its name, its signing key, and these.
    fn account_says<'a>(
        &'a self,
        limits: &'a AccountLimits,
        revocations: &'a BTreeMap<String, i64>,
        mappings: &'a BTreeMap<String, String>,
    ) -> claims::Account<'a> {
        claims::Account {
            name: &self.name,
            signing_key: Some(&self.signing),
            limits,
            revocations,
            mappings,
        }
    }

    /// The account public key (`A…`).
    pub fn account_public(&self) -> String {
        self.account.public_key()
    }

    /// Mints a user credential for `user` in this space, signed by the signing key, issued now
    /// and never expiring.
    pub fn mint(
        &self,
        name: &str,
        user: &KeyPair,
        permissions: &UserPermissions,
    ) -> Result<Creds, ProvisionError> {
        self.mint_at(name, user, permissions, now_secs(), None)
    }

    /// Like [`SpaceKeys::mint`], issued at `issued_at` with an expiry (Unix seconds) the broker
    /// enforces.
    pub fn mint_at(
        &self,
        name: &str,
        user: &KeyPair,
        permissions: &UserPermissions,
        issued_at: i64,
        expires: Option<i64>,
    ) -> Result<Creds, ProvisionError> {
        let jwt = claims::user_jwt(
            &self.signing,
            &self.account.public_key(),
            UserJwt {
                user_public: user.public_key(),
                name,
                issued_at,
                expires,
            },
            permissions,
        )?;
        seed_creds(jwt, user)
    }

    /// The stored key of a minted identity, if this data dir holds it.
    pub fn user_key(&self, id: &str) -> Result<Option<KeyPair>, ProvisionError> {
        let path = self.user_key_path(id);
        if !path.exists() {
            return Ok(None);
        }
        load_seed(&path, Kind::User).map(Some)
    }

    /// A new identity's key, stored before anything is signed with it.
    pub fn create_user_key(&self) -> Result<KeyPair, ProvisionError> {
        let user = KeyPair::new_user();
        let path = self.user_key_path(&user.public_key());
        private_dir(&self.dir.join("users"))?;
        let seed = user.seed().map_err(|e| ProvisionError::Sign(e.into()))?;
        write_atomic(&path, format!("{seed}\n").as_bytes(), 0o600)?;
        Ok(user)
    }

    /// Forgets a revoked identity's key.
    pub fn delete_user_key(&self, id: &str) -> Result<(), ProvisionError> {
        let path = self.user_key_path(id);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(FileError::new(&path, "removing", e).into())
            }
            _ => Ok(()),
        }
    }

    /// `users/<id>.nk`; an id is base32 (an nkey), so it never names a path outside `users/`.
    fn user_key_path(&self, id: &str) -> PathBuf {
        let safe: String = id.chars().filter(char::is_ascii_alphanumeric).collect();
        self.dir.join("users").join(format!("{safe}.nk"))
    }

    /// A user of the appliance itself in this space (`local-operator`, `manager`): one stable
    /// key per name under the space's key directory, unrestricted within the space (whoever
    /// can read the data dir holds every key anyway).
    pub fn own_user_creds(&self, name: &str) -> Result<Creds, ProvisionError> {
        self.own_user_creds_with(name, |_| UserPermissions::unrestricted())
    }

    /// Like [`SpaceKeys::own_user_creds`], with the grants `permissions` gives the user's
    /// instance id (the dashboard's observer: Appendix B grants, not the whole space).
    pub fn own_user_creds_with(
        &self,
        name: &str,
        permissions: impl FnOnce(&InstanceId) -> UserPermissions,
    ) -> Result<Creds, ProvisionError> {
        let path = self.dir.join(format!("{name}.nk"));
        let [user] = load_group(&self.dir, &[(path.clone(), Kind::User)], true)?;
        let id = InstanceId::from_user_nkey(&user.public_key()).map_err(|e| {
            ProvisionError::BadSeed {
                path,
                kind: "user",
                reason: e.to_string(),
            }
        })?;
        self.mint(name, &user, &permissions(&id))
    }
}

fn seed_creds(jwt: String, user: &KeyPair) -> Result<Creds, ProvisionError> {
    let seed = user.seed().map_err(|e| ProvisionError::Sign(e.into()))?;
    Ok(Creds { jwt, seed })
}

/// Loads a group of seed files that must exist together. When none exists and `create` is
/// set, all are generated; when some exist and others do not, the store is half present.
fn load_group<const N: usize>(
    dir: &Path,
    files: &[(PathBuf, Kind); N],
    create: bool,
) -> Result<[KeyPair; N], ProvisionError> {
    let present: Vec<bool> = files.iter().map(|(p, _)| p.exists()).collect();
    if let (Some(p), Some(m)) = (
        present.iter().position(|&e| e),
        present.iter().position(|&e| !e),
    ) {
        return Err(ProvisionError::HalfPresent {
            dir: dir.to_owned(),
            present: files[p].0.clone(),
            missing: files[m].0.clone(),
        });
    }
    if !present.iter().any(|&e| e) {
        if !create {
            return Err(ProvisionError::Missing(dir.to_owned()));
        }
        for (path, kind) in files {
            let parent = path.parent().unwrap_or(dir);
            private_dir(parent)?;
            let seed = kind
                .generate()
                .seed()
                .map_err(|e| ProvisionError::Sign(e.into()))?;
            write_atomic(path, format!("{seed}\n").as_bytes(), 0o600)?;
            tracing::info!(path = %path.display(), kind = kind.label(), "generated key");
        }
    }
    let mut out = Vec::with_capacity(N);
    for (path, kind) in files {
        out.push(load_seed(path, *kind)?);
    }
    out.try_into()
        .map_err(|_| FileError::new(dir, "loading keys", std::io::Error::other("key count")).into())
}

fn load_seed(path: &Path, kind: Kind) -> Result<KeyPair, ProvisionError> {
    if let Some(parent) = path.parent() {
        let meta = fs::metadata(parent).map_err(FileError::at(parent, "reading metadata of"))?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777;
        if mode & 0o022 != 0 {
            return Err(ProvisionError::TooOpen {
                path: parent.to_owned(),
                mode,
            });
        }
    }
    let text = read_private(path)?;
    let seed = text.trim();
    let bad = |reason: String| ProvisionError::BadSeed {
        path: path.to_owned(),
        kind: kind.label(),
        reason,
    };
    if !seed.starts_with(kind.prefix()) {
        return Err(bad(format!(
            "expected a seed starting with {}",
            kind.prefix()
        )));
    }
    KeyPair::from_seed(seed).map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn created_once_and_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        let first = KeyStore::load_or_create(&dir).unwrap();
        let space = first.ensure_space("main").unwrap();
        let second = KeyStore::load_or_create(&dir).unwrap();
        assert_eq!(first.system_account(), second.system_account());
        assert_eq!(
            space.account_public(),
            second.space("main").unwrap().account_public()
        );
        let seed = dir.join("spaces/main/signing.nk");
        assert_eq!(
            fs::metadata(&seed).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::metadata(dir.join("spaces/main"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
    }

    #[test]
    fn half_present_store_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        KeyStore::load_or_create(&dir).unwrap();
        fs::remove_file(dir.join("system/account.nk")).unwrap();
        let err = KeyStore::load_or_create(&dir).err().unwrap();
        assert!(matches!(err, ProvisionError::HalfPresent { .. }), "{err}");
        assert!(err.to_string().contains("system/account.nk"));
    }

    #[test]
    fn half_present_space_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = KeyStore::load_or_create(tmp.path()).unwrap();
        store.ensure_space("main").unwrap();
        fs::remove_file(tmp.path().join("spaces/main/signing.nk")).unwrap();
        assert!(matches!(
            store.ensure_space("main"),
            Err(ProvisionError::HalfPresent { .. })
        ));
    }

    #[test]
    fn world_readable_seed_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        KeyStore::load_or_create(tmp.path()).unwrap();
        let path = tmp.path().join("operator.nk");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = KeyStore::load_or_create(tmp.path()).err().unwrap();
        assert!(
            matches!(err, ProvisionError::TooOpen { mode: 0o644, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("chmod 600"));
    }

    #[test]
    fn open_never_creates() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            KeyStore::open(&tmp.path().join("keys")),
            Err(ProvisionError::Missing(_))
        ));
        let store = KeyStore::load_or_create(tmp.path()).unwrap();
        assert!(matches!(
            store.space("nope"),
            Err(ProvisionError::UnknownSpace(_))
        ));
    }

    #[test]
    fn wrong_seed_kind_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        KeyStore::load_or_create(tmp.path()).unwrap();
        let user_seed = KeyPair::new_user().seed().unwrap();
        write_atomic(&tmp.path().join("operator.nk"), user_seed.as_bytes(), 0o600).unwrap();
        assert!(matches!(
            KeyStore::load_or_create(tmp.path()),
            Err(ProvisionError::BadSeed {
                kind: "operator",
                ..
            })
        ));
    }
}
