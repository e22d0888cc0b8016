//! The tools for what became of what was said: whether a send was read (`cotal_receipts`)
//! and the conversation it is part of (`cotal_thread`).

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};

use super::{
    RECEIPTS_DEFAULT, RECEIPTS_MAX, THREAD_CHANNELS, THREAD_DEFAULT, THREAD_HISTORY, THREAD_MAX,
};
use crate::mcp::CotalServer;
use crate::mcp::args::ReceiptsArgs;
use crate::mcp::args::ThreadArgs;
use crate::mcp::page;
use crate::mcp::views::ReadView;
use crate::mcp::views::ReceiptsView;
use crate::mcp::views::ThreadView;
use crate::mcp::wording;
use crate::protocol::Channel;
use crate::protocol::Routing;

#[tool_router(router = follow_up_router, vis = "pub(in crate::mcp)")]
impl CotalServer {
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
}
