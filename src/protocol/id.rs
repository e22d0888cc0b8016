//! Instance identity (§2).
//!
//! In the authenticated NATS binding an instance id is an Ed25519 nkey *user* public key:
//! base32, 56 characters, prefix `U`, with a CRC16 checksum. The same string is used as the
//! `AgentCard.id`, the subject sender token, the authenticating user and the durable names, so
//! it must already be a valid subject token: nkeys are (`[A-Z2-7]` only). Open dev mode may use
//! an opaque stable id instead; [`InstanceId::open`] accepts one only if sanitization (§3) would
//! leave it unchanged, so the id a peer sees in `from.id` is exactly the sender token.

use std::fmt;
use std::str::FromStr;

use super::subject::is_token_char;

/// Length of an encoded nkey public key.
pub const NKEY_PUBLIC_KEY_LEN: usize = 56;

/// A stable instance id (§2), valid as a subject sender token (§3).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(String);

/// Why a string is not an instance id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The id is empty.
    #[error("instance id is empty")]
    Empty,
    /// The nkey has the wrong length.
    #[error("nkey user public key must be {NKEY_PUBLIC_KEY_LEN} characters, got {len}")]
    WrongLength {
        /// Length of the rejected string, in bytes.
        len: usize,
    },
    /// The nkey does not start with `U`.
    #[error("nkey user public key must start with 'U', got {found:?}")]
    NotAUserKey {
        /// The first character found.
        found: char,
    },
    /// The nkey failed base32 decoding, its checksum, or its key-type byte.
    #[error("invalid nkey user public key: {reason}")]
    InvalidNkey {
        /// What the nkey decoder reported.
        reason: String,
    },
    /// An open-mode id contains a character that sanitization would replace.
    #[error(
        "open-mode instance id {id:?} has {found:?} at byte {index}; ids must be [A-Za-z0-9_-]"
    )]
    NotAToken {
        /// The rejected id.
        id: String,
        /// The offending character.
        found: char,
        /// Its byte offset.
        index: usize,
    },
}

impl InstanceId {
    /// Validates an nkey user public key (authenticated binding, §2): length 56, prefix `U`,
    /// base32 with a valid checksum and the user key-type byte.
    pub fn from_user_nkey(key: &str) -> Result<Self, IdError> {
        if key.is_empty() {
            return Err(IdError::Empty);
        }
        if key.len() != NKEY_PUBLIC_KEY_LEN {
            return Err(IdError::WrongLength { len: key.len() });
        }
        if let Some(found) = key.chars().next().filter(|c| *c != 'U') {
            return Err(IdError::NotAUserKey { found });
        }
        let pair = nkeys::KeyPair::from_public_key(key).map_err(|e| IdError::InvalidNkey {
            reason: e.to_string(),
        })?;
        if pair.key_pair_type() != nkeys::KeyPairType::User {
            return Err(IdError::InvalidNkey {
                reason: format!("key type is {:?}, not User", pair.key_pair_type()),
            });
        }
        Ok(Self(key.to_owned()))
    }

    /// Accepts an opaque open-dev-mode id (§2): any non-empty `[A-Za-z0-9_-]+` string. Open mode
    /// is outside the §9 security claims; prefer [`InstanceId::from_user_nkey`].
    pub fn open(id: &str) -> Result<Self, IdError> {
        if id.is_empty() {
            return Err(IdError::Empty);
        }
        if let Some((index, found)) = id.char_indices().find(|(_, c)| !is_token_char(*c)) {
            return Err(IdError::NotAToken {
                id: id.to_owned(),
                found,
                index,
            });
        }
        Ok(Self(id.to_owned()))
    }

    /// The id as it appears on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The per-instance inbox prefix `_INBOX_<id>` a client must set before any request, pull
    /// consumer or KV watch (§10); replies then arrive under `_INBOX_<id>.>` (Appendix B).
    pub fn inbox_prefix(&self) -> String {
        format!("_INBOX_{}", self.0)
    }

    /// Whether the id is a valid nkey user public key (as opposed to an open-mode id).
    pub fn is_user_nkey(&self) -> bool {
        Self::from_user_nkey(&self.0).is_ok()
    }
}

/// Parses an authenticated (nkey) id; use [`InstanceId::open`] for open dev mode.
impl FromStr for InstanceId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_user_nkey(s)
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for InstanceId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: &str = "UAQGWOEVJKMIO4WXSYOTLARXYOZTCXFK67JASEH6AFFFYK6FOPSKQCAD";
    const BOB: &str = "UDI36ZKVNUM5WMO4QQ6HDQU7F4OH2RCXOJRX6GAIOS5SKVNNSKCDNLJA";

    #[test]
    fn spec_sample_ids_are_valid_user_nkeys() {
        for key in [ALICE, BOB] {
            let id = InstanceId::from_user_nkey(key).unwrap();
            assert_eq!(id.as_str(), key);
            assert!(id.is_user_nkey());
            assert_eq!(key.parse::<InstanceId>().unwrap(), id);
        }
    }

    #[test]
    fn inbox_prefix_is_per_instance() {
        let id = InstanceId::from_user_nkey(ALICE).unwrap();
        assert_eq!(id.inbox_prefix(), format!("_INBOX_{ALICE}"));
    }

    #[test]
    fn generated_user_key_is_accepted() {
        let key = nkeys::KeyPair::new_user().public_key();
        assert!(InstanceId::from_user_nkey(&key).is_ok());
    }

    #[test]
    fn empty_is_refused() {
        assert_eq!(InstanceId::from_user_nkey(""), Err(IdError::Empty));
        assert_eq!(InstanceId::open(""), Err(IdError::Empty));
    }

    #[test]
    fn wrong_length_is_refused() {
        assert_eq!(
            InstanceId::from_user_nkey(&ALICE[..55]),
            Err(IdError::WrongLength { len: 55 })
        );
    }

    #[test]
    fn non_user_prefix_is_refused() {
        let account = nkeys::KeyPair::new_account().public_key();
        assert_eq!(
            InstanceId::from_user_nkey(&account),
            Err(IdError::NotAUserKey { found: 'A' })
        );
    }

    #[test]
    fn bad_checksum_is_refused() {
        let mut tampered = ALICE.to_owned();
        tampered.replace_range(10..11, if &ALICE[10..11] == "A" { "B" } else { "A" });
        assert!(matches!(
            InstanceId::from_user_nkey(&tampered),
            Err(IdError::InvalidNkey { .. })
        ));
    }

    #[test]
    fn non_base32_is_refused() {
        let junk = format!("U{}", "!".repeat(55));
        assert!(matches!(
            InstanceId::from_user_nkey(&junk),
            Err(IdError::InvalidNkey { .. })
        ));
    }

    #[test]
    fn open_ids_must_be_tokens() {
        assert_eq!(
            InstanceId::open("dev-alice_1").unwrap().as_str(),
            "dev-alice_1"
        );
        assert!(!InstanceId::open("dev-alice_1").unwrap().is_user_nkey());
        assert_eq!(
            InstanceId::open("a.b"),
            Err(IdError::NotAToken {
                id: "a.b".into(),
                found: '.',
                index: 1
            })
        );
    }
}
