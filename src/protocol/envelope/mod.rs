//! Delivery envelopes (§5): [`CotalMessage`], [`EndpointRef`], [`Part`].
//!
//! The published JSON Schema is authoritative for shapes (§5 "Schema"), so parsing follows it
//! exactly rather than what a derive would do: a routing key that is present counts as present
//! even when its value is `null` (the schema's `not required` clauses), `ts` is any JSON number,
//! `data` may be `null`, and a part `kind` is `text`, `data`, or a reverse-DNS extension kind
//! (§11); a bare unknown kind such as `image` is not conformant and is refused. Routing is an
//! enum, so a message with zero or two routing fields cannot be built, and is refused when
//! parsed (§4, §5).
//!
//! Unknown fields are ignored (§5, §11) and kept in `extra`, so they survive a round trip.
//! Payload routing fields are advisory: how a message reached a receiver comes from the
//! subject, see [`super::receive`].

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value};

use super::channel_name::Channel;
use super::id::InstanceId;

mod read;

pub use read::RawEnvelope;

/// Why a JSON document is not a valid envelope.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// The bytes are not JSON.
    #[error("not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A value that must be an object is not.
    #[error("{field} must be a JSON object")]
    NotAnObject {
        /// Path of the value (`message`, `from`, `parts[1]`).
        field: String,
    },
    /// A required field is absent.
    #[error("missing required field {field}")]
    MissingField {
        /// Path of the field.
        field: String,
    },
    /// A field has the wrong JSON type.
    #[error("{field} must be {expected}")]
    WrongType {
        /// Path of the field.
        field: String,
        /// The expected JSON type.
        expected: &'static str,
    },
    /// Not exactly one of `channel`, `to`, `toService` is present (§4, §5).
    #[error("exactly one of channel, to, toService must be set; found {found:?}")]
    Routing {
        /// The routing fields present.
        found: Vec<&'static str>,
    },
    /// A part kind is neither core (`text`, `data`) nor a reverse-DNS extension (§5, §11).
    #[error("parts[{index}].kind {kind:?} is neither a core kind nor a reverse-DNS extension kind")]
    UnknownPartKind {
        /// Index of the part.
        index: usize,
        /// The refused kind.
        kind: String,
    },
    /// An extension kind given to a builder is not reverse-DNS.
    #[error("{kind:?} is not a reverse-DNS extension kind (e.g. com.acme.snapshot)")]
    InvalidExtensionKind {
        /// The refused kind.
        kind: String,
    },
}

/// Epoch milliseconds, as any JSON number (the schema's `ts: number`). Integers written by
/// this crate stay integers on the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EpochMillis(Number);

impl EpochMillis {
    /// A timestamp from integer milliseconds.
    pub fn from_millis(ms: u64) -> Self {
        Self(Number::from(ms))
    }

    /// The current wall-clock time (0 if the clock is before 1970).
    pub fn now() -> Self {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Self::from_millis(ms)
    }

    /// The value as `f64`, if representable.
    pub fn as_f64(&self) -> Option<f64> {
        self.0.as_f64()
    }

    /// The value as whole non-negative milliseconds, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        self.0.as_u64()
    }
}

impl fmt::Display for EpochMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A new message id: a UUID v7, time-ordered and unique (§5; also the `Nats-Msg-Id`, §8).
pub fn new_message_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Normalizes `@mention` names (§5): trim, lowercase, drop empty, drop duplicates (first
/// occurrence wins). An empty result means the field is omitted.
pub fn normalize_mentions<I, S>(names: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut out: Vec<String> = Vec::new();
    for name in names {
        let name = name.as_ref().trim().to_lowercase();
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// Writes the unknown fields kept in `extra`, skipping any that would duplicate a known key.
fn serialize_extra<M: SerializeMap>(
    map: &mut M,
    extra: &Map<String, Value>,
    known: &[&str],
) -> Result<(), M::Error> {
    for (key, value) in extra {
        if !known.contains(&key.as_str()) {
            map.serialize_entry(key, value)?;
        }
    }
    Ok(())
}

/// The sender or requester of a message: `{ id, name, role? }` (§5).
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointRef {
    /// Instance id (§2); must equal the subject sender on receive.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Service role, if any.
    pub role: Option<String>,
    /// Unknown fields, kept for round trips.
    pub extra: Map<String, Value>,
}

impl EndpointRef {
    /// An endpoint reference for `id` named `name`, with no role.
    pub fn new(id: &InstanceId, name: impl Into<String>) -> Self {
        Self {
            id: id.as_str().to_owned(),
            name: name.into(),
            role: None,
            extra: Map::new(),
        }
    }

    /// Sets the role.
    pub fn with_role(mut self, role: impl Into<String>) -> Self {
        self.role = Some(role.into());
        self
    }
}

impl Serialize for EndpointRef {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("name", &self.name)?;
        if let Some(role) = &self.role {
            map.serialize_entry("role", role)?;
        }
        serialize_extra(&mut map, &self.extra, &["id", "name", "role"])?;
        map.end()
    }
}

impl<'de> Deserialize<'de> for EndpointRef {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        read::endpoint(value, "endpoint").map_err(serde::de::Error::custom)
    }
}

/// A reverse-DNS extension part kind, `^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$` (§11).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExtensionKind(String);

impl ExtensionKind {
    /// Validates a reverse-DNS kind such as `com.acme.snapshot`.
    pub fn new(kind: &str) -> Result<Self, EnvelopeError> {
        if is_extension_kind(kind) {
            Ok(Self(kind.to_owned()))
        } else {
            Err(EnvelopeError::InvalidExtensionKind {
                kind: kind.to_owned(),
            })
        }
    }

    /// The kind text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn is_extension_kind(kind: &str) -> bool {
    let mut labels = 0;
    for label in kind.split('.') {
        if label.is_empty() || !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return false;
        }
        labels += 1;
    }
    labels >= 2
}

/// One content part (§5).
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// `{ "kind": "text", "text": string }`.
    Text {
        /// The text.
        text: String,
        /// Unknown fields.
        extra: Map<String, Value>,
    },
    /// `{ "kind": "data", "data": <any JSON value> }`.
    Data {
        /// The value (may be `null`).
        data: Value,
        /// Unknown fields.
        extra: Map<String, Value>,
    },
    /// A namespaced extension part. Receivers ignore kinds they do not support (§5).
    Extension {
        /// The reverse-DNS kind.
        kind: ExtensionKind,
        /// Every field except `kind`.
        fields: Map<String, Value>,
    },
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text {
            text: text.into(),
            extra: Map::new(),
        }
    }

    /// A data part.
    pub fn data(data: Value) -> Self {
        Self::Data {
            data,
            extra: Map::new(),
        }
    }

    /// The `kind` string.
    pub fn kind(&self) -> &str {
        match self {
            Self::Text { .. } => "text",
            Self::Data { .. } => "data",
            Self::Extension { kind, .. } => kind.as_str(),
        }
    }
}

impl Serialize for Part {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        match self {
            Self::Text { text, extra } => {
                map.serialize_entry("kind", "text")?;
                map.serialize_entry("text", text)?;
                serialize_extra(&mut map, extra, &["kind", "text"])?;
            }
            Self::Data { data, extra } => {
                map.serialize_entry("kind", "data")?;
                map.serialize_entry("data", data)?;
                serialize_extra(&mut map, extra, &["kind", "data"])?;
            }
            Self::Extension { kind, fields } => {
                map.serialize_entry("kind", kind.as_str())?;
                serialize_extra(&mut map, fields, &["kind"])?;
            }
        }
        map.end()
    }
}

/// The one routing field of a delivery message (§4): the enum makes "exactly one" structural.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Routing {
    /// `channel`: multicast.
    Channel(String),
    /// `to`: unicast to an instance id.
    To(String),
    /// `toService`: anycast to a role.
    ToService(String),
}

impl Routing {
    /// Multicast to a concrete channel.
    pub fn channel(channel: &Channel) -> Self {
        Self::Channel(channel.as_str().to_owned())
    }

    /// Unicast to an instance.
    pub fn to(target: &InstanceId) -> Self {
        Self::To(target.as_str().to_owned())
    }

    /// Anycast to a role.
    pub fn to_service(role: impl Into<String>) -> Self {
        Self::ToService(role.into())
    }

    /// The JSON field name.
    pub fn field_name(&self) -> &'static str {
        match self {
            Self::Channel(_) => "channel",
            Self::To(_) => "to",
            Self::ToService(_) => "toService",
        }
    }

    /// The routing value.
    pub fn value(&self) -> &str {
        match self {
            Self::Channel(v) | Self::To(v) | Self::ToService(v) => v,
        }
    }
}

/// A delivery message (§5).
#[derive(Clone, Debug, PartialEq)]
pub struct CotalMessage {
    /// Unique message id; also the JetStream `Nats-Msg-Id` (§8).
    pub id: String,
    /// Epoch milliseconds.
    pub ts: EpochMillis,
    /// Space name.
    pub space: String,
    /// The sender.
    pub from: EndpointRef,
    /// Exactly one routing field.
    pub routing: Routing,
    /// `@mention` names; omitted on the wire when empty. Builders normalize them.
    pub mentions: Vec<String>,
    /// Content parts.
    pub parts: Vec<Part>,
    /// Id of the message replied to.
    pub reply_to: Option<String>,
    /// Thread / conversation correlation id.
    pub context_id: Option<String>,
    /// Unknown fields, kept for round trips.
    pub extra: Map<String, Value>,
}

impl CotalMessage {
    /// A new message with a fresh UUID v7 id and the current time.
    pub fn new(
        space: impl Into<String>,
        from: EndpointRef,
        routing: Routing,
        parts: Vec<Part>,
    ) -> Self {
        Self {
            id: new_message_id(),
            ts: EpochMillis::now(),
            space: space.into(),
            from,
            routing,
            mentions: Vec::new(),
            parts,
            reply_to: None,
            context_id: None,
            extra: Map::new(),
        }
    }

    /// Sets the mentions, normalized (§5).
    pub fn with_mentions<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.mentions = normalize_mentions(names);
        self
    }

    /// Sets `replyTo`.
    pub fn with_reply_to(mut self, id: impl Into<String>) -> Self {
        self.reply_to = Some(id.into());
        self
    }

    /// Sets `contextId`.
    pub fn with_context_id(mut self, id: impl Into<String>) -> Self {
        self.context_id = Some(id.into());
        self
    }

    /// Parses a message from JSON bytes, following the published schema (§5).
    pub fn from_json(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        serde_json::from_slice::<RawEnvelope>(bytes)?.into_message()
    }

    /// Parses a message from an already decoded JSON value.
    pub fn from_value(value: Value) -> Result<Self, EnvelopeError> {
        read::message(value)
    }

    /// Serializes the message to JSON bytes, into a buffer sized for it at the start: one that
    /// starts at 128 bytes and doubles is grown three times for an 800-byte message.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut json = Vec::with_capacity(self.json_len_hint());
        serde_json::to_writer(&mut json, self)?;
        Ok(json)
    }

    /// About the length of the message's JSON text: its longest strings, and room for its keys,
    /// punctuation, time and short fields.
    fn json_len_hint(&self) -> usize {
        let texts: usize = (self.parts.iter())
            .map(|part| match part {
                Part::Text { text, .. } => text.len(),
                Part::Data { .. } | Part::Extension { .. } => 0,
            })
            .sum();
        JSON_LEN_SLACK + self.id.len() + self.space.len() + self.from.id.len() + texts
    }
}

/// The part of a message's JSON text [`CotalMessage::json_len_hint`] does not count: keys,
/// punctuation, the time, a name, a channel or a target, a few mentions.
const JSON_LEN_SLACK: usize = 256;

const MESSAGE_FIELDS: [&str; 11] = [
    "id",
    "ts",
    "space",
    "from",
    "channel",
    "to",
    "toService",
    "mentions",
    "parts",
    "replyTo",
    "contextId",
];

impl Serialize for CotalMessage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("ts", &self.ts)?;
        map.serialize_entry("space", &self.space)?;
        map.serialize_entry("from", &self.from)?;
        map.serialize_entry(self.routing.field_name(), self.routing.value())?;
        if !self.mentions.is_empty() {
            map.serialize_entry("mentions", &self.mentions)?;
        }
        map.serialize_entry("parts", &self.parts)?;
        if let Some(reply_to) = &self.reply_to {
            map.serialize_entry("replyTo", reply_to)?;
        }
        if let Some(context_id) = &self.context_id {
            map.serialize_entry("contextId", context_id)?;
        }
        serialize_extra(&mut map, &self.extra, &MESSAGE_FIELDS)?;
        map.end()
    }
}

impl<'de> Deserialize<'de> for CotalMessage {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        RawEnvelope::deserialize(deserializer)?
            .into_message()
            .map_err(serde::de::Error::custom)
    }
}
