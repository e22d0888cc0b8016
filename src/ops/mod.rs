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
//! | `channels-set` | [`ChannelsSet`] | ✓ | admin identities | the stored [`ChannelConfig`] |
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
//! surfaced already and asks for the rest with `backstop-want`.

pub mod receipt;
pub mod status;

pub use receipt::{ReadFor, ReadReceipt, Receipt, ReceiptFor};
pub use status::BrokerHealth;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::profile::DeploymentProfile;
use crate::protocol::{
    Channel, ChannelConfig, ChannelPattern, ControlReply, ControlRequest, EndpointRef, is_covered,
};

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

/// A request to the appliance. On the wire: `{"op": "<kebab-case name>", "args": {…}}`, the
/// `op`/`args` pair of a `ControlRequest` (§5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", content = "args", rename_all = "kebab-case")]
pub enum Request {
    /// Add and serve a space (no restart); it is remembered for later starts.
    SpaceAdd(SpaceAdd),
    /// The served spaces.
    SpaceList,
    /// Stop the appliance gracefully, as SIGTERM does; replies before it stops.
    Shutdown,
    /// Ask the broker, over the system account, whether it and its JetStream are healthy.
    BrokerHealth,
    /// How delivery goes in each space: what its readers refused, and each online durable
    /// member's unacknowledged copies and how long they have waited.
    Delivery,
    /// Write an archive of every served space: its streams and buckets as the broker
    /// snapshots them, and the keys, identities and profile they need.
    Backup(BackupRequest),
    /// Mint a credential; an existing name is refused unless `replace`, which re-issues (and
    /// revokes) its credential.
    Mint(MintRequest),
    /// End an identity: its credential is revoked, its connections closed, its durables and
    /// backlog deleted.
    Revoke(Revoke),
    /// Write a channel's config in the registry (§7).
    ChannelsSet(ChannelsSet),
    /// Remove a channel's config from the registry and, with `purge`, its history.
    ChannelsRm(ChannelsRm),
    /// Establish durable membership of a concrete channel from the caller's join cursor (§7).
    DurableJoin(DurableJoin),
    /// Close a durable membership at the current frontier (the leave cursor, §7).
    DurableLeave(DurableLeave),
    /// The caller's durable memberships.
    Memberships,
    /// Start (or restart) delivering the caller's backlog to its backstop inbox.
    Resume(Resume),
    /// Acknowledge durable copies the caller has handled.
    BackstopAck(BackstopAck),
    /// Ask for the content of offered entries the caller has not surfaced.
    BackstopWant(BackstopWant),
    /// Record how far the caller has read live channels it replays.
    ReplayMark(ReplayMark),
    /// How far the caller has read each live channel it replays.
    ReplayMarks,
    /// Where a message to a channel, an instance or a role goes now.
    Receipt(ReceiptFor),
    /// Whether a message the caller sent was acknowledged by its reader.
    Read(ReadFor),
}

impl Request {
    /// Every op name, as on the wire.
    pub const OPS: &'static [&'static str] = &[
        "space-add",
        "space-list",
        "shutdown",
        "broker-health",
        "delivery",
        "backup",
        "mint",
        "revoke",
        "channels-set",
        "channels-rm",
        "durable-join",
        "durable-leave",
        "memberships",
        "resume",
        "backstop-ack",
        "backstop-want",
        "replay-mark",
        "replay-marks",
        "receipt",
        "read",
    ];

    /// The op name.
    pub fn op(&self) -> &'static str {
        match self {
            Request::SpaceAdd(_) => "space-add",
            Request::SpaceList => "space-list",
            Request::Shutdown => "shutdown",
            Request::BrokerHealth => "broker-health",
            Request::Delivery => "delivery",
            Request::Backup(_) => "backup",
            Request::Mint(_) => "mint",
            Request::Revoke(_) => "revoke",
            Request::ChannelsSet(_) => "channels-set",
            Request::ChannelsRm(_) => "channels-rm",
            Request::DurableJoin(_) => "durable-join",
            Request::DurableLeave(_) => "durable-leave",
            Request::Memberships => "memberships",
            Request::Resume(_) => "resume",
            Request::BackstopAck(_) => "backstop-ack",
            Request::BackstopWant(_) => "backstop-want",
            Request::ReplayMark(_) => "replay-mark",
            Request::ReplayMarks => "replay-marks",
            Request::Receipt(_) => "receipt",
            Request::Read(_) => "read",
        }
    }

    /// Whether `transport` carries this op (the table in the module doc).
    pub fn served_on(&self, transport: Transport) -> bool {
        match self {
            Request::SpaceAdd(_)
            | Request::SpaceList
            | Request::Shutdown
            | Request::BrokerHealth
            | Request::Delivery
            | Request::Backup(_)
            | Request::Mint(_)
            | Request::Revoke(_) => transport == Transport::AdminSocket,
            Request::ChannelsSet(_) | Request::ChannelsRm(_) => true,
            Request::DurableJoin(_)
            | Request::DurableLeave(_)
            | Request::Memberships
            | Request::Resume(_)
            | Request::BackstopAck(_)
            | Request::BackstopWant(_)
            | Request::ReplayMark(_)
            | Request::ReplayMarks
            | Request::Receipt(_)
            | Request::Read(_) => transport == Transport::Control,
        }
    }

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

/// `space-add`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpaceAdd {
    /// The space name: 1 to 64 characters from `[A-Za-z0-9_-]`.
    pub name: String,
    /// Its deployment profile.
    pub profile: DeploymentProfile,
}

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

/// `backup`: where the appliance writes the archive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackupRequest {
    /// An absolute path that does not exist yet (the archive is never written over a file).
    pub out: std::path::PathBuf,
}

/// What an archive of `cotald backup` holds (`cotald-backup.json` inside it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackupManifest {
    /// The archive's layout version.
    pub format: u32,
    /// The cotald that wrote it.
    pub cotald: String,
    /// The broker whose snapshots it holds.
    pub nats_server: String,
    /// When it was taken (RFC 3339, UTC).
    pub created: String,
    /// Each served space, and the streams and buckets copied of it, in the order they were
    /// copied and are restored.
    pub spaces: Vec<SpaceCopy>,
}

/// The streams and buckets of one space in a backup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpaceCopy {
    /// The space.
    pub name: String,
    /// Its streams, in order.
    pub streams: Vec<StreamCopy>,
}

/// One stream (or bucket's stream) in a backup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamCopy {
    /// Its name.
    pub stream: String,
    /// Its messages when the snapshot began.
    pub messages: u64,
    /// The size of the broker's archive of it.
    pub bytes: u64,
}

/// The reply to `backup`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackupReport {
    /// The archive written.
    pub path: std::path::PathBuf,
    /// Its size.
    pub bytes: u64,
    /// How long it took.
    pub millis: u64,
    /// What it holds.
    pub manifest: BackupManifest,
}

/// The reply to `shutdown`: the appliance that is stopping.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stopping {
    /// The pid of the `cotald` process.
    pub pid: u32,
}

/// One served space.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpaceInfo {
    /// The space name.
    pub name: String,
    /// The account public key.
    pub account: String,
    /// The deployment profile.
    pub profile: DeploymentProfile,
    /// The join link (§10).
    pub link: String,
    /// The machine operator's credentials for this space.
    pub operator_creds: std::path::PathBuf,
}

/// The credential profiles `cotald mint` issues (Appendix B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CredentialProfile {
    /// An agent: reads within `allowSubscribe`, posts within `allowPublish`, DMs and anycast.
    Agent,
    /// Reads chat, CHAT history, presence and the channel registry; publishes nothing.
    Observer,
    /// The observer's reads, the whole space's live traffic and DM history; publishes nothing.
    Admin,
}

/// `mint`: what to mint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MintRequest {
    /// Display name (the JWT's name); unique within the space.
    pub name: String,
    /// The space.
    pub space: String,
    /// The profile; `None` means agent.
    #[serde(default)]
    pub profile: Option<CredentialProfile>,
    /// Channels joined at boot (⊆ `allow_subscribe`).
    #[serde(default)]
    pub subscribe: Vec<String>,
    /// The read ACL; defaults to `subscribe`.
    #[serde(default)]
    pub allow_subscribe: Vec<String>,
    /// The post ACL; default none.
    #[serde(default)]
    pub allow_publish: Vec<String>,
    /// Anycast role.
    #[serde(default)]
    pub role: Option<String>,
    /// Lifetime of the credential (`90s`, `12h`, `30d`); the broker refuses it afterwards.
    #[serde(default)]
    pub expires: Option<String>,
    /// Re-issue the credential of an identity of that name (the current one is revoked);
    /// without it, a name that exists is refused.
    #[serde(default)]
    pub replace: bool,
}

/// What the appliance remembers of a minted identity (never its seed): the grants of its
/// current credential, which the trusted reader authorizes against (§9 item 6).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityRecord {
    /// The instance id (user public key).
    pub id: String,
    /// Display name.
    pub name: String,
    /// The space.
    pub space: String,
    /// The profile.
    pub profile: CredentialProfile,
    /// Anycast role.
    pub role: Option<String>,
    /// Boot channels.
    pub subscribe: Vec<String>,
    /// Read ACL.
    pub allow_subscribe: Vec<String>,
    /// Post ACL.
    pub allow_publish: Vec<String>,
    /// When the credential expires (Unix seconds), if it does.
    #[serde(default)]
    pub expires_at: Option<i64>,
    /// When the current credential was issued (Unix seconds).
    #[serde(default)]
    pub issued_at: i64,
    /// Credentials of this id issued at or before this second are refused by the broker (set
    /// when a re-mint replaced them, or when the identity was revoked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revokes_before: Option<i64>,
    /// When the identity was revoked (Unix seconds): it has no valid credential left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<i64>,
}

impl IdentityRecord {
    /// Whether DMs can be addressed to it: an agent, or a person (`admin`, the machine
    /// operator among them), reads its own `dm_<id>`; an observer reads no DM (Appendix B).
    pub fn has_inbox(&self) -> bool {
        matches!(
            self.profile,
            CredentialProfile::Agent | CredentialProfile::Admin
        )
    }

    /// The read ACL as patterns (entries that do not parse grant nothing).
    pub fn read_acl(&self) -> Vec<ChannelPattern> {
        self.allow_subscribe
            .iter()
            .filter_map(|c| ChannelPattern::from_policy(c).ok())
            .collect()
    }

    /// Whether the read ACL covers the concrete `channel` (§9: the current read ACL).
    pub fn may_read(&self, channel: &str) -> bool {
        Channel::new(channel).is_ok_and(|c| is_covered(&self.read_acl(), &c))
    }

    /// Whether the post ACL covers the concrete `channel`.
    pub fn may_post(&self, channel: &str) -> bool {
        let acl: Vec<ChannelPattern> = self
            .allow_publish
            .iter()
            .filter_map(|c| ChannelPattern::from_policy(c).ok())
            .collect();
        Channel::new(channel).is_ok_and(|c| is_covered(&acl, &c))
    }
}

/// `mint`'s reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MintReply {
    /// The identity.
    pub record: IdentityRecord,
    /// The `.creds` text (secret; the caller writes it).
    pub creds: String,
    /// A join link naming the identity's boot channels.
    pub link: String,
    /// Whether its durables were created (false when minted without a running appliance).
    pub provisioned: bool,
    /// Whether this replaced an earlier credential of the same name (which is now revoked).
    #[serde(default)]
    pub replaced: bool,
}

/// `revoke`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Revoke {
    /// The space.
    pub space: String,
    /// The identity's name (or its id).
    pub name: String,
}

/// `channels-set`: the config of one concrete channel (§7), replacing what is stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelsSet {
    /// The space: required on the admin socket; on `ctl` it is the subject's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<String>,
    /// The concrete channel.
    pub channel: String,
    /// Its config.
    pub config: ChannelConfig,
}

/// `channels-rm`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelsRm {
    /// The space: required on the admin socket; on `ctl` it is the subject's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<String>,
    /// The concrete channel.
    pub channel: String,
    /// Delete its history too (every post stored on it, from CHAT).
    #[serde(default)]
    pub purge: bool,
}

/// What `channels-rm` removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelRemoved {
    /// The channel.
    pub channel: String,
    /// Whether it had a config, now removed.
    pub config_removed: bool,
    /// How many stored posts were deleted (0 without `purge`).
    pub purged: u64,
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
    /// Whether the caller takes offers ([`OfferBatch`]) once it follows a channel: it
    /// confirms what it surfaced live and asks for the rest (`backstop-want`). Without it,
    /// every durable copy carries its content.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub offers: bool,
}

/// `resume`'s reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    /// The session now delivering.
    pub session: String,
    /// The caller's open memberships.
    pub memberships: Vec<Membership>,
    /// The consumers whose backlog this session hands over: each says [`CAUGHT_UP`] once what
    /// it held at the session's start has been handed over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumers: Vec<String>,
}

/// `backstop-ack`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackstopAck {
    /// The token of each handled copy ([`Copy::token`]).
    pub tokens: Vec<String>,
}

/// `backstop-want`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackstopWant {
    /// The token of each offered entry the caller has not surfaced ([`Offer::token`]).
    pub tokens: Vec<String>,
}

/// Header of a stored `@mention` copy: the chat subject the message was published on (§3),
/// which the reader hands over with it.
pub const COPY_SUBJECT: &str = "Cotal-Subject";

/// Durable copies on their way to a member: one message on its inbox carries every copy the
/// trusted reader had at hand, so a catch-up moves hundreds of copies per message through the
/// broker instead of one. Each copy is framed as `<subject> <token> <length>\n<payload>`: the
/// chat subject the message was published on (§3, which the member validates the copy
/// against like any delivery), the token it acknowledges with `backstop-ack`, and the original
/// payload, unchanged. Subjects and tokens hold no space or line end, so nothing is escaped.
#[derive(Debug, Default)]
pub struct CopyBatch {
    body: Vec<u8>,
    copies: usize,
}

impl CopyBatch {
    /// Adds one copy.
    pub fn push(&mut self, subject: &str, token: &str, payload: &[u8]) {
        self.body.reserve(Self::framed_len(subject, token, payload));
        self.body.extend_from_slice(subject.as_bytes());
        self.body.push(b' ');
        self.body.extend_from_slice(token.as_bytes());
        self.body.push(b' ');
        self.body
            .extend_from_slice(payload.len().to_string().as_bytes());
        self.body.push(b'\n');
        self.body.extend_from_slice(payload);
        self.copies += 1;
    }

    /// The bytes one copy takes in a batch.
    pub fn framed_len(subject: &str, token: &str, payload: &[u8]) -> usize {
        subject.len() + token.len() + payload.len().to_string().len() + payload.len() + 3
    }

    /// The batch's size in bytes.
    pub fn len(&self) -> usize {
        self.body.len()
    }

    /// How many copies it holds.
    pub fn copies(&self) -> usize {
        self.copies
    }

    /// Whether it holds no copy.
    pub fn is_empty(&self) -> bool {
        self.copies == 0
    }

    /// The message body.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}

/// One copy of a [`CopyBatch`], borrowed from the received body.
#[derive(Debug, PartialEq, Eq)]
pub struct Copy<'a> {
    /// The chat subject it was published on.
    pub subject: &'a str,
    /// What `backstop-ack` acknowledges.
    pub token: &'a str,
    /// The original payload.
    pub payload: &'a [u8],
}

/// A batch body that is not a sequence of framed copies.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a malformed batch of durable copies: {0}")]
pub struct CopyBatchError(&'static str);

/// The copies of a batch body, in order.
pub fn copies(body: &[u8]) -> Result<Vec<Copy<'_>>, CopyBatchError> {
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let end = rest
            .iter()
            .position(|b| *b == b'\n')
            .ok_or(CopyBatchError("a frame without its line end"))?;
        let head = std::str::from_utf8(&rest[..end])
            .map_err(|_| CopyBatchError("a frame head that is not UTF-8"))?;
        let mut fields = head.split(' ');
        let (Some(subject), Some(token), Some(len), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(CopyBatchError(
                "a frame head without subject, token and length",
            ));
        };
        let len: usize = len
            .parse()
            .map_err(|_| CopyBatchError("a frame length that is not a number"))?;
        let payload = rest[end + 1..]
            .get(..len)
            .ok_or(CopyBatchError("a frame shorter than its length"))?;
        out.push(Copy {
            subject,
            token,
            payload,
        });
        rest = &rest[end + 1 + len..];
    }
    Ok(out)
}

/// Header of a message on the backstop inbox whose body is not a [`CopyBatch`]: its value
/// says what it is.
pub const BATCH_KIND: &str = "Cotal-Batch";
/// [`BATCH_KIND`]'s value for an [`OfferBatch`].
pub const OFFERS: &str = "offers";
/// [`BATCH_KIND`]'s value for a consumer's word that what it held when the session started has
/// been handed over (or as much as its window lets out before acknowledgements): the body is
/// `<session> <consumer>`. It follows that consumer's copies on the same inbox, so a member
/// that reads it has every one of them.
pub const CAUGHT_UP: &str = "caught-up";

/// The body of a [`CAUGHT_UP`] message.
pub fn caught_up_body(session: &str, consumer: &str) -> String {
    format!("{session} {consumer}")
}

/// Reads a [`CAUGHT_UP`] body: (session, consumer); `None` when it is not one.
pub fn caught_up(body: &[u8]) -> Option<(&str, &str)> {
    let text = std::str::from_utf8(body).ok()?;
    let (session, consumer) = text.split_once(' ')?;
    (!session.is_empty() && !consumer.is_empty() && !consumer.contains(' '))
        .then_some((session, consumer))
}

/// Entries offered to a member that follows its channel, without their content: each framed
/// as `<subject> <token> <id>\n`, the chat subject (which names the sender, §3), the token the
/// member acknowledges (`backstop-ack`, as for a copy) or asks the content of
/// (`backstop-want`), and the message's `id`, validated by the trusted reader. (sender, `id`)
/// is what the member deduplicates by, so it knows without the content whether it surfaced the
/// message already.
#[derive(Debug, Default)]
pub struct OfferBatch {
    body: Vec<u8>,
}

impl OfferBatch {
    /// Adds one offer; false (nothing added) when the id holds a space or a line end, which
    /// the framing cannot carry: such an entry is handed over as a copy instead.
    pub fn push(&mut self, subject: &str, token: &str, id: &str) -> bool {
        if id.is_empty() || id.contains([' ', '\n', '\r']) {
            return false;
        }
        for part in [subject, " ", token, " ", id, "\n"] {
            self.body.extend_from_slice(part.as_bytes());
        }
        true
    }

    /// The batch's size in bytes.
    pub fn len(&self) -> usize {
        self.body.len()
    }

    /// Whether it holds no offer.
    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }

    /// The message body.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }
}

/// One offer of an [`OfferBatch`], borrowed from the received body.
#[derive(Debug, PartialEq, Eq)]
pub struct Offer<'a> {
    /// The chat subject it was published on.
    pub subject: &'a str,
    /// What `backstop-ack` acknowledges and `backstop-want` asks for.
    pub token: &'a str,
    /// The message's `id`.
    pub id: &'a str,
}

/// The offers of a batch body, in order.
pub fn offers(body: &[u8]) -> Result<Vec<Offer<'_>>, CopyBatchError> {
    let text =
        std::str::from_utf8(body).map_err(|_| CopyBatchError("offers that are not UTF-8"))?;
    text.lines()
        .map(|line| {
            let mut fields = line.split(' ');
            match (fields.next(), fields.next(), fields.next(), fields.next()) {
                (Some(subject), Some(token), Some(id), None) if !id.is_empty() => {
                    Ok(Offer { subject, token, id })
                }
                _ => Err(CopyBatchError("an offer without subject, token and id")),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::InstanceId;

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

    #[test]
    fn a_batch_of_copies_round_trips_whatever_the_payload_holds() {
        let mut batch = CopyBatch::default();
        let payloads: [&[u8]; 3] = [b"{\"a\": 1}", b"", b"line\nbreaks and spaces \n"];
        for (i, p) in payloads.iter().enumerate() {
            batch.push("cotal.main.chat.UA.general", &format!("c{i}"), p);
        }
        assert_eq!(batch.copies(), 3);
        let expected: usize = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| CopyBatch::framed_len("cotal.main.chat.UA.general", &format!("c{i}"), p))
            .sum();
        assert_eq!(batch.len(), expected);
        let body = batch.into_body();
        let read = copies(&body).unwrap();
        assert_eq!(read.len(), 3);
        for (i, copy) in read.iter().enumerate() {
            assert_eq!(copy.subject, "cotal.main.chat.UA.general");
            assert_eq!(copy.token, format!("c{i}"));
            assert_eq!(copy.payload, payloads[i]);
        }
        assert_eq!(copies(b"").unwrap(), []);
    }

    #[test]
    fn a_malformed_batch_is_refused() {
        for body in [
            &b"cotal.main.chat.UA.general c1 5"[..],
            b"cotal.main.chat.UA.general c1\n{}",
            b"cotal.main.chat.UA.general c1 x\n{}",
            b"cotal.main.chat.UA.general c1 9\n{}",
            b"a b c d\n",
        ] {
            assert!(copies(body).is_err(), "{body:?}");
        }
    }

    #[test]
    fn offers_round_trip_and_an_id_the_framing_cannot_carry_is_refused() {
        let mut batch = OfferBatch::default();
        assert!(batch.push("cotal.main.chat.UA.general", "f7", "m-1"));
        assert!(batch.push("cotal.main.chat.UB.general", "f9", "m-2"));
        for id in ["", "a b", "a\nb"] {
            assert!(
                !batch.push("cotal.main.chat.UA.general", "f10", id),
                "{id:?}"
            );
        }
        let body = batch.into_body();
        assert_eq!(
            offers(&body).unwrap(),
            [
                Offer {
                    subject: "cotal.main.chat.UA.general",
                    token: "f7",
                    id: "m-1"
                },
                Offer {
                    subject: "cotal.main.chat.UB.general",
                    token: "f9",
                    id: "m-2"
                }
            ]
        );
        assert_eq!(offers(b"").unwrap(), []);
        for body in [&b"a b\n"[..], b"a b c d\n", b"a b \n", b"\xff"] {
            assert!(offers(body).is_err(), "{body:?}");
        }
    }
}
