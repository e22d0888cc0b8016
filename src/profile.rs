//! The operator's TOML profile: the broker settings and the spaces to serve.
//!
//! Unknown keys are errors that name the key and the file (a typo must not silently fall
//! back to a default). With no file, the embedded `config/local.toml` is used: one space
//! `main` with the `local` deployment profile.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::binding::streams::{Retention, StreamLimits};
use crate::protocol::{
    CHANNEL_DEFAULTS_KEY, ChannelConfig, ChannelDefaults, ChannelDescription, ChannelInstructions,
    ChannelPattern, DeliveryClass, ReplayWindow,
};

/// The profile compiled into the binary (`config/local.toml`).
pub const EMBEDDED_LOCAL: &str = include_str!("../config/local.toml");

/// A parsed and validated profile.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Broker-wide settings.
    pub broker: BrokerConfig,
    /// The spaces, by name (§1: one space = one account).
    pub spaces: BTreeMap<String, SpaceConfig>,
    /// The web dashboard `cotald up` serves.
    #[serde(default)]
    pub dashboard: DashboardConfig,
    /// This appliance as one node of a cluster of appliances (`[cluster]`).
    #[serde(default)]
    pub cluster: Option<ClusterConfig>,
    /// This appliance as a leaf node of an existing NATS system (`[leaf]`).
    #[serde(default)]
    pub leaf: Option<LeafConfig>,
    /// The text it was read from (a backup carries it).
    #[serde(skip)]
    pub text: String,
}

/// `[cluster]`: the appliance is one node of a NATS cluster of appliances sharing one trust
/// chain (`cotald cluster init` / `join`). Routes are TLS with the shared CA, both ways.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// The cluster's name (the same on every node).
    pub name: String,
    /// This node's route listener.
    pub listen: SocketAddr,
    /// The other nodes' route listeners (`host:port`); listing this node too is harmless.
    #[serde(default)]
    pub routes: Vec<String>,
    /// Replicas of every stream and bucket; default 3 when the cluster has at least 3 nodes
    /// (this one and its routes), else 1.
    #[serde(default)]
    pub replicas: Option<usize>,
}

impl ClusterConfig {
    /// The replicas streams and buckets are created with.
    pub fn replicas(&self) -> usize {
        self.replicas
            .unwrap_or(if self.routes.len() + 1 >= 3 { 3 } else { 1 })
    }
}

/// `[leaf]`: the appliance runs as a leaf node of an existing NATS system. Each listed
/// space's account is bound to the hub through one leaf connection; its JetStream (domain
/// `cotald`) stays local. What crosses is documented in the README (`cotal.<space>.>` both
/// ways; JetStream, KV and system subjects never).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeafConfig {
    /// The hub's leaf node listener (`tls://hub:7422`, `nats-leaf://hub:7422`).
    pub remote: String,
    /// The hub-side `.creds` the leaf connections present (none: the hub needs no auth).
    #[serde(default)]
    pub credentials: Option<PathBuf>,
    /// The CA that signed the hub's certificate, when the system trust store does not hold it.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// The spaces bound to the hub; default every space of the profile.
    #[serde(default)]
    pub spaces: Option<Vec<String>>,
}

impl LeafConfig {
    /// The spaces bound to the hub.
    pub fn spaces(&self, profile: &Profile) -> Vec<String> {
        self.spaces
            .clone()
            .unwrap_or_else(|| profile.spaces.keys().cloned().collect())
    }
}

/// The port the dashboard listens on unless the profile says otherwise (documented in the
/// README and `config/local.toml`).
pub const DASHBOARD_PORT: u16 = 4280;

/// The web dashboard (`[dashboard]`): where it listens and whether it is served at all.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DashboardConfig {
    /// Its HTTP listener; loopback unless the operator chooses to expose it (port 0 picks a
    /// free port).
    #[serde(default = "default_dashboard_listen")]
    pub listen: SocketAddr,
    /// `false` serves nothing.
    #[serde(default = "default_true")]
    pub enabled: bool,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig {
            listen: default_dashboard_listen(),
            enabled: true,
        }
    }
}

fn default_dashboard_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], DASHBOARD_PORT))
}

fn default_true() -> bool {
    true
}

/// Broker-wide settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Client listener address (TLS).
    pub listen: SocketAddr,
    /// The broker's HTTP monitoring listener, off unless set: it answers anyone who can reach
    /// it, without credentials (every connection's user, name and subscriptions), so it must
    /// be a loopback address. cotald itself asks the broker over the system account.
    #[serde(default)]
    pub monitor: Option<SocketAddr>,
    /// JetStream fsync interval (`"always"`, or a duration such as `"1s"`, `"2m"`).
    #[serde(default = "default_sync_interval")]
    pub sync_interval: String,
    /// Extra names for the server certificate (in addition to localhost and loopback IPs).
    #[serde(default)]
    pub hostnames: Vec<String>,
    /// How long a server certificate is valid (`"365d"` unless set; at least `"10s"`). It is
    /// issued at every start and renewed while running when a third of it is left.
    #[serde(default = "BrokerConfig::default_certificate_lifetime")]
    pub certificate_lifetime: ReplayWindow,
}

impl BrokerConfig {
    /// A year.
    pub(crate) fn default_certificate_lifetime() -> ReplayWindow {
        ReplayWindow::parse("365d").expect("a window")
    }
}

/// The deployment profile of a space (§7): it decides `=defaults.deliveryClass`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeploymentProfile {
    /// Local / self-hosted: channels are `durable` by default.
    Local,
    /// Public / web-scale: channels are `live` by default, durability opt-in.
    Public,
}

impl DeploymentProfile {
    /// The delivery class a channel has when neither it nor the space says otherwise (§7).
    pub fn default_delivery_class(self) -> DeliveryClass {
        match self {
            DeploymentProfile::Local => DeliveryClass::Durable,
            DeploymentProfile::Public => DeliveryClass::Live,
        }
    }
}

/// `[spaces.<name>.delivery]`: when delivery to a durable member counts as stalled.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryConfig {
    /// An online member that has copies waiting and has acknowledged none of them for this
    /// long makes `cotald status` say `DEGRADED`, naming it (`"60s"`, `"5m"`).
    #[serde(default = "DeliveryConfig::default_stall_after")]
    pub stall_after: ReplayWindow,
}

impl DeliveryConfig {
    fn default_stall_after() -> ReplayWindow {
        ReplayWindow::parse("60s").expect("a window")
    }
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            stall_after: Self::default_stall_after(),
        }
    }
}

/// One space.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpaceConfig {
    /// The deployment profile.
    pub profile: DeploymentProfile,
    /// JetStream limits of the space's account.
    #[serde(default)]
    pub jetstream: JetStreamConfig,
    /// Stream retention.
    #[serde(default)]
    pub retention: RetentionConfig,
    /// Space-wide channel defaults (`=defaults`, §7); `delivery_class` defaults to the
    /// deployment profile's.
    #[serde(default)]
    pub defaults: DefaultsConfig,
    /// Per-channel configs, keyed by concrete channel name (§7).
    #[serde(default)]
    pub channels: BTreeMap<String, ChannelToml>,
    /// When delivery to a member counts as stalled.
    #[serde(default)]
    pub delivery: DeliveryConfig,
    /// Replicas of the space's streams and buckets: set from `[cluster]`, never written in a
    /// space's table (0 and 1 both mean one).
    #[serde(skip)]
    pub replicas: usize,
}

impl SpaceConfig {
    /// A space with the given profile and every other setting at its default.
    pub fn with_profile(profile: DeploymentProfile) -> Self {
        SpaceConfig {
            profile,
            jetstream: JetStreamConfig::default(),
            retention: RetentionConfig::default(),
            defaults: DefaultsConfig::default(),
            channels: BTreeMap::new(),
            delivery: DeliveryConfig::default(),
            replicas: 1,
        }
    }

    /// The `=defaults` record written at space creation: the deployment profile's delivery
    /// class unless the profile file overrides it (§7).
    pub fn channel_defaults(&self) -> ChannelDefaults {
        ChannelDefaults {
            replay: self.defaults.replay,
            replay_window: self.defaults.replay_window.clone(),
            delivery_class: Some(
                self.defaults
                    .delivery_class
                    .unwrap_or(self.profile.default_delivery_class()),
            ),
            extra: Default::default(),
        }
    }

    /// The channel registry entries the profile declares (key → JSON value), `=defaults` first.
    pub fn registry_entries(&self) -> Vec<(String, serde_json::Value)> {
        let mut out = vec![(
            CHANNEL_DEFAULTS_KEY.to_owned(),
            serde_json::to_value(self.channel_defaults()).unwrap_or_default(),
        )];
        for (name, c) in &self.channels {
            let config = ChannelConfig {
                replay: c.replay,
                replay_window: c.replay_window.clone(),
                delivery_class: c.delivery_class,
                description: c.description.clone(),
                instructions: c.instructions.clone(),
                extra: Default::default(),
            };
            out.push((
                name.clone(),
                serde_json::to_value(config).unwrap_or_default(),
            ));
        }
        out
    }

    /// The stream retention for the binding.
    pub fn retention(&self) -> Retention {
        let r = &self.retention;
        let age =
            |w: &Option<ReplayWindow>| w.as_ref().map(ReplayWindow::duration).unwrap_or_default();
        Retention {
            chat: StreamLimits {
                max_age: age(&r.chat_max_age),
                max_bytes: r.chat_max_bytes,
                max_msgs: 0,
            },
            dm: StreamLimits {
                max_age: age(&r.dm_max_age),
                max_bytes: r.dm_max_bytes,
                max_msgs: r.dm_max_msgs,
            },
            task: StreamLimits {
                max_age: age(&r.task_max_age),
                max_bytes: r.task_max_bytes,
                max_msgs: 0,
            },
            store_budget: self.jetstream.max_file_store,
            replicas: self.replicas,
        }
    }
}

/// Stream retention of a space. Ages use the `replayWindow` syntax (`90s`, `12h`, `30d`);
/// sizes are bytes or `K`/`M`/`G`/`T` multiples; 0 means unlimited. DM and TASK are bounded
/// unless set (30 days / 7 days, 1 GiB each), so neither can take the space's whole storage.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// CHAT: oldest message kept (on top of the spec's 1000 per sender and channel).
    #[serde(default)]
    pub chat_max_age: Option<ReplayWindow>,
    /// CHAT: total bytes.
    #[serde(default, deserialize_with = "de_size")]
    pub chat_max_bytes: i64,
    /// DM: oldest message kept.
    #[serde(default = "default_dm_age")]
    pub dm_max_age: Option<ReplayWindow>,
    /// DM: total bytes.
    #[serde(default = "default_dm_bytes", deserialize_with = "de_size")]
    pub dm_max_bytes: i64,
    /// DM: total messages.
    #[serde(default)]
    pub dm_max_msgs: i64,
    /// TASK: oldest unconsumed work item kept (7 days unless set: a task to a role nobody
    /// serves expires).
    #[serde(default = "default_task_age")]
    pub task_max_age: Option<ReplayWindow>,
    /// TASK: total bytes (1 GiB unless set: tasks cannot take the space's whole storage).
    #[serde(default = "default_task_bytes", deserialize_with = "de_size")]
    pub task_max_bytes: i64,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            chat_max_age: None,
            chat_max_bytes: 0,
            dm_max_age: default_dm_age(),
            dm_max_bytes: default_dm_bytes(),
            dm_max_msgs: 0,
            task_max_age: default_task_age(),
            task_max_bytes: default_task_bytes(),
        }
    }
}

fn default_dm_age() -> Option<ReplayWindow> {
    ReplayWindow::parse("30d").ok()
}

fn default_dm_bytes() -> i64 {
    1 << 30
}

fn default_task_age() -> Option<ReplayWindow> {
    ReplayWindow::parse("7d").ok()
}

fn default_task_bytes() -> i64 {
    1 << 30
}

/// `=defaults` overrides (§7).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultsConfig {
    /// Replay history on join (built-in: true).
    pub replay: Option<bool>,
    /// Backfill horizon.
    pub replay_window: Option<ReplayWindow>,
    /// Delivery class (default: the deployment profile's).
    pub delivery_class: Option<DeliveryClass>,
}

/// One channel's config (§7), as written in a profile.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelToml {
    /// History replay on join.
    pub replay: Option<bool>,
    /// Backfill horizon (`^\d+(s|m|h|d)$`).
    pub replay_window: Option<ReplayWindow>,
    /// `live` or `durable`.
    pub delivery_class: Option<DeliveryClass>,
    /// One line, at most 200 characters.
    pub description: Option<ChannelDescription>,
    /// At most 2000 characters.
    pub instructions: Option<ChannelInstructions>,
}

/// JetStream storage limits of a space's account, as sizes (`"256M"`, `"10G"`, bytes).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JetStreamConfig {
    /// Memory storage limit.
    #[serde(default = "default_memory", deserialize_with = "de_size")]
    pub max_memory_store: i64,
    /// File storage limit.
    #[serde(default = "default_file", deserialize_with = "de_size")]
    pub max_file_store: i64,
}

impl Default for JetStreamConfig {
    fn default() -> Self {
        JetStreamConfig {
            max_memory_store: default_memory(),
            max_file_store: default_file(),
        }
    }
}

fn default_sync_interval() -> String {
    "1s".to_owned()
}

fn default_memory() -> i64 {
    256 << 20
}

fn default_file() -> i64 {
    10 << 30
}

/// Why a profile was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file could not be read.
    #[error("cannot read profile {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The TOML is invalid or has an unknown key.
    #[error("invalid profile {origin}: {message}")]
    Parse { origin: String, message: String },
    /// A value is out of range.
    #[error("invalid profile {origin}: {message}")]
    Invalid { origin: String, message: String },
}

impl Profile {
    /// Reads and validates a profile file.
    pub fn read(path: &Path) -> Result<Self, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The embedded default (`config/local.toml`).
    pub fn embedded() -> Result<Self, ProfileError> {
        Self::parse(EMBEDDED_LOCAL, "(embedded config/local.toml)")
    }

    /// Parses and validates profile text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ProfileError> {
        let mut profile: Profile = toml::from_str(text).map_err(|e| ProfileError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })?;
        profile.text = text.to_owned();
        profile
            .validate()
            .map_err(|message| ProfileError::Invalid {
                origin: origin.to_owned(),
                message,
            })?;
        Ok(profile)
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        self.broker.validate()?;
        if self.spaces.is_empty() {
            return Err("no [spaces.<name>] table: a profile serves at least one space".into());
        }
        if let Some(cluster) = &self.cluster {
            cluster.validate()?;
        }
        if let Some(leaf) = &self.leaf {
            self.validate_leaf(leaf)?;
        }
        for (name, space) in &self.spaces {
            validate_space_name(name)?;
            space.validate(name)?;
        }
        Ok(())
    }

    /// A leaf node's settings: not beside a cluster, a remote URL, spaces of this profile.
    fn validate_leaf(&self, leaf: &LeafConfig) -> Result<(), String> {
        if self.cluster.is_some() {
            return Err(
                "[leaf] and [cluster] together: make one node of the cluster the leaf, \
                 or connect the cluster to the hub with a leaf remote of its own"
                    .into(),
            );
        }
        let scheme = leaf.remote.split_once("://").map(|(s, _)| s);
        if !matches!(scheme, Some("tls" | "nats-leaf" | "nats" | "ws" | "wss")) {
            return Err(format!(
                "leaf.remote = {:?}: expected a URL such as tls://hub:7422",
                leaf.remote
            ));
        }
        for space in leaf.spaces(self) {
            if !self.spaces.contains_key(&space) {
                return Err(format!(
                    "leaf.spaces: {space:?} is not a space of this profile"
                ));
            }
        }
        Ok(())
    }
}

impl BrokerConfig {
    /// The monitoring port only on loopback; a sync interval nats-server reads.
    fn validate(&self) -> Result<(), String> {
        if let Some(monitor) = self.monitor
            && !monitor.ip().is_loopback()
        {
            return Err(format!(
                "broker.monitor = {monitor}: the monitoring port has no authentication and must \
                 bind a loopback address (or be left out: cotald does not need it)"
            ));
        }
        if !valid_sync_interval(&self.sync_interval) {
            return Err(format!(
                "broker.sync_interval = {:?}: expected \"always\" or a duration such as \
                 \"500ms\", \"1s\", \"2m\"",
                self.sync_interval
            ));
        }
        Ok(())
    }
}

impl ClusterConfig {
    /// A clean name, replicas JetStream allows and the nodes can hold, routes as host:port.
    fn validate(&self) -> Result<(), String> {
        validate_token("cluster.name", &self.name)?;
        if self.replicas.is_some_and(|r| !(1..=5).contains(&r)) {
            return Err("cluster.replicas: JetStream allows 1 to 5 replicas".into());
        }
        if self.replicas() > self.routes.len() + 1 {
            return Err(format!(
                "cluster.replicas = {}: more replicas than nodes (this one and {} routes)",
                self.replicas(),
                self.routes.len()
            ));
        }
        for route in &self.routes {
            if route.contains("://") || route.rsplit_once(':').is_none() {
                return Err(format!(
                    "cluster.routes: {route:?}: expected host:port (routes are always TLS)"
                ));
            }
        }
        Ok(())
    }
}

impl SpaceConfig {
    /// Space `name`'s settings: channel configs named by concrete channels, no negative
    /// retention, positive storage limits.
    fn validate(&self, name: &str) -> Result<(), String> {
        for channel in self.channels.keys() {
            let concrete = ChannelPattern::from_policy(channel)
                .ok()
                .filter(ChannelPattern::is_concrete);
            if concrete.is_none_or(|c| c.as_str() != channel) {
                return Err(format!(
                    "spaces.{name}.channels.{channel:?}: a channel config needs a concrete \
                     channel name: dotted segments of [A-Za-z0-9_-], no wildcard"
                ));
            }
        }
        let r = &self.retention;
        if r.chat_max_bytes < 0 || r.dm_max_bytes < 0 || r.dm_max_msgs < 0 || r.task_max_bytes < 0 {
            return Err(format!(
                "spaces.{name}.retention: sizes and counts cannot be negative"
            ));
        }
        let js = &self.jetstream;
        if js.max_memory_store <= 0 || js.max_file_store <= 0 {
            return Err(format!(
                "spaces.{name}.jetstream: storage limits must be positive sizes"
            ));
        }
        Ok(())
    }
}

/// A space name becomes a subject token (§3), an account name and a directory name, so it
/// must already be a clean token: `[A-Za-z0-9_-]+`. A name that sanitization would change is
/// refused rather than silently renamed.
pub fn validate_space_name(name: &str) -> Result<(), String> {
    validate_token("space name", name)
}

/// A strict routing token (`[A-Za-z0-9_-]`, 1 to 64 characters): refused, not sanitized.
pub fn validate_token(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "{what} {name:?}: use 1 to 64 characters from [A-Za-z0-9_-]"
        ));
    }
    Ok(())
}

fn valid_sync_interval(s: &str) -> bool {
    if s == "always" {
        return true;
    }
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && matches!(&s[digits..], "ms" | "s" | "m" | "h")
}

fn de_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(i64),
        Text(String),
    }
    match Size::deserialize(d)? {
        Size::Bytes(n) => Ok(n),
        Size::Text(s) => parse_size(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "invalid size {s:?}: expected bytes or a number with K, M, G or T"
            ))
        }),
    }
}

/// A size for people: `512 KiB`, `178.0 MiB`, `10.0 GiB` (the inverse of the profile's sizes).
pub fn human_size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    const MIB: f64 = KIB * 1024.0;
    const GIB: f64 = MIB * 1024.0;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.1} GiB", b / GIB)
    } else if b >= MIB {
        format!("{:.1} MiB", b / MIB)
    } else if b >= KIB {
        format!("{:.0} KiB", b / KIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// Parses `"512"`, `"256K"`, `"256M"`, `"10G"`, `"1T"` (binary multiples) into bytes.
fn parse_size(s: &str) -> Option<i64> {
    let s = s.trim();
    let (num, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        b'T' | b't' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    num.parse::<i64>().ok()?.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests;
