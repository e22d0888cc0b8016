//! What `cotald status` reports of a running appliance, in the words its writer (the appliance)
//! and its readers (the command line, the dashboard) share: the health of each service, the
//! broker's last restart, who holds a clustered space's lease. The runtime state file
//! (`run/state.json`, the data dir's `RuntimeState`) is made of these.

use serde::{Deserialize, Serialize};

/// How a service is doing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "reason", rename_all = "lowercase")]
pub enum Health {
    /// Started, not serving yet.
    Starting,
    /// Serving.
    Running,
    /// Serving in part, or waiting to be restarted; the reason says what is missing.
    Degraded(String),
    /// Stopped (shutdown).
    Stopped,
}

/// One service's health as `cotald status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceStatus {
    /// The set it belongs to (`appliance`, or the space's name).
    pub scope: String,
    /// The service.
    pub name: String,
    /// Its health.
    #[serde(flatten)]
    pub health: Health,
    /// How many times it was restarted after failing.
    pub restarts: u32,
    /// Why it failed last (an error, or `panicked: …`), kept once it runs again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
}

/// Why and when the broker was last restarted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRestart {
    /// `exited: <status>`, `unhealthy: <what /healthz said>` or `unresponsive: <…>`.
    pub reason: String,
    /// When the old child was found dead or was killed (RFC 3339, UTC).
    pub at: String,
}

/// Who holds a space's lease, as one node saw it last.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    /// The holder's server name, when someone holds it.
    pub holder: Option<String>,
    /// Whether that is this node.
    pub mine: bool,
}

/// The reply to `broker-health`: what the broker says of itself (`HEALTHZ`, `VARZ`), asked
/// over the system account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerHealth {
    /// Whether the server and its JetStream are up.
    pub healthy: bool,
    /// Why not, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The version the broker reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The reply to `delivery`: how delivery goes in each served space, as `cotald status` shows
/// it.
pub type DeliveryReport = std::collections::BTreeMap<String, SpaceDelivery>;

/// How delivery goes in one space.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceDelivery {
    /// How many messages the space's readers refused (§4, §5), by reason token.
    pub refused: std::collections::BTreeMap<String, u64>,
    /// After how many seconds an online member that acknowledges nothing counts as stalled.
    pub stall_after_secs: u64,
    /// Every durable member, online or away, by id.
    pub members: Vec<MemberDelivery>,
}

/// One durable member's delivery (§4 `durable`, §8 trusted reader).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberDelivery {
    /// The instance id.
    pub id: String,
    /// The name it was minted with, when the appliance knows it.
    pub name: Option<String>,
    /// Whether it has a delivery session (it is connected).
    pub online: bool,
    /// Online: copies handed over (or offered) and not acknowledged yet.
    pub unacknowledged: u64,
    /// Online: how long the member has had copies waiting without acknowledging any (its
    /// oldest pending copy's age while it was connected); 0 when nothing waits.
    pub waiting_secs: u64,
    /// Whether `waiting_secs` passed the space's stall threshold.
    pub stalled: bool,
    /// Away: the messages its durable channels stored after its position, which its next
    /// session reads (its own posts among them, which are not surfaced); `None` when online,
    /// or when it could not be counted (unknown).
    pub backlog: Option<u64>,
    /// Away: how long ago the oldest of that backlog was stored.
    pub oldest_pending_secs: Option<u64>,
}

impl MemberDelivery {
    /// What is stuck for it, in words: `dave (UDAVE…) has 5 copies unacknowledged for 61 s`.
    pub fn stall(&self) -> String {
        format!(
            "{} ({}) has {} copies unacknowledged for {} s",
            self.name.as_deref().unwrap_or("an identity"),
            self.id,
            self.unacknowledged,
            self.waiting_secs
        )
    }
}

/// Why the services of a running appliance do not all serve, one reason a service that is not
/// running (what `cotald status` and the dashboard's health page both say).
pub fn services_degraded(services: &[ServiceStatus]) -> Vec<String> {
    services
        .iter()
        .filter_map(|s| match &s.health {
            Health::Running => None,
            Health::Degraded(reason) => Some(format!("{} {}: {reason}", s.scope, s.name)),
            Health::Starting => Some(format!("{} {}: starting", s.scope, s.name)),
            Health::Stopped => Some(format!("{} {}: stopped", s.scope, s.name)),
        })
        .collect()
}
