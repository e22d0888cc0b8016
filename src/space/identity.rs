//! Minting a credential (Appendix B, §9): validate the request, build the profile's
//! permissions, sign the user JWT with the space's signing key, and describe the identity so
//! that the provisioner can pre-create what it binds.
//!
//! Validation refuses rather than rewrites: a channel pattern that sanitization would change
//! (`foo/bar`), a misplaced `>` (`a.>.b`), an empty segment, or a `subscribe` entry that
//! `allowSubscribe` does not cover are errors, and nothing is written.
//!
//! A name is an identity's handle in its space: re-minting it keeps the identity's key (so its
//! id, durable memberships and backlog stay) and issues the new credential one second after the
//! old one, so that revoking everything issued up to the old one's time spares the new one.

use crate::binding::acl::{self, AgentScope};
use crate::binding::{Creds, SpaceNames};
use crate::ops::{CredentialProfile, IdentityRecord, MintRequest};
use crate::profile::validate_token;
use crate::protocol::{ChannelPattern, InstanceId, ReplayWindow};
use crate::provision::{SpaceKeys, now_secs};

use super::identities::Identities;

/// A minted credential and what it was minted for.
pub struct Minted {
    /// The identity.
    pub record: IdentityRecord,
    /// The credential (secret).
    pub creds: Creds,
    /// The identity of that name it replaced, if any (as recorded before the re-mint).
    pub replaced: Option<IdentityRecord>,
}

/// Why a mint request was refused.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// A field is invalid.
    #[error("{0}")]
    Invalid(String),
    /// The name is taken and the request does not say `replace`.
    #[error(
        "identity `{name}` already exists in space {space} (id {id}); pass --replace to \
         re-issue its credential (the current one is revoked), or choose another name"
    )]
    Exists {
        /// The name.
        name: String,
        /// The space.
        space: String,
        /// The existing identity's id.
        id: String,
    },
    /// Signing failed.
    #[error(transparent)]
    Provision(#[from] crate::provision::ProvisionError),
    /// The record could not be stored.
    #[error(transparent)]
    Store(#[from] super::store::StoreError),
}

fn patterns(flag: &str, raw: &[String]) -> Result<Vec<ChannelPattern>, MintError> {
    raw.iter()
        .map(|c| {
            ChannelPattern::from_policy(c)
                .map_err(|e| MintError::Invalid(format!("{flag} {c:?}: {e}")))
        })
        .collect()
}

/// The channels joined at boot when a request names no channel at all.
pub const DEFAULT_SUBSCRIBE: &str = "general";

/// The longest identity name.
pub const MAX_NAME: usize = 64;

/// Refuses a name that could not serve as a handle, a file name and a terminal string alike:
/// 1 to 64 characters from `[A-Za-z0-9_.-]`, not starting with `.` (hidden files, `.`, `..`)
/// or `-` (read as an option by the commands handed the file).
pub fn validate_name(name: &str) -> Result<(), MintError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        return Ok(());
    }
    // An overlong name is shown by its start and its length, not in full.
    let shown: String = name.chars().take(MAX_NAME).collect();
    let length = if shown.len() < name.len() {
        format!(" ({} characters)", name.chars().count())
    } else {
        String::new()
    };
    Err(MintError::Invalid(format!(
        "name {shown:?}{length}: use 1 to {MAX_NAME} characters from [A-Za-z0-9_.-], not \
         starting with `.` or `-`"
    )))
}

/// What a mint request grants, validated: the profile, the channels the identity joins and
/// those it may read and post to.
struct Grants {
    profile: CredentialProfile,
    subscribe: Vec<ChannelPattern>,
    allow_subscribe: Vec<ChannelPattern>,
    allow_publish: Vec<ChannelPattern>,
}

/// Validates what `req` asks for: the name, the role, the channel patterns (an agent joins by
/// default what [`DEFAULT_SUBSCRIBE`] names, and only what it may read).
fn grants(req: &MintRequest) -> Result<Grants, MintError> {
    let invalid = |m: String| Err(MintError::Invalid(m));
    validate_name(&req.name)?;
    let profile = req.profile.unwrap_or(CredentialProfile::Agent);
    if profile != CredentialProfile::Agent
        && (req.role.is_some()
            || !req.subscribe.is_empty()
            || !req.allow_subscribe.is_empty()
            || !req.allow_publish.is_empty())
    {
        return invalid(format!(
            "--role, --subscribe, --allow-subscribe and --allow-publish apply to agents; the \
             {profile:?} profile has fixed grants"
        ));
    }
    if let Some(role) = &req.role {
        validate_token("role", role).map_err(MintError::Invalid)?;
    }
    let mut subscribe_raw = req.subscribe.clone();
    if profile == CredentialProfile::Agent
        && subscribe_raw.is_empty()
        && req.allow_subscribe.is_empty()
    {
        subscribe_raw.push(DEFAULT_SUBSCRIBE.to_owned());
    }
    let subscribe = patterns("--subscribe", &subscribe_raw)?;
    let allow_subscribe = if req.allow_subscribe.is_empty() {
        subscribe.clone()
    } else {
        patterns("--allow-subscribe", &req.allow_subscribe)?
    };
    let allow_publish = patterns("--allow-publish", &req.allow_publish)?;
    for s in &subscribe {
        if !allow_subscribe.iter().any(|a| a.covers(s)) {
            return invalid(format!(
                "--subscribe {s} is not within --allow-subscribe ({}): an agent may only join \
                 channels it may read",
                allow_subscribe
                    .iter()
                    .map(ChannelPattern::as_str)
                    .collect::<Vec<_>>()
                    .join(",")
            ));
        }
    }
    Ok(Grants {
        profile,
        subscribe,
        allow_subscribe,
        allow_publish,
    })
}

/// When a credential of lifetime `--expires TEXT` ends (seconds since the epoch).
fn expiry(expires: Option<&str>) -> Result<Option<i64>, MintError> {
    let Some(text) = expires else {
        return Ok(None);
    };
    let lifetime = ReplayWindow::parse(text)
        .map_err(|_| {
            MintError::Invalid(format!(
                "--expires {text:?}: give a number and a unit, e.g. 90s, 30m, 12h or 30d"
            ))
        })?
        .duration();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Ok(Some((now + lifetime).as_secs() as i64))
}

/// Validates `req` and signs its credential with `keys` (the space named in the request).
/// `previous` is the identity of that name minted before, if any: its key is reused when the
/// data dir holds it, so the identity keeps its id. A new key is stored before it signs.
pub fn mint(
    keys: &SpaceKeys,
    req: &MintRequest,
    previous: Option<&IdentityRecord>,
) -> Result<Minted, MintError> {
    let Grants {
        profile,
        subscribe,
        allow_subscribe,
        allow_publish,
    } = grants(req)?;
    let expires_at = expiry(req.expires.as_deref())?;
    let kept = match previous {
        Some(p) => keys.user_key(&p.id)?.map(|key| (key, p.issued_at)),
        None => None,
    };
    let kept_id = kept.is_some();
    let (user, issued_at) = match kept {
        Some((key, before)) => (key, now_secs().max(before + 1)),
        None => (keys.create_user_key()?, now_secs()),
    };
    let id = InstanceId::from_user_nkey(&user.public_key())
        .map_err(|e| MintError::Invalid(e.to_string()))?;
    let names = SpaceNames::new(keys.name());
    let permissions = match profile {
        CredentialProfile::Agent => acl::agent(
            &names,
            &AgentScope {
                id: id.clone(),
                role: req.role.clone(),
                allow_subscribe: allow_subscribe.clone(),
                allow_publish: allow_publish.clone(),
            },
        ),
        CredentialProfile::Observer => acl::observer(&names, &id),
        CredentialProfile::Admin => acl::admin(&names, &id),
    };
    let creds = keys.mint_at(&req.name, &user, &permissions, issued_at, expires_at)?;
    let strings = |v: &[ChannelPattern]| v.iter().map(|c| c.as_str().to_owned()).collect();
    Ok(Minted {
        record: IdentityRecord {
            id: id.as_str().to_owned(),
            name: req.name.clone(),
            space: keys.name().to_owned(),
            profile,
            role: req.role.clone(),
            subscribe: strings(&subscribe),
            allow_subscribe: strings(&allow_subscribe),
            allow_publish: strings(&allow_publish),
            expires_at,
            issued_at,
            revokes_before: kept_id.then_some(issued_at - 1),
            revoked_at: None,
        },
        creds,
        replaced: previous.cloned(),
    })
}

/// The `mint` operation on a space's identities, the same with the appliance running or not:
/// the credential is signed and its record stored. A name that exists is refused unless the
/// request says `replace`: two identities of one name would make the name useless as a
/// handle. Replacing re-issues its credential; when the data dir no longer holds the old key,
/// the old identity is revoked whole.
pub fn mint_identity(
    keys: &SpaceKeys,
    identities: &Identities,
    req: &MintRequest,
) -> Result<Minted, MintError> {
    let previous = identities.by_name(&req.name);
    if let Some(existing) = previous.as_ref().filter(|_| !req.replace) {
        return Err(MintError::Exists {
            name: existing.name.clone(),
            space: existing.space.clone(),
            id: existing.id.clone(),
        });
    }
    let minted = mint(keys, req, previous.as_ref())?;
    if let Some(old) = &minted.replaced
        && old.id != minted.record.id
    {
        let now = now_secs();
        identities.save(IdentityRecord {
            revoked_at: Some(now),
            revokes_before: Some(now),
            ..old.clone()
        })?;
    }
    identities.save(minted.record.clone())?;
    Ok(minted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::KeyStore;

    fn keys() -> (tempfile::TempDir, SpaceKeys) {
        let tmp = tempfile::tempdir().unwrap();
        let store = KeyStore::load_or_create(tmp.path()).unwrap();
        let space = store.ensure_space("main").unwrap();
        (tmp, space)
    }

    fn req(subscribe: &[&str], allow: &[&str]) -> MintRequest {
        MintRequest {
            name: "alice".into(),
            space: "main".into(),
            subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
            allow_subscribe: allow.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn refusals_name_the_problem() {
        let (_tmp, keys) = keys();
        let cases: &[(MintRequest, &str)] = &[
            (req(&["foo/bar"], &[]), "foo/bar"),
            (req(&["a.>.b"], &[]), "a.>.b"),
            (req(&["a..b"], &[]), "a..b"),
            (req(&["ops"], &["team.>"]), "not within --allow-subscribe"),
            (req(&["team"], &["team.>"]), "not within --allow-subscribe"),
            (
                MintRequest {
                    role: Some("re viewer".into()),
                    ..req(&[], &[])
                },
                "role",
            ),
            (
                MintRequest {
                    profile: Some(CredentialProfile::Observer),
                    ..req(&["general"], &[])
                },
                "apply to agents",
            ),
            (
                MintRequest {
                    name: " bob".into(),
                    ..req(&[], &[])
                },
                "name",
            ),
            (
                MintRequest {
                    name: "a\u{1b}]0;x".into(),
                    ..req(&[], &[])
                },
                "name",
            ),
            (
                MintRequest {
                    name: "..".into(),
                    ..req(&[], &[])
                },
                "name",
            ),
            (
                MintRequest {
                    name: "x".repeat(65),
                    ..req(&[], &[])
                },
                "name",
            ),
            (
                MintRequest {
                    name: "-rf".into(),
                    ..req(&[], &[])
                },
                "name",
            ),
        ];
        for (r, expect) in cases {
            let err = mint(&keys, r, None).err().expect("refused").to_string();
            assert!(err.contains(expect), "{r:?}: {err}");
        }
    }

    #[test]
    fn a_refused_name_is_shown_short_and_escaped() {
        let long = validate_name(&"x".repeat(10_000)).unwrap_err().to_string();
        assert!(long.contains("(10000 characters)"), "{long}");
        assert!(long.len() < 200, "{long}");
        let esc = validate_name("a\u{1b}]0;x\u{7}").unwrap_err().to_string();
        assert!(esc.starts_with("name \"a\\u{1b}]0;x\\u{7}\": "), "{esc}");
        for ok in ["alice", "a.b-c_d", "x".repeat(64).as_str()] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn expiry_is_signed_into_the_credential() {
        let (_tmp, keys) = keys();
        let m = mint(
            &keys,
            &MintRequest {
                expires: Some("12h".into()),
                ..req(&[], &[])
            },
            None,
        )
        .unwrap();
        let exp = m.record.expires_at.unwrap();
        let payload = m.creds.jwt.split('.').nth(1).unwrap();
        use base64::Engine;
        let claims: serde_json::Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(claims["exp"], exp);
        assert!(claims["exp"].as_i64().unwrap() > claims["iat"].as_i64().unwrap() + 43_000);
        let bad = MintRequest {
            expires: Some("soon".into()),
            ..req(&[], &[])
        };
        assert!(
            mint(&keys, &bad, None)
                .err()
                .unwrap()
                .to_string()
                .contains("--expires")
        );
    }

    #[test]
    fn a_re_mint_keeps_the_id_and_is_issued_later() {
        let (_tmp, keys) = keys();
        let first = mint(&keys, &req(&[], &[]), None).unwrap();
        let again = mint(&keys, &req(&["ops"], &[]), Some(&first.record)).unwrap();
        assert_eq!(again.record.id, first.record.id);
        assert!(again.record.issued_at > first.record.issued_at);
        assert_eq!(first.record.revokes_before, None);
        assert_eq!(
            again.record.revokes_before,
            Some(again.record.issued_at - 1)
        );
        assert_eq!(again.record.allow_subscribe, ["ops"]);
        assert_eq!(
            again.creds.claims().unwrap().issued_at,
            again.record.issued_at
        );
        // A refused request stores no key.
        let users = || {
            std::fs::read_dir(_tmp.path().join("spaces/main/users"))
                .unwrap()
                .count()
        };
        let before = users();
        assert!(mint(&keys, &req(&["a..b"], &[]), None).is_err());
        assert_eq!(users(), before);
    }

    #[test]
    fn defaults_and_coverage() {
        let (_tmp, keys) = keys();
        let m = mint(&keys, &req(&[], &[]), None).unwrap();
        assert_eq!(m.record.subscribe, ["general"]);
        assert_eq!(m.record.allow_subscribe, ["general"]);
        assert!(m.record.allow_publish.is_empty());
        assert_eq!(m.creds.public_key().unwrap(), m.record.id);
        let m = mint(&keys, &req(&["team.backend"], &["team.>", "general"]), None).unwrap();
        assert_eq!(m.record.subscribe, ["team.backend"]);
        assert_eq!(m.record.allow_subscribe, ["team.>", "general"]);
    }
}
