//! The `cotal_*` tools: arguments and results as JSON schemas (the doc comments are what the
//! agent reads), each thin over the [`Client`](crate::client::Client).

use std::collections::BTreeMap;
use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{CotalServer, page, wording};
use crate::client::{ConnectionState, Delivery, DurableState, JoinError, Replay};
use crate::protocol::{
    AgentSkill, AttentionMode, Channel, ChannelConfig, ChannelDefaults, ChannelMode, CotalMessage,
    DeliveryClass, InstanceId, Part, PresenceStatus, Routing, resolve,
};

/// How many messages `cotal_inbox` returns unless told otherwise.
const INBOX_DEFAULT: usize = 20;
/// The most `cotal_inbox` returns at once.
const INBOX_MAX: usize = 200;
/// How many failed acknowledgements an answer lists (the rest are counted).
const ACK_ERRORS_SHOWN: usize = 10;
/// The longest `cotal_inbox` blocks.
const WAIT_MAX: u64 = 300;
/// How many messages `cotal_history` returns unless told otherwise, and at most.
const HISTORY_DEFAULT: usize = 30;
const HISTORY_MAX: usize = 500;
/// How many messages `cotal_thread` returns unless told otherwise, and at most.
const THREAD_DEFAULT: usize = 50;
const THREAD_MAX: usize = 200;
/// How many of a thread's channels `cotal_thread` reads the history of, and how far back.
const THREAD_CHANNELS: usize = 4;
const THREAD_HISTORY: usize = 500;
/// How many characters of a sent message's text cotal_receipts shows.
const PREVIEW_CHARS: usize = 80;
/// How many sent messages cotal_receipts reports unless told otherwise, and at most.
const RECEIPTS_DEFAULT: usize = 10;
const RECEIPTS_MAX: usize = 50;
/// How long a name lookup waits for the roster's first read.
const ROSTER_LOAD: Duration = Duration::from_secs(5);

/// The text parts of a message, joined by newlines.
pub(super) fn text_of(parts: &[Part]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ----- shared result shapes -----

/// A sender.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Who {
    /// The first 12 characters of its instance id: enough to tell senders apart and to
    /// address a DM (cotal_dm takes a name, a whole id, or such a prefix); cotal_roster shows
    /// whole ids.
    pub(super) id: String,
    /// Display name.
    pub(super) name: String,
    /// Anycast role, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) role: Option<String>,
}

/// One message.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MessageView {
    /// Message id (use it as reply_to to answer).
    pub(super) id: String,
    /// channel, dm or anycast.
    pub(super) kind: String,
    /// The channel, for channel messages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) channel: Option<String>,
    /// The role it was sent to, for anycast.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) role: Option<String>,
    /// Who sent it.
    pub(super) from: Who,
    /// Its text.
    pub(super) text: String,
    /// Present when the text is larger than one answer: which bytes `text` holds; the rest
    /// comes in the next cotal_inbox call, under the same id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) text_part: Option<super::page::TextPart>,
    /// Non-text parts (data, files), as sent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) other_parts: Vec<Value>,
    /// Present when the non-text parts were too large to return: their size in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) other_parts_omitted: Option<usize>,
    /// Names it mentions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) mentions: Vec<String>,
    /// Whether it mentions you.
    pub(super) mentions_you: bool,
    /// The id of the message it answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reply_to: Option<String>,
    /// Conversation id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) context_id: Option<String>,
    /// The thread it belongs to (its context id, else the first message of its reply chain
    /// that this session knows): cotal_thread with it reads the whole conversation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) thread: Option<String>,
    /// When it was sent (Unix epoch milliseconds).
    pub(super) ts: Value,
    /// Replayed from the channel's history on join (sent before you joined).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) historical: bool,
    /// Kept for you while you were away (durable channel or a mention).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) durable: bool,
}

impl CotalServer {
    fn view_message(&self, m: &CotalMessage) -> MessageView {
        let me = self.client.card().name;
        let (kind, channel, role) = match &m.routing {
            Routing::Channel(c) => ("channel", Some(c.clone()), None),
            Routing::To(_) => ("dm", None, None),
            Routing::ToService(r) => ("anycast", None, Some(r.clone())),
        };
        MessageView {
            id: m.id.clone(),
            kind: kind.to_owned(),
            channel,
            role,
            from: Who {
                id: m.from.id.chars().take(SHORT_ID).collect(),
                name: m.from.name.clone(),
                role: m.from.role.clone(),
            },
            text: text_of(&m.parts),
            other_parts: m
                .parts
                .iter()
                .filter(|p| !matches!(p, Part::Text { .. }))
                .filter_map(|p| serde_json::to_value(p).ok())
                .collect(),
            mentions: m.mentions.clone(),
            mentions_you: m.mentions.contains(&me),
            reply_to: m.reply_to.clone(),
            context_id: m.context_id.clone(),
            thread: self.threads.thread(m),
            text_part: None,
            other_parts_omitted: None,
            ts: serde_json::to_value(&m.ts).unwrap_or_default(),
            historical: false,
            durable: false,
        }
    }

    fn view_delivery(&self, d: &Delivery) -> MessageView {
        let mut view = self.view_message(&d.message);
        view.kind = d.kind.as_str().to_owned();
        if d.channel.is_some() {
            view.channel = d.channel.clone();
        }
        view.historical = d.historical;
        view.durable = d.durable;
        view
    }

    fn channel(&self, name: &str) -> Result<Channel, String> {
        Channel::new(name).map_err(|e| {
            format!(
                "Refused: {name:?} is not a channel ({e}). Fix: a channel is dot-separated words \
                 such as general or team.backend, without wildcards."
            )
        })
    }

    /// Refuses a channel the space knows nothing of (a likely typo), when the agent may read
    /// or post to it (one it may not is refused in those words by what follows).
    async fn known(&self, channel: &Channel) -> Result<(), String> {
        let mine = |patterns: &[String]| {
            patterns.iter().any(|p| {
                crate::protocol::ChannelPattern::from_policy(p)
                    .is_ok_and(|p| crate::protocol::is_covered(&[p], channel))
            })
        };
        if !mine(&self.grants.read) && !mine(&self.grants.post) {
            return Ok(());
        }
        match self.client.known_channel(channel).await {
            Err(e) => Err(wording::refusal(
                &crate::ops::error_text(&e),
                "Fix: to create it, call again with new: true (cotal_channels lists the \
                 channels).",
            )),
            Ok(()) => Ok(()),
        }
    }

    async fn publish(&self, message: CotalMessage) -> Result<Json<Sent>, String> {
        let sequence = self
            .client
            .publish(&message)
            .await
            .map_err(|e| wording::send_error(&message.routing, &e, &self.grants))?;
        self.threads.record(&message);
        self.sent.record(super::sent::Outgoing {
            id: message.id.clone(),
            routing: message.routing.clone(),
            sequence,
            preview: text_of(&message.parts)
                .chars()
                .take(PREVIEW_CHARS)
                .collect(),
        });
        let receipt = self.client.receipt(&message.routing).await;
        Ok(Json(Sent {
            id: message.id,
            sequence,
            delivered: match &receipt {
                Ok(r) => r.words(),
                Err(e) => format!("where it went is unknown: {}", wording::other_error(e)),
            },
            receipt: receipt.ok().and_then(|r| serde_json::to_value(r).ok()),
        }))
    }

    /// A message of `text` (refused when it says nothing: an empty message is never meant).
    fn draft(
        &self,
        routing: Routing,
        text: String,
        reply_to: Option<String>,
    ) -> Result<CotalMessage, String> {
        if text.trim().is_empty() {
            return Err(wording::refusal(
                "the text is empty",
                "Fix: say something in text.",
            ));
        }
        let mut message = CotalMessage::new(
            self.client.space(),
            self.client.endpoint(),
            routing,
            vec![Part::text(text)],
        );
        message.reply_to = reply_to.filter(|r| !r.is_empty());
        message.context_id = message
            .reply_to
            .as_deref()
            .map(|parent| self.threads.context_for_reply(parent));
        Ok(message)
    }
}

/// A message that was sent.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Sent {
    /// The message id.
    id: String,
    /// Its position in the space's stream (the broker stored it).
    sequence: u64,
    /// Where it went, in words: stored for how many durable members (how many away), how
    /// many received it live (0 is said), whether a DM's target is online, whether anyone
    /// online holds a task's role; "unknown" when the appliance could not say.
    delivered: String,
    /// The same as counts: tier (durable, live, dm, task), durable_members, durable_away,
    /// live_now, target, target_online, role_holders, role_online (absent = unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    receipt: Option<Value>,
}

// ----- arguments -----

/// Arguments of cotal_send.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendArgs {
    /// The channel, e.g. general or team.backend (must be one you may post to).
    channel: String,
    /// The message text.
    text: String,
    /// Names of peers to mention; a mentioned peer gets the message even if it did not join
    /// the channel or is away.
    #[serde(default)]
    mentions: Vec<String>,
    /// The id of the message this answers.
    #[serde(default)]
    reply_to: Option<String>,
    /// Post to a channel that has no config and no messages yet, creating it (without it such
    /// a post is refused as a likely typo, naming the closest channel).
    #[serde(default)]
    new: bool,
}

/// Arguments of cotal_dm.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct DmArgs {
    /// The peer: its name (as in cotal_roster) or its instance id.
    to: String,
    /// The message text.
    text: String,
    /// The id of the message this answers.
    #[serde(default)]
    reply_to: Option<String>,
}

/// Arguments of cotal_anycast.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct AnycastArgs {
    /// The role, e.g. reviewer: exactly one of its holders gets the message, now or when one
    /// connects.
    role: String,
    /// The message text (typically a task).
    text: String,
    /// The id of the message this answers.
    #[serde(default)]
    reply_to: Option<String>,
}

/// Arguments of cotal_inbox.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct InboxArgs {
    /// The most messages to return (default 20, at most 200); the rest stay for the next call.
    #[serde(default)]
    limit: Option<usize>,
    /// Look without consuming: nothing is acknowledged, the same messages come again.
    #[serde(default)]
    peek: bool,
    /// Unless something you have not seen waits, block up to this many seconds (at most 300)
    /// for the next message or notice. What a peek showed you does not end a wait.
    #[serde(default)]
    wait: Option<u64>,
}

/// Arguments of cotal_thread.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ThreadArgs {
    /// A message id (any message of the thread), or a thread id as a message's thread shows.
    id: String,
    /// Where to start, counted in messages of the thread (default 0, the first).
    #[serde(default)]
    start: Option<usize>,
    /// The most messages to return (default 50, at most 200).
    #[serde(default)]
    limit: Option<usize>,
}

/// Arguments of cotal_receipts.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct ReceiptsArgs {
    /// One message you sent, by id; without it, your most recent sends.
    #[serde(default)]
    id: Option<String>,
    /// How many of your most recent sends (default 10, at most 50).
    #[serde(default)]
    limit: Option<usize>,
}

/// Arguments of cotal_roster.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct RosterArgs {
    /// Also list peers that are offline.
    #[serde(default)]
    include_offline: bool,
}

/// Arguments naming one channel.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ChannelArgs {
    /// The channel, e.g. general or team.backend.
    channel: String,
}

/// Arguments of cotal_join.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct JoinArgs {
    /// The channel (or a pattern within your read permissions, e.g. team.>).
    channel: String,
    /// Replay the channel's recent history into your inbox, as its config says (default true).
    #[serde(default)]
    history: Option<bool>,
    /// Join a channel that has no config and no messages yet (without it such a join is
    /// refused as a likely typo, naming the closest channel).
    #[serde(default)]
    new: bool,
}

/// Arguments of cotal_history.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct HistoryArgs {
    /// The channel.
    channel: String,
    /// The most recent messages to return (default 30, at most 500).
    #[serde(default)]
    limit: Option<usize>,
}

/// A presence status you can declare.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StatusWord {
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
pub enum AttentionWord {
    /// Everything is welcome.
    Open,
    /// Do not disturb.
    Dnd,
    /// Focused: only what matters.
    Focus,
}

/// Arguments of cotal_status.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct StatusArgs {
    /// idle, working or waiting (unchanged when absent).
    #[serde(default)]
    status: Option<StatusWord>,
    /// What you are doing, in a few words (an empty text clears it; unchanged when absent,
    /// except that idle clears it).
    #[serde(default)]
    activity: Option<String>,
    /// open, dnd or focus (unchanged when absent).
    #[serde(default)]
    attention: Option<AttentionWord>,
}

/// A per-channel mode.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModeWord {
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
pub struct ChannelModeArgs {
    /// The channel.
    channel: String,
    /// normal, quiet, muted, or all (normal, and every message here wakes you).
    mode: ModeWord,
}

/// A skill on your card.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct SkillArg {
    /// A short id, e.g. rust-review.
    id: String,
    /// Its display name.
    name: String,
    /// What it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
}

/// Arguments of cotal_persona.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct PersonaArgs {
    /// One line about you (unchanged when absent; an empty text clears it).
    #[serde(default)]
    description: Option<String>,
    /// Capability tags, e.g. ["rust", "review"] (replace the old ones; unchanged when absent).
    #[serde(default)]
    tags: Option<Vec<String>>,
    /// Skills (replace the old ones; unchanged when absent).
    #[serde(default)]
    skills: Option<Vec<SkillArg>>,
}

/// Arguments of cotal_reconnect.
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct ReconnectArgs {
    /// Drop the connection and connect again now (default: only report the state).
    #[serde(default)]
    force: bool,
}

// ----- results -----

/// What cotal_inbox returns.
#[derive(Debug, Serialize, JsonSchema)]
pub struct InboxView {
    /// The messages, oldest first.
    messages: Vec<MessageView>,
    /// How many more wait (call again to read them): what is addressed to you comes first.
    remaining: usize,
    /// Of those, how many by kind.
    left: super::inbox::Left,
    /// The messages of this answer that belong to a thread, by thread (cotal_thread reads
    /// one whole).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    threads: BTreeMap<String, Vec<String>>,
    /// Whether this was a peek (nothing consumed).
    peeked: bool,
    /// Live channel messages dropped because too many waited unread, per channel (read them
    /// with cotal_history).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    overflow: BTreeMap<String, u64>,
    /// What else happened (joins, refusals, connection gaps).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notices: Vec<String>,
    /// Acknowledgements that failed (those messages may come again).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ack_errors: Vec<String>,
    /// Present while the session is still starting: what is under way (the answer may miss
    /// messages that waited for you; ask again shortly).
    #[serde(skip_serializing_if = "Option::is_none")]
    starting: Option<String>,
}

impl InboxView {
    /// A page of `messages`, grouped by thread where that fits the page.
    fn page(
        messages: Vec<MessageView>,
        notices: Vec<String>,
        remaining: usize,
        left: super::inbox::Left,
        starting: Option<String>,
        peeked: bool,
    ) -> InboxView {
        let mut threads: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for m in &messages {
            if let Some(thread) = &m.thread {
                threads
                    .entry(thread.clone())
                    .or_default()
                    .push(m.id.clone());
            }
        }
        let mut view = InboxView {
            messages,
            remaining,
            left,
            threads,
            peeked,
            overflow: BTreeMap::new(),
            notices,
            ack_errors: Vec::new(),
            starting,
        };
        // The grouping repeats ids: it goes when it would take the page past its bound (each
        // message still names its thread).
        if page::json_len(&view) + page::ENVELOPE_SLACK > page::PAGE_BYTES {
            view.threads.clear();
        }
        view
    }
}

/// One peer in the roster.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PeerView {
    /// Instance id.
    id: String,
    /// Display name.
    name: String,
    /// agent or endpoint.
    kind: Value,
    /// Anycast role.
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<String>,
    /// idle, working, waiting or offline.
    status: String,
    /// What it says it is doing.
    #[serde(skip_serializing_if = "Option::is_none")]
    activity: Option<String>,
    /// Its attention mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    attention: Option<Value>,
    /// One line about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    /// Its tags.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tags: Vec<String>,
    /// Whether this is you.
    you: bool,
}

/// What cotal_roster returns.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RosterView {
    /// The peers.
    peers: Vec<PeerView>,
    /// True while the connection is down: statuses are as last seen.
    stale: bool,
}

/// One channel as you see it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ChannelView {
    /// The channel.
    channel: String,
    /// Whether you receive it now.
    joined: bool,
    /// Whether your credential lets you read it.
    may_read: bool,
    /// Whether your credential lets you post to it.
    may_post: bool,
    /// Its one-line purpose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) description: Option<String>,
    /// How to use it (follow these when posting).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) instructions: Option<String>,
    /// live (only while connected) or durable (kept for members while away).
    delivery_class: String,
    /// Whether its history is replayed on join and readable with cotal_history.
    replay: bool,
    /// How far back history goes, e.g. 24h (none: all that is kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    replay_window: Option<String>,
    /// Your mode for it (quiet, muted), if set.
    #[serde(skip_serializing_if = "Option::is_none")]
    your_mode: Option<Value>,
}

/// What cotal_channels returns.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ChannelsView {
    /// The channels: configured, joined, or named by your permissions.
    channels: Vec<ChannelView>,
    /// Patterns you may read.
    may_read: Vec<String>,
    /// Patterns you may post to.
    may_post: Vec<String>,
}

/// What cotal_join and cotal_leave return.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MembershipView {
    /// The channel.
    channel: String,
    /// What happened, e.g. "joined durable general".
    outcome: String,
    /// Whether messages are kept for you while you are away (durable membership).
    durable: bool,
    /// History messages put in your inbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    history_in_inbox: Option<usize>,
}

/// What cotal_receipts returns.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ReceiptsView {
    /// Your sends, newest first.
    sent: Vec<ReadView>,
}

/// Whether one message you sent was read.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ReadView {
    /// Its id.
    id: String,
    /// Where it went: #channel, a DM's target, or a role.
    to: String,
    /// The start of its text.
    text: String,
    /// Whether it was read, in words.
    read: String,
    /// The same as fields (tier; state read/delivered/waiting for a DM or task; due_to and
    /// read_by_at_least for a durable channel); absent when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    receipt: Option<Value>,
}

/// What cotal_thread returns.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ThreadView {
    /// The thread's id.
    thread: String,
    /// Where this page starts in the thread (call again with start = start + the messages
    /// returned to read on).
    start: usize,
    /// The messages, in the order they were sent. A text larger than a page is cut (its
    /// text_part says which bytes); the whole came in your inbox.
    messages: Vec<MessageView>,
    /// How many messages of the thread follow this page.
    more: usize,
    /// Channels whose history could not be read, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unread_history: Vec<String>,
    /// Where the thread was read from.
    scope: String,
}

/// What cotal_history returns.
#[derive(Debug, Serialize, JsonSchema)]
pub struct HistoryView {
    /// The channel.
    channel: String,
    /// Its most recent messages, oldest first (yours included).
    messages: Vec<MessageView>,
}

/// What you declare about yourself.
#[derive(Debug, Serialize, JsonSchema)]
pub struct StatusView {
    /// idle, working or waiting.
    status: String,
    /// What you are doing.
    #[serde(skip_serializing_if = "Option::is_none")]
    activity: Option<String>,
    /// open, dnd or focus.
    attention: String,
    /// Your per-channel modes.
    channel_modes: BTreeMap<String, Value>,
    /// Channels where every message wakes you (mode all; only you see this).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    wake_on_every_message: Vec<String>,
}

/// Your card.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PersonaView {
    /// Your name.
    name: String,
    /// Your instance id.
    id: String,
    /// Your role.
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<String>,
    /// One line about you.
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    /// Your tags.
    tags: Vec<String>,
    /// Your skills.
    skills: Vec<SkillArg>,
}

/// The connection.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ConnectionView {
    /// connected, reconnecting or disconnected.
    state: String,
    /// Whether a reconnect was done by this call.
    reconnected: bool,
}

/// What cotal_connection returns.
#[derive(Debug, Serialize, JsonSchema)]
pub struct HealthView {
    /// ready, starting, degraded, reconnecting or disconnected.
    state: String,
    /// Why it is not ready (empty when it is).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    reasons: Vec<String>,
    /// Seconds since the connection state last changed (absent: not since this session
    /// connected).
    #[serde(skip_serializing_if = "Option::is_none")]
    state_for_s: Option<u64>,
    /// How many times the connection was lost in this session.
    lost: u64,
    /// The last error met: how many seconds ago, and what.
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<ErrorView>,
    /// Messages waiting in your inbox (cotal_inbox reads them).
    inbox_waiting: usize,
    /// Seconds since the oldest of them was sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    oldest_waiting_s: Option<u64>,
    /// What waits for you at the broker, by durable.
    at_broker: Vec<BrokerWaitingView>,
    /// Durables the broker did not describe, and why (their counts are unknown).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    at_broker_unknown: Vec<String>,
    /// Messages this connection sent and received (every protocol message).
    sent: u64,
    /// See sent.
    received: u64,
}

/// An error the connection met.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ErrorView {
    /// How many seconds ago.
    ago_s: u64,
    /// What it was.
    what: String,
}

/// What waits at the broker on one of your durables.
#[derive(Debug, Serialize, JsonSchema)]
pub struct BrokerWaitingView {
    /// What the durable carries.
    what: String,
    /// Copies not yet handed to you.
    not_yet_delivered: u64,
    /// Copies handed to you and not yet acknowledged (in your inbox, or on their way).
    unacknowledged: usize,
    /// Seconds since a copy was last handed to you (absent: never).
    #[serde(skip_serializing_if = "Option::is_none")]
    last_delivered_s: Option<u64>,
}

/// Who you are.
#[derive(Debug, Serialize, JsonSchema)]
pub struct YouView {
    /// Your display name (what others mention and DM).
    name: String,
    /// Your instance id.
    id: String,
    /// Your anycast role: messages sent to it may come to you.
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<String>,
    /// The space.
    space: String,
}

/// What cotal_orientation returns.
#[derive(Debug, Serialize, JsonSchema)]
pub struct OrientationView {
    /// Who you are.
    you: YouView,
    /// The connection state.
    connection: String,
    /// Channel patterns you may read (join).
    may_read: Vec<String>,
    /// Channel patterns you may post to.
    may_post: Vec<String>,
    /// Whether you may send direct messages.
    may_dm: bool,
    /// Whether you may send anycast.
    may_anycast: bool,
    /// Channels you receive now.
    joined: Vec<String>,
    /// What the joins at start said.
    joins_at_start: Vec<String>,
    /// Peers online now (not you).
    present: Vec<PeerView>,
    /// What you declare.
    your_status: StatusView,
    /// Messages waiting in your inbox.
    waiting: usize,
    /// Present while the session is still starting: what is under way (`joined` and `waiting`
    /// may not be complete yet; ask again shortly).
    #[serde(skip_serializing_if = "Option::is_none")]
    starting: Option<String>,
    /// How to work here: on the first call of a session (the server's instructions carry it
    /// too).
    #[serde(skip_serializing_if = "Option::is_none")]
    guide: Option<String>,
}

/// How many characters of an instance id a message shows of its sender.
pub const SHORT_ID: usize = 12;

fn status_view(d: &crate::client::Declared, prefs: &super::wake::Prefs) -> StatusView {
    let mut every: Vec<String> = prefs
        .every_message
        .lock()
        .map(|e| e.iter().cloned().collect())
        .unwrap_or_default();
    every.sort_unstable();
    StatusView {
        status: d.status.as_str().to_owned(),
        activity: d.activity.clone(),
        attention: match d.attention {
            None | Some(AttentionMode::Open) => "open",
            Some(AttentionMode::Dnd) => "dnd",
            Some(AttentionMode::Focus) => "focus",
        }
        .to_owned(),
        channel_modes: d
            .channel_modes
            .iter()
            .map(|(c, m)| (c.clone(), serde_json::to_value(m).unwrap_or_default()))
            .collect(),
        wake_on_every_message: every,
    }
}

fn state_word(state: ConnectionState) -> &'static str {
    match state {
        ConnectionState::Connected => "connected",
        ConnectionState::Reconnecting => "reconnecting",
        ConnectionState::Disconnected => "disconnected",
    }
}

pub(super) fn channel_view(
    server: &CotalServer,
    channel: &Channel,
    config: Option<&ChannelConfig>,
    defaults: Option<&ChannelDefaults>,
    joined: bool,
) -> ChannelView {
    let effective = resolve(config, defaults);
    let modes = server.client.declared().channel_modes;
    ChannelView {
        channel: channel.as_str().to_owned(),
        joined,
        may_read: server.grants.may_read(channel),
        may_post: server.grants.may_post(channel),
        description: config
            .and_then(|c| c.description.as_ref())
            .and_then(|d| serde_json::to_value(d).ok())
            .and_then(|v| v.as_str().map(str::to_owned)),
        instructions: config
            .and_then(|c| c.instructions.as_ref())
            .and_then(|d| serde_json::to_value(d).ok())
            .and_then(|v| v.as_str().map(str::to_owned)),
        delivery_class: match effective.delivery_class {
            DeliveryClass::Live => "live",
            DeliveryClass::Durable => "durable",
        }
        .to_owned(),
        replay: effective.replay,
        replay_window: effective.replay_window.map(|w| w.as_str().to_owned()),
        your_mode: modes
            .get(channel.as_str())
            .and_then(|m| serde_json::to_value(m).ok()),
    }
}

#[tool_router(router = tool_router, vis = "pub(super)")]
impl CotalServer {
    /// Call this first. Tells who you are (name, id, role, space), what you may read and post,
    /// the channels you receive, who is present, what you declare about yourself, how many
    /// messages wait for you, and how to work in the space.
    #[tool(name = "cotal_orientation")]
    async fn orientation(&self) -> Result<Json<OrientationView>, String> {
        let starting = self.started().await;
        let _ = tokio::time::timeout(ROSTER_LOAD, self.client.roster().loaded()).await;
        let card = self.client.card();
        let connection = state_word(*self.client.state().borrow()).to_owned();
        let present = self
            .peer_views(false)
            .into_iter()
            .filter(|p| !p.you)
            .collect();
        Ok(Json(OrientationView {
            you: YouView {
                name: card.name,
                id: card.id,
                role: card.role,
                space: self.client.space().to_owned(),
            },
            connection,
            may_read: self.grants.read.clone(),
            may_post: self.grants.post.clone(),
            may_dm: self.grants.dm,
            may_anycast: self.grants.anycast,
            joined: self.client.joined().await,
            joins_at_start: self.boot.lock().map(|b| b.clone()).unwrap_or_default(),
            present,
            your_status: status_view(&self.client.declared(), &self.prefs),
            waiting: self.inbox.waiting().await,
            starting,
            guide: (!self.guided.swap(true, std::sync::atomic::Ordering::Relaxed))
                .then(|| wording::GUIDE.to_owned()),
        }))
    }

    /// Post a message to a channel; everyone who joined it gets it. Read the channel's
    /// instructions first (cotal_channel_info). Mention peers by name to be sure they see it;
    /// set reply_to to the id of the message you answer.
    #[tool(name = "cotal_send")]
    async fn send(&self, Parameters(args): Parameters<SendArgs>) -> Result<Json<Sent>, String> {
        let channel = self.channel(&args.channel)?;
        if !args.new {
            self.known(&channel).await?;
        }
        let message = self
            .draft(Routing::channel(&channel), args.text, args.reply_to)?
            .with_mentions(&args.mentions);
        self.publish(message).await
    }

    /// Send a direct message to one peer, by name (as cotal_roster shows it), short id or
    /// instance id; a peer that is away is found by name too when you received a message from
    /// it, or when it was minted on this machine. Only that peer reads it; it is kept for the
    /// peer until it reads it, even if it is away.
    #[tool(name = "cotal_dm")]
    async fn dm(&self, Parameters(args): Parameters<DmArgs>) -> Result<Json<Sent>, String> {
        let _ = tokio::time::timeout(ROSTER_LOAD, self.client.roster().loaded()).await;
        let to: InstanceId = self
            .client
            .roster()
            .resolve(&args.to)
            .map_err(|e| wording::resolve_error(&e))?;
        let message = self.draft(Routing::to(&to), args.text, args.reply_to)?;
        self.publish(message).await
    }

    /// Send a message to a role (anycast): exactly one holder of the role gets it, now or when
    /// one connects. Use it to hand out a task without choosing who does it.
    #[tool(name = "cotal_anycast")]
    async fn anycast(
        &self,
        Parameters(args): Parameters<AnycastArgs>,
    ) -> Result<Json<Sent>, String> {
        let routing = Routing::to_service(args.role.clone());
        // A task for a role no identity holds would be discarded: refused before it is sent.
        if let Ok(receipt) = self.client.receipt(&routing).await
            && receipt.role_holders == Some(0)
        {
            return Err(wording::refusal(
                &format!(
                    "no identity of this space holds role {}, so the task would be discarded",
                    args.role
                ),
                "Fix: cotal_roster shows the roles peers hold; the operator mints a holder with \
                 `cotald mint NAME --role ROLE`.",
            ));
        }
        let message = self.draft(routing, args.text, args.reply_to)?;
        self.publish(message).await
    }

    /// Read what arrived for you since the last call, oldest first: channel messages, direct
    /// messages, anycast tasks, messages kept for you while away, mentions. What this returns
    /// is consumed (acknowledged, it will not come again); what it does not return stays for
    /// the next call. peek looks without consuming. wait blocks until something you have not
    /// seen arrives (use it when you are idle and waiting for others; what a peek showed does
    /// not count). Also reports notices and any overflow.
    #[tool(name = "cotal_inbox")]
    async fn inbox(
        &self,
        Parameters(args): Parameters<InboxArgs>,
    ) -> Result<Json<InboxView>, String> {
        let limit = args.limit.unwrap_or(INBOX_DEFAULT).clamp(1, INBOX_MAX);
        let starting = self.started().await;
        if let Some(wait) = args.wait.filter(|w| *w > 0) {
            self.inbox
                .wait(Duration::from_secs(wait.min(WAIT_MAX)))
                .await;
        }
        let budget = page::PAGE_BYTES - page::ENVELOPE_SLACK;
        let fit = |d: &Delivery, from, room| page::fit(self.view_delivery(d), from, room, budget);
        if args.peek {
            let (messages, notices, remaining, left) = self.inbox.peek(limit, budget, fit).await;
            return Ok(Json(InboxView::page(
                messages, notices, remaining, left, starting, true,
            )));
        }
        let taken = self.inbox.take(limit, budget, fit).await;
        let mut ack_errors = Vec::new();
        let read_all = !taken.deliveries.is_empty() && taken.remaining == 0;
        for delivery in taken.deliveries {
            let id: String = delivery.message.id.chars().take(SHORT_ID * 3).collect();
            // Acknowledged once it is in the answer (§8), and only then.
            if let Err(e) = delivery.ack().await {
                ack_errors.push(format!("{id}: {}", crate::ops::error_text(&e)));
            }
        }
        if ack_errors.len() > ACK_ERRORS_SHOWN {
            let more = ack_errors.len() - ACK_ERRORS_SHOWN;
            ack_errors.truncate(ACK_ERRORS_SHOWN);
            ack_errors.push(format!("and {more} more"));
        }
        // Everything given is read: a next session replays the live channels only after now.
        // A call that read nothing moves no mark (and asks the broker nothing).
        if read_all && let Err(e) = self.client.mark_read().await {
            tracing::debug!(error = %e, "replay mark not recorded");
        }
        let mut view = InboxView::page(
            taken.views,
            taken.notices,
            taken.remaining,
            taken.left,
            starting,
            false,
        );
        view.overflow = taken.overflow;
        view.ack_errors = ack_errors;
        Ok(Json(view))
    }

    /// Who is in the space: name, id, role, status (idle/working/waiting/offline), what they
    /// are doing, their attention mode and description. Use names from here for cotal_dm and
    /// mentions.
    #[tool(name = "cotal_roster")]
    async fn roster(
        &self,
        Parameters(args): Parameters<RosterArgs>,
    ) -> Result<Json<RosterView>, String> {
        let _ = tokio::time::timeout(ROSTER_LOAD, self.client.roster().loaded()).await;
        Ok(Json(RosterView {
            peers: self.peer_views(args.include_offline),
            stale: self.client.roster().is_stale(),
        }))
    }

    /// The channels: the configured ones, the ones you joined, and those your permissions
    /// name, each with its description and instructions, whether you joined it, whether you
    /// may read and post, and its delivery (live or durable) and history settings.
    #[tool(name = "cotal_channels")]
    async fn channels(&self) -> Result<Json<ChannelsView>, String> {
        let registry = self
            .client
            .channel_registry()
            .await
            .map_err(|e| wording::other_error(&e))?;
        let joined = self.client.joined().await;
        let mut names: std::collections::BTreeSet<String> =
            registry.channels.keys().cloned().collect();
        names.extend(joined.iter().cloned());
        names.extend(self.grants.read.iter().cloned());
        names.extend(self.grants.post.iter().cloned());
        let channels = names
            .iter()
            .filter_map(|n| Channel::new(n).ok())
            .map(|c| {
                channel_view(
                    self,
                    &c,
                    registry.channels.get(c.as_str()),
                    registry.defaults.as_ref(),
                    joined.iter().any(|j| j == c.as_str()),
                )
            })
            .collect();
        Ok(Json(ChannelsView {
            channels,
            may_read: self.grants.read.clone(),
            may_post: self.grants.post.clone(),
        }))
    }

    /// One channel: its description, instructions (follow them when posting), delivery and
    /// history settings, whether you joined it and may read and post.
    #[tool(name = "cotal_channel_info")]
    async fn channel_info(
        &self,
        Parameters(args): Parameters<ChannelArgs>,
    ) -> Result<Json<ChannelView>, String> {
        let channel = self.channel(&args.channel)?;
        let registry = self
            .client
            .channel_registry()
            .await
            .map_err(|e| wording::other_error(&e))?;
        let joined = self.client.joined().await;
        Ok(Json(channel_view(
            self,
            &channel,
            registry.channels.get(channel.as_str()),
            registry.defaults.as_ref(),
            joined.iter().any(|j| j == channel.as_str()),
        )))
    }

    /// Join a channel: from now on its messages come to your inbox, and its recent history is
    /// put there too (unless history is false). On a durable channel you become a member:
    /// messages are kept for you while you are away, until you leave.
    #[tool(name = "cotal_join")]
    async fn join(
        &self,
        Parameters(args): Parameters<JoinArgs>,
    ) -> Result<Json<MembershipView>, String> {
        let replay = match args.history {
            Some(false) => Replay::Off,
            _ => Replay::Resume,
        };
        // A concrete channel may be a typo; a pattern names no channel to make.
        if let (false, Ok(channel)) = (args.new, Channel::new(&args.channel)) {
            self.known(&channel).await?;
        }
        let report = self
            .client
            .join(&args.channel, replay)
            .await
            .map_err(|e| wording::join_error(&e, &self.grants))?;
        Ok(Json(MembershipView {
            outcome: report.summary(),
            durable: report.durable == DurableState::Established,
            history_in_inbox: Some(report.backfilled),
            channel: report.channel,
        }))
    }

    /// Leave a channel: its messages stop coming, and on a durable channel your membership
    /// ends (nothing is kept for you any more).
    #[tool(name = "cotal_leave")]
    async fn leave(
        &self,
        Parameters(args): Parameters<ChannelArgs>,
    ) -> Result<Json<MembershipView>, String> {
        match self.client.leave(&args.channel).await {
            Ok(()) => Ok(Json(MembershipView {
                outcome: format!("left {}", args.channel),
                durable: false,
                history_in_inbox: None,
                channel: args.channel,
            })),
            // Not joined in this session, but maybe a durable member from an earlier one.
            Err(JoinError::NotJoined(channel)) => match self.client.durable_leave(&channel).await {
                Ok(m) => Ok(Json(MembershipView {
                    outcome: format!(
                        "left durable {} (nothing after stream sequence {} is kept for you)",
                        m.channel,
                        m.leave_cursor.unwrap_or(m.join_cursor)
                    ),
                    durable: false,
                    history_in_inbox: None,
                    channel: m.channel,
                })),
                Err(_) => Err(wording::join_error(
                    &JoinError::NotJoined(channel),
                    &self.grants,
                )),
            },
            Err(e) => Err(wording::join_error(&e, &self.grants)),
        }
    }

    /// The most recent messages of one channel (yours included), oldest first, without
    /// touching your inbox. Use it to catch up on a channel before posting.
    #[tool(name = "cotal_history")]
    async fn history(
        &self,
        Parameters(args): Parameters<HistoryArgs>,
    ) -> Result<Json<HistoryView>, String> {
        let channel = self.channel(&args.channel)?;
        let limit = args.limit.unwrap_or(HISTORY_DEFAULT).clamp(1, HISTORY_MAX);
        // The broker would refuse the read too, but only as a timeout.
        if !self.grants.may_read(&channel) {
            return Err(wording::unreadable(&channel, &self.grants));
        }
        let messages = self
            .client
            .history(&channel, limit)
            .await
            .map_err(|e| wording::other_error(&e))?;
        for m in &messages {
            self.threads.record(m);
        }
        Ok(Json(HistoryView {
            channel: channel.as_str().to_owned(),
            messages: messages.iter().map(|m| self.view_message(m)).collect(),
        }))
    }

    /// Whether what you sent was read: for each DM, whether the recipient acknowledged it,
    /// has it, or not yet; for each task, whether a holder took it; for a durable channel,
    /// how many members acknowledged it (at least). Your most recent sends, or one by id.
    #[tool(name = "cotal_receipts")]
    async fn receipts(
        &self,
        Parameters(args): Parameters<ReceiptsArgs>,
    ) -> Result<Json<ReceiptsView>, String> {
        let limit = args
            .limit
            .unwrap_or(RECEIPTS_DEFAULT)
            .clamp(1, RECEIPTS_MAX);
        let picked = self.sent.pick(args.id.as_deref(), limit);
        if let Some(id) = &args.id
            && picked.is_empty()
        {
            return Err(wording::refusal(
                &format!("this session sent no message {id} it still remembers"),
                "Fix: pass the id a send returned, or leave id out for your recent sends.",
            ));
        }
        let mut sent = Vec::with_capacity(picked.len());
        for m in picked {
            let receipt = self.client.read_receipt(&m.routing, m.sequence).await;
            let to = match &m.routing {
                Routing::Channel(c) => format!("#{c}"),
                Routing::To(id) => self
                    .client
                    .roster()
                    .name_of(id)
                    .unwrap_or_else(|| id.clone()),
                Routing::ToService(role) => format!("role {role}"),
            };
            sent.push(ReadView {
                id: m.id,
                to,
                text: m.preview,
                read: match &receipt {
                    Ok(r) => r.words(),
                    Err(e) => format!("unknown: {}", wording::other_error(e)),
                },
                receipt: receipt.ok().and_then(|r| serde_json::to_value(r).ok()),
            });
        }
        Ok(Json(ReceiptsView { sent }))
    }

    /// A conversation in the order it was written: the message with this id and every reply
    /// in its thread (by reply_to and context_id), or a thread id as messages show it. Read
    /// from what this session received and sent and from the history of the channels the
    /// thread ran on. Returns at most limit messages from start (a page, never over 64 KB);
    /// more says how many follow.
    #[tool(name = "cotal_thread")]
    async fn thread(
        &self,
        Parameters(args): Parameters<ThreadArgs>,
    ) -> Result<Json<ThreadView>, String> {
        let thread = self.threads.resolve(&args.id);
        // The channels the thread ran on: their history holds what came before this session.
        let mut channels: Vec<String> = self
            .threads
            .messages(&thread)
            .iter()
            .filter_map(|m| match &m.routing {
                Routing::Channel(c) => Some(c.clone()),
                _ => None,
            })
            .collect();
        channels.sort_unstable();
        channels.dedup();
        let mut unread = Vec::new();
        for name in channels.iter().take(THREAD_CHANNELS) {
            let Ok(channel) = Channel::new(name) else {
                continue;
            };
            if !self.grants.may_read(&channel) {
                continue;
            }
            match self.client.history(&channel, THREAD_HISTORY).await {
                Ok(messages) => messages.iter().for_each(|m| self.threads.record(m)),
                Err(e) => unread.push(format!("#{name}: {}", wording::other_error(&e))),
            }
        }
        let all = self.threads.messages(&thread);
        if all.is_empty() {
            return Err(wording::refusal(
                &format!("no message of thread {} is known to this session", args.id),
                "Fix: pass a message id as cotal_inbox or cotal_history show it, or the \
                 thread a message names.",
            ));
        }
        let start = args.start.unwrap_or(0).min(all.len());
        let limit = args.limit.unwrap_or(THREAD_DEFAULT).clamp(1, THREAD_MAX);
        let budget = page::PAGE_BYTES - page::ENVELOPE_SLACK;
        let mut used = 0;
        let mut messages = Vec::new();
        for m in all.iter().skip(start).take(limit) {
            let Some(fitted) = page::fit(self.view_message(m), 0, budget - used, budget) else {
                break;
            };
            let cut = fitted.text_to.is_some();
            if cut && !messages.is_empty() {
                break;
            }
            used += fitted.bytes;
            messages.push(fitted.view);
            if cut {
                break;
            }
        }
        Ok(Json(ThreadView {
            more: all.len() - start - messages.len(),
            thread,
            start,
            messages,
            unread_history: unread,
            scope: "what this session received, sent and read with cotal_history, and the \
                    history of the thread's channels; DMs from before this session are not \
                    included"
                .to_owned(),
        }))
    }

    /// Declare what you are doing, so others know whether to wait for you: status (idle,
    /// working, waiting), a short activity, and your attention (open, dnd, focus). Set working
    /// when you take a task and idle when done. Without arguments, shows what you declare.
    #[tool(name = "cotal_status")]
    async fn status(
        &self,
        Parameters(args): Parameters<StatusArgs>,
    ) -> Result<Json<StatusView>, String> {
        let now = self.client.declared();
        if args.status.is_some() || args.activity.is_some() {
            let status = match args.status {
                Some(StatusWord::Idle) => PresenceStatus::Idle,
                Some(StatusWord::Working) => PresenceStatus::Working,
                Some(StatusWord::Waiting) => PresenceStatus::Waiting,
                None => now.status,
            };
            let activity = match args.activity {
                Some(a) if a.is_empty() => None,
                Some(a) => Some(a),
                // Idle is done with what it was doing: the activity goes with it.
                None if matches!(args.status, Some(StatusWord::Idle)) => None,
                None => now.activity,
            };
            self.client
                .set_status(status, activity)
                .await
                .map_err(|e| wording::other_error(&e))?;
        }
        if let Some(attention) = args.attention {
            let mode = match attention {
                AttentionWord::Open => None,
                AttentionWord::Dnd => Some(AttentionMode::Dnd),
                AttentionWord::Focus => Some(AttentionMode::Focus),
            };
            self.client
                .set_attention(mode)
                .await
                .map_err(|e| wording::other_error(&e))?;
        }
        Ok(Json(status_view(&self.client.declared(), &self.prefs)))
    }

    /// Set how a channel concerns you (advisory, others see it): quiet, muted, or normal to
    /// clear; all also wakes you for every message there (yours alone, others do not see it).
    /// Returns everything you declare.
    #[tool(name = "cotal_channel_mode")]
    async fn channel_mode(
        &self,
        Parameters(args): Parameters<ChannelModeArgs>,
    ) -> Result<Json<StatusView>, String> {
        let channel = self.channel(&args.channel)?;
        let mode = match args.mode {
            ModeWord::Normal | ModeWord::All => None,
            ModeWord::Quiet => Some(ChannelMode::Quiet),
            ModeWord::Muted => Some(ChannelMode::Muted),
        };
        if let Ok(mut every) = self.prefs.every_message.lock() {
            match args.mode {
                ModeWord::All => every.insert(channel.as_str().to_owned()),
                _ => every.remove(channel.as_str()),
            };
        }
        self.client
            .set_channel_mode(&channel, mode)
            .await
            .map_err(|e| wording::other_error(&e))?;
        Ok(Json(status_view(&self.client.declared(), &self.prefs)))
    }

    /// Describe yourself to others (your card): a one-line description, tags and skills. Your
    /// name, id and role come from your credential. Without arguments, shows your card.
    #[tool(name = "cotal_persona")]
    async fn persona(
        &self,
        Parameters(args): Parameters<PersonaArgs>,
    ) -> Result<Json<PersonaView>, String> {
        let card = self.client.card();
        if args.description.is_some() || args.tags.is_some() || args.skills.is_some() {
            let description = match args.description {
                Some(d) if d.is_empty() => None,
                Some(d) => Some(d),
                None => card.description.clone(),
            };
            let tags = args.tags.unwrap_or(card.tags.clone());
            let skills = match args.skills {
                Some(skills) => skills
                    .into_iter()
                    .map(|s| AgentSkill {
                        id: s.id,
                        name: s.name,
                        description: s.description,
                        extra: Default::default(),
                    })
                    .collect(),
                None => card.skills.clone(),
            };
            self.client
                .set_persona(description, tags, skills)
                .await
                .map_err(|e| wording::other_error(&e))?;
        }
        let card = self.client.card();
        Ok(Json(PersonaView {
            name: card.name,
            id: card.id,
            role: card.role,
            description: card.description,
            tags: card.tags,
            skills: card
                .skills
                .into_iter()
                .map(|s| SkillArg {
                    id: s.id,
                    name: s.name,
                    description: s.description,
                })
                .collect(),
        }))
    }

    /// Whether you are cut off or simply unanswered: the connection's state (ready, starting,
    /// degraded, reconnecting, disconnected) and why it is not ready, the last error, what
    /// waits in your inbox (and since when) and what waits for you at the broker.
    #[tool(name = "cotal_connection")]
    async fn connection(&self) -> Result<Json<HealthView>, String> {
        let health = self.client.health();
        let (waiting, unknown) = self.client.durables_waiting().await;
        let starting = self.started_now();
        let ago = |t: std::time::SystemTime| t.elapsed().map_or(0, |d| d.as_secs());
        let mut reasons: Vec<String> = starting.iter().cloned().collect();
        reasons.extend(health.troubles(&waiting));
        reasons.extend(unknown.iter().map(|u| format!("unknown: {u}")));
        let state = match health.state {
            ConnectionState::Reconnecting => "reconnecting",
            ConnectionState::Disconnected => "disconnected",
            ConnectionState::Connected if starting.is_some() => "starting",
            ConnectionState::Connected if !reasons.is_empty() => "degraded",
            ConnectionState::Connected => "ready",
        };
        let now_ms = crate::protocol::EpochMillis::now().as_f64().unwrap_or(0.0);
        Ok(Json(HealthView {
            state: state.to_owned(),
            reasons,
            state_for_s: health.since.map(ago),
            lost: health.lost,
            last_error: health.last_error.map(|(at, what)| ErrorView {
                ago_s: ago(at),
                what,
            }),
            inbox_waiting: self.inbox.waiting().await,
            oldest_waiting_s: self
                .inbox
                .oldest_sent()
                .await
                .map(|ts| ((now_ms - ts).max(0.0) / 1000.0) as u64),
            at_broker: waiting
                .into_iter()
                .map(|d| BrokerWaitingView {
                    what: d.what.to_owned(),
                    not_yet_delivered: d.pending,
                    unacknowledged: d.unacknowledged,
                    last_delivered_s: d.last_delivered.map(ago),
                })
                .collect(),
            at_broker_unknown: unknown,
            sent: health.sent,
            received: health.received,
        }))
    }

    /// The connection to the space (connected, reconnecting, disconnected). With force, drop
    /// it and connect again now (channels, DMs and presence come back by themselves).
    #[tool(name = "cotal_reconnect")]
    async fn reconnect(
        &self,
        Parameters(args): Parameters<ReconnectArgs>,
    ) -> Result<Json<ConnectionView>, String> {
        let mut state = self.client.state();
        if args.force {
            self.client
                .force_reconnect()
                .await
                .map_err(|e| wording::other_error(&e))?;
            let _ = tokio::time::timeout(
                Duration::from_secs(10),
                state.wait_for(|s| *s == ConnectionState::Connected),
            )
            .await;
        }
        let now = *state.borrow();
        Ok(Json(ConnectionView {
            state: state_word(now).to_owned(),
            reconnected: args.force,
        }))
    }
}

impl CotalServer {
    fn peer_views(&self, include_offline: bool) -> Vec<PeerView> {
        let roster = self.client.roster();
        let me = self.client.id().as_str().to_owned();
        roster
            .peers()
            .into_iter()
            .filter_map(|(id, peer)| {
                let status = roster.status(&id).unwrap_or(PresenceStatus::Offline);
                if status == PresenceStatus::Offline && !include_offline {
                    return None;
                }
                let card = &peer.presence.card;
                Some(PeerView {
                    you: id == me,
                    name: card.name.clone(),
                    kind: serde_json::to_value(card.kind).unwrap_or_default(),
                    role: card.role.clone(),
                    status: status.as_str().to_owned(),
                    activity: peer.presence.activity.clone(),
                    attention: peer
                        .presence
                        .attention
                        .and_then(|a| serde_json::to_value(a).ok()),
                    description: card.description.clone(),
                    tags: card.tags.clone(),
                    id,
                })
            })
            .collect()
    }
}
