//! The tools of the space around the agent: who is in it (`cotal_roster`), its channels
//! (`cotal_channels`, `cotal_channel_info`) and the agent's memberships (`cotal_join`,
//! `cotal_leave`, §7).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};

use super::{ROSTER_LOAD, channel_view};
use crate::client::DurableState;
use crate::client::JoinError;
use crate::client::Replay;
use crate::mcp::CotalServer;
use crate::mcp::args::ChannelArgs;
use crate::mcp::args::JoinArgs;
use crate::mcp::args::RosterArgs;
use crate::mcp::views::ChannelView;
use crate::mcp::views::ChannelsView;
use crate::mcp::views::MembershipView;
use crate::mcp::views::RosterView;
use crate::mcp::wording;
use crate::protocol::Channel;

#[tool_router(router = space_router, vis = "pub(in crate::mcp)")]
impl CotalServer {
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
}
