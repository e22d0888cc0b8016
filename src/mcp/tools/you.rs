//! The tools of the agent itself: what it declares (`cotal_status`, `cotal_channel_mode`,
//! `cotal_persona`, §6) and its connection (`cotal_connection`, `cotal_reconnect`).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};

use super::{state_word, status_view};
use crate::client::ConnectionState;
use crate::mcp::CotalServer;
use crate::mcp::args::AttentionWord;
use crate::mcp::args::ChannelModeArgs;
use crate::mcp::args::ModeWord;
use crate::mcp::args::PersonaArgs;
use crate::mcp::args::ReconnectArgs;
use crate::mcp::args::SkillArg;
use crate::mcp::args::StatusArgs;
use crate::mcp::args::StatusWord;
use crate::mcp::views::BrokerWaitingView;
use crate::mcp::views::ConnectionView;
use crate::mcp::views::ErrorView;
use crate::mcp::views::HealthView;
use crate::mcp::views::PersonaView;
use crate::mcp::views::StatusView;
use crate::mcp::wording;
use crate::protocol::AgentSkill;
use crate::protocol::AttentionMode;
use crate::protocol::ChannelMode;
use crate::protocol::PresenceStatus;
use std::time::Duration;

#[tool_router(router = you_router, vis = "pub(in crate::mcp)")]
impl CotalServer {
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
