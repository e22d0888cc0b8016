//! Minting a credential (Appendix B, §9): validate the request, build the profile's
//! permissions, sign the user JWT with the space's signing key, and describe the identity so
//! that the provisioner can pre-create what it binds.
//!
//! Validation refuses rather than rewrites: a channel pattern that sanitization would change
//! (`foo/bar`), a misplaced `>` (`a.>.b`), an empty segment, or a `subscribe` entry that
//! `allowSubscribe` does not cover are errors, and nothing is written.

use serde::{Deserialize, Serialize};

use crate::binding::SpaceNames;
use crate::binding::acl::{self, AgentScope};
use crate::profile::validate_token;
use crate::protocol::{ChannelPattern, InstanceId, ReplayWindow};
use crate::provision::{Creds, SpaceKeys};

/// The credential profiles `cotald mint` issues (Appendix B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CredentialProfile {
    /// An agent: reads within `allowSubscribe`, posts within `allowPublish`, DMs and anycast.
    Agent,
    /// Reads chat, CHAT history, presence and the channel registry; publishes nothing.
    Observer,
    /// The observer's reads, the whole space's live traffic and DM history; publishes nothing.
    Admin,
}

/// What to mint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MintRequest {
    /// Display name (the JWT's name).
    pub name: String,
    /// The space.
    pub space: String,
    /// The profile; `None` means agent.
    pub profile: Option<CredentialProfile>,
    /// Channels joined at boot (⊆ `allow_subscribe`).
    #[serde(default)]
    pub subscribe: Vec<String>,
    /// The read ACL; defaults to `subscribe`.
    #[serde(default)]
    pub allow_subscribe: Vec<String>,
    /// The post ACL; default none.
    #[serde(default)]
    pub allow_publish: Vec<String>,
    /// Anycast role.
    pub role: Option<String>,
    /// Lifetime of the credential (`90s`, `12h`, `30d`); the broker refuses it afterwards.
    #[serde(default)]
    pub expires: Option<String>,
}

/// What the data dir remembers of a minted identity (never its seed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityRecord {
    /// The instance id (user public key).
    pub id: String,
    /// Display name.
    pub name: String,
    /// The space.
    pub space: String,
    /// The profile.
    pub profile: CredentialProfile,
    /// Anycast role.
    pub role: Option<String>,
    /// Boot channels.
    pub subscribe: Vec<String>,
    /// Read ACL.
    pub allow_subscribe: Vec<String>,
    /// Post ACL.
    pub allow_publish: Vec<String>,
    /// When the credential expires (Unix seconds), if it does.
    #[serde(default)]
    pub expires_at: Option<i64>,
}

/// A minted credential and what it was minted for.
pub struct Minted {
    /// The identity.
    pub record: IdentityRecord,
    /// The credential (secret).
    pub creds: Creds,
}

/// Why a mint request was refused.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// A field is invalid.
    #[error("{0}")]
    Invalid(String),
    /// Signing failed.
    #[error(transparent)]
    Provision(#[from] crate::provision::ProvisionError),
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

/// Validates `req` and signs its credential with `keys` (the space named in the request).
pub fn mint(keys: &SpaceKeys, req: &MintRequest) -> Result<Minted, MintError> {
    let invalid = |m: String| Err(MintError::Invalid(m));
    let name = req.name.trim();
    if name.is_empty() || name != req.name || name.contains(['/', '\n', '\r']) {
        return invalid(format!(
            "name {:?}: use a non-empty display name without slashes or surrounding spaces",
            req.name
        ));
    }
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

    let expires_at = match &req.expires {
        None => None,
        Some(text) => {
            let lifetime = ReplayWindow::parse(text)
                .map_err(|e| MintError::Invalid(format!("--expires {text:?}: {e}")))?
                .duration();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            Some((now + lifetime).as_secs() as i64)
        }
    };
    let user = nkeys::KeyPair::new_user();
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
    let creds = keys.mint_until(name, &user, &permissions, expires_at)?;
    let strings = |v: &[ChannelPattern]| v.iter().map(|c| c.as_str().to_owned()).collect();
    Ok(Minted {
        record: IdentityRecord {
            id: id.as_str().to_owned(),
            name: name.to_owned(),
            space: keys.name().to_owned(),
            profile,
            role: req.role.clone(),
            subscribe: strings(&subscribe),
            allow_subscribe: strings(&allow_subscribe),
            allow_publish: strings(&allow_publish),
            expires_at,
        },
        creds,
    })
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
        ];
        for (r, expect) in cases {
            let err = mint(&keys, r).err().expect("refused").to_string();
            assert!(err.contains(expect), "{r:?}: {err}");
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
            mint(&keys, &bad)
                .err()
                .unwrap()
                .to_string()
                .contains("--expires")
        );
    }

    #[test]
    fn defaults_and_coverage() {
        let (_tmp, keys) = keys();
        let m = mint(&keys, &req(&[], &[])).unwrap();
        assert_eq!(m.record.subscribe, ["general"]);
        assert_eq!(m.record.allow_subscribe, ["general"]);
        assert!(m.record.allow_publish.is_empty());
        assert_eq!(m.creds.public_key().unwrap(), m.record.id);
        let m = mint(&keys, &req(&["team.backend"], &["team.>", "general"])).unwrap();
        assert_eq!(m.record.subscribe, ["team.backend"]);
        assert_eq!(m.record.allow_subscribe, ["team.>", "general"]);
    }
}
