//! Cross-module tests: envelopes, receive validation, the spec vectors, the JSON Schema, and
//! properties over arbitrary input.

mod envelope;
mod properties;
mod receive;
mod schema;
mod vectors;

use serde_json::Value;

/// Spec §12 sample id: Alice.
pub(super) const ALICE: &str = "UAQGWOEVJKMIO4WXSYOTLARXYOZTCXFK67JASEH6AFFFYK6FOPSKQCAD";
/// Spec §12 sample id: Bob.
pub(super) const BOB: &str = "UDI36ZKVNUM5WMO4QQ6HDQU7F4OH2RCXOJRX6GAIOS5SKVNNSKCDNLJA";

/// Reads a JSON file under the repository's `spec/` directory.
pub(super) fn spec_json(relative: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("spec")
        .join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

pub(super) fn alice() -> super::InstanceId {
    super::InstanceId::from_user_nkey(ALICE).unwrap()
}

pub(super) fn bob() -> super::InstanceId {
    super::InstanceId::from_user_nkey(BOB).unwrap()
}
