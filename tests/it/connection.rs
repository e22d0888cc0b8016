//! `cotal_connection`: an agent tells "cut off" from "unanswered". Ready while connected and
//! started; reconnecting while the broker is gone (the supervisor frozen, so nothing restarts
//! it); ready again once it is back, naming the loss as its last error and counting it.

use serde_json::{Value, json};

use crate::helper::{Cotald, eventually, mint};
use crate::mcp::{Agent, agent, call};

/// Asks `cotal_connection` until its answer satisfies `pred`; that answer.
async fn until(agent: &Agent, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    eventually(what, || async {
        let now = call(agent, "cotal_connection", json!({})).await;
        pred(&now).then_some(now)
    })
    .await
}

#[tokio::test]
async fn an_agent_sees_its_connection_lost_and_back() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let b = agent(&bob).await;
    call(&b, "cotal_orientation", json!({})).await;

    let ready = until(&b, "ready", |v| v["state"] == "ready").await;
    assert_eq!(ready["lost"], 0, "{ready}");
    assert!(ready.get("reasons").is_none(), "{ready}");
    assert_eq!(
        ready["at_broker"][0],
        json!({"what": "direct messages", "not_yet_delivered": 0, "unacknowledged": 0}),
        "{ready}"
    );

    // The broker killed while the supervisor cannot restart it: cut off, and it says so.
    let broker = c.state().broker_pid;
    c.signal(libc::SIGSTOP);
    // SAFETY: plain syscall on the broker child.
    assert_eq!(unsafe { libc::kill(broker as i32, libc::SIGKILL) }, 0);
    let cut = until(&b, "reconnecting", |v| v["state"] == "reconnecting").await;
    assert_eq!(cut["lost"], 1, "{cut}");
    assert_eq!(
        cut["at_broker_unknown"][0],
        "not connected: the broker cannot be asked"
    );
    assert!(
        cut["last_error"]["what"]
            .as_str()
            .is_some_and(|w| w.starts_with("the connection to the server was lost")),
        "{cut}"
    );

    // Restarted: ready again, the loss counted and named, no longer a reason.
    c.signal(libc::SIGCONT);
    let back = until(&b, "ready again", |v| v["state"] == "ready").await;
    assert_eq!(back["lost"], 1, "{back}");
    assert!(back["last_error"]["what"].is_string(), "{back}");

    b.cancel().await.unwrap();
    c.stop().await;
}
