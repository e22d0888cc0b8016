//! `cotald mcp`: real MCP clients (the Rust SDK's) driving real `cotald mcp` processes as two
//! identities of one space.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, ReadResourceRequestParams};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, Peer, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use cotald::protocol::PresenceStatus;

use crate::helper::{
    Cotald, Minted, Probe, TIMEOUT, cotald_bin, endpoint, eventually, mint, operator_endpoint,
    set_channel,
};

pub(crate) type Agent = Peer<RoleClient>;

/// An MCP client that passes on the log notifications it receives.
struct Listener(mpsc::UnboundedSender<Value>);

#[allow(deprecated)] // MCP logging: what hosts of the earlier revisions show.
impl ClientHandler for Listener {
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(params.data);
    }
}

/// Launches `cotald mcp` as `m` (the way a host does) and initializes an MCP session with it.
pub(crate) async fn agent(m: &Minted) -> RunningService<RoleClient, ()> {
    agent_as(m, ()).await
}

/// [`agent`] with a client handler of its own.
pub(crate) async fn agent_as<H: ClientHandler>(
    m: &Minted,
    handler: H,
) -> RunningService<RoleClient, H> {
    initialize(launch(m), handler).await
}

/// Starts `cotald mcp` as `m`, the way a host does; its MCP session is not initialized yet.
pub(crate) fn launch(m: &Minted) -> TokioChildProcess {
    let mut cmd = tokio::process::Command::new(cotald_bin());
    cmd.arg("mcp")
        .arg("--creds")
        .arg(&m.creds)
        .args(["--link", &m.link])
        .arg("--ca")
        .arg(&m.ca);
    let (transport, _) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn cotald mcp");
    transport
}

/// Initializes the MCP session over `transport`, as `handler`.
pub(crate) async fn initialize<H: ClientHandler>(
    transport: TokioChildProcess,
    handler: H,
) -> RunningService<RoleClient, H> {
    tokio::time::timeout(TIMEOUT, handler.serve(transport))
        .await
        .expect("initialize in time")
        .expect("initialize")
}

/// Calls a tool; the raw result (which may be a tool error).
pub(crate) async fn call_raw(agent: &Agent, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    tokio::time::timeout(
        TIMEOUT + Duration::from_secs(35),
        agent.call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args)),
    )
    .await
    .unwrap_or_else(|_| panic!("{tool} answers in time"))
    .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// Calls a tool that must succeed; its structured result.
pub(crate) async fn call(agent: &Agent, tool: &str, args: Value) -> Value {
    let result = call_raw(agent, tool, args).await;
    assert_ne!(result.is_error, Some(true), "{tool} failed: {result:?}");
    result
        .structured_content
        .unwrap_or_else(|| panic!("{tool} returns structured content"))
}

/// The text of a tool error.
pub(crate) async fn refusal(agent: &Agent, tool: &str, args: Value) -> String {
    let result = call_raw(agent, tool, args).await;
    assert_eq!(
        result.is_error,
        Some(true),
        "{tool} should fail: {result:?}"
    );
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

/// Reads the inbox (what waits, then blocking up to 30 s per call for what is new) until a
/// message satisfying `pred` comes; returns it and every message read on the way.
pub(crate) async fn inbox_until(
    agent: &Agent,
    pred: impl Fn(&Value) -> bool,
) -> (Value, Vec<Value>) {
    let mut read = Vec::new();
    let found = tokio::time::timeout(TIMEOUT, async {
        let mut args = json!({});
        loop {
            let got = call(agent, "cotal_inbox", args.clone()).await;
            args = json!({"wait": 30});
            for m in got["messages"].as_array().unwrap() {
                read.push(m.clone());
                if pred(m) {
                    return m.clone();
                }
            }
        }
    })
    .await
    .expect("the message within the timeout");
    (found, read)
}

/// Reads the inbox until a notice containing `needle` (e.g. a boot join's outcome) comes.
async fn notice_until(agent: &Agent, needle: &str) {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(TIMEOUT, async {
        loop {
            let got = call(agent, "cotal_inbox", json!({"wait": 30})).await;
            for n in got["notices"].as_array().cloned().unwrap_or_default() {
                let n = n.as_str().unwrap().to_owned();
                if n.contains(needle) {
                    return;
                }
                seen.push(n);
            }
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "no notice containing {needle:?}; seen: {seen:?}"
    );
}

/// Waits until `agent`'s roster shows bob working on PR 7.
async fn roster_shows_bob_reviewing(agent: &Agent) {
    eventually("the roster showing bob reviewing PR 7", || async move {
        let roster = call(agent, "cotal_roster", json!({})).await;
        roster["peers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| {
                p["name"] == "bob" && p["status"] == "working" && p["activity"] == "reviewing PR 7"
            })
            .then_some(())
    })
    .await;
}

/// Starts a `cotal_inbox` wait, checks that it still waits a second later (nothing it has
/// not seen is there), then sends `what` to `to` and returns the texts the wait came back with.
async fn a_wait_ends_only_with(
    agent: &Agent,
    sender: &cotald::client::Client,
    to: &cotald::protocol::Routing,
    what: &str,
) -> Vec<String> {
    let mut waiting = {
        let agent = agent.clone();
        tokio::spawn(async move { call(&agent, "cotal_inbox", json!({"wait": 30})).await })
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(1), &mut waiting)
            .await
            .is_err(),
        "the wait returned before anything new arrived"
    );
    sender.send_text(to.clone(), what).await.unwrap();
    let got = tokio::time::timeout(TIMEOUT, waiting)
        .await
        .unwrap()
        .unwrap();
    got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| text(m).to_owned())
        .collect()
}

pub(crate) fn text(m: &Value) -> &str {
    m["text"].as_str().unwrap()
}

const TOOLS: &[&str] = &[
    "cotal_anycast",
    "cotal_channel_info",
    "cotal_channel_mode",
    "cotal_channels",
    "cotal_connection",
    "cotal_dm",
    "cotal_history",
    "cotal_inbox",
    "cotal_join",
    "cotal_leave",
    "cotal_orientation",
    "cotal_persona",
    "cotal_receipts",
    "cotal_reconnect",
    "cotal_roster",
    "cotal_send",
    "cotal_status",
    "cotal_thread",
];

#[tokio::test]
async fn two_agents_exchange_a_channel_message_a_dm_by_name_and_an_anycast_task() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let channels = ["--subscribe", "general", "--allow-publish", "general"];
    let alice = mint(tmp.path(), "alice", "main", &channels).await;
    let mut bob_args = channels.to_vec();
    bob_args.extend(["--role", "reviewer"]);
    let bob = mint(tmp.path(), "bob", "main", &bob_args).await;

    let (notes, mut announced) = mpsc::unbounded_channel();
    let b = agent_as(&bob, Listener(notes)).await;
    let info = b.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|s| s.name.as_str()),
        Some("cotald")
    );
    assert!(
        info.instructions
            .as_deref()
            .is_some_and(|i| i.contains("cotal_orientation"))
    );
    let tools = b.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    assert_eq!(names, TOOLS);
    for tool in &tools {
        assert_eq!(
            tool.input_schema.get("type"),
            Some(&json!("object")),
            "{}",
            tool.name
        );
        assert!(
            tool.description.as_deref().is_some_and(|d| d.len() > 40),
            "{} teaches its use",
            tool.name
        );
        assert!(
            tool.output_schema.is_some(),
            "{} has a result schema",
            tool.name
        );
    }
    let send = tools.iter().find(|t| t.name == "cotal_send").unwrap();
    let required: Vec<&str> = send.input_schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(required, ["channel", "text"]);
    for field in ["mentions", "reply_to"] {
        assert!(
            send.input_schema["properties"].get(field).is_some(),
            "{field}"
        );
    }
    notice_until(&b, "joined durable general").await;

    let a = agent(&alice).await;
    notice_until(&a, "joined durable general").await;
    let me = call(&a, "cotal_orientation", json!({})).await;
    assert!(me["guide"].is_string(), "the guide, once a session: {me}");
    let again = call(&a, "cotal_orientation", json!({})).await;
    assert!(again.get("guide").is_none(), "not twice: {again}");
    assert_eq!(me["you"]["name"], "alice");
    assert_eq!(me["you"]["id"], alice.id.as_str());
    assert_eq!(me["you"]["space"], "main");
    assert_eq!(me["may_post"], json!(["general"]));
    assert_eq!(me["joined"], json!(["general"]));
    assert!(
        me["present"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "bob" && p["role"] == "reviewer"),
        "{me}"
    );

    // A channel message, answered with reply_to.
    let sent = call(
        &a,
        "cotal_send",
        json!({"channel": "general", "text": "hello from alice", "mentions": ["bob"]}),
    )
    .await;
    // Hosts that show notifications hear of it at once; the inbox has it either way.
    let note = tokio::time::timeout(TIMEOUT, announced.recv())
        .await
        .expect("an arrival is announced")
        .unwrap();
    assert_eq!(note["event"], "message");
    assert_eq!(note["id"], sent["id"]);
    assert!(
        note["summary"]
            .as_str()
            .unwrap()
            .starts_with("#general alice: hello from alice"),
        "{note}"
    );
    let (got, _) = inbox_until(&b, |m| text(m) == "hello from alice").await;
    assert_eq!(got["kind"], "channel");
    assert_eq!(got["channel"], "general");
    assert_eq!(got["from"]["name"], "alice");
    assert_eq!(got["id"], sent["id"]);
    assert_eq!(got["mentions_you"], true);
    call(
        &b,
        "cotal_send",
        json!({"channel": "general", "text": "hi alice", "reply_to": sent["id"]}),
    )
    .await;
    let (reply, _) = inbox_until(&a, |m| text(m) == "hi alice").await;
    assert_eq!(reply["reply_to"], sent["id"]);

    // A sender is shown by a short id, which addresses a DM as well as the whole one.
    assert_eq!(got["from"]["id"], &alice.id[..12]);
    // The short id is resolved against the roster, as an agent would read it: once alice's
    // presence has reached bob's.
    eventually("alice in bob's roster", || async {
        let roster = call(&b, "cotal_roster", json!({})).await;
        roster["peers"]
            .as_array()?
            .iter()
            .any(|p| p["name"] == "alice")
            .then_some(())
    })
    .await;
    call(
        &b,
        "cotal_dm",
        json!({"to": got["from"]["id"], "text": "by the short id"}),
    )
    .await;
    let (short, _) = inbox_until(&a, |m| text(m) == "by the short id").await;
    assert_eq!(short["kind"], "dm");

    // A DM by name: peek shows it without consuming; inbox returns it once.
    call(&a, "cotal_dm", json!({"to": "bob", "text": "psst, bob"})).await;
    let peeked = tokio::time::timeout(TIMEOUT, async {
        loop {
            let p = call(&b, "cotal_inbox", json!({"peek": true, "wait": 30})).await;
            if p["messages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| text(m) == "psst, bob")
            {
                return p;
            }
        }
    })
    .await
    .expect("the DM is peeked");
    assert_eq!(peeked["peeked"], true);
    let again = call(&b, "cotal_inbox", json!({"peek": true})).await;
    assert_eq!(
        again["messages"], peeked["messages"],
        "a peek consumes nothing"
    );
    let (dm, _) = inbox_until(&b, |m| text(m) == "psst, bob").await;
    assert_eq!(dm["kind"], "dm");
    assert_eq!(dm["from"]["name"], "alice");
    let after = call(&b, "cotal_inbox", json!({"peek": true})).await;
    assert!(
        !after["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| text(m) == "psst, bob"),
        "returned once: {after}"
    );

    // An anycast task to the role bob holds: the receipt names the online holder; one to a role
    // nobody holds is refused (the warden would discard it).
    let sent = call(
        &a,
        "cotal_anycast",
        json!({"role": "reviewer", "text": "please review PR 7"}),
    )
    .await;
    assert_eq!(
        (
            &sent["receipt"]["role_holders"],
            &sent["receipt"]["role_online"]
        ),
        (&json!(1), &json!(1)),
        "{sent}"
    );
    let refused = refusal(
        &a,
        "cotal_anycast",
        json!({"role": "deployer", "text": "please deploy"}),
    )
    .await;
    assert!(
        refused.contains("holds role deployer") && refused.contains("discarded"),
        "{refused}"
    );
    let (task, _) = inbox_until(&b, |m| text(m) == "please review PR 7").await;
    assert_eq!(task["kind"], "anycast");
    assert_eq!(task["role"], "reviewer");

    // Status and roster: what bob declares, alice sees.
    let status = call(
        &b,
        "cotal_status",
        json!({"status": "working", "activity": "reviewing PR 7"}),
    )
    .await;
    assert_eq!(status["status"], "working");
    roster_shows_bob_reviewing(&a).await;
    // Done: idle clears what he was doing.
    let status = call(&b, "cotal_status", json!({"status": "idle"})).await;
    assert_eq!(status["status"], "idle");
    assert!(
        status.get("activity").is_none_or(|a| a.is_null()),
        "{status}"
    );

    // History, channels and the channel's config.
    let history = call(&a, "cotal_history", json!({"channel": "general"})).await;
    let texts: Vec<&str> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert_eq!(texts, ["hello from alice", "hi alice"]);
    let channels = call(&a, "cotal_channels", json!({})).await;
    let general = channels["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["channel"] == "general")
        .cloned()
        .expect("general is listed");
    assert_eq!(general["joined"], true);
    assert_eq!(general["may_post"], true);

    // Refusals are tool errors that name the fix.
    let refused = refusal(&a, "cotal_send", json!({"channel": "secret", "text": "x"})).await;
    assert!(
        refused.starts_with("Refused: you may not post to secret. You may post to: general."),
        "what the agent can do comes first: {refused}"
    );
    assert!(
        refused.ends_with("(a new credential with --allow-publish)."),
        "{refused}"
    );
    let typo = refusal(&a, "cotal_send", json!({"channel": "generl", "text": "x"})).await;
    assert!(typo.contains("Did you mean general?"), "{typo}");
    let unfit = refusal(&a, "cotal_send", json!({"text": "x"})).await;
    assert!(
        unfit.starts_with("Refused: cotal_send has no channel: it needs channel and text."),
        "in the server's words, not the JSON library's: {unfit}"
    );
    let unknown = refusal(&a, "cotal_dm", json!({"to": "carol", "text": "x"})).await;
    assert!(unknown.contains("nobody named `carol`"), "{unknown}");
    assert!(unknown.contains("cotal_roster"), "{unknown}");
    let outside = refusal(&a, "cotal_join", json!({"channel": "secret"})).await;
    assert!(
        outside.starts_with("Refused: you may not read secret."),
        "{outside}"
    );
    assert!(outside.contains("--allow-subscribe"), "{outside}");

    // The host ends bob's session: its last word is `offline` (§6), not a lapsed heartbeat.
    let watcher = operator_endpoint(tmp.path(), &alice, true).await;
    let roster = watcher.client.roster().clone();
    b.cancel().await.unwrap();
    tokio::time::timeout(TIMEOUT, async {
        loop {
            let changed = roster.changed();
            if roster
                .peer(&bob.id)
                .is_some_and(|p| p.presence.status == PresenceStatus::Offline)
            {
                return;
            }
            changed.await;
        }
    })
    .await
    .expect("bob's final presence record says offline");

    a.cancel().await.unwrap();
    watcher.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn only_what_inbox_returned_is_acked_and_the_rest_comes_again_after_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let sender = endpoint(&alice, |o| o.presence = false).await;
    let to_bob = cotald::protocol::Routing::to(
        &cotald::protocol::InstanceId::from_user_nkey(&bob.id).unwrap(),
    );

    let b = agent(&bob).await;
    for text in ["first", "second"] {
        sender.client.send_text(to_bob.clone(), text).await.unwrap();
    }
    // Both wait in the inbox; only the first is returned (limit 1).
    tokio::time::timeout(TIMEOUT, async {
        loop {
            let p = call(&b, "cotal_inbox", json!({"peek": true, "wait": 30})).await;
            if p["messages"].as_array().unwrap().len() + p["remaining"].as_u64().unwrap() as usize
                >= 2
            {
                return;
            }
        }
    })
    .await
    .expect("both DMs arrive");
    let got = call(&b, "cotal_inbox", json!({"limit": 1})).await;
    let texts: Vec<&str> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert_eq!(texts, ["first"]);
    assert_eq!(got["remaining"], 1);
    b.cancel().await.unwrap();

    // A new session gets the unread one, and only it: the first was acked.
    let b = agent(&bob).await;
    let (second, read) = inbox_until(&b, |m| text(m) == "second").await;
    assert_eq!(second["kind"], "dm");
    assert!(read.iter().all(|m| text(m) != "first"), "{read:?}");
    drained(&c, tmp.path(), &format!("dm_{}", bob.id)).await;

    b.cancel().await.unwrap();
    sender.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn channels_carry_their_instructions_and_the_agent_manages_memberships_and_its_card() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let carol = mint(
        tmp.path(),
        "carol",
        "main",
        &[
            "--subscribe",
            "general",
            "--allow-subscribe",
            "general,ops,quiet",
            "--allow-publish",
            "general,ops",
        ],
    )
    .await;
    let op = operator_endpoint(tmp.path(), &carol, false).await;
    set_channel(
        &op,
        "ops",
        json!({
            "description": "Deploys and incidents",
            "instructions": "Post one line per deploy.",
            "deliveryClass": "durable",
        }),
    )
    .await;
    set_channel(
        &op,
        "quiet",
        json!({"replay": false, "deliveryClass": "live"}),
    )
    .await;

    let a = agent(&carol).await;
    notice_until(&a, "joined durable general").await;
    let ops = call(&a, "cotal_channel_info", json!({"channel": "ops"})).await;
    assert_eq!(ops["description"], "Deploys and incidents");
    assert_eq!(ops["instructions"], "Post one line per deploy.");
    assert_eq!(ops["delivery_class"], "durable");
    assert_eq!(ops["joined"], false);
    assert_eq!(ops["may_post"], true);

    // The instructions are a resource too.
    let resources = a.list_all_resources().await.unwrap();
    let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
    assert!(uris.contains(&"cotal://channel/ops"), "{uris:?}");
    assert!(
        !uris.contains(&"cotal://channel/quiet"),
        "quiet has nothing to say"
    );
    let read = a
        .read_resource(ReadResourceRequestParams::new("cotal://channel/ops"))
        .await
        .unwrap();
    let body = serde_json::to_value(&read.contents[0]).unwrap();
    assert!(
        body["text"]
            .as_str()
            .unwrap()
            .contains("Post one line per deploy."),
        "{body}"
    );

    // Join and leave: a durable membership, ended by the leave.
    let joined = call(&a, "cotal_join", json!({"channel": "ops"})).await;
    assert_eq!(joined["outcome"], "joined durable ops");
    assert_eq!(joined["durable"], true);
    let listed = call(&a, "cotal_channels", json!({})).await;
    assert!(
        listed["channels"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["channel"] == "ops" && c["joined"] == true),
        "{listed}"
    );
    let left = call(&a, "cotal_leave", json!({"channel": "ops"})).await;
    assert_eq!(left["outcome"], "left ops");
    let again = refusal(&a, "cotal_leave", json!({"channel": "ops"})).await;
    assert!(again.contains("not joined to ops"), "{again}");
    assert!(again.contains("cotal_channels"), "{again}");

    // A channel without readable history says so.
    let quiet = call(&a, "cotal_join", json!({"channel": "quiet"})).await;
    assert_eq!(quiet["outcome"], "joined live quiet");
    let closed = refusal(&a, "cotal_history", json!({"channel": "quiet"})).await;
    assert!(closed.contains("replay = false"), "{closed}");
    let outside = refusal(&a, "cotal_history", json!({"channel": "secret"})).await;
    assert!(
        outside.starts_with("Refused: you may not read secret. You may read: general, ops, quiet."),
        "{outside}"
    );
    assert!(
        outside.contains("You may read: general, ops, quiet"),
        "{outside}"
    );

    // What carol declares about herself.
    let modes = call(
        &a,
        "cotal_channel_mode",
        json!({"channel": "general", "mode": "muted"}),
    )
    .await;
    assert_eq!(modes["channel_modes"]["general"], "muted");
    let status = call(&a, "cotal_status", json!({"attention": "focus"})).await;
    assert_eq!(status["attention"], "focus");
    assert_eq!(status["status"], "idle");
    let card = call(
        &a,
        "cotal_persona",
        json!({"description": "Deploy bot", "tags": ["ops"], "skills": [{"id": "deploy", "name": "Deploy"}]}),
    )
    .await;
    assert_eq!(card["name"], "carol");
    assert_eq!(card["description"], "Deploy bot");
    assert_eq!(card["tags"], json!(["ops"]));
    assert_eq!(card["skills"][0]["id"], "deploy");

    // A forced reconnect comes back, and the endpoint still posts.
    let conn = call(&a, "cotal_reconnect", json!({"force": true})).await;
    assert_eq!(conn["state"], "connected");
    assert_eq!(conn["reconnected"], true);
    call(
        &a,
        "cotal_send",
        json!({"channel": "general", "text": "back"}),
    )
    .await;

    a.cancel().await.unwrap();
    op.client.close().await;
    c.stop().await;
}

/// Waits until the DM durable `consumer` has nothing pending and nothing unacknowledged.
async fn drained(c: &Cotald, dir: &Path, consumer: &str) {
    let probe = Probe::connect(c, &dir.join("spaces/main/local-operator.creds")).await;
    let js = async_nats::jetstream::new(probe.client);
    let stream = &js.get_stream("DM_main").await.unwrap();
    eventually("every DM acknowledged", || async move {
        let info = stream.consumer_info(consumer).await.unwrap();
        (info.num_pending == 0 && info.num_ack_pending == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn print_config_names_absolute_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(cotald_bin())
        .current_dir(tmp.path())
        .args([
            "mcp",
            "--creds",
            "bob.creds",
            "--link",
            "cotals://127.0.0.1:4222/main?channels=general",
            "--ca",
            "ca.pem",
            "--data-dir",
            "data",
            "--print-config",
            "claude",
        ])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let server = &doc["mcpServers"]["cotal"];
    assert_eq!(server["type"], "stdio");
    assert_eq!(server["command"], cotald_bin());
    let dir = tmp.path().canonicalize().unwrap();
    assert_eq!(
        server["args"],
        json!([
            "mcp",
            "--link",
            "cotals://127.0.0.1:4222/main?channels=general",
            "--creds",
            dir.join("bob.creds").display().to_string(),
            "--ca",
            dir.join("ca.pem").display().to_string(),
            "--data-dir",
            dir.join("data").display().to_string(),
        ])
    );

    // Acting as a minted identity of the local appliance: the name and the data dir.
    let out = tokio::process::Command::new(cotald_bin())
        .current_dir(tmp.path())
        .args([
            "mcp",
            "--as",
            "bob",
            "--data-dir",
            "data",
            "--print-config",
            "json",
        ])
        .output()
        .await
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        doc["mcpServers"]["cotal"]["args"],
        json!([
            "mcp",
            "--as",
            "bob",
            "--data-dir",
            dir.join("data").display().to_string()
        ])
    );
}

/// A tool call of the README's MCP section, as written there (`` `TOOL {ARGS}` ``); `<the
/// task's id>` stands for `task_id`.
fn as_written(readme: &str, tool: &str, args: &str, task_id: &str) -> Value {
    let written = format!("`{tool} {args}`");
    assert!(
        readme.contains(&written),
        "the README's MCP section calls {written}"
    );
    serde_json::from_str(&args.replace("<the task's id>", task_id)).expect("JSON arguments")
}

/// An agent started the way `cotald mcp --print-config claude` tells a host to.
async fn agent_from_config(config: &Value) -> RunningService<RoleClient, ()> {
    let server = &config["mcpServers"]["cotal"];
    let mut cmd = tokio::process::Command::new(server["command"].as_str().unwrap());
    for arg in server["args"].as_array().unwrap() {
        cmd.arg(arg.as_str().unwrap());
    }
    let (transport, _) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the configured cotald mcp");
    tokio::time::timeout(TIMEOUT, ().serve(transport))
        .await
        .expect("initialize in time")
        .expect("initialize")
}

/// The README's "AI agents over MCP" section, run as written: its shell block, then alice's
/// and bob's tool calls in the order it gives them, each with the outcome it promises.
#[tokio::test]
async fn the_readme_mcp_section_runs_as_written() {
    let readme = crate::cli::readme();
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let mut configs = Vec::new();
    for words in crate::cli::readme_commands("mcp") {
        assert_eq!(words[0], "cotald", "{words:?}");
        let out = crate::helper::cotald_in(
            tmp.path(),
            &words[1..].iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .await;
        assert!(
            out.status.success(),
            "{words:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if words[1] == "mcp" {
            configs.push(serde_json::from_slice::<Value>(&out.stdout).expect("a .mcp.json"));
        }
    }
    // "for each agent": the README prints alice's; bob's is the same with his name.
    let alice_config = configs.pop().expect("the block prints a config");
    let bob_config: Value =
        serde_json::from_str(&alice_config.to_string().replace("\"alice\"", "\"bob\"")).unwrap();
    let b = agent_from_config(&bob_config).await;
    notice_until(&b, "joined durable general").await;
    let a = agent_from_config(&alice_config).await;
    notice_until(&a, "joined durable general").await;

    // Alice.
    let me = call(
        &a,
        "cotal_orientation",
        as_written(&readme, "cotal_orientation", "{}", ""),
    )
    .await;
    assert_eq!(
        (me["you"]["name"].as_str(), me["you"]["space"].as_str()),
        (Some("alice"), Some("main"))
    );
    assert_eq!(me["may_post"], json!(["general"]));
    assert_eq!(me["joined"], json!(["general"]));
    assert!(
        me["present"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "bob" && p["role"] == "reviewer"),
        "{me}"
    );
    let post = r#"{"channel": "general", "text": "PR 7 is ready", "mentions": ["bob"]}"#;
    call(
        &a,
        "cotal_send",
        as_written(&readme, "cotal_send", post, ""),
    )
    .await;
    let task = r#"{"role": "reviewer", "text": "please review PR 7"}"#;
    let sent_task = call(
        &a,
        "cotal_anycast",
        as_written(&readme, "cotal_anycast", task, ""),
    )
    .await;
    let task_id = sent_task["id"].as_str().expect("the task's id").to_owned();
    let wait = as_written(&readme, "cotal_inbox", r#"{"wait": 60}"#, "");
    let waiting = {
        let (a, wait) = (a.peer().clone(), wait.clone());
        tokio::spawn(async move { call(&a, "cotal_inbox", wait).await })
    };

    // Bob.
    call(&b, "cotal_orientation", json!({})).await;
    let wait_bob = as_written(&readme, "cotal_inbox", r#"{"wait": 60}"#, "");
    let mut read: Vec<Value> = Vec::new();
    let seen = |read: &[Value], t: &str| read.iter().find(|m| text(m) == t).cloned();
    let (post_seen, task_seen) = tokio::time::timeout(TIMEOUT, async {
        loop {
            let got = call(&b, "cotal_inbox", wait_bob.clone()).await;
            read.extend(got["messages"].as_array().unwrap().iter().cloned());
            if let (Some(post), Some(task)) = (
                seen(&read, "PR 7 is ready"),
                seen(&read, "please review PR 7"),
            ) {
                return (post, task);
            }
        }
    })
    .await
    .expect("bob's inbox holds the post and the task");
    assert_eq!(post_seen["mentions_you"], true);
    assert_eq!(
        (task_seen["kind"].as_str(), task_seen["role"].as_str()),
        (Some("anycast"), Some("reviewer"))
    );
    assert_eq!(task_seen["id"], task_id.as_str());
    let working = r#"{"status": "working", "activity": "reviewing PR 7"}"#;
    call(
        &b,
        "cotal_status",
        as_written(&readme, "cotal_status", working, ""),
    )
    .await;
    roster_shows_bob_reviewing(&a).await;
    let answer = r#"{"to": "alice", "text": "LGTM", "reply_to": "<the task's id>"}"#;
    call(
        &b,
        "cotal_dm",
        as_written(&readme, "cotal_dm", answer, &task_id),
    )
    .await;
    call(
        &b,
        "cotal_status",
        as_written(&readme, "cotal_status", r#"{"status": "idle"}"#, ""),
    )
    .await;

    // Alice's wait returned with the answer.
    let answered = tokio::time::timeout(TIMEOUT, waiting)
        .await
        .expect("the wait returns")
        .unwrap();
    let dm = answered["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| text(m) == "LGTM")
        .unwrap_or_else(|| panic!("the wait returned bob's answer: {answered}"))
        .clone();
    assert_eq!(dm["kind"], "dm");
    assert_eq!(dm["reply_to"], task_id.as_str());
    c.stop().await;
}

/// An agent restarted by its host resumes: on a durable channel (the `local` profile's default)
/// a second session of the same identity surfaces nothing the first acknowledged, says nothing
/// waits, and a `wait` returns only with what is new.
#[tokio::test]
async fn a_second_session_surfaces_nothing_the_first_acknowledged_and_waits_for_the_new() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let sender = endpoint(&alice, |o| o.presence = false).await;
    let general =
        cotald::protocol::Routing::channel(&cotald::protocol::Channel::new("general").unwrap());

    let b = agent(&bob).await;
    notice_until(&b, "joined durable general").await;
    for t in ["old-1", "old-2"] {
        sender.client.send_text(general.clone(), t).await.unwrap();
    }
    inbox_until(&b, |m| text(m) == "old-2").await;
    b.cancel().await.unwrap();

    // The host starts the agent again.
    let b = agent(&bob).await;
    // Until its boot join is reported, the inbox holds nothing the first session read.
    let mut resurfaced = Vec::new();
    tokio::time::timeout(TIMEOUT, async {
        loop {
            let got = call(&b, "cotal_inbox", json!({"wait": 30})).await;
            resurfaced.extend(
                got["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| text(m).to_owned()),
            );
            if got["notices"].as_array().is_some_and(|n| {
                n.iter()
                    .any(|n| n.as_str().is_some_and(|n| n.contains("general")))
            }) {
                return;
            }
        }
    })
    .await
    .expect("the boot join is reported");
    assert!(resurfaced.is_empty(), "surfaced again: {resurfaced:?}");
    let me = call(&b, "cotal_orientation", json!({})).await;
    assert_eq!(me["joined"], json!(["general"]));
    assert_eq!(me["waiting"], 0, "{me}");

    // A wait returns only with what is new.
    let texts = a_wait_ends_only_with(&b, &sender.client, &general, "new-1").await;
    assert_eq!(texts, ["new-1"]);
    b.cancel().await.unwrap();
    sender.client.close().await;
    c.stop().await;
}

/// A new session's first answers are exact: with two channel messages and two DMs waiting
/// for the agent while it was away, its first `cotal_orientation` (its very first call) says
/// it joined its channel and that 4 wait, and its first `cotal_inbox` returns those 4. A wait
/// after a peek wakes only for what the peek did not show.
#[tokio::test]
async fn a_new_sessions_first_answers_are_exact_with_four_waiting() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let sender = endpoint(&alice, |o| o.presence = false).await;
    let general =
        cotald::protocol::Routing::channel(&cotald::protocol::Channel::new("general").unwrap());
    let to_bob = cotald::protocol::Routing::to(
        &cotald::protocol::InstanceId::from_user_nkey(&bob.id).unwrap(),
    );
    let b = agent(&bob).await;
    notice_until(&b, "joined durable general").await;
    b.cancel().await.unwrap();

    for (to, t) in [
        (&general, "post-1"),
        (&to_bob, "dm-1"),
        (&general, "post-2"),
        (&to_bob, "dm-2"),
    ] {
        sender.client.send_text(to.clone(), t).await.unwrap();
    }

    let b = agent(&bob).await;
    let me = call(&b, "cotal_orientation", json!({})).await;
    assert_eq!(me["joined"], json!(["general"]), "{me}");
    assert_eq!(me["waiting"], 4, "{me}");
    assert!(me.get("starting").is_none(), "{me}");
    let got = call(&b, "cotal_inbox", json!({})).await;
    let mut texts: Vec<&str> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    texts.sort_unstable();
    assert_eq!(texts, ["dm-1", "dm-2", "post-1", "post-2"], "{got}");
    assert_eq!(got["remaining"], 0, "{got}");
    assert!(got.get("starting").is_none(), "{got}");

    // A peek shows what arrived; a wait after it wakes only for something newer.
    sender
        .client
        .send_text(to_bob.clone(), "dm-3")
        .await
        .unwrap();
    let peeked = call(&b, "cotal_inbox", json!({"peek": true, "wait": 30})).await;
    assert_eq!(peeked["messages"][0]["text"], "dm-3", "{peeked}");
    let texts = a_wait_ends_only_with(&b, &sender.client, &to_bob, "dm-4").await;
    assert_eq!(texts, ["dm-3", "dm-4"]);
    b.cancel().await.unwrap();
    sender.client.close().await;
    c.stop().await;
}

/// A channel message the agent never read is not lost with its session: on a durable channel
/// its durable copy, handed over while the live copy waited unread, is not acknowledged, and
/// the next session surfaces the message.
#[tokio::test]
async fn a_channel_message_left_unread_comes_again_in_the_next_session() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let sender = endpoint(&alice, |o| o.presence = false).await;
    let general =
        cotald::protocol::Routing::channel(&cotald::protocol::Channel::new("general").unwrap());
    let op = Probe::connect(&c, &tmp.path().join("spaces/main/local-operator.creds")).await;
    let js = async_nats::jetstream::new(op.client.clone());
    let chat = &js.get_stream("CHAT_main").await.unwrap();
    let consumer = &cotald::binding::interval_consumer(&bob.id, "general", 1);

    let b = agent(&bob).await;
    notice_until(&b, "joined durable general").await;
    sender
        .client
        .send_text(general.clone(), "unread")
        .await
        .unwrap();
    // Its live copy waits in the inbox, unread (a peek reads nothing) ...
    eventually("the live copy in bob's inbox", || {
        let b = b.peer().clone();
        async move {
            let p = call(&b, "cotal_inbox", json!({"peek": true, "wait": 5})).await;
            p["messages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| text(m) == "unread")
                .then_some(())
        }
    })
    .await;
    // ... and its durable copy has been handed to the session.
    eventually("the durable copy handed over", || async move {
        let info = chat.consumer_info(consumer).await.ok()?;
        (info.delivered.consumer_sequence >= 1).then_some(())
    })
    .await;
    b.cancel().await.unwrap();

    let b = agent(&bob).await;
    let (again, _) = inbox_until(&b, |m| text(m) == "unread").await;
    assert_eq!(again["channel"], "general");
    b.cancel().await.unwrap();
    sender.client.close().await;
    c.stop().await;
}

/// On a `live` channel the appliance keeps how far the identity read: a new session replays
/// only what came after, and a wait returns only with what is new.
#[tokio::test]
async fn a_second_session_on_a_live_channel_replays_only_what_came_after_what_was_read() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "news"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "news"]).await;
    let op = operator_endpoint(tmp.path(), &alice, false).await;
    set_channel(&op, "news", json!({"deliveryClass": "live"})).await;
    let sender = endpoint(&alice, |o| o.presence = false).await;
    let news = cotald::protocol::Routing::channel(&cotald::protocol::Channel::new("news").unwrap());

    let b = agent(&bob).await;
    notice_until(&b, "joined live news").await;
    sender
        .client
        .send_text(news.clone(), "read-1")
        .await
        .unwrap();
    inbox_until(&b, |m| text(m) == "read-1").await;
    // The mark is the appliance's: in the members registry, which only the manager writes.
    let probe = Probe::connect(&c, &tmp.path().join("spaces/main/local-operator.creds")).await;
    let registry = async_nats::jetstream::new(probe.client.clone())
        .get_key_value("cotal_members_main")
        .await
        .unwrap();
    let key = format!("mark.{}", bob.id);
    eventually("bob's replay mark of news", || async {
        let marks = registry.get(&key).await.ok().flatten()?;
        let marks: serde_json::Map<String, Value> = serde_json::from_slice(&marks).ok()?;
        marks.get("news").map(|_| ())
    })
    .await;
    b.cancel().await.unwrap();
    sender
        .client
        .send_text(news.clone(), "missed-2")
        .await
        .unwrap();

    let b = agent(&bob).await;
    let mut surfaced = Vec::new();
    let mut joined = false;
    tokio::time::timeout(TIMEOUT, async {
        while !(joined && surfaced.iter().any(|t| t == "missed-2")) {
            let got = call(&b, "cotal_inbox", json!({"wait": 30})).await;
            surfaced.extend(
                got["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| text(m).to_owned()),
            );
            joined |= got["notices"].as_array().is_some_and(|n| {
                n.iter()
                    .any(|n| n.as_str().is_some_and(|n| n.contains("news")))
            });
        }
    })
    .await
    .expect("the join is reported and what was missed replayed");
    assert_eq!(surfaced, ["missed-2"], "nothing read before comes again");

    let mut waiting = {
        let b = b.peer().clone();
        tokio::spawn(async move { call(&b, "cotal_inbox", json!({"wait": 30})).await })
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(1), &mut waiting)
            .await
            .is_err(),
        "the wait returned before anything new arrived"
    );
    sender.client.send_text(news, "new-3").await.unwrap();
    let got = tokio::time::timeout(TIMEOUT, waiting)
        .await
        .unwrap()
        .unwrap();
    let texts: Vec<&str> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert_eq!(texts, ["new-3"], "{got}");
    b.cancel().await.unwrap();
    sender.client.close().await;
    op.client.close().await;
    c.stop().await;
}

/// A peer that is away is addressed by name: on the appliance's machine `cotal_dm` knows the
/// identities it minted (and its operator) as `cotald send --to` does; anywhere, it knows the
/// senders of what the session received. The DM waits for the peer and reaches it.
#[tokio::test]
async fn cotal_dm_reaches_a_peer_that_is_away_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    // Alice's host launches her server on the appliance's machine (its data dir named).
    let mut cmd = tokio::process::Command::new(cotald_bin());
    cmd.arg("mcp")
        .arg("--creds")
        .arg(&alice.creds)
        .args(["--link", &alice.link])
        .arg("--ca")
        .arg(&alice.ca)
        .arg("--data-dir")
        .arg(tmp.path());
    let (transport, _) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let a = tokio::time::timeout(TIMEOUT, ().serve(transport))
        .await
        .unwrap()
        .unwrap();
    // Bob has never been online: he is in no roster, but minted here.
    call(
        &a,
        "cotal_dm",
        json!({"to": "bob", "text": "for when you are back"}),
    )
    .await;
    call(
        &a,
        "cotal_dm",
        json!({"to": &bob.id[..10], "text": "by short id"}),
    )
    .await;
    let mut b = endpoint(&bob, |o| o.presence = false).await;
    for want in ["for when you are back", "by short id"] {
        let d = crate::helper::delivery(&mut b.deliveries).await;
        assert_eq!(crate::helper::next_text_of(&d), want);
        d.ack().await.unwrap();
    }
    // The operator, never in the roster either, answers its DM by name.
    let asked = crate::helper::cotald_in(tmp.path(), &["send", "--to", "alice", "status?"]).await;
    assert!(
        asked.status.success(),
        "{}",
        String::from_utf8_lossy(&asked.stderr)
    );
    call(
        &a,
        "cotal_dm",
        json!({"to": "local-operator", "text": "all good"}),
    )
    .await;
    a.cancel().await.unwrap();
    b.client.close().await;
    c.stop().await;
}

/// A channel the agent may read or post to, that the space knows nothing of, is taken for a
/// typo by cotal_join and cotal_send (naming the closest), unless new: true says to make it.
#[tokio::test]
async fn a_typo_in_a_channel_is_refused_unless_new_says_to_make_it() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let grants = ["--allow-subscribe", ">", "--allow-publish", ">"];
    let alice = mint(tmp.path(), "alice", "main", &grants).await;
    let a = agent(&alice).await;
    for (tool, args) in [
        ("cotal_join", json!({"channel": "genral"})),
        ("cotal_send", json!({"channel": "genral", "text": "x"})),
    ] {
        let typo = refusal(&a, tool, args).await;
        assert!(
            typo.contains("channel `genral` has no config and no messages yet")
                && typo.contains("did you mean `general`?")
                && typo.contains("new: true"),
            "{tool}: {typo}"
        );
    }
    let empty = refusal(&a, "cotal_send", json!({"channel": "general", "text": " "})).await;
    assert!(empty.contains("the text is empty"), "{empty}");
    call(&a, "cotal_join", json!({"channel": "genral", "new": true})).await;
    call(
        &a,
        "cotal_send",
        json!({"channel": "lab", "text": "x", "new": true}),
    )
    .await;
    call(
        &a,
        "cotal_send",
        json!({"channel": "lab", "text": "known now"}),
    )
    .await;
    a.cancel().await.unwrap();
    c.stop().await;
}
