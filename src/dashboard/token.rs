//! The dashboard's access token: 32 random bytes (hex), one per data dir, kept in an
//! owner-only file so that the URL a person bookmarked keeps working across restarts. It is
//! the only secret between a browser and the dashboard (the Jupyter pattern): the printed URL
//! carries it once, then an HttpOnly cookie does.

use std::io::Read;
use std::path::Path;

use crate::files::{FileError, write_atomic};

/// How many random bytes a token holds.
const TOKEN_BYTES: usize = 32;

/// The access token.
#[derive(Clone)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

/// Why the token could not be read or made.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The system's random source.
    #[error("cannot read random bytes for the dashboard token")]
    Random(#[source] std::io::Error),
    /// The token file.
    #[error(transparent)]
    File(#[from] FileError),
}

impl Token {
    /// The token stored at `path`, or a new one written there (mode 0600) when there is none
    /// or it is not a token.
    pub fn load_or_create(path: &Path) -> Result<Self, TokenError> {
        if let Ok(text) = std::fs::read_to_string(path) {
            let text = text.trim();
            if text.len() == TOKEN_BYTES * 2 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Ok(Token(text.to_ascii_lowercase()));
            }
        }
        let mut bytes = [0u8; TOKEN_BYTES];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map_err(TokenError::Random)?;
        let token = data_encoding::HEXLOWER.encode(&bytes);
        write_atomic(path, format!("{token}\n").as_bytes(), 0o600)?;
        Ok(Token(token))
    }

    /// The token's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `given` is the token, compared in constant time.
    pub fn matches(&self, given: &str) -> bool {
        same(&self.0, given)
    }

    /// The anti-forgery value every form of the dashboard carries: derived from the token
    /// (so it is the same across restarts, and useless to anyone who does not hold the
    /// token), never the token itself, which stays in its HttpOnly cookie.
    pub fn csrf(&self) -> String {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(format!("cotald dashboard form\0{}", self.0));
        data_encoding::HEXLOWER.encode(&digest[..16])
    }

    /// Whether a form's `given` anti-forgery value is this token's, compared in constant time.
    pub fn csrf_matches(&self, given: &str) -> bool {
        same(&self.csrf(), given)
    }
}

/// `a == b`, in a time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_made_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("dashboard.token");
        let first = Token::load_or_create(&path).unwrap();
        assert_eq!(first.as_str().len(), 64);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = Token::load_or_create(&path).unwrap();
        assert!(again.matches(first.as_str()));
        assert!(!again.matches(""));
        assert!(!again.matches(&first.as_str()[1..]));
        std::fs::write(&path, "not a token").unwrap();
        let replaced = Token::load_or_create(&path).unwrap();
        assert!(!replaced.matches(first.as_str()));
    }
}
