//! An envelope's fields as found in its document, and the schema's rules applied to them (§5).
//!
//! A delivery is read from its JSON text in one pass ([`RawEnvelope::read`]): each field the
//! envelope knows goes straight to its place, kept as it was found (absent, of the JSON type
//! its rule asks for, or of another), and only unknown fields are kept as JSON values. Reading
//! the document into a JSON value first and taking that apart builds every object as a map of
//! owned keys only to empty it again; on the receive path, which every copy of every message
//! takes, that was most of the cost of a check. A document already decoded
//! ([`CotalMessage::from_value`]) is sorted into the same places, and the rules are applied by
//! the same code, so a document is accepted or refused, and for the same reason, however it
//! was read. As in a decoded document, a key given twice keeps its last value. A content part
//! is read into its fields in the same pass; as its `kind` may come last, its `text` and `data`
//! are kept as found until the kind says where they go ([`PartFields`]).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::{
    CotalMessage, EndpointRef, EnvelopeError, EpochMillis, ExtensionKind, Part, Routing,
    is_extension_kind,
};

/// A field as found in its object.
#[derive(Debug, Default)]
enum Found<T> {
    /// Not there.
    #[default]
    Absent,
    /// There, of the JSON type its rule asks for.
    Typed(T),
    /// There, of another type (`null` included).
    Mistyped,
}

impl<T> Found<T> {
    fn is_present(&self) -> bool {
        !matches!(self, Self::Absent)
    }

    /// A required field's value.
    fn required(self, path: &str, name: &str, expected: &'static str) -> Result<T, EnvelopeError> {
        match self {
            Self::Typed(value) => Ok(value),
            Self::Absent => Err(EnvelopeError::MissingField {
                field: field_path(path, name),
            }),
            Self::Mistyped => Err(wrong(path, name, expected)),
        }
    }

    /// An optional field's value: absent is `None`, present of another type (`null` too) is
    /// refused.
    fn optional(
        self,
        path: &str,
        name: &str,
        expected: &'static str,
    ) -> Result<Option<T>, EnvelopeError> {
        match self {
            Self::Typed(value) => Ok(Some(value)),
            Self::Absent => Ok(None),
            Self::Mistyped => Err(wrong(path, name, expected)),
        }
    }
}

/// The path of field `name` of the object at `path` (the message's own fields are bare).
fn field_path(path: &str, name: &str) -> String {
    if path == "message" {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

fn wrong(path: &str, name: &str, expected: &'static str) -> EnvelopeError {
    EnvelopeError::WrongType {
        field: field_path(path, name),
        expected,
    }
}

fn string(value: Value) -> Found<String> {
    match value {
        Value::String(s) => Found::Typed(s),
        _ => Found::Mistyped,
    }
}

fn array(value: Value) -> Found<Vec<Value>> {
    match value {
        Value::Array(items) => Found::Typed(items),
        _ => Found::Mistyped,
    }
}

/// The fields of a content part (§5, §11) as found: its `kind` first decides what `text` and
/// `data` are (the field its kind asks for, or one kept with the unknown fields), so both are
/// kept as found until then.
#[derive(Default)]
struct PartFields {
    kind: Option<Value>,
    text: Option<Value>,
    data: Option<Value>,
    extra: Map<String, Value>,
}

impl Entries for PartFields {
    fn set(&mut self, key: Cow<'_, str>, value: Value) {
        match &*key {
            "kind" => self.kind = Some(value),
            "text" => self.text = Some(value),
            "data" => self.data = Some(value),
            _ => {
                self.extra.insert(key.into_owned(), value);
            }
        }
    }
}

impl PartFields {
    /// The part at `index` of `parts`: its `kind`, then what that kind asks for; everything
    /// else is kept (an extension part keeps every field but `kind`).
    fn into_part(self, index: usize) -> Result<Part, EnvelopeError> {
        let path = || format!("parts[{index}]");
        let kind = match self.kind {
            Some(Value::String(kind)) => kind,
            Some(_) => return Err(wrong(&path(), "kind", "a string")),
            None => {
                return Err(EnvelopeError::MissingField {
                    field: field_path(&path(), "kind"),
                });
            }
        };
        let mut extra = self.extra;
        let mut keep = |name: &str, value: Option<Value>| {
            if let Some(value) = value {
                extra.insert(name.to_owned(), value);
            }
        };
        match kind.as_str() {
            "text" => {
                keep("data", self.data);
                let text = match self.text {
                    Some(Value::String(text)) => text,
                    Some(_) => return Err(wrong(&path(), "text", "a string")),
                    None => {
                        return Err(EnvelopeError::MissingField {
                            field: field_path(&path(), "text"),
                        });
                    }
                };
                Ok(Part::Text { text, extra })
            }
            "data" => {
                keep("text", self.text);
                let data = self.data.ok_or_else(|| EnvelopeError::MissingField {
                    field: field_path(&path(), "data"),
                })?;
                Ok(Part::Data { data, extra })
            }
            other if is_extension_kind(other) => {
                keep("text", self.text);
                keep("data", self.data);
                Ok(Part::Extension {
                    kind: ExtensionKind(kind),
                    fields: extra,
                })
            }
            _ => Err(EnvelopeError::UnknownPartKind { index, kind }),
        }
    }
}

/// A content part as found in `parts` at `index`.
fn part(found: ObjectOr<PartFields>, index: usize) -> Result<Part, EnvelopeError> {
    match found {
        ObjectOr::Object(fields) => fields.into_part(index),
        ObjectOr::Other => Err(EnvelopeError::NotAnObject {
            field: format!("parts[{index}]"),
        }),
    }
}

/// A decoded value sorted as it would have been read.
fn object_or<T: Entries>(value: Value) -> ObjectOr<T> {
    match value {
        Value::Object(map) => ObjectOr::Object(T::from_map(map)),
        _ => ObjectOr::Other,
    }
}

/// The fields of an object: sorted into place one entry at a time, whether read from text or
/// taken from a decoded map.
trait Entries: Default {
    /// Puts the entry `key: value` in its place (a later entry of the same key replaces it).
    fn set(&mut self, key: Cow<'_, str>, value: Value);

    /// Reads the entries of an object from a document, as [`Entries::set`] would place them.
    fn read<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut fields = Self::default();
        while let Some(Key(key)) = map.next_key()? {
            let value = map.next_value()?;
            fields.set(key, value);
        }
        Ok(fields)
    }

    fn from_map(map: Map<String, Value>) -> Self {
        let mut fields = Self::default();
        for (key, value) in map {
            fields.set(Cow::Owned(key), value);
        }
        fields
    }
}

/// An object key, borrowed from the document where it holds no escape.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }
            fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }
            fn visit_string<E>(self, key: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// A JSON value read as the object `T` when it is one; any other value is read whole, as a
/// decoded document would be (so it fails or passes the parser's limits alike), and dropped.
enum ObjectOr<T> {
    Object(T),
    Other,
}

impl<T> From<ObjectOr<T>> for Found<T> {
    fn from(value: ObjectOr<T>) -> Self {
        match value {
            ObjectOr::Object(fields) => Found::Typed(fields),
            ObjectOr::Other => Found::Mistyped,
        }
    }
}

impl<'de, T: Entries> Deserialize<'de> for ObjectOr<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ObjectOrVisitor(PhantomData))
    }
}

/// The visits of a scalar (`null`, a boolean, a number, a string) for a visitor that reads one
/// as `$other`: a value of a type the caller does not take apart.
macro_rules! other_scalars {
    ($other:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($other)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($other)
        }
    };
}

struct ObjectOrVisitor<T>(PhantomData<T>);

impl<'de, T: Entries> Visitor<'de> for ObjectOrVisitor<T> {
    type Value = ObjectOr<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::read(map).map(ObjectOr::Object)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<Value>()?.is_some() {}
        Ok(ObjectOr::Other)
    }
    other_scalars!(ObjectOr::Other);
}

/// A JSON value read as an array of `T` when it is one; any other value is read whole, as a
/// decoded document would be, and dropped.
enum ArrayOr<T> {
    Array(Vec<T>),
    Other,
}

impl<T> From<ArrayOr<T>> for Found<Vec<T>> {
    fn from(value: ArrayOr<T>) -> Self {
        match value {
            ArrayOr::Array(items) => Found::Typed(items),
            ArrayOr::Other => Found::Mistyped,
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ArrayOr<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ArrayOrVisitor(PhantomData))
    }
}

struct ArrayOrVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ArrayOrVisitor<T> {
    type Value = ArrayOr<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(16));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(ArrayOr::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<Key<'de>, Value>()?.is_some() {}
        Ok(ArrayOr::Other)
    }
    other_scalars!(ArrayOr::Other);
}

/// The fields of an endpoint reference (`from`, §5).
#[derive(Default)]
struct EndpointFields {
    id: Found<String>,
    name: Found<String>,
    role: Found<String>,
    extra: Map<String, Value>,
}

impl Entries for EndpointFields {
    fn set(&mut self, key: Cow<'_, str>, value: Value) {
        match &*key {
            "id" => self.id = string(value),
            "name" => self.name = string(value),
            "role" => self.role = string(value),
            _ => {
                self.extra.insert(key.into_owned(), value);
            }
        }
    }
}

impl EndpointFields {
    fn into_endpoint(self, path: &str) -> Result<EndpointRef, EnvelopeError> {
        Ok(EndpointRef {
            id: self.id.required(path, "id", "a string")?,
            name: self.name.required(path, "name", "a string")?,
            role: self.role.optional(path, "role", "a string")?,
            extra: self.extra,
        })
    }
}

/// An endpoint reference from a decoded value at `path`.
pub(super) fn endpoint(value: Value, path: &str) -> Result<EndpointRef, EnvelopeError> {
    match value {
        Value::Object(map) => EndpointFields::from_map(map).into_endpoint(path),
        _ => Err(EnvelopeError::NotAnObject {
            field: path.to_owned(),
        }),
    }
}

/// The fields of a delivery message (§5).
#[derive(Default)]
struct MessageFields {
    id: Found<String>,
    ts: Found<Number>,
    space: Found<String>,
    from: Found<EndpointFields>,
    channel: Found<String>,
    to: Found<String>,
    to_service: Found<String>,
    mentions: Found<Vec<Value>>,
    parts: Found<Vec<ObjectOr<PartFields>>>,
    reply_to: Found<String>,
    context_id: Found<String>,
    extra: Map<String, Value>,
}

impl Entries for MessageFields {
    fn set(&mut self, key: Cow<'_, str>, value: Value) {
        match &*key {
            "id" => self.id = string(value),
            "ts" => {
                self.ts = match value {
                    Value::Number(n) => Found::Typed(n),
                    _ => Found::Mistyped,
                }
            }
            "space" => self.space = string(value),
            "from" => self.from = object_or::<EndpointFields>(value).into(),
            "channel" => self.channel = string(value),
            "to" => self.to = string(value),
            "toService" => self.to_service = string(value),
            "mentions" => self.mentions = array(value),
            "parts" => {
                self.parts = match value {
                    Value::Array(items) => Found::Typed(items.into_iter().map(object_or).collect()),
                    _ => Found::Mistyped,
                }
            }
            "replyTo" => self.reply_to = string(value),
            "contextId" => self.context_id = string(value),
            _ => {
                self.extra.insert(key.into_owned(), value);
            }
        }
    }

    /// As [`Entries::set`] places each entry, with `from` read straight into its fields.
    fn read<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut fields = Self::default();
        while let Some(Key(key)) = map.next_key()? {
            if key == "from" {
                fields.from = map.next_value::<ObjectOr<EndpointFields>>()?.into();
            } else if key == "parts" {
                fields.parts = map.next_value::<ArrayOr<ObjectOr<PartFields>>>()?.into();
            } else {
                let value = map.next_value()?;
                fields.set(key, value);
            }
        }
        Ok(fields)
    }
}

impl MessageFields {
    /// The message, or the first rule its fields break, in the order the rules are listed
    /// (routing, `id`, `ts`, `space`, `from`, `mentions`, `parts`, `replyTo`, `contextId`).
    fn into_message(self) -> Result<CotalMessage, EnvelopeError> {
        const PATH: &str = "message";
        let present = (
            self.channel.is_present(),
            self.to.is_present(),
            self.to_service.is_present(),
        );
        let routing = match present {
            (true, false, false) => {
                Routing::Channel(self.channel.required(PATH, "channel", "a string")?)
            }
            (false, true, false) => Routing::To(self.to.required(PATH, "to", "a string")?),
            (false, false, true) => {
                Routing::ToService(self.to_service.required(PATH, "toService", "a string")?)
            }
            (channel, to, to_service) => {
                let found = [("channel", channel), ("to", to), ("toService", to_service)]
                    .into_iter()
                    .filter_map(|(name, present)| present.then_some(name))
                    .collect();
                return Err(EnvelopeError::Routing { found });
            }
        };
        let id = self.id.required(PATH, "id", "a string")?;
        let ts = EpochMillis(self.ts.required(PATH, "ts", "a number")?);
        let space = self.space.required(PATH, "space", "a string")?;
        let from = match self.from {
            Found::Typed(from) => from.into_endpoint("from")?,
            Found::Absent => {
                return Err(EnvelopeError::MissingField {
                    field: "from".into(),
                });
            }
            Found::Mistyped => {
                return Err(EnvelopeError::NotAnObject {
                    field: "from".into(),
                });
            }
        };
        let mentions = self
            .mentions
            .optional(PATH, "mentions", "an array")?
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s),
                _ => Err(EnvelopeError::WrongType {
                    field: format!("mentions[{i}]"),
                    expected: "a string",
                }),
            })
            .collect::<Result<_, _>>()?;
        let parts = self
            .parts
            .required(PATH, "parts", "an array")?
            .into_iter()
            .enumerate()
            .map(|(i, found)| part(found, i))
            .collect::<Result<_, _>>()?;
        Ok(CotalMessage {
            id,
            ts,
            space,
            from,
            routing,
            mentions,
            parts,
            reply_to: self.reply_to.optional(PATH, "replyTo", "a string")?,
            context_id: self.context_id.optional(PATH, "contextId", "a string")?,
            extra: self.extra,
        })
    }
}

/// A message from a decoded value.
pub(super) fn message(value: Value) -> Result<CotalMessage, EnvelopeError> {
    match value {
        Value::Object(map) => MessageFields::from_map(map).into_message(),
        _ => Err(EnvelopeError::NotAnObject {
            field: "message".into(),
        }),
    }
}

/// A delivery's document as read, before the envelope's rules are applied: what the receive
/// checks ask first (that it is JSON, then its sender) is known without judging its shape
/// (§5's order).
pub struct RawEnvelope(ObjectOr<MessageFields>);

impl<'de> Deserialize<'de> for RawEnvelope {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ObjectOr::deserialize(deserializer).map(RawEnvelope)
    }
}

impl RawEnvelope {
    /// Reads a document from JSON text; fails only when it is not JSON.
    pub fn read(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// `from.id`, when the document is an object whose `from` is an object with a string `id`.
    pub fn sender(&self) -> Option<&str> {
        match &self.0 {
            ObjectOr::Object(MessageFields {
                from:
                    Found::Typed(EndpointFields {
                        id: Found::Typed(id),
                        ..
                    }),
                ..
            }) => Some(id),
            _ => None,
        }
    }

    /// The message, or why the document is not a valid envelope.
    pub fn into_message(self) -> Result<CotalMessage, EnvelopeError> {
        match self.0 {
            ObjectOr::Object(fields) => fields.into_message(),
            ObjectOr::Other => Err(EnvelopeError::NotAnObject {
                field: "message".into(),
            }),
        }
    }
}
