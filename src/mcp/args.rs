//! What the `cotal_*` tools take: the arguments as JSON schemas (the doc comments are what
//! the agent reads).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Arguments of cotal_send.
#[derive(Debug, Deserialize, JsonSchema)]
pub(super) struct SendArgs {
    /// The channel, e.g. general or team.backend (must be one you may post to).
    pub(super) channel: String,
    /// The message text.
    pub(super) text: String,
    /// Names of peers to mention (each is woken). On a live channel a mentioned peer that may
    /// read it gets the message even if it did not join the channel or is away; on a durable
    /// channel its members get every message anyway, and a peer that is not one gets none.
    #[serde(default)]
    pub(super) mentions: Vec<String>,
    /// The id of the message this answers.
    #[serde(default)]
    pub(super) reply_to: Option<String>,
    /// Post to a channel that has no config and no messages yet, creating it (without it such
    /// a post is refused as a likely typo, naming the closest channel).
    #[serde(default)]
    pub(super) new: bool,
}

/// Arguments of cotal_dm.
#[derive(Debug, Deserialize, JsonSchema)]
pub(super) struct DmArgs {
    /// The peer: its name (as in cotal_roster) or its instance id.
    pub(super) to: String,
    /// The message text.
    pub(super) text: String,
    /// The id of the message this answers.
    #[serde(default)]
    pub(super) reply_to: Option<String>,
}

/// Arguments of cotal_anycast.
#[derive(Debug, Deserialize, JsonSchema)]
pub(super) struct AnycastArgs {
    /// The role, e.g. reviewer: exactly one of its holders gets the message, now or when one
    /// connects.
    pub(super) role: String,
    /// The message text (typically a task).
    pub(super) text: String,
    /// The id of the message this answers.
    #[serde(default)]
    pub(super) reply_to: Option<String>,
}

/// Arguments of cotal_inbox.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(super) struct InboxArgs {
    /// The most messages to return (default 20, at most 200); the rest stay for the next call.
    #[serde(default)]
    pub(super) limit: Option<usize>,
    /// Look without consuming: nothing is acknowledged, the same messages come again.
    #[serde(default)]
    pub(super) peek: bool,
    /// Unless something you have not seen waits, block up to this many seconds (at most 300)
    /// for the next message or notice. What a peek showed you does not end a wait.
    #[serde(default)]
    pub(super) wait: Option<u64>,
}

/// Arguments of cotal_thread.
#[derive(Debug, Deserialize, JsonSchema)]
pub(super) struct ThreadArgs {
    /// A message id (any message of the thread), or a thread id as a message's thread shows.
    pub(super) id: String,
    /// Where to start, counted in messages of the thread (default 0, the first).
    #[serde(default)]
    pub(super) start: Option<usize>,
    /// The most messages to return (default 50, at most 200).
    #[serde(default)]
    pub(super) limit: Option<usize>,
}

/// Arguments of cotal_receipts.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(super) struct ReceiptsArgs {
    /// One message you sent, by id; without it, your most recent sends.
    #[serde(default)]
    pub(super) id: Option<String>,
    /// How many of your most recent sends (default 10, at most 50).
    #[serde(default)]
    pub(super) limit: Option<usize>,
}

/// Arguments of cotal_roster.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(super) struct RosterArgs {
    /// Also list peers that are offline.
    #[serde(default)]
    pub(super) include_offline: bool,
}

/// Arguments naming one channel.
#[derive(Debug, Deserialize, JsonSchema)]
pub(super) struct ChannelArgs {
    /// The channel, e.g. general or team.backend.
    pub(super) channel: String,
}

/// Arguments of cotal_join.
#[derive(Debug, Deserialize, JsonSchema)]
pub(super) struct JoinArgs {
    /// The channel (or a pattern within your read permissions, e.g. team.>).
    pub(super) channel: String,
    /// Replay the channel's recent history into your inbox, as its config says (default true).
    #[serde(default)]
    pub(super) history: Option<bool>,
    /// Join a channel that has no config and no messages yet (without it such a join is
    /// refused as a likely typo, naming the closest channel).
    #[serde(default)]
    pub(super) new: bool,
}

/// Arguments of cotal_history.
#[derive(Debug, Deserialize, JsonSchema)]
pub(super) struct HistoryArgs {
    /// The channel.
    pub(super) channel: String,
    /// The most recent messages to return (default 30, at most 500).
    #[serde(default)]
    pub(super) limit: Option<usize>,
}

/// A presence status you can declare.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum StatusWord {
    /// Free for work.
    Idle,
    /// Busy with a task.
    Working,
    /// Blocked, waiting for someone or something.
    Waiting,
}

/// An attention mode (advisory: it tells others how you want to be interrupted).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum AttentionWord {
    /// Everything is welcome.
    Open,
    /// Do not disturb.
    Dnd,
    /// Focused: only what matters.
    Focus,
}

/// Arguments of cotal_status.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(super) struct StatusArgs {
    /// idle, working or waiting (unchanged when absent).
    #[serde(default)]
    pub(super) status: Option<StatusWord>,
    /// What you are doing, in a few words (an empty text clears it; unchanged when absent,
    /// except that idle clears it).
    #[serde(default)]
    pub(super) activity: Option<String>,
    /// open, dnd or focus (unchanged when absent).
    #[serde(default)]
    pub(super) attention: Option<AttentionWord>,
}

/// A per-channel mode.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum ModeWord {
    /// As everything else.
    Normal,
    /// Quiet: low priority for you.
    Quiet,
    /// Muted: you do not want to be interrupted by it.
    Muted,
    /// As normal, and every message here wakes you (by default only DMs, tasks for your role
    /// and mentions of you do).
    All,
}

/// Arguments of cotal_channel_mode.
#[derive(Debug, Deserialize, JsonSchema)]
pub(super) struct ChannelModeArgs {
    /// The channel.
    pub(super) channel: String,
    /// normal, quiet, muted, or all (normal, and every message here wakes you).
    pub(super) mode: ModeWord,
}

/// A skill on your card.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct SkillArg {
    /// A short id, e.g. rust-review.
    pub(super) id: String,
    /// Its display name.
    pub(super) name: String,
    /// What it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) description: Option<String>,
}

/// Arguments of cotal_persona.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(super) struct PersonaArgs {
    /// One line about you (unchanged when absent; an empty text clears it).
    #[serde(default)]
    pub(super) description: Option<String>,
    /// Capability tags, e.g. ["rust", "review"] (replace the old ones; unchanged when absent).
    #[serde(default)]
    pub(super) tags: Option<Vec<String>>,
    /// Skills (replace the old ones; unchanged when absent).
    #[serde(default)]
    pub(super) skills: Option<Vec<SkillArg>>,
}

/// Arguments of cotal_reconnect.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub(super) struct ReconnectArgs {
    /// Drop the connection and connect again now (default: only report the state).
    #[serde(default)]
    pub(super) force: bool,
}
