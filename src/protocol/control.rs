//! Control requests and replies (§5).
//!
//! A control request travels on `cotal.<space>.ctl.<service>.<sender>`; the reply rides the
//! transport reply subject and is not a delivery message. A server must check
//! `ControlRequest.from.id` against the subject sender before acting: use
//! [`super::receive::accept_control_request`], which does that and parses the body.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::envelope::EndpointRef;

/// `{ "op": string, "args"?: object, "from": EndpointRef }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ControlRequest {
    /// The operation name.
    pub op: String,
    /// Operation arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Map<String, Value>>,
    /// The requester; must equal the `ctl` subject sender.
    pub from: EndpointRef,
    /// Unknown fields, kept for round trips.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ControlRequest {
    /// A request for `op` without arguments.
    pub fn new(op: impl Into<String>, from: EndpointRef) -> Self {
        Self {
            op: op.into(),
            args: None,
            from,
            extra: Map::new(),
        }
    }

    /// Sets the arguments.
    pub fn with_args(mut self, args: Map<String, Value>) -> Self {
        self.args = Some(args);
        self
    }
}

/// `{ "ok": boolean, "data"?: <any JSON value>, "error"?: string }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ControlReply {
    /// Whether the operation succeeded.
    pub ok: bool,
    /// Result value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Failure description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Unknown fields, kept for round trips.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ControlReply {
    /// A successful reply, with an optional result.
    pub fn success(data: Option<Value>) -> Self {
        Self {
            ok: true,
            data,
            error: None,
            extra: Map::new(),
        }
    }

    /// A failed reply: `{ "ok": false, "error": ... }` (§5).
    pub fn failure(error: impl Into<String>) -> Self {
        Self {
            ok: false,
            data: None,
            error: Some(error.into()),
            extra: Map::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn request_round_trips_with_unknown_fields() {
        let raw = json!({
            "op": "durable-join",
            "args": {"channel": "team.backend"},
            "from": {"id": "UAQ", "name": "alice", "x-extra": 1},
            "future": true
        });
        let req: ControlRequest = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(req.op, "durable-join");
        assert_eq!(req.args.as_ref().unwrap()["channel"], "team.backend");
        assert_eq!(req.extra["future"], true);
        assert_eq!(serde_json::to_value(&req).unwrap(), raw);
    }

    #[test]
    fn request_needs_op_and_from() {
        assert!(
            serde_json::from_value::<ControlRequest>(json!({"from": {"id": "a", "name": "b"}}))
                .is_err()
        );
        assert!(serde_json::from_value::<ControlRequest>(json!({"op": "x"})).is_err());
        assert!(
            serde_json::from_value::<ControlRequest>(
                json!({"op": "x", "args": [1], "from": {"id": "a", "name": "b"}})
            )
            .is_err()
        );
    }

    #[test]
    fn replies_serialize_minimally() {
        assert_eq!(
            serde_json::to_value(ControlReply::success(None)).unwrap(),
            json!({"ok": true})
        );
        assert_eq!(
            serde_json::to_value(ControlReply::success(Some(json!([1])))).unwrap(),
            json!({"ok": true, "data": [1]})
        );
        assert_eq!(
            serde_json::to_value(ControlReply::failure("sender-mismatch")).unwrap(),
            json!({"ok": false, "error": "sender-mismatch"})
        );
        let reply: ControlReply =
            serde_json::from_value(json!({"ok": false, "error": "nope", "code": 7})).unwrap();
        assert_eq!(reply.error.as_deref(), Some("nope"));
        assert_eq!(reply.extra["code"], 7);
        assert!(serde_json::from_value::<ControlReply>(json!({"ok": "yes"})).is_err());
    }
}
