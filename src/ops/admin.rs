//! The machine operator's ops (the admin socket) and the channel registry's (also an admin
//! identity's on `ctl.manager`, §7): their arguments and replies.

use serde::{Deserialize, Serialize};

use crate::profile::DeploymentProfile;
use crate::protocol::{Channel, ChannelConfig, ChannelPattern, is_covered};

/// `space-add`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpaceAdd {
    /// The space name: 1 to 64 characters from `[A-Za-z0-9_-]`.
    pub name: String,
    /// Its deployment profile.
    pub profile: DeploymentProfile,
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
