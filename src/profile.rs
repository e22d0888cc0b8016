//! The operator's TOML profile: the broker settings and the spaces to serve.
//!
//! Unknown keys are errors that name the key and the file (a typo must not silently fall
//! back to a default). With no file, the embedded `config/local.toml` is used: one space
//! `main` with the `local` deployment profile.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The profile compiled into the binary (`config/local.toml`).
pub const EMBEDDED_LOCAL: &str = include_str!("../config/local.toml");

/// A parsed and validated profile.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Broker-wide settings.
    pub broker: BrokerConfig,
    /// The spaces, by name (§1: one space = one account).
    pub spaces: BTreeMap<String, SpaceConfig>,
}

/// Broker-wide settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Client listener address (TLS).
    pub listen: SocketAddr,
    /// Monitoring listener; must be a loopback address.
    #[serde(default = "default_monitor")]
    pub monitor: SocketAddr,
    /// JetStream fsync interval (`"always"`, or a duration such as `"1s"`, `"2m"`).
    #[serde(default = "default_sync_interval")]
    pub sync_interval: String,
    /// Extra names for the server certificate (in addition to localhost and loopback IPs).
    #[serde(default)]
    pub hostnames: Vec<String>,
}

/// The deployment profile of a space (§7): it decides `=defaults.deliveryClass`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeploymentProfile {
    /// Local / self-hosted: channels are `durable` by default.
    Local,
    /// Public / web-scale: channels are `live` by default, durability opt-in.
    Public,
}

/// One space.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpaceConfig {
    /// The deployment profile.
    pub profile: DeploymentProfile,
    /// JetStream limits of the space's account.
    #[serde(default)]
    pub jetstream: JetStreamConfig,
}

/// JetStream storage limits of a space's account, as sizes (`"256M"`, `"10G"`, bytes).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JetStreamConfig {
    /// Memory storage limit.
    #[serde(default = "default_memory", deserialize_with = "de_size")]
    pub max_memory_store: i64,
    /// File storage limit.
    #[serde(default = "default_file", deserialize_with = "de_size")]
    pub max_file_store: i64,
}

impl Default for JetStreamConfig {
    fn default() -> Self {
        JetStreamConfig {
            max_memory_store: default_memory(),
            max_file_store: default_file(),
        }
    }
}

fn default_monitor() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn default_sync_interval() -> String {
    "1s".to_owned()
}

fn default_memory() -> i64 {
    256 << 20
}

fn default_file() -> i64 {
    10 << 30
}

/// Why a profile was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file could not be read.
    #[error("cannot read profile {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The TOML is invalid or has an unknown key.
    #[error("invalid profile {origin}: {message}")]
    Parse { origin: String, message: String },
    /// A value is out of range.
    #[error("invalid profile {origin}: {message}")]
    Invalid { origin: String, message: String },
}

impl Profile {
    /// Reads and validates a profile file.
    pub fn read(path: &Path) -> Result<Self, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The embedded default (`config/local.toml`).
    pub fn embedded() -> Result<Self, ProfileError> {
        Self::parse(EMBEDDED_LOCAL, "(embedded config/local.toml)")
    }

    /// Parses and validates profile text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ProfileError> {
        let profile: Profile = toml::from_str(text).map_err(|e| ProfileError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        profile
            .validate()
            .map_err(|message| ProfileError::Invalid {
                origin: origin.to_owned(),
                message,
            })?;
        Ok(profile)
    }

    fn validate(&self) -> Result<(), String> {
        if !self.broker.monitor.ip().is_loopback() {
            return Err(format!(
                "broker.monitor = {}: the monitoring port has no authentication and must bind \
                 a loopback address",
                self.broker.monitor
            ));
        }
        if !valid_sync_interval(&self.broker.sync_interval) {
            return Err(format!(
                "broker.sync_interval = {:?}: expected \"always\" or a duration such as \
                 \"500ms\", \"1s\", \"2m\"",
                self.broker.sync_interval
            ));
        }
        if self.spaces.is_empty() {
            return Err("no [spaces.<name>] table: a profile serves at least one space".into());
        }
        for (name, space) in &self.spaces {
            validate_space_name(name)?;
            let js = &space.jetstream;
            if js.max_memory_store <= 0 || js.max_file_store <= 0 {
                return Err(format!(
                    "spaces.{name}.jetstream: storage limits must be positive sizes"
                ));
            }
        }
        Ok(())
    }
}

/// A space name becomes a subject token (§3), an account name and a directory name, so it
/// must already be a clean token: `[A-Za-z0-9_-]+`. A name that sanitization would change is
/// refused rather than silently renamed.
pub fn validate_space_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "space name {name:?}: use 1 to 64 characters from [A-Za-z0-9_-]"
        ));
    }
    Ok(())
}

fn valid_sync_interval(s: &str) -> bool {
    if s == "always" {
        return true;
    }
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && matches!(&s[digits..], "ms" | "s" | "m" | "h")
}

fn de_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(i64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Bytes(n) => Ok(n),
        Size::Text(s) => parse_size(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "invalid size {s:?}: expected bytes or a number with K, M, G or T"
            ))
        }),
    }
}

/// Parses `"512"`, `"256K"`, `"256M"`, `"10G"`, `"1T"` (binary multiples) into bytes.
fn parse_size(s: &str) -> Option<i64> {
    let s = s.trim();
    let (num, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        b'T' | b't' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    num.parse::<i64>().ok()?.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_profile_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        let mut count = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                Profile::read(&path).unwrap();
                count += 1;
            }
        }
        assert!(count >= 1);
        let embedded = Profile::embedded().unwrap();
        assert_eq!(embedded.spaces["main"].profile, DeploymentProfile::Local);
        assert_eq!(embedded.spaces["main"].jetstream.max_file_store, 10 << 30);
    }

    #[test]
    fn unknown_key_names_the_key_and_the_file() {
        let text = EMBEDDED_LOCAL.replace("sync_interval", "sync_intervall");
        let err = Profile::parse(&text, "my.toml").unwrap_err().to_string();
        assert!(err.contains("my.toml"), "{err}");
        assert!(err.contains("sync_intervall"), "{err}");
    }

    #[test]
    fn refusals() {
        let cases = [
            (
                "monitor = \"127.0.0.1:0\"",
                "monitor = \"0.0.0.0:8222\"",
                "loopback",
            ),
            (
                "sync_interval = \"1s\"",
                "sync_interval = \"soon\"",
                "sync_interval",
            ),
            ("spaces.main", "spaces.\"ma.in\"", "space name"),
            (
                "max_file_store = \"10G\"",
                "max_file_store = \"10X\"",
                "invalid size",
            ),
        ];
        for (from, to, expect) in cases {
            let text = EMBEDDED_LOCAL.replace(from, to);
            assert_ne!(text, EMBEDDED_LOCAL, "{from}");
            let err = Profile::parse(&text, "t.toml").unwrap_err().to_string();
            assert!(err.contains(expect), "{to}: {err}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("256M"), Some(256 << 20));
        assert_eq!(parse_size("1t"), Some(1 << 40));
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size("99999999999T"), None);
    }
}
