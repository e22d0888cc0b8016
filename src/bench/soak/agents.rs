//! The soak's agents, as a team runs them: most are programs on the project's client library
//! (durable members of the team channel, holders of a role), a third are hosts of `cotald mcp`
//! sessions that read their inbox now and then. Each reports what it reads to the ledger.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::ledger::{Ledger, tokens};
use crate::client::{Client, ConnectOptions, Replay, Settled};
use crate::protocol::{CotalMessage, JoinLink, Part, Routing};

/// The durable channel every library agent belongs to.
pub(super) const TEAM: &str = "team";
/// A live channel: posts owed to nobody.
pub(super) const CHATTER: &str = "chatter";
/// How long one MCP request may take.
const MCP_TIMEOUT: Duration = Duration::from_secs(30);

/// An identity as `cotald mint --json` prints it.
#[derive(Debug, Clone, serde::Deserialize)]
pub(super) struct Minted {
    pub(super) id: String,
    pub(super) creds: PathBuf,
    pub(super) link: String,
    pub(super) ca: PathBuf,
}

/// How an agent runs.
pub(super) enum Agent {
    Library(LibraryAgent),
    Mcp(Box<McpAgent>),
}

impl Agent {
    /// Sends `text` as this agent, answering `reply_to` when given: once the broker
    /// acknowledged it, the message's id when this agent knows it (a library agent), or why not.
    pub(super) async fn send(
        &self,
        routing: Routing,
        text: String,
        mentions: &[String],
        reply_to: Option<String>,
    ) -> anyhow::Result<Option<String>> {
        match self {
            Agent::Library(a) => {
                let client = &a.client;
                let mut message = CotalMessage::new(
                    client.space(),
                    client.endpoint(),
                    routing,
                    vec![Part::text(text)],
                )
                .with_mentions(mentions);
                if let Some(id) = reply_to {
                    message = message.with_reply_to(id);
                }
                client.publish(&message).await?;
                Ok(Some(message.id))
            }
            Agent::Mcp(a) => a
                .send(routing, text, mentions, reply_to)
                .await
                .map(|()| None),
        }
    }

    /// Ends its session (a host that stops, a program that exits): what its client said is
    /// not settled of what it handled (it may come to the next session), or `None` when the
    /// agent cannot tell (an MCP session logs it, to its host).
    pub(super) async fn close(&self) -> Option<Settled> {
        match self {
            Agent::Library(a) => Some(a.close().await),
            Agent::Mcp(a) => {
                a.close().await;
                None
            }
        }
    }
}

/// A program on the client library: a durable member of [`TEAM`], on [`CHATTER`] live.
pub(super) struct LibraryAgent {
    pub(super) client: Client,
    reader: tokio::task::JoinHandle<()>,
}

impl LibraryAgent {
    /// Connects as `minted` with `role`, joins the channels, and reads from then on.
    pub(super) async fn start(
        index: usize,
        minted: &Minted,
        role: &str,
        ledger: Arc<Mutex<Ledger>>,
    ) -> anyhow::Result<LibraryAgent> {
        let link = JoinLink::parse(&minted.link)?;
        let creds = std::fs::read_to_string(&minted.creds)?;
        let mut opts = ConnectOptions::new(link, creds);
        opts.ca = Some(minted.ca.clone());
        opts.role = Some(role.to_owned());
        let connection = tokio::time::timeout(MCP_TIMEOUT, Client::connect(opts))
            .await
            .context("connecting in time")??;
        let client = connection.client.clone();
        client.join(TEAM, Replay::Resume).await?;
        client.join(CHATTER, Replay::Off).await?;
        let mut deliveries = connection.deliveries;
        let reader = tokio::spawn(async move {
            while let Some(delivery) = deliveries.next().await {
                let read: Vec<u64> = delivery
                    .message
                    .parts
                    .iter()
                    .filter_map(|part| match part {
                        Part::Text { text, .. } => Some(tokens(text).collect::<Vec<_>>()),
                        _ => None,
                    })
                    .flatten()
                    .collect();
                let historical = delivery.historical;
                let acked = delivery.ack().await.is_ok();
                let now = std::time::Instant::now();
                let mut ledger = ledger.lock().unwrap_or_else(|e| e.into_inner());
                for token in read {
                    match historical {
                        true => ledger.shown_as_history(index, token, acked, now),
                        false => ledger.received(index, token, acked, now),
                    }
                }
            }
        });
        Ok(LibraryAgent { client, reader })
    }

    pub(super) async fn leave(&self) -> anyhow::Result<()> {
        Ok(self.client.leave(TEAM).await?)
    }

    pub(super) async fn rejoin(&self) -> anyhow::Result<()> {
        self.client.join(TEAM, Replay::Resume).await?;
        Ok(())
    }

    async fn close(&self) -> Settled {
        let settled = self.client.clone().close().await;
        self.reader.abort();
        settled
    }
}

/// What the soak asks of an MCP host.
enum Ask {
    Call {
        tool: &'static str,
        args: Value,
        answer: oneshot::Sender<anyhow::Result<Value>>,
    },
}

/// A host of a `cotald mcp` session: calls its tools one at a time, and between the soak's
/// sends reads its inbox (which acknowledges what it returns).
pub(super) struct McpAgent {
    asks: mpsc::Sender<Ask>,
    /// Ends the host's loop, which closes the session's stdin.
    stop: CancellationToken,
    host: tokio::task::JoinHandle<()>,
    child: tokio::sync::Mutex<Child>,
}

impl McpAgent {
    /// Launches `cotald mcp` as `minted`, as a host does, and initializes the session.
    pub(super) async fn start(
        exe: &Path,
        index: usize,
        minted: &Minted,
        ledger: Arc<Mutex<Ledger>>,
    ) -> anyhow::Result<McpAgent> {
        let mut child = tokio::process::Command::new(exe)
            .arg("mcp")
            .arg("--creds")
            .arg(&minted.creds)
            .args(["--link", &minted.link])
            .arg("--ca")
            .arg(&minted.ca)
            .env("RUST_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting `cotald mcp`")?;
        let mut session = Session {
            stdin: child.stdin.take().context("stdin")?,
            stdout: BufReader::new(child.stdout.take().context("stdout")?).lines(),
            next_id: 0,
        };
        session.initialize().await?;
        let (asks, mut asked) = mpsc::channel::<Ask>(16);
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let host = tokio::spawn(async move {
            loop {
                // What the soak asks first; the inbox when it asks nothing.
                let ask = tokio::select! {
                    () = stopped.cancelled() => return,
                    ask = asked.recv() => match ask {
                        Some(ask) => Some(ask),
                        None => return,
                    },
                    () = tokio::time::sleep(Duration::from_millis(500)) => None,
                };
                match ask {
                    Some(Ask::Call { tool, args, answer }) => {
                        let _ = answer.send(session.call(tool, args).await);
                    }
                    None => {
                        let args = json!({ "limit": 200 });
                        if let Ok(read) = session.call("cotal_inbox", args).await {
                            let now = std::time::Instant::now();
                            let mut ledger = ledger.lock().unwrap_or_else(|e| e.into_inner());
                            // What the inbox returns it acknowledges.
                            for (token, acked, historical) in inbox_tokens(&read) {
                                match historical {
                                    true => ledger.shown_as_history(index, token, acked, now),
                                    false => ledger.received(index, token, acked, now),
                                }
                            }
                        }
                    }
                }
            }
        });
        Ok(McpAgent {
            asks,
            stop,
            host,
            child: tokio::sync::Mutex::new(child),
        })
    }

    async fn send(
        &self,
        routing: Routing,
        text: String,
        mentions: &[String],
        reply_to: Option<String>,
    ) -> anyhow::Result<()> {
        let (tool, args) = match routing {
            Routing::Channel(channel) => (
                "cotal_send",
                json!({ "channel": channel, "text": text, "mentions": mentions, "reply_to": reply_to }),
            ),
            Routing::To(to) => (
                "cotal_dm",
                json!({ "to": to, "text": text, "reply_to": reply_to }),
            ),
            Routing::ToService(role) => ("cotal_anycast", json!({ "role": role, "text": text })),
        };
        let (answer, answered) = oneshot::channel();
        self.asks
            .send(Ask::Call { tool, args, answer })
            .await
            .context("the host is gone")?;
        answered.await.context("the host is gone")?.map(|_| ())
    }

    async fn close(&self) {
        self.stop.cancel();
        // A call in progress is abandoned: its session ends with the host.
        self.host.abort();
        let mut child = self.child.lock().await;
        // Its stdin closed with the session: the server ends as a host's would.
        if tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}

/// The tokens of the messages a `cotal_inbox` answer returns, each with whether it was
/// acknowledged and whether it came as history (a live channel's, replayed on joining since
/// the last session's read mark): its structured content (the text content repeats it, and
/// the notices are not messages); an id named in `ack_errors` was not confirmed.
fn inbox_tokens(answer: &Value) -> Vec<(u64, bool, bool)> {
    let view = &answer["structuredContent"];
    let unconfirmed: Vec<&str> = view["ack_errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str()?.split_once(": ").map(|(id, _)| id))
        .collect();
    let messages = view["messages"].as_array();
    messages
        .into_iter()
        .flatten()
        .flat_map(|m| {
            let id = m["id"].as_str().unwrap_or_default();
            let acked = !unconfirmed.iter().any(|u| id.starts_with(u));
            let historical = m["historical"] == true;
            let text = m["text"].as_str().unwrap_or_default();
            tokens(text)
                .map(move |t| (t, acked, historical))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// One MCP session over a child's stdio: JSON-RPC, a line each way.
struct Session {
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

impl Session {
    async fn initialize(&mut self) -> anyhow::Result<()> {
        self.request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": { "name": "cotald-soak", "version": env!("CARGO_PKG_VERSION") },
            }),
        )
        .await?;
        self.write(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
            .await
    }

    /// Calls a tool; a tool error is an error.
    async fn call(&mut self, tool: &str, args: Value) -> anyhow::Result<Value> {
        let result = self
            .request("tools/call", json!({ "name": tool, "arguments": args }))
            .await?;
        if result["isError"] == true {
            bail!("{tool}: {}", result["content"]);
        }
        Ok(result)
    }

    async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        self.write(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await?;
        let answer = tokio::time::timeout(MCP_TIMEOUT, async {
            while let Some(line) = self.stdout.next_line().await? {
                let Ok(message) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                // Notifications (a wake, a log line) have no id.
                if message["id"] == id {
                    return Ok::<_, anyhow::Error>(message);
                }
            }
            bail!("the MCP server closed its output")
        })
        .await
        .with_context(|| format!("{method}: no answer within {MCP_TIMEOUT:?}"))??;
        if let Some(error) = answer.get("error") {
            bail!("{method}: {error}");
        }
        Ok(answer["result"].clone())
    }

    async fn write(&mut self, message: &Value) -> anyhow::Result<()> {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await?;
        self.stdin.flush().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inbox_answer_is_read_once_from_its_messages_and_an_unconfirmed_ack_is_not_an_ack() {
        let structured = json!({
            "messages": [
                { "id": "aaaa1111", "text": "soak#4 from the soak" },
                { "id": "bbbb2222", "text": "soak#9 x" },
                { "id": "cccc3333", "text": "soak#3 y", "historical": true },
            ],
            "notices": ["soak#5 is not a message"],
            "ack_errors": ["bbbb: timed out"],
        });
        let answer = json!({
            "content": [{ "type": "text", "text": structured.to_string() }],
            "structuredContent": structured,
        });
        assert_eq!(
            inbox_tokens(&answer),
            [(4, true, false), (9, false, false), (3, true, true)]
        );
    }
}
