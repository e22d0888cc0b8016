//! The transport-agnostic Cotal contract (spec §2–§7, §10, §11) as pure functions and types.
//!
//! Nothing here performs I/O, so the NATS binding, the in-process services and the client
//! all speak one typed vocabulary and are tested against the same spec vectors
//! (`spec/vectors/`). Where the spec defines a shape, the published JSON Schema wins (§5);
//! `spec/cotal.schema.json` extends it to the shapes it does not cover.
//!
//! | Spec | Module | Entry points |
//! | --- | --- | --- |
//! | §2 identity | [`id`] | [`InstanceId`] |
//! | §3 subjects | [`subject`] | [`SpaceSubjects`], [`parse_subject`], [`check_application_subject`], [`subject_matches`] |
//! | §3 channels | [`channel_name`] | [`Channel`], [`ChannelPattern`], [`ChannelPattern::from_policy`], [`is_covered`] |
//! | §4, §5 receive | [`receive`] | [`accept_delivery`], [`accept_control_request`], [`DeliveryKind`], [`Rejection`] |
//! | §5 envelopes | [`envelope`] | [`CotalMessage`], [`Routing`], [`Part`], [`EndpointRef`], [`normalize_mentions`] |
//! | §5 control | [`control`] | [`ControlRequest`], [`ControlReply`] |
//! | §6, §11 presence | [`presence`] | [`Presence`], [`AgentCard`], [`effective_status`], [`accept_presence_record`] |
//! | §7 channel config | [`channel_config`] | [`ChannelConfig`], [`ChannelDefaults`], [`resolve`] |
//! | §10 join links | [`link`] | [`JoinLink`], [`LinkAuth`] |

#![warn(missing_docs)]

pub mod channel_config;
pub mod channel_name;
pub mod control;
pub mod envelope;
pub mod id;
pub mod link;
pub mod presence;
pub mod receive;
pub mod subject;

#[cfg(test)]
mod tests;

pub use channel_config::{
    CHANNEL_DEFAULTS_KEY, ChannelConfig, ChannelConfigError, ChannelDefaults, ChannelDescription,
    ChannelInstructions, DeliveryClass, EffectiveChannelConfig, RegistryKey, ReplayWindow, resolve,
};
pub use channel_name::{Channel, ChannelError, ChannelPattern, closest, is_covered};
pub use control::{ControlReply, ControlRequest};
pub use envelope::{
    CotalMessage, EndpointRef, EnvelopeError, EpochMillis, ExtensionKind, Part, Routing,
    new_message_id, normalize_mentions,
};
pub use id::{IdError, InstanceId};
pub use link::{DEFAULT_PORT, Host, JoinLink, JoinLinkError, LinkAuth};
pub use presence::{
    AgentCard, AgentSkill, AttentionMode, ChannelMode, EndpointKind, HEARTBEAT_INTERVAL,
    LIVENESS_WINDOW, Presence, PresenceError, PresenceStatus, WIRE_PROTOCOL_VERSION,
    accept_presence_record, effective_status,
};
pub use receive::{
    AcceptedControlRequest, AcceptedDelivery, DeliveryKind, RejectReason, Rejection,
    accept_control_request, accept_delivery,
};
pub use subject::{
    ParsedSubject, SpaceSubjects, SubjectError, SubjectKind, SubjectParseError, Token, TokenSlot,
    check_application_subject, parse_subject, sanitize, subject_matches,
};

/// The version of the Cotal Wire Specification this crate implements.
pub const SPEC_VERSION: &str = "0.3";
