//! `cotald mcp`: an MCP server on stdio that makes its host (any AI agent that speaks MCP) a
//! conformant Cotal endpoint (§12).
//!
//! The server holds one [`Client`] for its whole life, so the agent keeps what a short-lived
//! `cotald send` would lose between calls: presence heartbeats while the host runs and a final
//! `offline` when it ends (§6), the joins of the link's channels (the credential's boot
//! channels, §10) with their history and durable membership (§7), its DM durable and, when the
//! credential grants a role, that role's anycast durable (§8). Messages arrive while the agent
//! is busy and wait in the [`inbox`] until it reads them; a copy is acknowledged only when
//! `cotal_inbox` returned it (§8: acked once handled).
//!
//! Each arriving message is also announced as an MCP log notification. The MCP revision of
//! 2026 deprecates logging, but the hosts in use speak the earlier revisions, where it is the
//! one push a host shows; a host that ignores it loses nothing, the inbox has the message.
//!
//! The tools (`cotal_*`, in `tools`, their arguments in `args` and results in `views`) are
//! thin over the client; their descriptions teach an agent when to use each
//! (`wording::GUIDE` is the overview). Errors are tool errors (the
//! agent sees them and can act) worded as refusals with the fix. Each channel with a
//! description or instructions is also a resource (`cotal://channel/<name>`), for hosts that
//! put resources before the agent.

#![allow(deprecated)] // MCP logging: see the module doc.

mod args;
pub mod inbox;
mod page;
mod sent;
mod thread;
mod tools;
mod views;
pub mod wake;
mod wording;

use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourcesResult, LoggingLevel, LoggingMessageNotificationParam, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt, tool_handler};

use crate::binding::{CredsError, SpaceNames, UserPermissions, svc_durable};
use crate::client::{Client, ClientError, ConnectOptions, Delivery, Replay};
use crate::protocol::{Channel, ChannelPattern, SpaceSubjects, is_covered};

use inbox::Inbox;

/// What the credential lets this endpoint do, read from its permissions (Appendix B): the
/// channels it may read and post to, whether it may send DMs and anycast, and the role whose
/// anycast it serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Channel patterns it may read (`>` for everything).
    pub read: Vec<String>,
    /// Channel patterns it may post to.
    pub post: Vec<String>,
    /// Whether it may send direct messages.
    pub dm: bool,
    /// Whether it may send anycast.
    pub anycast: bool,
    /// The role whose anycast durable it may read.
    pub role: Option<String>,
}

impl Grants {
    /// The grants of `permissions` for instance `id` in the space named by `names`.
    pub fn of(permissions: &UserPermissions, names: &SpaceNames, id: &str) -> Grants {
        let chat = names.chat_prefix();
        let everything = |p: &crate::binding::Permission| p.is_unrestricted();
        let read = if everything(&permissions.subscribe) {
            vec![">".to_owned()]
        } else {
            permissions
                .subscribe
                .allow
                .iter()
                .filter_map(|s| s.strip_prefix(&chat))
                .filter_map(|rest| match rest {
                    ">" => Some(">"),
                    _ => rest.strip_prefix("*."),
                })
                .map(str::to_owned)
                .collect()
        };
        let own = format!("{chat}{id}.");
        let post = if everything(&permissions.publish) {
            vec![">".to_owned()]
        } else {
            permissions
                .publish
                .allow
                .iter()
                .filter_map(|s| s.strip_prefix(&own))
                .map(str::to_owned)
                .collect()
        };
        let next = crate::binding::system::consumer_next(&names.task_stream(), &svc_durable(""));
        let role = permissions
            .publish
            .allow
            .iter()
            .find_map(|s| s.strip_prefix(&next))
            .filter(|r| !r.is_empty() && !r.contains(['*', '>']))
            .map(str::to_owned);
        Grants {
            read,
            post,
            dm: permissions.may_publish(&names.dm("X", id)),
            anycast: permissions.may_publish(&names.task("X", id)),
            role,
        }
    }

    fn patterns(list: &[String]) -> Vec<ChannelPattern> {
        list.iter()
            .filter_map(|c| ChannelPattern::from_policy(c).ok())
            .collect()
    }

    /// Whether the read ACL covers `channel`.
    pub fn may_read(&self, channel: &Channel) -> bool {
        is_covered(&Self::patterns(&self.read), channel)
    }

    /// Whether the post ACL covers `channel`.
    pub fn may_post(&self, channel: &Channel) -> bool {
        is_covered(&Self::patterns(&self.post), channel)
    }
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The credential cannot be read.
    #[error("cannot use the credential")]
    Credential(#[from] CredsError),
    /// The space named by the link is not a valid space name.
    #[error("invalid space in the link")]
    Space(#[from] crate::protocol::SubjectError),
    /// Connecting to the space failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The MCP session could not start (the host hung up or spoke no MCP).
    #[error("the MCP session on stdio did not start")]
    Session(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The MCP server: the connected endpoint, its inbox, and the tools over them.
#[derive(Clone)]
pub struct CotalServer {
    client: Client,
    inbox: Arc<Inbox>,
    grants: Arc<Grants>,
    /// What the joins of the boot channels said (or that they are under way).
    boot: Arc<Mutex<Vec<String>>>,
    /// How far the session is from answering exactly.
    start: tokio::sync::watch::Receiver<Start>,
    /// The host: its peer once initialized, its subscription to the inbox.
    host: Arc<wake::Host>,
    /// What wakes the agent.
    prefs: Arc<wake::Prefs>,
    /// The conversations this session saw.
    threads: Arc<thread::Threads>,
    /// What this session sent.
    sent: Arc<sent::SentLog>,
    /// Whether `cotal_orientation` already gave this session the guide.
    guided: Arc<std::sync::atomic::AtomicBool>,
    tool_router: rmcp::handler::server::router::tool::ToolRouter<CotalServer>,
}

/// Connects as `opts` says and serves MCP on stdin/stdout until the host closes it or
/// `shutdown` resolves; then says `offline` and disconnects. The role is the credential's
/// when `opts` names none.
pub async fn serve_stdio(
    mut opts: ConnectOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), McpError> {
    let creds = crate::binding::Creds::parse(&opts.creds)?;
    let claims = creds.claims()?;
    let subjects = SpaceSubjects::new(opts.link.space())?;
    let names = SpaceNames::new(subjects.space().as_str());
    let grants = Grants::of(&claims.permissions, &names, &claims.subject);
    if opts.role.is_none() {
        opts.role = grants.role.clone();
    }
    let boot = opts.link.channels().to_vec();
    let conn = Client::connect(opts).await?;
    let host: Arc<wake::Host> = Arc::default();
    let prefs = Arc::new(wake::Prefs {
        me: conn.client.card().name.to_lowercase(),
        every_message: Default::default(),
    });
    let threads: Arc<thread::Threads> = Arc::default();
    let inbox = start_inbox(conn.deliveries, &conn.client, &host, &prefs, &threads);
    tokio::spawn(wake::run(inbox.clone(), host.clone()));
    let (started, start) = tokio::sync::watch::channel(Start::Joining {
        done: 0,
        of: boot.len(),
    });
    let server = CotalServer {
        client: conn.client.clone(),
        inbox,
        grants: Arc::new(grants),
        boot: Arc::default(),
        start,
        host,
        prefs,
        threads,
        sent: Arc::default(),
        guided: Arc::default(),
        tool_router: CotalServer::tool_router()
            + CotalServer::space_router()
            + CotalServer::follow_up_router()
            + CotalServer::you_router(),
    };
    server.start(boot, started);
    let result = async {
        let running = server
            .clone()
            .serve(rmcp::transport::stdio_pipes())
            .await
            .map_err(|e| McpError::Session(e.into()))?;
        let stop = running.cancellation_token();
        let waiting = running.waiting();
        tokio::pin!(waiting);
        tokio::select! {
            _ = &mut waiting => {}
            () = shutdown => {
                stop.cancel();
                let _ = waiting.await;
            }
        }
        Ok(())
    }
    .await;
    // Nothing is pulled any more, then what the agent did not read goes back.
    let settled = conn.client.stop_receiving().await;
    if !settled.complete() {
        tracing::info!(
            unsettled = settled.unsettled,
            acks_confirmed = settled.acks_confirmed,
            "some of what this session read may be handed again to the next one"
        );
    }
    server.inbox.release().await;
    conn.client.close().await;
    result
}

/// The inbox of the session: every arrival kept for its threads, announced to the host (a
/// log notification; history replayed by a join is not news) and weighed for a wake.
fn start_inbox(
    deliveries: crate::client::Deliveries,
    client: &Client,
    host: &Arc<wake::Host>,
    prefs: &Arc<wake::Prefs>,
    threads: &Arc<thread::Threads>,
) -> Arc<Inbox> {
    let (host, prefs, client) = (host.clone(), prefs.clone(), client.clone());
    let threads = threads.clone();
    Inbox::start(
        deliveries,
        prefs.me.clone(),
        Box::new(move |d| {
            threads.record(&d.message);
            if let Some(peer) = host.peer().filter(|_| !d.historical) {
                let peer = peer.clone();
                let note = arrival_note(d);
                tokio::spawn(async move {
                    let _ = peer.notify_logging_message(note).await;
                });
            }
            prefs.reason(d, &client.declared())
        }),
    )
}

/// The log notification announcing a copy: who, where, and the start of its text.
fn arrival_note(d: &Delivery) -> LoggingMessageNotificationParam {
    let text = tools::text_of(&d.message.parts);
    let preview: String = text.chars().take(200).collect();
    let place = match &d.channel {
        Some(c) => format!("#{c}"),
        None => d.kind.as_str().to_owned(),
    };
    LoggingMessageNotificationParam::new(
        LoggingLevel::Info,
        serde_json::json!({
            "event": "message",
            "id": d.message.id,
            "kind": d.kind.as_str(),
            "channel": d.channel,
            "from": d.message.from.name,
            "summary": format!("{place} {}: {preview}", d.message.from.name),
            "hint": "call cotal_inbox to read it",
        }),
    )
    .with_logger("cotal")
}

/// How far a session is from answering exactly: the link's channels joined (their history in
/// the inbox), then what waited for the endpoint when it connected (its DMs, its role's tasks,
/// its durable channels' backlog) surfaced and in the inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Joining the boot channels: `done` of `of`.
    Joining { done: usize, of: usize },
    /// Receiving what waited.
    Receiving,
    /// Every first answer is exact from now on.
    Ready,
}

/// How long a first answer waits for the session to be [`Start::Ready`] before it says what is
/// still under way instead.
const START_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl CotalServer {
    /// Joins the boot channels in the background (history is surfaced while joining, into the
    /// inbox), each outcome kept for `cotal_orientation` and reported in the inbox; then waits
    /// for the backlog found at connect to be in the inbox, and says so on `started`.
    fn start(&self, channels: Vec<String>, started: tokio::sync::watch::Sender<Start>) {
        let server = self.clone();
        tokio::spawn(async move {
            let of = channels.len();
            for (done, channel) in channels.into_iter().enumerate() {
                started.send_replace(Start::Joining { done, of });
                let said = match server.client.join(&channel, Replay::Resume).await {
                    Ok(report) => report.summary(),
                    Err(e) => format!(
                        "could not join {channel}: {}",
                        wording::join_error(&e, &server.grants)
                    ),
                };
                tracing::info!(channel, outcome = %said, "boot join");
                server
                    .boot
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(said.clone());
                server.inbox.notice(said).await;
            }
            started.send_replace(Start::Receiving);
            server.client.caught_up().await;
            server.inbox.reached(server.client.surfaced()).await;
            started.send_replace(Start::Ready);
        });
    }

    /// Waits (up to [`START_WAIT`]) until the session answers exactly; `None` then, else what
    /// is still under way, for the answer to say.
    pub(super) async fn started(&self) -> Option<String> {
        let mut start = self.start.clone();
        let ready = tokio::time::timeout(START_WAIT, start.wait_for(|s| *s == Start::Ready))
            .await
            .is_ok_and(|r| r.is_ok());
        if ready {
            return None;
        }
        self.started_now()
    }

    /// What is still under way in the session's start, as of now; `None` once it is done.
    pub(super) fn started_now(&self) -> Option<String> {
        let now = *self.start.borrow();
        Some(match now {
            Start::Ready => return None,
            Start::Joining { done, of } => format!(
                "still joining the channels of your link ({done} of {of} done): what waits for \
                 you may not all be here yet; ask again shortly"
            ),
            Start::Receiving => {
                let what = self.client.catching_up();
                let what = match what.is_empty() {
                    true => "what waited for you".to_owned(),
                    false => what.join(", "),
                };
                format!(
                    "still receiving {what} from the broker: not all of it is here yet; ask \
                     again shortly"
                )
            }
        })
    }
}

/// The resource of a channel's description and instructions.
const CHANNEL_RESOURCE: &str = "cotal://channel/";

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CotalServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_experimental_with(
                    [(wake::CHANNEL_CAPABILITY.to_owned(), Default::default())].into(),
                )
                .enable_tools()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_logging()
                .build(),
        )
        .with_server_info(Implementation::new("cotald", env!("CARGO_PKG_VERSION")))
        .with_instructions(wording::GUIDE)
    }

    /// Each tool call, through the router; arguments that do not fit a tool are refused in
    /// the server's words (the fields it needs), not the JSON library's.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = request.name.to_string();
        let call = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        let response = self.tool_router.call(call).await?;
        let CallToolResponse::Complete(result) = &response else {
            return Ok(response);
        };
        let said = result.content.first().and_then(|c| {
            let text = &c.as_text()?.text;
            text.strip_prefix("failed to deserialize parameters:")
                .map(|s| s.trim().to_owned())
        });
        match (result.is_error, said) {
            (Some(true), Some(said)) => {
                let required: Vec<String> = self
                    .tool_router
                    .get(&tool)
                    .and_then(|t| t.input_schema.get("required").cloned())
                    .and_then(|r| serde_json::from_value(r).ok())
                    .unwrap_or_default();
                let text = wording::bad_arguments(&tool, &said, &required);
                Ok(CallToolResult::error(vec![ContentBlock::text(text)]).into())
            }
            _ => Ok(response),
        }
    }

    /// The host is initialized: what wakes the agent may be announced from now on.
    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        self.host.initialized(context.peer);
    }

    /// A subscription to the inbox resource: it is said updated with every wake.
    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match request.uri == wake::INBOX_RESOURCE {
            true => {
                self.host.subscribe(true);
                Ok(())
            }
            false => Err(ErrorData::resource_not_found(
                format!(
                    "{} cannot be subscribed to; {} can",
                    request.uri,
                    wake::INBOX_RESOURCE
                ),
                None,
            )),
        }
    }

    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if request.uri == wake::INBOX_RESOURCE {
            self.host.subscribe(false);
        }
        Ok(())
    }

    /// The inbox (what waits and what of it is for the agent), and one resource per channel
    /// that has a description or instructions (§7), for hosts that put resources in the
    /// agent's context; `cotal_channel_info` says the same.
    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let registry = self
            .client
            .channel_registry()
            .await
            .map_err(|e| ErrorData::internal_error(wording::other_error(&e), None))?;
        let resources = registry
            .channels
            .iter()
            .filter(|(_, c)| c.description.is_some() || c.instructions.is_some())
            .filter_map(|(name, config)| {
                let channel = Channel::new(name).ok()?;
                let view = tools::channel_view(self, &channel, Some(config), None, false);
                let mut resource =
                    Resource::new(format!("{CHANNEL_RESOURCE}{name}"), format!("#{name}"))
                        .with_title(format!("How to use #{name}"))
                        .with_mime_type("text/markdown");
                if let Some(description) = view.description {
                    resource = resource.with_description(description);
                }
                Some(resource)
            })
            .collect::<Vec<_>>();
        let inbox = Resource::new(wake::INBOX_RESOURCE, "inbox")
            .with_title("What waits for you")
            .with_mime_type("text/plain")
            .with_description("How many messages wait and which are for you; subscribe to be told when that changes");
        Ok(ListResourcesResult::with_all_items(
            std::iter::once(inbox).chain(resources).collect(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let not_found = || {
            ErrorData::resource_not_found(
                format!(
                    "no such resource: {} (resources/list names the channels that have one)",
                    request.uri
                ),
                None,
            )
        };
        if request.uri == wake::INBOX_RESOURCE {
            let waiting = self.inbox.waiting().await;
            let waking = self.inbox.waking().await;
            let text = match waking.is_empty() {
                true => format!("{waiting} waiting, none addressed to you."),
                false => wake::describe(&waking, false).0,
            };
            let text = format!("{text} (in all, {waiting} messages wait)");
            return Ok(ReadResourceResult::new(vec![ResourceContents::text(
                text,
                request.uri.clone(),
            )])
            .into());
        }
        let channel = request
            .uri
            .strip_prefix(CHANNEL_RESOURCE)
            .and_then(|name| Channel::new(name).ok())
            .ok_or_else(not_found)?;
        let registry = self
            .client
            .channel_registry()
            .await
            .map_err(|e| ErrorData::internal_error(wording::other_error(&e), None))?;
        let config = registry
            .channels
            .get(channel.as_str())
            .ok_or_else(not_found)?;
        let view = tools::channel_view(self, &channel, Some(config), None, false);
        let mut text = format!("# #{}\n", channel.as_str());
        for part in [view.description, view.instructions].into_iter().flatten() {
            text.push('\n');
            text.push_str(&part);
            text.push('\n');
        }
        Ok(ReadResourceResult::new(vec![ResourceContents::text(text, request.uri.clone())]).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::acl::{self, AgentScope};
    use crate::protocol::InstanceId;

    fn id() -> InstanceId {
        let key = nkeys::KeyPair::new_user();
        InstanceId::from_user_nkey(&key.public_key()).unwrap()
    }

    fn patterns(list: &[&str]) -> Vec<ChannelPattern> {
        list.iter()
            .map(|c| ChannelPattern::from_policy(c).unwrap())
            .collect()
    }

    #[test]
    fn an_agents_grants_are_read_from_its_permissions() {
        let names = SpaceNames::new("main");
        let me = id();
        let permissions = acl::agent(
            &names,
            &AgentScope {
                id: me.clone(),
                role: Some("reviewer".into()),
                allow_subscribe: patterns(&["general", "team.>"]),
                allow_publish: patterns(&["general"]),
            },
        );
        let grants = Grants::of(&permissions, &names, me.as_str());
        assert_eq!(grants.read, ["general", "team.>"]);
        assert_eq!(grants.post, ["general"]);
        assert!(grants.dm && grants.anycast);
        assert_eq!(grants.role.as_deref(), Some("reviewer"));
        assert!(grants.may_read(&Channel::new("team.backend").unwrap()));
        assert!(!grants.may_post(&Channel::new("team.backend").unwrap()));
    }

    #[test]
    fn an_observer_reads_everything_and_posts_nothing() {
        let names = SpaceNames::new("main");
        let me = id();
        let grants = Grants::of(&acl::observer(&names, &me), &names, me.as_str());
        assert_eq!(grants.read, [">"]);
        assert!(grants.post.is_empty());
        assert!(!grants.dm && !grants.anycast);
        assert_eq!(grants.role, None);
        assert!(grants.may_read(&Channel::new("anything.at.all").unwrap()));
    }
}
