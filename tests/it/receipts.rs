//! Receipts that name where a message went, per tier, through `cotald send --json` and through
//! the MCP tools: a durable channel with a member away, a live channel nobody is subscribed
//! to, a DM to a peer that is away, a task for a role whose holder is away, a role nobody
//! holds, and a refused send.

use serde_json::{Value, json};

use cotald::client::Replay;

use crate::helper::{
    Cotald, endpoint, join_durable_and_leave_the_room, mint, operator_endpoint, set_channel,
};
use crate::mcp::{agent, call, refusal};

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
