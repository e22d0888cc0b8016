//! A credential as data (§9, Appendix B): the `.creds` text (a user JWT and its nkey seed),
//! the claims of that JWT, and the permissions they grant, with the questions the client and
//! the services ask of them ("may this identity publish on X?"). Minting lives in
//! `provision`; this module only reads what was minted, so every reader answers alike.
//!
//! The JWT's signature is not checked here: the broker checks it on connect, and a reader of
//! its own credential only needs to know what it was granted.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use nkeys::KeyPair;
use serde::{Deserialize, Serialize};

use crate::protocol::subject_matches;

/// One direction (publish or subscribe) of a user's permissions, as the JWT carries it. An empty
/// `allow` list allows everything not denied (the NATS rule).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Permission {
    /// Subjects (or patterns) allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Subjects (or patterns) denied; a deny wins over an allow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

impl Permission {
    /// Whether `subject` is permitted. A pattern (a subscription with wildcards) is taken
    /// literally, so it is permitted only where a grant covers it whole.
    pub fn allows(&self, subject: &str) -> bool {
        let allowed = self.allow.is_empty() || self.allow.iter().any(|p| covers(p, subject));
        allowed && !self.deny.iter().any(|p| covers(p, subject))
    }

    /// Whether this direction is unrestricted (no allow list and no deny list).
    pub fn is_unrestricted(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }
}

/// Whether `grant` covers every subject `subject` can stand for: a literal subject as NATS
/// matches it; in a pattern, a `>` is covered only by a `>` (a `*` grant is narrower).
fn covers(grant: &str, subject: &str) -> bool {
    if subject.ends_with(".>") || subject == ">" {
        let (grant_head, subject_head) = (grant.rsplit_once('.'), subject.rsplit_once('.'));
        return match (grant, grant_head, subject_head) {
            (">", _, _) => true,
            (_, Some((g, ">")), Some((s, _))) => subject_matches(g, s) || covers(grant, s),
            _ => false,
        };
    }
    subject_matches(grant, subject)
}

/// What a user may publish and subscribe to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserPermissions {
    /// What it may publish (requests included: a request is a publish).
    pub publish: Permission,
    /// What it may subscribe to.
    pub subscribe: Permission,
}

impl UserPermissions {
    /// No restriction beyond the account boundary.
    pub fn unrestricted() -> Self {
        Self::default()
    }

    /// Whether a publish (or request) on `subject` is granted.
    pub fn may_publish(&self, subject: &str) -> bool {
        self.publish.allows(subject)
    }

    /// Whether a subscription to `subject` (a pattern, taken literally) is granted.
    pub fn may_subscribe(&self, subject: &str) -> bool {
        self.subscribe.allows(subject)
    }
}

/// Why a credential could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CredsError {
    /// A decorated block is missing.
    #[error("no {0} block in the credentials (is this a .creds file from `cotald mint`?)")]
    MissingBlock(&'static str),
    /// The seed is not a valid user seed.
    #[error("the credentials' seed is invalid")]
    BadSeed(#[source] nkeys::error::Error),
    /// The JWT cannot be decoded.
    #[error("the credentials' JWT is malformed: {0}")]
    BadJwt(&'static str),
    /// The JWT's payload is not the claims of a user.
    #[error("the credentials' JWT holds no user claims")]
    BadClaims(#[source] serde_json::Error),
}

/// A user credential: the signed JWT and the user's seed (`SU…`, secret).
#[derive(Clone)]
pub struct Creds {
    /// The user JWT.
    pub jwt: String,
    /// The user's nkey seed. Secret.
    pub seed: String,
}

impl Creds {
    /// Parses a `.creds` file text.
    pub fn parse(text: &str) -> Result<Self, CredsError> {
        Ok(Creds {
            jwt: block(text, "NATS USER JWT")?,
            seed: block(text, "USER NKEY SEED")?,
        })
    }

    /// Renders the `.creds` file text. The closing lines carry six dashes; clients match them
    /// literally.
    pub fn render(&self) -> String {
        format!(
            "-----BEGIN NATS USER JWT-----\n{}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\
             NKEYs are sensitive and should be treated as secrets.\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n\n\
             *************************************************************\n",
            self.jwt, self.seed
        )
    }

    /// The public key (instance id, §2) of the seed.
    pub fn public_key(&self) -> Result<String, CredsError> {
        KeyPair::from_seed(&self.seed)
            .map(|kp| kp.public_key())
            .map_err(CredsError::BadSeed)
    }

    /// The claims of the JWT (not verified: the broker does that).
    pub fn claims(&self) -> Result<UserClaims, CredsError> {
        UserClaims::decode(&self.jwt)
    }
}

impl std::fmt::Debug for Creds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Creds")
            .field("jwt", &self.jwt)
            .finish_non_exhaustive()
    }
}

/// The claims of a user JWT that matter to its holder and to the services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserClaims {
    /// `sub`: the user's public key, the instance id.
    pub subject: String,
    /// `name`: the display name it was minted with.
    pub name: String,
    /// `iat`: when it was issued (Unix seconds).
    pub issued_at: i64,
    /// `exp`: when it expires (Unix seconds), if it does.
    pub expires: Option<i64>,
    /// `nats.issuer_account`: the account (space) it belongs to.
    pub issuer_account: Option<String>,
    /// `nats.pub` and `nats.sub`.
    pub permissions: UserPermissions,
}

#[derive(Deserialize)]
struct RawClaims {
    #[serde(default)]
    sub: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    iat: i64,
    #[serde(default)]
    exp: Option<i64>,
    #[serde(default)]
    nats: RawUser,
}

#[derive(Default, Deserialize)]
struct RawUser {
    #[serde(default, rename = "pub")]
    publish: Permission,
    #[serde(default, rename = "sub")]
    subscribe: Permission,
    #[serde(default)]
    issuer_account: Option<String>,
}

/// The claims of a JWT (its payload, base64url-decoded), unverified.
pub(crate) fn jwt_payload(jwt: &str) -> Result<Vec<u8>, CredsError> {
    let payload = jwt
        .split('.')
        .nth(1)
        .ok_or(CredsError::BadJwt("no payload"))?;
    URL_SAFE_NO_PAD
        .decode(payload.trim().trim_end_matches('='))
        .map_err(|_| CredsError::BadJwt("the payload is not base64url"))
}

impl UserClaims {
    /// Decodes the payload of a user JWT.
    pub fn decode(jwt: &str) -> Result<Self, CredsError> {
        let bytes = jwt_payload(jwt)?;
        let raw: RawClaims = serde_json::from_slice(&bytes).map_err(CredsError::BadClaims)?;
        Ok(UserClaims {
            subject: raw.sub,
            name: raw.name,
            issued_at: raw.iat,
            expires: raw.exp,
            issuer_account: raw.nats.issuer_account,
            permissions: UserPermissions {
                publish: raw.nats.publish,
                subscribe: raw.nats.subscribe,
            },
        })
    }
}

fn block(text: &str, name: &'static str) -> Result<String, CredsError> {
    let begin = format!("-----BEGIN {name}-----");
    let start = text.find(&begin).ok_or(CredsError::MissingBlock(name))? + begin.len();
    let rest = &text[start..];
    let end = rest
        .find("------END")
        .ok_or(CredsError::MissingBlock(name))?;
    let value = rest[..end].trim();
    if value.is_empty() {
        return Err(CredsError::MissingBlock(name));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_then_parse_round_trips() {
        let kp = KeyPair::new_user();
        let creds = Creds {
            jwt: "eyJ.header.sig".into(),
            seed: kp.seed().unwrap(),
        };
        let text = creds.render();
        assert!(text.contains("------END NATS USER JWT------"));
        assert!(text.contains("------END USER NKEY SEED------"));
        let back = Creds::parse(&text).unwrap();
        assert_eq!(back.jwt, creds.jwt);
        assert_eq!(back.seed, creds.seed);
        assert_eq!(back.public_key().unwrap(), kp.public_key());
    }

    #[test]
    fn parse_refuses_a_file_without_seed() {
        let text = "-----BEGIN NATS USER JWT-----\nabc\n------END NATS USER JWT------\n";
        assert!(matches!(
            Creds::parse(text),
            Err(CredsError::MissingBlock("USER NKEY SEED"))
        ));
        assert!(matches!(
            Creds::parse("-----BEGIN CERTIFICATE-----"),
            Err(CredsError::MissingBlock("NATS USER JWT"))
        ));
    }

    #[test]
    fn claims_decode_the_grants() {
        let payload = serde_json::json!({
            "sub": "UABC", "name": "alice", "iat": 10, "exp": 20,
            "nats": {"pub": {"allow": ["a.>"], "deny": ["a.b"]}, "sub": {"allow": ["c.*"]},
                     "issuer_account": "AXYZ", "type": "user"}
        });
        let jwt = format!("e30.{}.sig", URL_SAFE_NO_PAD.encode(payload.to_string()));
        let claims = UserClaims::decode(&jwt).unwrap();
        assert_eq!(claims.subject, "UABC");
        assert_eq!(claims.expires, Some(20));
        assert_eq!(claims.issuer_account.as_deref(), Some("AXYZ"));
        let p = &claims.permissions;
        assert!(p.may_publish("a.c"));
        assert!(!p.may_publish("a.b"), "deny wins");
        assert!(!p.may_publish("b"));
        assert!(p.may_subscribe("c.d"));
        assert!(p.may_subscribe("c.*"), "a pattern a grant covers whole");
        assert!(!p.may_subscribe("c.>"), "a pattern wider than the grant");
        assert!(UserPermissions::unrestricted().may_publish("anything"));
        assert!(matches!(
            UserClaims::decode("nodots"),
            Err(CredsError::BadJwt(_))
        ));
    }
}
