//! Every operation the appliance serves, in one place: the requests, their arguments, what
//! each replies, and which transport may carry it.
//!
//! Two transports carry the same [`Request`] and both answer with the spec's
//! [`ControlReply`] (§5: `{ok, data?, error?}`):
//! - the **admin socket** (`run/admin.sock`, owner-only): the machine operator, who holds every
//!   key of the data dir anyway ([`Transport::AdminSocket`], served by `daemon::admin`);
//! - **`cotal.<space>.ctl.manager.<sender>`** (§5, §7): an identity of that space, whose
//!   `from.id` must equal the subject sender and whose reply must ride its own
//!   `_INBOX_<sender>.…` ([`Transport::Control`], served by `services::manager`).
//!
//! | op | args | admin socket | `ctl.manager` | reply `data` |
//! | --- | --- | --- | --- | --- |
//! | `space-add` | [`SpaceAdd`] | ✓ | | [`SpaceInfo`] |
//! | `space-list` | — | ✓ | | `[SpaceInfo]` |
//! | `shutdown` | — | ✓ | | [`Stopping`] |
//! | `broker-health` | — | ✓ | | [`BrokerHealth`] |
//! | `delivery` | — | ✓ | | [`status::DeliveryReport`] |
//! | `backup` | [`BackupRequest`] | ✓ | | [`BackupReport`] |
//! | `mint` | [`MintRequest`] | ✓ (also with no appliance running) | | [`MintReply`] |
//! | `revoke` | [`Revoke`] | ✓ | | [`IdentityRecord`] |
//! | `channels-set` | [`ChannelsSet`] | ✓ | admin identities | the stored [`ChannelConfig`](crate::protocol::ChannelConfig) |
//! | `channels-rm` | [`ChannelsRm`] | ✓ | admin identities | [`ChannelRemoved`] |
//! | `durable-join` | [`DurableJoin`] | | agents | [`Membership`] |
//! | `durable-leave` | [`DurableLeave`] | | agents | [`Membership`] |
//! | `memberships` | — | | agents | `[Membership]` |
//! | `resume` | [`Resume`] | | agents | [`Resumed`] |
//! | `backstop-ack` | [`BackstopAck`] | | agents | none (acks are published without a reply) |
//! | `backstop-want` | [`BackstopWant`] | | agents | none (the copies come on the backstop inbox) |
//! | `replay-mark` | [`ReplayMark`] | | agents | none (published without a reply) |
//! | `replay-marks` | — | | agents | channel → stream sequence |
//! | `receipt` | [`ReceiptFor`] | | agents | [`Receipt`] |
//! | `read` | [`ReadFor`] | | agents | [`ReadReceipt`] |
//!
//! An op a transport does not serve, an unknown op, or arguments of the wrong shape are
//! refused with `{ok: false, error}` naming the op.
//!
//! **Durable copies** (§8 trusted reader) reach a member on `_INBOX_<id>.backstop`
//! ([`crate::binding::backstop_inbox`]) in batches ([`CopyBatch`]): each copy with the original chat subject,
//! the token to acknowledge and the original payload unchanged; the member acks each token
//! with `backstop-ack` once it has handled the message. A member that follows its channel is
//! offered entries without their content ([`OfferBatch`]): it acks the token of what it
//! surfaced already and asks for the rest with `backstop-want`. A member that said so in its
//! `resume` (`ranges`) is granted a backlog as a [`Range`] it reads itself through its history
//! consumer, and acks its progress ([`range_token`]): the reader carries no content for it.

mod admin;
mod batch;
mod member;
pub mod receipt;
pub mod status;

pub use admin::{
    BackupManifest, BackupReport, BackupRequest, ChannelRemoved, ChannelsRm, ChannelsSet,
    CredentialProfile, IdentityRecord, MintReply, MintRequest, Revoke, SpaceAdd, SpaceCopy,
    SpaceInfo, Stopping, StreamCopy,
};
pub use batch::{
    BATCH_KIND, CAUGHT_UP, COPY_SUBJECT, Copy, CopyBatch, CopyBatchError, OFFERS, Offer,
    OfferBatch, RANGE, Range, RangeProgress, caught_up, caught_up_body, copies, offers,
    range_progress, range_token,
};
pub use member::{
    BackstopAck, BackstopWant, DurableJoin, DurableLeave, Membership, ReplayMark, Resume, Resumed,
};

pub use receipt::{ReadFor, ReadReceipt, Receipt, ReceiptFor};
pub use status::BrokerHealth;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::protocol::{ControlReply, ControlRequest, EndpointRef};

/// The name of the machine operator's own identity in every space (`spaces/<space>/
/// local-operator.creds`): a person, unrestricted within the space.
pub const OPERATOR: &str = "local-operator";

/// Which transport a request arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `run/admin.sock`: the machine operator.
    AdminSocket,
    /// `cotal.<space>.ctl.manager.<sender>`: an identity of the space.
    Control,
}

/// Declares [`Request`] from one line per op: its documentation, its wire name, its variant
/// (with its arguments' type, if any) and the transports that carry it; the op list, the name
/// of each request and where it is served follow from that line, never kept twice.
macro_rules! requests {
    ($( $(#[doc = $doc:literal])* $name:literal => $variant:ident $(($args:ty))? on $($transport:ident)|+; )*) => {
        /// A request to the appliance. On the wire: `{"op": "<name>", "args": {…}}`, the
        /// `op`/`args` pair of a `ControlRequest` (§5).
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "op", content = "args")]
        pub enum Request {
            $( $(#[doc = $doc])* #[serde(rename = $name)] $variant $(($args))?, )*
        }

        impl Request {
            /// Every op name, as on the wire.
            pub const OPS: &'static [&'static str] = &[$($name),*];

            /// The op name.
            pub fn op(&self) -> &'static str {
                match self {
                    $( requests!(@pattern $variant $($args)?) => $name, )*
                }
            }

            /// Whether `transport` carries this op (the table in the module doc).
            pub fn served_on(&self, transport: Transport) -> bool {
                match self {
                    $( requests!(@pattern $variant $($args)?) => {
                        matches!(transport, $(Transport::$transport)|+)
                    } )*
                }
            }
        }
    };
    (@pattern $variant:ident $args:ty) => { Request::$variant(_) };
    (@pattern $variant:ident) => { Request::$variant };
}

requests! {
    /// Add and serve a space (no restart); it is remembered for later starts.
    "space-add" => SpaceAdd(SpaceAdd) on AdminSocket;
    /// The served spaces.
    "space-list" => SpaceList on AdminSocket;
    /// Stop the appliance gracefully, as SIGTERM does; replies before it stops.
    "shutdown" => Shutdown on AdminSocket;
    /// Ask the broker, over the system account, whether it and its JetStream are healthy.
    "broker-health" => BrokerHealth on AdminSocket;
    /// How delivery goes in each space: what its readers refused, and each online durable
    /// member's unacknowledged copies and how long they have waited.
    "delivery" => Delivery on AdminSocket;
    /// Write an archive of every served space: its streams and buckets as the broker
    /// snapshots them, and the keys, identities and profile they need.
    "backup" => Backup(BackupRequest) on AdminSocket;
    /// Mint a credential; an existing name is refused unless `replace`, which re-issues (and
    /// revokes) its credential.
    "mint" => Mint(MintRequest) on AdminSocket;
    /// End an identity: its credential is revoked, its connections closed, its durables and
    /// backlog deleted.
    "revoke" => Revoke(Revoke) on AdminSocket;
    /// Write a channel's config in the registry (§7).
    "channels-set" => ChannelsSet(ChannelsSet) on AdminSocket | Control;
    /// Remove a channel's config from the registry and, with `purge`, its history.
    "channels-rm" => ChannelsRm(ChannelsRm) on AdminSocket | Control;
    /// Establish durable membership of a concrete channel from the caller's join cursor (§7).
    "durable-join" => DurableJoin(DurableJoin) on Control;
    /// Close a durable membership at the current frontier (the leave cursor, §7).
    "durable-leave" => DurableLeave(DurableLeave) on Control;
    /// The caller's durable memberships.
    "memberships" => Memberships on Control;
    /// Start (or restart) delivering the caller's backlog to its backstop inbox.
    "resume" => Resume(Resume) on Control;
    /// Acknowledge durable copies the caller has handled.
    "backstop-ack" => BackstopAck(BackstopAck) on Control;
    /// Ask for the content of offered entries the caller has not surfaced.
    "backstop-want" => BackstopWant(BackstopWant) on Control;
    /// Record how far the caller has read live channels it replays.
    "replay-mark" => ReplayMark(ReplayMark) on Control;
    /// How far the caller has read each live channel it replays.
    "replay-marks" => ReplayMarks on Control;
    /// Where a message to a channel, an instance or a role goes now.
    "receipt" => Receipt(ReceiptFor) on Control;
    /// Whether a message the caller sent was acknowledged by its reader.
    "read" => Read(ReadFor) on Control;
}

impl Request {
    /// Parses an op name and its arguments (a `ControlRequest`'s `op` and `args`).
    pub fn from_parts(op: &str, args: Option<Map<String, Value>>) -> Result<Self, OpError> {
        if !Self::OPS.contains(&op) {
            return Err(OpError::UnknownOp(op.to_owned()));
        }
        let mut object = Map::new();
        object.insert("op".into(), Value::String(op.to_owned()));
        if let Some(args) = args {
            object.insert("args".into(), Value::Object(args));
        }
        serde_json::from_value(Value::Object(object)).map_err(|source| OpError::BadArgs {
            op: op.to_owned(),
            source,
        })
    }

    /// This request as a `ControlRequest` from `from` (§5).
    pub fn to_control(&self, from: EndpointRef) -> ControlRequest {
        let mut request = ControlRequest::new(self.op(), from);
        if let Ok(Value::Object(mut object)) = serde_json::to_value(self)
            && let Some(Value::Object(args)) = object.remove("args")
        {
            request = request.with_args(args);
        }
        request
    }

    /// Parses a JSON request line (the admin socket).
    pub fn from_json(text: &str) -> Result<Self, OpError> {
        #[derive(Deserialize)]
        struct Parts {
            op: String,
            #[serde(default)]
            args: Option<Map<String, Value>>,
        }
        let parts: Parts = serde_json::from_str(text).map_err(OpError::Malformed)?;
        Self::from_parts(&parts.op, parts.args)
    }
}

/// Why a request was refused before it was executed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// The request is not JSON of the `{op, args}` shape.
    #[error("malformed request")]
    Malformed(#[source] serde_json::Error),
    /// No such op.
    #[error("unknown op `{0}` (known: {ops})", ops = Request::OPS.join(", "))]
    UnknownOp(String),
    /// The arguments do not have the op's shape.
    #[error("op `{op}`: invalid arguments")]
    BadArgs {
        /// The op.
        op: String,
        /// What is wrong with them.
        #[source]
        source: serde_json::Error,
    },
    /// The op exists but this transport does not carry it.
    #[error("op `{op}` is not served on {transport}")]
    WrongTransport {
        /// The op.
        op: &'static str,
        /// The transport it arrived on.
        transport: &'static str,
    },
    /// The caller may not perform the op.
    #[error("op `{op}` refused: {reason}")]
    NotAllowed {
        /// The op.
        op: &'static str,
        /// Why.
        reason: String,
    },
}

/// The text of an error and all its sources, `a: b: c` (what a `ControlReply.error` carries).
pub fn error_text(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let next = e.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = e.source();
    }
    text
}

/// The reply of an executed request: `data` on success, the error's text otherwise.
pub fn reply<T: Serialize, E: std::error::Error>(result: Result<T, E>) -> ControlReply {
    match result {
        Ok(data) => match serde_json::to_value(data) {
            Ok(Value::Null) => ControlReply::success(None),
            Ok(value) => ControlReply::success(Some(value)),
            Err(e) => ControlReply::failure(error_text(&e)),
        },
        Err(e) => ControlReply::failure(error_text(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ChannelConfig, InstanceId};

    #[test]
    fn the_module_table_lists_every_op_in_order() {
        let listed: Vec<&str> = include_str!("mod.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! | `"))
            .filter_map(|rest| rest.split('`').next())
            .collect();
        assert_eq!(listed, Request::OPS);
    }

    const ALICE: &str = "UAQGWOEVJKMIO4WXSYOTLARXYOZTCXFK67JASEH6AFFFYK6FOPSKQCAD";

    #[test]
    fn requests_round_trip_through_a_control_request() {
        let from = EndpointRef::new(&InstanceId::from_user_nkey(ALICE).unwrap(), "alice");
        for request in [
            Request::DurableJoin(DurableJoin {
                channel: "general".into(),
                cursor: 7,
            }),
            Request::Memberships,
            Request::BackstopAck(BackstopAck {
                tokens: vec!["c1".into()],
            }),
            Request::SpaceList,
        ] {
            let control = request.to_control(from.clone());
            assert_eq!(control.op, request.op());
            let back = Request::from_parts(&control.op, control.args.clone()).unwrap();
            assert_eq!(back, request);
        }
        let wire = serde_json::to_value(
            Request::DurableJoin(DurableJoin {
                channel: "general".into(),
                cursor: 7,
            })
            .to_control(from),
        )
        .unwrap();
        assert_eq!(wire["op"], "durable-join");
        assert_eq!(wire["args"]["cursor"], 7);
    }

    #[test]
    fn refusals_name_the_op() {
        assert!(matches!(
            Request::from_parts("frobnicate", None),
            Err(OpError::UnknownOp(op)) if op == "frobnicate"
        ));
        let mut args = Map::new();
        args.insert("channel".into(), 3.into());
        assert!(matches!(
            Request::from_parts("durable-leave", Some(args)),
            Err(OpError::BadArgs { op, .. }) if op == "durable-leave"
        ));
        assert!(matches!(
            Request::from_parts("durable-join", None),
            Err(OpError::BadArgs { .. })
        ));
        assert!(matches!(
            Request::from_json("not json"),
            Err(OpError::Malformed(_))
        ));
        assert_eq!(
            Request::from_json(r#"{"op":"space-list"}"#).unwrap(),
            Request::SpaceList
        );
    }

    #[test]
    fn each_op_names_its_transport() {
        assert!(Request::SpaceList.served_on(Transport::AdminSocket));
        assert!(!Request::SpaceList.served_on(Transport::Control));
        assert!(Request::Memberships.served_on(Transport::Control));
        assert!(!Request::Memberships.served_on(Transport::AdminSocket));
        let set = Request::ChannelsSet(ChannelsSet {
            space: None,
            channel: "general".into(),
            config: ChannelConfig::default(),
        });
        assert!(set.served_on(Transport::AdminSocket) && set.served_on(Transport::Control));
        for op in Request::OPS {
            assert!(
                matches!(
                    Request::from_parts(op, None),
                    Ok(_) | Err(OpError::BadArgs { .. })
                ),
                "{op} is a known op"
            );
        }
    }

    #[test]
    fn error_text_keeps_every_source() {
        let inner = serde_json::from_str::<u8>("x").unwrap_err();
        let e = OpError::BadArgs {
            op: "mint".into(),
            source: inner,
        };
        let text = error_text(&e);
        assert!(text.starts_with("op `mint`: invalid arguments: "), "{text}");
    }
}
