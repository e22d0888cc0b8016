//! The `.creds` file: a user JWT and its nkey seed in the decorated format every NATS client
//! reads. The closing lines carry six dashes; clients match them literally.

use std::fmt;

use nkeys::KeyPair;

/// A user credential: the signed JWT and the user's seed.
#[derive(Clone)]
pub struct Creds {
    /// The user JWT.
    pub jwt: String,
    /// The user's nkey seed (`SU…`). Secret.
    pub seed: String,
}

/// Why a `.creds` text could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CredsError {
    /// A decorated block is missing.
    #[error("no {0} block in the credentials")]
    MissingBlock(&'static str),
    /// The seed is not a valid user seed.
    #[error("the credentials' seed is invalid: {0}")]
    BadSeed(String),
}

impl Creds {
    /// The public key (instance id, §2) bound to this credential.
    pub fn public_key(&self) -> Result<String, CredsError> {
        KeyPair::from_seed(&self.seed)
            .map(|kp| kp.public_key())
            .map_err(|e| CredsError::BadSeed(e.to_string()))
    }

    /// Renders the `.creds` file text.
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

    /// Writes the `.creds` file (mode 0600, its directory 0700), replacing an older copy.
    pub fn write(&self, path: &std::path::Path) -> Result<(), super::ProvisionError> {
        if let Some(parent) = path.parent() {
            super::files::private_dir(parent)?;
        }
        super::files::write_regenerable(path, self.render().as_bytes(), 0o600)
    }

    /// Parses a `.creds` file text.
    pub fn parse(text: &str) -> Result<Self, CredsError> {
        Ok(Creds {
            jwt: block(text, "NATS USER JWT")?,
            seed: block(text, "USER NKEY SEED")?,
        })
    }
}

impl fmt::Debug for Creds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Creds")
            .field("jwt", &self.jwt)
            .finish_non_exhaustive()
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
    }
}
