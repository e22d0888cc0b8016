//! What a space's identities ask of the manager on `ctl.manager` (§7, §8): durable
//! membership, the trusted reader's sessions and acknowledgements, replay marks.

use serde::{Deserialize, Serialize};

/// `replay-mark`: the caller has read these live channels up to these CHAT stream sequences;
/// its next session's replay of each starts after it (at most [`ReplayMark::MAX`] channels).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayMark {
    /// Channel → stream sequence.
    pub marks: std::collections::BTreeMap<String, u64>,
}

impl ReplayMark {
    /// The most channels one mark may carry.
    pub const MAX: usize = 256;
}

/// `durable-join`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DurableJoin {
    /// A concrete channel within the caller's read ACL.
    pub channel: String,
    /// The join cursor: the CHAT frontier the caller captured once its live subscription was
    /// confirmed (§7). Durable delivery covers sequences above it.
    pub cursor: u64,
}

/// `durable-leave`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DurableLeave {
    /// The channel.
    pub channel: String,
}

/// A durable membership (§7): the caller is delivered every message of `channel` with
/// `join_cursor < seq ≤ leave_cursor` (no upper bound while open).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Membership {
    /// The member.
    pub member: String,
    /// The channel.
    pub channel: String,
    /// Increases with every join of this member to this channel.
    pub generation: u64,
    /// The CHAT frontier at join.
    pub join_cursor: u64,
    /// The CHAT frontier at leave; `None` while the membership is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leave_cursor: Option<u64>,
}

/// `resume`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    /// Names this delivery session; a new `resume` replaces the previous session, whose
    /// unacknowledged copies are delivered again.
    pub session: String,
    /// Whether the caller takes offers ([`OfferBatch`](super::OfferBatch)) once it follows a channel: it
    /// confirms what it surfaced live and asks for the rest (`backstop-want`). Without it,
    /// every durable copy carries its content.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub offers: bool,
    /// Whether the caller reads a backlog itself when granted a [`Range`](super::Range) of
    /// it (through its history consumer), confirming its progress with range tokens. Without
    /// it, every entry of a backlog comes as a copy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ranges: bool,
}

/// `resume`'s reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    /// The session now delivering.
    pub session: String,
    /// The caller's open memberships.
    pub memberships: Vec<Membership>,
    /// The consumers whose backlog this session hands over: each says [`CAUGHT_UP`](super::CAUGHT_UP) once what
    /// it held at the session's start has been handed over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumers: Vec<String>,
}

/// `backstop-ack`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackstopAck {
    /// The token of each handled copy ([`Copy::token`](super::Copy::token)).
    pub tokens: Vec<String>,
}

/// `backstop-want`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackstopWant {
    /// The token of each offered entry the caller has not surfaced ([`Offer::token`](super::Offer::token)).
    pub tokens: Vec<String>,
}
