//! Receipts that name where a message went, per tier, through `cotald send --json` and through
//! the MCP tools: a durable channel with a member away, a live channel nobody is subscribed
//! to, a DM to a peer that is away, a task for a role whose holder is away, a role nobody
//! holds, and a refused send. Read receipts: a DM and a task waiting, delivered, then read;
//! a durable channel's members; and another identity refused a receipt for what it did not
//! send.

use serde_json::{Value, json};

use cotald::client::Replay;

use crate::helper::{
    Cotald, endpoint, join_durable_and_leave_the_room, mint, operator_endpoint, set_channel,
};
use crate::mcp::{Agent, agent, call, inbox_until, refusal};

/// `cotald send --as alice ARGS --json`: its one JSON line.
async fn sent(dir: &std::path::Path, args: &[&str]) -> Value {
    let mut all = vec!["send", "--as", "alice", "--json"];
    all.extend_from_slice(args);
    let out = crate::helper::cotald_in(dir, &all).await;
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `cotald send --as alice ARGS`, which must fail: what it said.
async fn refused(dir: &std::path::Path, args: &[&str]) -> String {
    let mut all = vec!["send", "--as", "alice"];
    all.extend_from_slice(args);
    let out = crate::helper::cotald_in(dir, &all).await;
    assert!(!out.status.success(), "{args:?} was not refused");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn every_send_says_where_it_went_by_tier() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let c = Cotald::up(dir).await;
    let posts = ["--allow-publish", "general", "--allow-publish", "news"];
    let alice = mint(dir, "alice", "main", &posts).await;
    let bob = mint(dir, "bob", "main", &["--subscribe", "general"]).await;
    let carol = mint(dir, "carol", "main", &["--subscribe", "general"]).await;
    mint(dir, "rita", "main", &["--role", "reviewer"]).await;
    let op = operator_endpoint(dir, &alice, false).await;
    set_channel(&op, "news", json!({"deliveryClass": "live"})).await;
    // bob is a durable member of general, away; carol one, online and joined.
    join_durable_and_leave_the_room(&bob, "general").await;
    let carol = endpoint(&carol, |_| {}).await;
    carol.client.join("general", Replay::Off).await.unwrap();

    // Through the command line.
    let durable = sent(dir, &["--channel", "general", "to the team"]).await;
    assert_eq!(
        durable["receipt"],
        json!({"tier": "durable", "durable_members": 2, "durable_away": 1, "live_now": 1}),
        "{durable}"
    );
    assert!(
        durable["delivered"]
            .as_str()
            .unwrap()
            .contains("stored for 2 durable members (1 away"),
        "{durable}"
    );
    let live = sent(dir, &["--channel", "news", "anyone?"]).await;
    assert_eq!(
        live["receipt"],
        json!({"tier": "live", "live_now": 0}),
        "{live}"
    );
    assert!(
        live["delivered"]
            .as_str()
            .unwrap()
            .contains("nobody is subscribed now"),
        "{live}"
    );
    let dm = sent(dir, &["--to", "bob", "are you there?"]).await;
    assert_eq!(
        dm["receipt"],
        json!({"tier": "dm", "target": "bob", "target_online": false}),
        "{dm}"
    );
    let task = sent(dir, &["--service", "reviewer", "please review"]).await;
    assert_eq!(
        task["receipt"],
        json!({"tier": "task", "role_holders": 1, "role_online": 0}),
        "{task}"
    );
    assert!(
        task["delivered"]
            .as_str()
            .unwrap()
            .contains("nobody holding the role is online"),
        "{task}"
    );
    let ghost = refused(dir, &["--service", "ghost", "anyone?"]).await;
    assert!(
        ghost.contains("no agent of this space holds role ghost"),
        "{ghost}"
    );
    let outside = refused(dir, &["--channel", "secret", "--new", "psst"]).await;
    assert!(outside.contains("secret"), "{outside}");

    // Through MCP.
    let a = agent(&alice).await;
    let got = call(
        &a,
        "cotal_send",
        json!({"channel": "general", "text": "via mcp"}),
    )
    .await;
    assert_eq!(got["receipt"]["tier"], "durable", "{got}");
    assert_eq!(got["receipt"]["durable_away"], 1, "{got}");
    let got = call(
        &a,
        "cotal_send",
        json!({"channel": "news", "text": "via mcp"}),
    )
    .await;
    assert_eq!(got["receipt"]["live_now"], 0, "{got}");
    let got = call(&a, "cotal_dm", json!({"to": "bob", "text": "via mcp"})).await;
    assert_eq!(got["receipt"]["target_online"], false, "{got}");
    assert!(
        got["delivered"].as_str().unwrap().contains("bob is away"),
        "{got}"
    );
    let got = call(
        &a,
        "cotal_anycast",
        json!({"role": "reviewer", "text": "via mcp"}),
    )
    .await;
    assert_eq!(got["receipt"]["role_online"], 0, "{got}");
    let ghost = refusal(&a, "cotal_anycast", json!({"role": "ghost", "text": "x"})).await;
    assert!(ghost.contains("would be discarded"), "{ghost}");
    let outside = refusal(
        &a,
        "cotal_send",
        json!({"channel": "secret", "text": "x", "new": true}),
    )
    .await;
    assert!(outside.contains("Refused"), "{outside}");

    a.cancel().await.unwrap();
    carol.client.close().await;
    op.client.close().await;
    c.stop().await;
}

/// What `cotal_receipts` says of the message `id`: its receipt's fields.
async fn read_state(agent: &Agent, id: &str) -> Value {
    let got = call(agent, "cotal_receipts", json!({"id": id})).await;
    assert_eq!(got["sent"][0]["id"], id, "{got}");
    got["sent"][0]["receipt"].clone()
}

#[tokio::test]
async fn a_dm_and_a_task_are_seen_waiting_delivered_and_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let c = Cotald::up(dir).await;
    let alice = mint(dir, "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(
        dir,
        "bob",
        "main",
        &["--subscribe", "general", "--role", "reviewer"],
    )
    .await;
    let carol = mint(dir, "carol", "main", &[]).await;
    let a = agent(&alice).await;

    // Sent while bob has never connected (so by id): waiting.
    let bob_id = cotald::protocol::InstanceId::from_user_nkey(&bob.id).unwrap();
    let dm = call(
        &a,
        "cotal_dm",
        json!({"to": bob_id.as_str(), "text": "psst"}),
    )
    .await;
    let dm = dm["id"].as_str().unwrap().to_owned();
    let task = call(
        &a,
        "cotal_anycast",
        json!({"role": "reviewer", "text": "review please"}),
    )
    .await;
    let task = task["id"].as_str().unwrap().to_owned();
    assert_eq!(
        read_state(&a, &dm).await,
        json!({"tier": "dm", "state": "waiting"})
    );
    assert_eq!(
        read_state(&a, &task).await,
        json!({"tier": "task", "state": "waiting"})
    );

    // bob's host runs: both are in its inbox, not read yet.
    let b = agent(&bob).await;
    call(&b, "cotal_orientation", json!({})).await;
    crate::helper::eventually("delivered", || async {
        let dm = read_state(&a, &dm).await;
        let task = read_state(&a, &task).await;
        (dm["state"] == "delivered" && task["state"] == "delivered").then_some(())
    })
    .await;

    // bob reads: both are read.
    inbox_until(&b, |m| m["text"] == "review please").await;
    crate::helper::eventually("read", || async {
        let dm = read_state(&a, &dm).await;
        let task = read_state(&a, &task).await;
        (dm["state"] == "read" && task["state"] == "read").then_some(())
    })
    .await;
    let recent = call(&a, "cotal_receipts", json!({})).await;
    let words: Vec<&str> = recent["sent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["read"].as_str().unwrap())
        .collect();
    assert_eq!(
        words,
        [
            "a holder of the role took it and acknowledged it",
            "read: the recipient acknowledged it"
        ],
        "newest first"
    );

    // A durable channel message: due to bob, a durable member.
    let post = call(
        &a,
        "cotal_send",
        json!({"channel": "general", "text": "to the team"}),
    )
    .await;
    let receipt = read_state(&a, post["id"].as_str().unwrap()).await;
    assert_eq!(receipt["tier"], "durable", "{receipt}");
    assert_eq!(receipt["due_to"], 1, "{receipt}");

    // Another identity cannot ask about alice's DM by its sequence.
    let carol = endpoint(&carol, |o| o.presence = false).await;
    let probe = carol
        .client
        .read_receipt(&cotald::protocol::Routing::to(&bob_id), 1)
        .await;
    assert!(
        probe
            .as_ref()
            .is_err_and(|e| cotald::ops::error_text(e).contains("not one you sent there")),
        "{probe:?}"
    );
    let unknown = refusal(&a, "cotal_receipts", json!({"id": "nope"})).await;
    assert!(unknown.contains("no message nope"), "{unknown}");

    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
    carol.client.close().await;
    c.stop().await;
}
