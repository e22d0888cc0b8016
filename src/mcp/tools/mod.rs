//! The `cotal_*` tools: arguments and results as JSON schemas (the doc comments are what the
//! agent reads), each thin over the [`Client`](crate::client::Client).

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};

use super::args::{AnycastArgs, DmArgs, HistoryArgs, InboxArgs, SendArgs};
use super::views::{
    ChannelView, HistoryView, InboxView, MessageView, OrientationView, PeerView, SHORT_ID, Sent,
    StatusView, Who, YouView,
};
use super::{CotalServer, page, wording};
use crate::client::{ConnectionState, Delivery};
use crate::protocol::{
    AttentionMode, Channel, ChannelConfig, ChannelDefaults, CotalMessage, DeliveryClass,
    InstanceId, Part, PresenceStatus, Routing, resolve,
};

mod follow_up;
mod space;
mod you;

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
        // A reply carries its parent's thread as its context.
        message.context_id = message
            .reply_to
            .as_deref()
            .map(|parent| self.threads.resolve(parent));
        Ok(message)
    }
}
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
        let read_all = !taken.deliveries.is_empty() && taken.remaining == 0;
        // Acknowledged once it is in the answer (§8), and only then; confirmed by the broker, so
        // that the answer can say truly which may come again.
        let acks = taken.deliveries.into_iter().map(|delivery| async move {
            let id: String = delivery.message.id.chars().take(SHORT_ID * 3).collect();
            delivery
                .ack_confirmed()
                .await
                .map_err(|e| format!("{id}: {}", crate::ops::error_text(&e)))
        });
        let mut ack_errors: Vec<String> = futures_util::future::join_all(acks)
            .await
            .into_iter()
            .filter_map(Result::err)
            .collect();
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
