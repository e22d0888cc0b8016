//! What the `cotal_*` tools return: the result shapes as JSON schemas (the doc comments are
//! what the agent reads), built by the handlers in `tools`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use super::args::SkillArg;
use super::page;

/// A sender.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct Who {
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
pub(super) struct MessageView {
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

/// A message that was sent.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct Sent {
    /// The message id.
    pub(super) id: String,
    /// Its position in the space's stream (the broker stored it).
    pub(super) sequence: u64,
    /// Where it went, in words: stored for how many durable members (how many away), how
    /// many received it live (0 is said), whether a DM's target is online, whether anyone
    /// online holds a task's role; "unknown" when the appliance could not say.
    pub(super) delivered: String,
    /// The same as counts: tier (durable, live, dm, task), durable_members, durable_away,
    /// live_now, target, target_online, role_holders, role_online (absent = unknown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) receipt: Option<Value>,
}

/// What cotal_inbox returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct InboxView {
    /// The messages, oldest first.
    pub(super) messages: Vec<MessageView>,
    /// How many more wait (call again to read them): what is addressed to you comes first.
    pub(super) remaining: usize,
    /// Of those, how many by kind.
    pub(super) left: super::inbox::Left,
    /// The messages of this answer that belong to a thread, by thread (cotal_thread reads
    /// one whole).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) threads: BTreeMap<String, Vec<String>>,
    /// Whether this was a peek (nothing consumed).
    pub(super) peeked: bool,
    /// Live channel messages dropped because too many waited unread, per channel (read them
    /// with cotal_history).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) overflow: BTreeMap<String, u64>,
    /// What else happened (joins, refusals, connection gaps).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) notices: Vec<String>,
    /// Acknowledgements the broker did not confirm, as "id: why" (those messages may come
    /// again).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) ack_errors: Vec<String>,
    /// Present while the session is still starting: what is under way (the answer may miss
    /// messages that waited for you; ask again shortly).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) starting: Option<String>,
}

impl InboxView {
    /// A page of `messages`, grouped by thread where that fits the page.
    pub(super) fn page(
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
pub(super) struct PeerView {
    /// Instance id.
    pub(super) id: String,
    /// Display name.
    pub(super) name: String,
    /// agent or endpoint.
    pub(super) kind: Value,
    /// Anycast role.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) role: Option<String>,
    /// idle, working, waiting or offline.
    pub(super) status: String,
    /// What it says it is doing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) activity: Option<String>,
    /// Its attention mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) attention: Option<Value>,
    /// One line about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) description: Option<String>,
    /// Its tags.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) tags: Vec<String>,
    /// Whether this is you.
    pub(super) you: bool,
}

/// What cotal_roster returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct RosterView {
    /// The peers.
    pub(super) peers: Vec<PeerView>,
    /// True while the connection is down: statuses are as last seen.
    pub(super) stale: bool,
}

/// One channel as you see it.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct ChannelView {
    /// The channel.
    pub(super) channel: String,
    /// Whether you receive it now.
    pub(super) joined: bool,
    /// Whether your credential lets you read it.
    pub(super) may_read: bool,
    /// Whether your credential lets you post to it.
    pub(super) may_post: bool,
    /// Its one-line purpose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) description: Option<String>,
    /// How to use it (follow these when posting).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) instructions: Option<String>,
    /// live (only while connected) or durable (kept for members while away).
    pub(super) delivery_class: String,
    /// Whether its history is replayed on join and readable with cotal_history.
    pub(super) replay: bool,
    /// How far back history goes, e.g. 24h (none: all that is kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) replay_window: Option<String>,
    /// Your mode for it (quiet, muted), if set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) your_mode: Option<Value>,
}

/// What cotal_channels returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct ChannelsView {
    /// The channels: configured, joined, or named by your permissions.
    pub(super) channels: Vec<ChannelView>,
    /// Patterns you may read.
    pub(super) may_read: Vec<String>,
    /// Patterns you may post to.
    pub(super) may_post: Vec<String>,
}

/// What cotal_join and cotal_leave return.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct MembershipView {
    /// The channel.
    pub(super) channel: String,
    /// What happened, e.g. "joined durable general".
    pub(super) outcome: String,
    /// Whether messages are kept for you while you are away (durable membership).
    pub(super) durable: bool,
    /// History messages put in your inbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) history_in_inbox: Option<usize>,
}

/// What cotal_receipts returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct ReceiptsView {
    /// Your sends, newest first.
    pub(super) sent: Vec<ReadView>,
}

/// Whether one message you sent was read.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct ReadView {
    /// Its id.
    pub(super) id: String,
    /// Where it went: #channel, a DM's target, or a role.
    pub(super) to: String,
    /// The start of its text.
    pub(super) text: String,
    /// Whether it was read, in words.
    pub(super) read: String,
    /// The same as fields (tier; state read/delivered/waiting for a DM or task; due_to and
    /// read_by_at_least for a durable channel); absent when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) receipt: Option<Value>,
}

/// What cotal_thread returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct ThreadView {
    /// The thread's id.
    pub(super) thread: String,
    /// Where this page starts in the thread (call again with start = start + the messages
    /// returned to read on).
    pub(super) start: usize,
    /// The messages, in the order they were sent. A text larger than a page is cut (its
    /// text_part says which bytes); the whole came in your inbox.
    pub(super) messages: Vec<MessageView>,
    /// How many messages of the thread follow this page.
    pub(super) more: usize,
    /// Channels whose history could not be read, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) unread_history: Vec<String>,
    /// Where the thread was read from.
    pub(super) scope: String,
}

/// What cotal_history returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct HistoryView {
    /// The channel.
    pub(super) channel: String,
    /// Its most recent messages, oldest first (yours included).
    pub(super) messages: Vec<MessageView>,
}

/// What you declare about yourself.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct StatusView {
    /// idle, working or waiting.
    pub(super) status: String,
    /// What you are doing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) activity: Option<String>,
    /// open, dnd or focus.
    pub(super) attention: String,
    /// Your per-channel modes.
    pub(super) channel_modes: BTreeMap<String, Value>,
    /// Channels where every message wakes you (mode all; only you see this).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) wake_on_every_message: Vec<String>,
}

/// Your card.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct PersonaView {
    /// Your name.
    pub(super) name: String,
    /// Your instance id.
    pub(super) id: String,
    /// Your role.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) role: Option<String>,
    /// One line about you.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) description: Option<String>,
    /// Your tags.
    pub(super) tags: Vec<String>,
    /// Your skills.
    pub(super) skills: Vec<SkillArg>,
}

/// The connection.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct ConnectionView {
    /// connected, reconnecting or disconnected.
    pub(super) state: String,
    /// Whether a reconnect was done by this call.
    pub(super) reconnected: bool,
}

/// What cotal_connection returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct HealthView {
    /// ready, starting, degraded, reconnecting or disconnected.
    pub(super) state: String,
    /// Why it is not ready (empty when it is).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) reasons: Vec<String>,
    /// Seconds since the connection state last changed (absent: not since this session
    /// connected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) state_for_s: Option<u64>,
    /// How many times the connection was lost in this session.
    pub(super) lost: u64,
    /// The last error met: how many seconds ago, and what.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) last_error: Option<ErrorView>,
    /// Messages waiting in your inbox (cotal_inbox reads them).
    pub(super) inbox_waiting: usize,
    /// Seconds since the oldest of them was sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) oldest_waiting_s: Option<u64>,
    /// What waits for you at the broker, by durable.
    pub(super) at_broker: Vec<BrokerWaitingView>,
    /// Durables the broker did not describe, and why (their counts are unknown).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) at_broker_unknown: Vec<String>,
    /// Messages this connection sent and received (every protocol message).
    pub(super) sent: u64,
    /// See sent.
    pub(super) received: u64,
}

/// An error the connection met.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct ErrorView {
    /// How many seconds ago.
    pub(super) ago_s: u64,
    /// What it was.
    pub(super) what: String,
}

/// What waits at the broker on one of your durables.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct BrokerWaitingView {
    /// What the durable carries.
    pub(super) what: String,
    /// Copies not yet handed to you.
    pub(super) not_yet_delivered: u64,
    /// Copies handed to you and not yet acknowledged (in your inbox, or on their way).
    pub(super) unacknowledged: usize,
    /// Seconds since a copy was last handed to you (absent: never).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) last_delivered_s: Option<u64>,
}

/// Who you are.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct YouView {
    /// Your display name (what others mention and DM).
    pub(super) name: String,
    /// Your instance id.
    pub(super) id: String,
    /// Your anycast role: messages sent to it may come to you.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) role: Option<String>,
    /// The space.
    pub(super) space: String,
}

/// What cotal_orientation returns.
#[derive(Debug, Serialize, JsonSchema)]
pub(super) struct OrientationView {
    /// Who you are.
    pub(super) you: YouView,
    /// The connection state.
    pub(super) connection: String,
    /// Channel patterns you may read (join).
    pub(super) may_read: Vec<String>,
    /// Channel patterns you may post to.
    pub(super) may_post: Vec<String>,
    /// Whether you may send direct messages.
    pub(super) may_dm: bool,
    /// Whether you may send anycast.
    pub(super) may_anycast: bool,
    /// Channels you receive now.
    pub(super) joined: Vec<String>,
    /// What the joins at start said.
    pub(super) joins_at_start: Vec<String>,
    /// Peers online now (not you).
    pub(super) present: Vec<PeerView>,
    /// What you declare.
    pub(super) your_status: StatusView,
    /// Messages waiting in your inbox.
    pub(super) waiting: usize,
    /// Present while the session is still starting: what is under way (`joined` and `waiting`
    /// may not be complete yet; ask again shortly).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) starting: Option<String>,
    /// How to work here: on the first call of a session (the server's instructions carry it
    /// too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) guide: Option<String>,
}

pub(super) const SHORT_ID: usize = 12;
