//! NATS JWT claims (operator, account, user), typed by hand and signed with nkeys.
//!
//! Neither `nats-jwt` (0.3: no operator claims, no JetStream account limits) nor
//! `nats-io-jwt` (0.1: users default to bearer tokens, and its build script rewrites files in
//! the cargo registry) covers what the server needs, so the claims are serde structs here.
//! Wire format (the v2 JWT of nats-server): header `{"typ":"JWT","alg":"ed25519-nkey"}`,
//! base64url without padding, `jti` = base32 (no padding) of SHA-512/256 over the claims with
//! an empty `jti`, signature = Ed25519 over `header.payload` by the issuer's nkey.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use nkeys::KeyPair;
use serde::Serialize;
use sha2::{Digest, Sha512_256};

use super::ProvisionError;
use crate::binding::{Permission, UserPermissions};

const HEADER: &str = r#"{"typ":"JWT","alg":"ed25519-nkey"}"#;

#[derive(Serialize)]
struct Claims<'a, N: Serialize> {
    jti: String,
    iat: i64,
    iss: String,
    name: &'a str,
    sub: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    exp: Option<i64>,
    nats: N,
}

#[derive(Serialize)]
struct OperatorClaims<'a> {
    system_account: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    version: u8,
}

#[derive(Serialize)]
struct AccountClaims<'a> {
    limits: &'a AccountLimits,
    signing_keys: Vec<String>,
    /// User key → Unix seconds: the broker refuses that user's JWTs issued at or before it.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    revocations: &'a BTreeMap<String, i64>,
    /// Subject → where the broker delivers what is published on it instead.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    mappings: BTreeMap<&'a str, [Mapping<'a>; 1]>,
    #[serde(rename = "type")]
    kind: &'static str,
    version: u8,
}

/// One destination of a subject mapping; all of it (weight 100).
#[derive(Serialize)]
struct Mapping<'a> {
    subject: &'a str,
    weight: u8,
}

#[derive(Serialize)]
struct UserClaims<'a> {
    #[serde(rename = "pub")]
    publish: &'a Permission,
    #[serde(rename = "sub")]
    subscribe: &'a Permission,
    subs: i64,
    data: i64,
    payload: i64,
    issuer_account: String,
    #[serde(rename = "type")]
    kind: &'static str,
    version: u8,
}

/// Account limits. `-1` means unlimited; JetStream is enabled on an account by non-zero
/// storage limits and disabled by zero ones.
#[derive(Debug, Clone, Serialize)]
pub struct AccountLimits {
    pub subs: i64,
    pub data: i64,
    pub payload: i64,
    pub imports: i64,
    pub exports: i64,
    pub wildcards: bool,
    pub conn: i64,
    pub leaf: i64,
    /// Refuse user JWTs marked as bearer tokens: every user must prove its seed.
    pub disallow_bearer: bool,
    #[serde(flatten)]
    pub jetstream: JetStreamLimits,
}

/// The JetStream part of [`AccountLimits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct JetStreamLimits {
    pub mem_storage: i64,
    pub disk_storage: i64,
    pub streams: i64,
    pub consumer: i64,
}

impl JetStreamLimits {
    /// JetStream disabled (the SYS account).
    pub const DISABLED: JetStreamLimits = JetStreamLimits {
        mem_storage: 0,
        disk_storage: 0,
        streams: 0,
        consumer: 0,
    };
}

impl AccountLimits {
    /// Unlimited connections and messages, no bearer tokens, the given JetStream limits.
    pub fn with_jetstream(jetstream: JetStreamLimits) -> Self {
        AccountLimits {
            subs: -1,
            data: -1,
            payload: -1,
            imports: -1,
            exports: -1,
            wildcards: true,
            conn: -1,
            leaf: -1,
            disallow_bearer: true,
            jetstream,
        }
    }
}

pub(crate) fn operator_jwt(
    operator: &KeyPair,
    system_account: &str,
) -> Result<String, ProvisionError> {
    encode(
        operator,
        operator.public_key(),
        "cotald",
        now_secs(),
        None,
        OperatorClaims {
            system_account,
            kind: "operator",
            version: 2,
        },
    )
}

/// What an account JWT says beyond its issuer and subject.
pub(crate) struct Account<'a> {
    pub(crate) name: &'a str,
    pub(crate) signing_key: Option<&'a KeyPair>,
    pub(crate) limits: &'a AccountLimits,
    pub(crate) revocations: &'a BTreeMap<String, i64>,
    pub(crate) mappings: &'a BTreeMap<String, String>,
}

impl<'a> Account<'a> {
    fn claims(&self) -> AccountClaims<'a> {
        AccountClaims {
            limits: self.limits,
            signing_keys: self
                .signing_key
                .map(KeyPair::public_key)
                .into_iter()
                .collect(),
            revocations: self.revocations,
            mappings: self
                .mappings
                .iter()
                .map(|(from, to)| {
                    (
                        from.as_str(),
                        [Mapping {
                            subject: to,
                            weight: 100,
                        }],
                    )
                })
                .collect(),
            kind: "account",
            version: 2,
        }
    }
}

pub(crate) fn account_jwt(
    operator: &KeyPair,
    account: &KeyPair,
    says: &Account<'_>,
) -> Result<String, ProvisionError> {
    encode(
        operator,
        account.public_key(),
        says.name,
        now_secs(),
        None,
        says.claims(),
    )
}

/// Whether `jwt`, an account JWT, says what [`account_jwt`] would sign now for `account` by
/// `operator`, its issue time and id aside. Its signature is not checked: it is read from the
/// broker's resolver store in the appliance's own data dir, which the broker writes only with
/// what it verified; anything unreadable is not the same.
pub(crate) fn account_jwt_says(
    jwt: &str,
    operator: &KeyPair,
    account: &KeyPair,
    says: &Account<'_>,
) -> bool {
    let Ok(payload) = crate::binding::credential::jwt_payload(jwt) else {
        return false;
    };
    let Ok(mut on_file) = serde_json::from_slice::<serde_json::Value>(&payload) else {
        return false;
    };
    let wanted = Claims {
        jti: String::new(),
        iat: 0,
        iss: operator.public_key(),
        name: says.name,
        sub: account.public_key(),
        exp: None,
        nats: says.claims(),
    };
    let Ok(mut wanted) = serde_json::to_value(&wanted) else {
        return false;
    };
    for claims in [&mut on_file, &mut wanted] {
        if let Some(claims) = claims.as_object_mut() {
            claims.remove("jti");
            claims.remove("iat");
        }
    }
    on_file == wanted
}

/// What a user JWT says besides its permissions.
pub(crate) struct UserJwt<'a> {
    pub(crate) user_public: String,
    pub(crate) name: &'a str,
    /// `iat`, Unix seconds: a re-minted credential is issued after its predecessor, so that a
    /// revocation at the predecessor's time spares it.
    pub(crate) issued_at: i64,
    pub(crate) expires: Option<i64>,
}

/// Signs a user JWT. `signer` is the account's signing key (or the account key itself for
/// accounts without one); `issuer_account` is set whenever the two differ.
pub(crate) fn user_jwt(
    signer: &KeyPair,
    account_public: &str,
    user: UserJwt<'_>,
    permissions: &UserPermissions,
) -> Result<String, ProvisionError> {
    encode(
        signer,
        user.user_public,
        user.name,
        user.issued_at,
        user.expires,
        UserClaims {
            publish: &permissions.publish,
            subscribe: &permissions.subscribe,
            subs: -1,
            data: -1,
            payload: -1,
            issuer_account: account_public.to_owned(),
            kind: "user",
            version: 2,
        },
    )
}

fn encode<N: Serialize>(
    issuer: &KeyPair,
    subject: String,
    name: &str,
    iat: i64,
    exp: Option<i64>,
    nats: N,
) -> Result<String, ProvisionError> {
    let mut claims = Claims {
        jti: String::new(),
        iat,
        iss: issuer.public_key(),
        name,
        sub: subject,
        exp,
        nats,
    };
    let unhashed = serde_json::to_vec(&claims).map_err(|e| ProvisionError::Sign(e.into()))?;
    claims.jti = data_encoding::BASE32_NOPAD.encode(&Sha512_256::digest(&unhashed));
    let payload = serde_json::to_vec(&claims).map_err(|e| ProvisionError::Sign(e.into()))?;
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(HEADER),
        URL_SAFE_NO_PAD.encode(payload)
    );
    let signature = issuer
        .sign(signing_input.as_bytes())
        .map_err(|e| ProvisionError::Sign(e.into()))?;
    Ok(format!(
        "{signing_input}.{}",
        URL_SAFE_NO_PAD.encode(signature)
    ))
}

/// Now, in Unix seconds (the unit of JWT times).
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A JWT time (Unix seconds) as RFC 3339 in UTC, to the second, as people read it.
pub fn rfc3339(secs: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(secs) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => secs.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_payload(jwt: &str) -> serde_json::Value {
        serde_json::from_slice(&crate::binding::credential::jwt_payload(jwt).unwrap()).unwrap()
    }

    #[test]
    fn user_jwt_is_signed_by_the_signing_key_and_is_not_a_bearer_token() {
        let account = KeyPair::new_account();
        let signing = KeyPair::new_account();
        let user = KeyPair::new_user();
        let jwt = user_jwt(
            &signing,
            &account.public_key(),
            UserJwt {
                user_public: user.public_key(),
                name: "alice",
                issued_at: 42,
                expires: None,
            },
            &UserPermissions::unrestricted(),
        )
        .unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        let signed = format!("{}.{}", parts[0], parts[1]);
        signing.verify(signed.as_bytes(), &sig).unwrap();
        assert!(account.verify(signed.as_bytes(), &sig).is_err());

        let claims = decode_payload(&jwt);
        assert_eq!(claims["iss"], signing.public_key());
        assert_eq!(claims["sub"], user.public_key());
        assert_eq!(claims["nats"]["issuer_account"], account.public_key());
        assert_eq!(claims["nats"]["type"], "user");
        assert!(claims["nats"].get("bearer_token").is_none());
        assert_eq!(claims["jti"].as_str().unwrap().len(), 52);
        assert_eq!(claims["iat"], 42);
    }

    #[test]
    fn account_jwt_carries_the_signing_key_and_limits() {
        let operator = KeyPair::new_operator();
        let account = KeyPair::new_account();
        let signing = KeyPair::new_account();
        let limits = AccountLimits::with_jetstream(JetStreamLimits {
            mem_storage: 1 << 20,
            disk_storage: 1 << 30,
            streams: -1,
            consumer: -1,
        });
        let none = BTreeMap::new();
        let says = Account {
            name: "main",
            signing_key: Some(&signing),
            limits: &limits,
            revocations: &BTreeMap::new(),
            mappings: &none,
        };
        let jwt = account_jwt(&operator, &account, &says).unwrap();
        let claims = decode_payload(&jwt);
        assert!(claims["nats"].get("revocations").is_none());
        assert!(claims["nats"].get("mappings").is_none());
        let revoked = BTreeMap::from([("UABC".to_owned(), 7)]);
        let held = BTreeMap::from([("c.inst.*.UABC".to_owned(), "c.ctl.manager.UABC".to_owned())]);
        let says = Account {
            name: "main",
            signing_key: None,
            limits: &limits,
            revocations: &revoked,
            mappings: &held,
        };
        let jwt = account_jwt(&operator, &account, &says).unwrap();
        let later = decode_payload(&jwt);
        assert_eq!(later["nats"]["revocations"]["UABC"], 7);
        assert_eq!(
            later["nats"]["mappings"]["c.inst.*.UABC"],
            serde_json::json!([{"subject": "c.ctl.manager.UABC", "weight": 100}])
        );
        assert_eq!(claims["iss"], operator.public_key());
        assert_eq!(claims["nats"]["signing_keys"][0], signing.public_key());
        assert_eq!(claims["nats"]["limits"]["disallow_bearer"], true);
        assert_eq!(claims["nats"]["limits"]["disk_storage"], 1 << 30);
    }

    #[test]
    fn an_account_jwt_says_what_it_was_signed_with_whenever_it_was_issued() {
        let (operator, account) = (KeyPair::new_operator(), KeyPair::new_account());
        let limits = AccountLimits::with_jetstream(JetStreamLimits::DISABLED);
        let revoked = BTreeMap::from([("UABC".to_owned(), 7)]);
        let none = BTreeMap::new();
        let says = Account {
            name: "main",
            signing_key: None,
            limits: &limits,
            revocations: &revoked,
            mappings: &none,
        };
        let jwt = account_jwt(&operator, &account, &says).unwrap();
        assert!(account_jwt_says(&jwt, &operator, &account, &says));
        let more = BTreeMap::from([("UABC".to_owned(), 7), ("UDEF".to_owned(), 9)]);
        let other = Account {
            revocations: &more,
            ..says
        };
        assert!(!account_jwt_says(&jwt, &operator, &account, &other));
        assert!(!account_jwt_says(
            &jwt,
            &operator,
            &KeyPair::new_account(),
            &says
        ));
        assert!(!account_jwt_says("garbage", &operator, &account, &says));
    }
}
