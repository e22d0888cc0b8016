//! Presence and agent cards (§6), and the advertised wire version (§11).
//!
//! Presence is a per-space directory keyed by instance id. Two rules make it trustworthy
//! without a central authority: a record whose key is not its own `card.id` is dropped
//! ([`accept_presence_record`]), and liveness is derived by the reader from the record's `ts`
//! ([`effective_status`]): a stale heartbeat means `offline` whatever the record says. Live
//! clients never heartbeat as `offline`; [`Presence::heartbeat`] refuses it, and
//! [`Presence::final_offline`] builds the one record a graceful disconnect may write.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::envelope::EpochMillis;
use super::id::InstanceId;

/// The wire contract version this implementation advertises in `AgentCard.protocolVersion`
/// (§11). It stays `0.2` until the v0.3 core-subscription behaviour is the advertised target.
pub const WIRE_PROTOCOL_VERSION: &str = "0.2";

/// Default presence heartbeat interval (§6).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(2000);

/// Default liveness window: a record older than this is `offline` (§6).
pub const LIVENESS_WINDOW: Duration = Duration::from_millis(6000);

/// Participation class of an instance (§6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndpointKind {
    /// An agent node.
    Agent,
    /// A plain endpoint (observer, logger, dashboard).
    Endpoint,
}

/// `{ id, name, description? }` (§6).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentSkill {
    /// Skill id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The identity record of an instance (§6).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCard {
    /// Instance id (§2); also the presence key.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Participation class.
    pub kind: EndpointKind,
    /// Service role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// One-line summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Capability tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Skills.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<AgentSkill>,
    /// Free-form display metadata (reserved keys: `connector`, `model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Map<String, Value>>,
    /// Wire version spoken (§11); absent means "the v0.x line".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl AgentCard {
    /// A card for `id`, advertising [`WIRE_PROTOCOL_VERSION`].
    pub fn new(id: &InstanceId, name: impl Into<String>, kind: EndpointKind) -> Self {
        Self {
            id: id.as_str().to_owned(),
            name: name.into(),
            kind,
            role: None,
            description: None,
            tags: Vec::new(),
            skills: Vec::new(),
            meta: None,
            protocol_version: Some(WIRE_PROTOCOL_VERSION.to_owned()),
            extra: Map::new(),
        }
    }
}

/// What an instance is doing (§6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PresenceStatus {
    /// Idle.
    Idle,
    /// Waiting for input.
    Waiting,
    /// Working.
    Working,
    /// Gone.
    Offline,
}

impl PresenceStatus {
    /// The wire word (§6).
    pub fn as_str(self) -> &'static str {
        match self {
            PresenceStatus::Idle => "idle",
            PresenceStatus::Waiting => "waiting",
            PresenceStatus::Working => "working",
            PresenceStatus::Offline => "offline",
        }
    }
}

/// Global attention mode (§6); advisory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionMode {
    /// Receives everything (also the meaning of an absent mode).
    Open,
    /// Do not disturb.
    Dnd,
    /// Focused.
    Focus,
}

/// Per-channel attention override (§6); advisory, not access control.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelMode {
    /// Quiet.
    Quiet,
    /// Muted.
    Muted,
}

/// A presence record (§6).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Presence {
    /// The identity record.
    pub card: AgentCard,
    /// Declared status; see [`effective_status`] for what a reader should believe.
    pub status: PresenceStatus,
    /// Free-form current activity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<String>,
    /// Global attention mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention: Option<AttentionMode>,
    /// Per-channel attention overrides, keyed by concrete channel.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub channel_modes: BTreeMap<String, ChannelMode>,
    /// Epoch ms of the last heartbeat.
    pub ts: EpochMillis,
    /// Unknown fields.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Why a presence record was refused.
#[derive(Debug, thiserror::Error)]
pub enum PresenceError {
    /// A live heartbeat may not declare `offline` (§6).
    #[error("a live heartbeat must not declare status offline")]
    OfflineHeartbeat,
    /// The key the record was stored under is not its `card.id` (§6): drop it.
    #[error("presence key {key:?} does not equal card.id {card_id:?}")]
    KeyMismatch {
        /// The directory key.
        key: String,
        /// The record's `card.id`.
        card_id: String,
    },
    /// The record is not valid presence JSON.
    #[error("invalid presence record: {0}")]
    Json(#[from] serde_json::Error),
}

impl Presence {
    /// A heartbeat record; refuses [`PresenceStatus::Offline`].
    pub fn heartbeat(
        card: AgentCard,
        status: PresenceStatus,
        ts: EpochMillis,
    ) -> Result<Self, PresenceError> {
        if status == PresenceStatus::Offline {
            return Err(PresenceError::OfflineHeartbeat);
        }
        Ok(Self::record(card, status, ts))
    }

    /// The single final `offline` record a graceful disconnect may publish (§6).
    pub fn final_offline(card: AgentCard, ts: EpochMillis) -> Self {
        Self::record(card, PresenceStatus::Offline, ts)
    }

    fn record(card: AgentCard, status: PresenceStatus, ts: EpochMillis) -> Self {
        Self {
            card,
            status,
            activity: None,
            attention: None,
            channel_modes: BTreeMap::new(),
            ts,
            extra: Map::new(),
        }
    }

    /// The directory key this record must be written under: its own `card.id` (§6).
    pub fn key(&self) -> &str {
        &self.card.id
    }
}

/// Parses a directory entry and drops it unless `key == card.id` (§6).
pub fn accept_presence_record(key: &str, value: &[u8]) -> Result<Presence, PresenceError> {
    let presence: Presence = serde_json::from_slice(value)?;
    if presence.card.id != key {
        return Err(PresenceError::KeyMismatch {
            key: key.to_owned(),
            card_id: presence.card.id,
        });
    }
    Ok(presence)
}

/// The status a reader should believe at `now`: `offline` once `ts` is older than `window`
/// (§6), else the declared status. A `ts` that is not a finite number counts as stale; a `ts`
/// in the future (clock skew) counts as fresh.
pub fn effective_status(
    presence: &Presence,
    now: &EpochMillis,
    window: Duration,
) -> PresenceStatus {
    let (Some(ts), Some(now)) = (presence.ts.as_f64(), now.as_f64()) else {
        return PresenceStatus::Offline;
    };
    let window_ms = window.as_secs_f64() * 1000.0;
    if !ts.is_finite() || now - ts > window_ms {
        PresenceStatus::Offline
    } else {
        presence.status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ALICE: &str = "UAQGWOEVJKMIO4WXSYOTLARXYOZTCXFK67JASEH6AFFFYK6FOPSKQCAD";

    fn card() -> AgentCard {
        AgentCard::new(
            &InstanceId::from_user_nkey(ALICE).unwrap(),
            "alice",
            EndpointKind::Agent,
        )
    }

    fn live(ts: u64) -> Presence {
        Presence::heartbeat(
            card(),
            PresenceStatus::Working,
            EpochMillis::from_millis(ts),
        )
        .unwrap()
    }

    #[test]
    fn constants_match_the_spec() {
        assert_eq!(HEARTBEAT_INTERVAL, Duration::from_millis(2000));
        assert_eq!(LIVENESS_WINDOW, Duration::from_millis(6000));
        assert_eq!(WIRE_PROTOCOL_VERSION, "0.2");
    }

    #[test]
    fn card_advertises_protocol_version() {
        let v = serde_json::to_value(card()).unwrap();
        assert_eq!(
            v,
            json!({"id": ALICE, "name": "alice", "kind": "agent", "protocolVersion": "0.2"})
        );
    }

    #[test]
    fn heartbeat_refuses_offline() {
        assert!(matches!(
            Presence::heartbeat(card(), PresenceStatus::Offline, EpochMillis::from_millis(1)),
            Err(PresenceError::OfflineHeartbeat)
        ));
        let last = Presence::final_offline(card(), EpochMillis::from_millis(1));
        assert_eq!(last.status, PresenceStatus::Offline);
        assert_eq!(last.key(), ALICE);
    }

    #[test]
    fn stale_timestamp_means_offline() {
        let p = live(10_000);
        let at = |ms| effective_status(&p, &EpochMillis::from_millis(ms), LIVENESS_WINDOW);
        assert_eq!(at(10_000), PresenceStatus::Working);
        assert_eq!(at(16_000), PresenceStatus::Working);
        assert_eq!(at(16_001), PresenceStatus::Offline);
        assert_eq!(at(5_000), PresenceStatus::Working, "future ts is fresh");
    }

    #[test]
    fn fractional_timestamp_is_compared_numerically() {
        let mut p = live(0);
        p.ts = serde_json::from_value(json!(10000.5)).unwrap();
        assert_eq!(
            effective_status(&p, &EpochMillis::from_millis(16_000), LIVENESS_WINDOW),
            PresenceStatus::Working
        );
    }

    #[test]
    fn record_under_a_foreign_key_is_dropped() {
        let bytes = serde_json::to_vec(&live(1)).unwrap();
        assert!(accept_presence_record(ALICE, &bytes).is_ok());
        assert!(matches!(
            accept_presence_record("UOTHER", &bytes),
            Err(PresenceError::KeyMismatch { .. })
        ));
        assert!(matches!(
            accept_presence_record(ALICE, b"{}"),
            Err(PresenceError::Json(_))
        ));
    }

    #[test]
    fn presence_round_trips_with_every_field() {
        let raw = json!({
            "card": {
                "id": ALICE, "name": "alice", "kind": "endpoint", "role": "planner",
                "description": "plans", "tags": ["x"],
                "skills": [{"id": "s", "name": "S", "description": "d", "extra": 1}],
                "meta": {"connector": "cli", "model": "m"}, "protocolVersion": "0.2",
                "future": {"a": 1}
            },
            "status": "idle",
            "activity": "reading",
            "attention": "focus",
            "channelModes": {"team.backend": "muted", "general": "quiet"},
            "ts": 1710000000000u64,
            "unknown": [1, 2]
        });
        let p: Presence = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(p.attention, Some(AttentionMode::Focus));
        assert_eq!(p.channel_modes["team.backend"], ChannelMode::Muted);
        assert_eq!(p.card.skills[0].extra["extra"], 1);
        assert_eq!(serde_json::to_value(&p).unwrap(), raw);
    }

    #[test]
    fn unknown_enum_values_are_refused() {
        for (field, value) in [("status", "busy"), ("attention", "away")] {
            let mut v = serde_json::to_value(live(1)).unwrap();
            v[field] = json!(value);
            assert!(serde_json::from_value::<Presence>(v).is_err(), "{field}");
        }
    }
}
