//! Channel configuration, space defaults and effective resolution (§7).
//!
//! Channel config is optional and lives in the per-space registry keyed by the concrete
//! channel; space-wide defaults live under the reserved key [`CHANNEL_DEFAULTS_KEY`]. §7
//! requires one resolution shared by live join, durable fan-out, history read and membership
//! surfacing, so [`resolve`] is the only place the `channel ?? defaults ?? built-in` rule is
//! written; every path must call it instead of reading fields directly.
//!
//! Values are validated when built and when parsed: `replayWindow` matches
//! `^\d+(s|m|h|d)$`, `description` holds at most 200 characters and `instructions` at most
//! 2000 (Unicode scalar values, not bytes).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::channel_name::{Channel, ChannelError, ChannelPattern};

/// Registry key of the space-wide [`ChannelDefaults`]. Sanitization never produces `=`, so no
/// channel can collide with it.
pub const CHANNEL_DEFAULTS_KEY: &str = "=defaults";

/// Built-in replay default when neither channel nor space sets one (§7).
pub const DEFAULT_REPLAY: bool = true;

/// Built-in delivery class when neither channel nor space sets one (§7).
pub const DEFAULT_DELIVERY_CLASS: DeliveryClass = DeliveryClass::Durable;

/// Maximum `description` length in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 200;

/// Maximum `instructions` length in characters.
pub const MAX_INSTRUCTIONS_CHARS: usize = 2000;

/// Per-channel delivery class (§4, §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryClass {
    /// At-most-once core-subscription delivery.
    Live,
    /// Live plus an at-least-once per-member backstop.
    Durable,
}

/// Why a channel config value is refused.
#[derive(Debug, thiserror::Error)]
pub enum ChannelConfigError {
    /// `replayWindow` does not match `^\d+(s|m|h|d)$`.
    #[error("replayWindow {value:?} must match ^\\d+(s|m|h|d)$, e.g. \"24h\"")]
    ReplayWindowSyntax {
        /// The refused value.
        value: String,
    },
    /// `replayWindow` is too large to represent.
    #[error("replayWindow {value:?} overflows")]
    ReplayWindowOverflow {
        /// The refused value.
        value: String,
    },
    /// `description` is longer than 200 characters.
    #[error("description has {chars} characters; the maximum is {MAX_DESCRIPTION_CHARS}")]
    DescriptionTooLong {
        /// Its length in characters.
        chars: usize,
    },
    /// `instructions` is longer than 2000 characters.
    #[error("instructions has {chars} characters; the maximum is {MAX_INSTRUCTIONS_CHARS}")]
    InstructionsTooLong {
        /// Its length in characters.
        chars: usize,
    },
    /// A registry key is neither `=defaults` nor a concrete channel.
    #[error("registry key {key:?} is not {CHANNEL_DEFAULTS_KEY:?} or a channel: {source}")]
    InvalidRegistryKey {
        /// The refused key.
        key: String,
        /// Why it is not a channel.
        source: ChannelError,
    },
    /// The record is not valid JSON for its type.
    #[error("invalid channel config JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// A backfill horizon such as `24h` (§7). Keeps its text for round trips.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ReplayWindow {
    text: String,
    duration: Duration,
}

impl ReplayWindow {
    /// Parses `^\d+(s|m|h|d)$`; digits are ASCII.
    pub fn parse(value: &str) -> Result<Self, ChannelConfigError> {
        let syntax = || ChannelConfigError::ReplayWindowSyntax {
            value: value.to_owned(),
        };
        let split = value.len().checked_sub(1).ok_or_else(syntax)?;
        let (digits, unit) = (value.get(..split), value.get(split..));
        let (Some(digits), Some(unit)) = (digits, unit) else {
            return Err(syntax());
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax());
        }
        let seconds_per_unit: u64 = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => return Err(syntax()),
        };
        let overflow = || ChannelConfigError::ReplayWindowOverflow {
            value: value.to_owned(),
        };
        let amount: u64 = digits.parse().map_err(|_| overflow())?;
        let seconds = amount.checked_mul(seconds_per_unit).ok_or_else(overflow)?;
        Ok(Self {
            text: value.to_owned(),
            duration: Duration::from_secs(seconds),
        })
    }

    /// The horizon as a duration.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl TryFrom<String> for ReplayWindow {
    type Error = ChannelConfigError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<ReplayWindow> for String {
    fn from(window: ReplayWindow) -> Self {
        window.text
    }
}

impl fmt::Display for ReplayWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A text newtype whose length (in characters) is bounded, checked when built and when parsed.
macro_rules! bounded_text {
    ($(#[$doc:meta])* $name:ident, $max:expr, $error:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates the length.
            pub fn new(text: impl Into<String>) -> Result<Self, ChannelConfigError> {
                let text = text.into();
                let chars = text.chars().count();
                if chars > $max {
                    return Err(ChannelConfigError::$error { chars });
                }
                Ok(Self(text))
            }

            /// The text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = ChannelConfigError;

            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(t: $name) -> Self {
                t.0
            }
        }
    };
}

bounded_text!(
    /// A channel's one-line purpose, at most 200 characters.
    ChannelDescription,
    MAX_DESCRIPTION_CHARS,
    DescriptionTooLong
);

bounded_text!(
    /// Advisory usage text for a channel, at most 2000 characters.
    ChannelInstructions,
    MAX_INSTRUCTIONS_CHARS,
    InstructionsTooLong
);

/// Per-channel config (§7). Every field overrides the space default when set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelConfig {
    /// History replay on join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<bool>,
    /// Backfill horizon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_window: Option<ReplayWindow>,
    /// Delivery class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_class: Option<DeliveryClass>,
    /// One-line purpose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<ChannelDescription>,
    /// Advisory usage text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<ChannelInstructions>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChannelConfig {
    /// Parses and validates a registry value.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ChannelConfigError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// Space-wide defaults stored under [`CHANNEL_DEFAULTS_KEY`] (§7).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChannelDefaults {
    /// Default replay on join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<bool>,
    /// Default backfill horizon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_window: Option<ReplayWindow>,
    /// Default delivery class; written at space creation from the deployment profile (§7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_class: Option<DeliveryClass>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChannelDefaults {
    /// Parses and validates the `=defaults` value.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ChannelConfigError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// A channel-registry key: the defaults record or one concrete channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryKey {
    /// [`CHANNEL_DEFAULTS_KEY`].
    Defaults,
    /// A channel's config.
    Channel(Channel),
}

impl RegistryKey {
    /// Classifies a registry key. Channel keys must already be in wire form.
    pub fn parse(key: &str) -> Result<Self, ChannelConfigError> {
        if key == CHANNEL_DEFAULTS_KEY {
            return Ok(Self::Defaults);
        }
        let invalid = |source| ChannelConfigError::InvalidRegistryKey {
            key: key.to_owned(),
            source,
        };
        let channel = ChannelPattern::from_policy(key)
            .and_then(|pattern| pattern.to_channel())
            .map_err(invalid)?;
        Ok(Self::Channel(channel))
    }

    /// The key string.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Defaults => CHANNEL_DEFAULTS_KEY,
            Self::Channel(channel) => channel.as_str(),
        }
    }
}

/// The configuration that governs a channel, after resolution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectiveChannelConfig {
    /// Replay on join: `channel.replay ?? defaults.replay ?? true`.
    pub replay: bool,
    /// `channel.deliveryClass ?? defaults.deliveryClass ?? durable`.
    pub delivery_class: DeliveryClass,
    /// `channel.replayWindow ?? defaults.replayWindow`; `None` means no horizon.
    pub replay_window: Option<ReplayWindow>,
}

/// The single effective-resolution rule of §7, used by every path.
pub fn resolve(
    channel: Option<&ChannelConfig>,
    defaults: Option<&ChannelDefaults>,
) -> EffectiveChannelConfig {
    EffectiveChannelConfig {
        replay: channel
            .and_then(|c| c.replay)
            .or_else(|| defaults.and_then(|d| d.replay))
            .unwrap_or(DEFAULT_REPLAY),
        delivery_class: channel
            .and_then(|c| c.delivery_class)
            .or_else(|| defaults.and_then(|d| d.delivery_class))
            .unwrap_or(DEFAULT_DELIVERY_CLASS),
        replay_window: channel
            .and_then(|c| c.replay_window.clone())
            .or_else(|| defaults.and_then(|d| d.replay_window.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn replay_window_parses_each_unit() {
        for (text, secs) in [("30s", 30), ("5m", 300), ("24h", 86_400), ("7d", 604_800)] {
            let w = ReplayWindow::parse(text).unwrap();
            assert_eq!(w.duration(), Duration::from_secs(secs));
            assert_eq!(w.as_str(), text);
        }
        assert_eq!(
            ReplayWindow::parse("0s").unwrap().duration(),
            Duration::ZERO
        );
        assert_eq!(
            ReplayWindow::parse("007m").unwrap().duration().as_secs(),
            420
        );
    }

    #[test]
    fn replay_window_syntax_refusals() {
        for bad in [
            "", "h", "24", "24H", "1w", "-1h", "+1h", " 1h", "1h ", "1.5h", "1hh", "١h", "24ｈ",
        ] {
            assert!(
                matches!(
                    ReplayWindow::parse(bad),
                    Err(ChannelConfigError::ReplayWindowSyntax { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn replay_window_overflow_is_typed() {
        let max_days = u64::MAX / 86_400;
        assert!(ReplayWindow::parse(&format!("{max_days}d")).is_ok());
        for bad in [
            format!("{}d", max_days + 1),
            format!("{}s", u128::from(u64::MAX) + 1),
            format!("{}h", "9".repeat(40)),
        ] {
            assert!(
                matches!(
                    ReplayWindow::parse(&bad),
                    Err(ChannelConfigError::ReplayWindowOverflow { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn description_and_instructions_count_characters() {
        assert!(ChannelDescription::new("é".repeat(200)).is_ok());
        assert!(matches!(
            ChannelDescription::new("é".repeat(201)),
            Err(ChannelConfigError::DescriptionTooLong { chars: 201 })
        ));
        assert!(ChannelInstructions::new("😀".repeat(2000)).is_ok());
        assert!(matches!(
            ChannelInstructions::new("x".repeat(2001)),
            Err(ChannelConfigError::InstructionsTooLong { chars: 2001 })
        ));
    }

    #[test]
    fn parsing_validates_every_field() {
        let ok = ChannelConfig::from_json(
            br#"{"replay":false,"replayWindow":"24h","deliveryClass":"live","description":"d","instructions":"i","x":1}"#,
        )
        .unwrap();
        assert_eq!(ok.replay, Some(false));
        assert_eq!(ok.delivery_class, Some(DeliveryClass::Live));
        assert_eq!(ok.extra["x"], 1);
        let long = format!(r#"{{"description":"{}"}}"#, "a".repeat(201));
        for bad in [
            r#"{"replayWindow":"1w"}"#,
            r#"{"deliveryClass":"lossy"}"#,
            r#"{"replay":"yes"}"#,
            long.as_str(),
        ] {
            assert!(matches!(
                ChannelConfig::from_json(bad.as_bytes()),
                Err(ChannelConfigError::Json(_))
            ));
        }
        assert!(ChannelDefaults::from_json(br#"{"replayWindow":"x"}"#).is_err());
    }

    #[test]
    fn config_round_trips() {
        let raw = json!({"replayWindow": "24h", "deliveryClass": "durable", "future": [1]});
        let c: ChannelConfig = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(serde_json::to_value(&c).unwrap(), raw);
        let d = ChannelDefaults {
            delivery_class: Some(DeliveryClass::Live),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            json!({"deliveryClass": "live"})
        );
    }

    #[test]
    fn resolution_is_channel_then_defaults_then_builtin() {
        let none = resolve(None, None);
        assert_eq!(
            none,
            EffectiveChannelConfig {
                replay: true,
                delivery_class: DeliveryClass::Durable,
                replay_window: None
            }
        );
        let defaults = ChannelDefaults {
            replay: Some(false),
            replay_window: Some(ReplayWindow::parse("1d").unwrap()),
            delivery_class: Some(DeliveryClass::Live),
            ..Default::default()
        };
        let from_defaults = resolve(Some(&ChannelConfig::default()), Some(&defaults));
        assert!(!from_defaults.replay);
        assert_eq!(from_defaults.delivery_class, DeliveryClass::Live);
        assert_eq!(from_defaults.replay_window.unwrap().as_str(), "1d");
        let channel = ChannelConfig {
            replay: Some(true),
            replay_window: Some(ReplayWindow::parse("2h").unwrap()),
            delivery_class: Some(DeliveryClass::Durable),
            ..Default::default()
        };
        let from_channel = resolve(Some(&channel), Some(&defaults));
        assert!(from_channel.replay);
        assert_eq!(from_channel.delivery_class, DeliveryClass::Durable);
        assert_eq!(from_channel.replay_window.unwrap().as_str(), "2h");
    }

    #[test]
    fn registry_keys() {
        assert_eq!(
            RegistryKey::parse("=defaults").unwrap(),
            RegistryKey::Defaults
        );
        assert_eq!(
            RegistryKey::parse("team.backend").unwrap().as_str(),
            "team.backend"
        );
        assert_eq!(RegistryKey::Defaults.as_str(), CHANNEL_DEFAULTS_KEY);
        for bad in ["", "team.>", "a..b", "foo/bar", "=other"] {
            assert!(
                matches!(
                    RegistryKey::parse(bad),
                    Err(ChannelConfigError::InvalidRegistryKey { .. })
                ),
                "{bad}"
            );
        }
    }
}
