//! The wire as untrusted input (§4, §5): frames an agent's credential lets it write and no
//! library would (the broker passes a header block through untouched) cost that one message
//! only, on every connection the appliance and its clients own.

use std::collections::BTreeSet;
use std::time::Duration;

use cotald::client::{Connection, Replay};
use serde_json::json;

use crate::dashboard::Site;
use crate::helper::{Cotald, TIMEOUT, cotald_in, endpoint, join_durable_and_leave_the_room, mint};
use crate::raw::RawClient;

/// What a text of a delivery says.
fn text(d: &cotald::client::Delivery) -> String {
    serde_json::to_value(&d.message.parts[0]).unwrap()["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// An envelope of `from` with `routing`, saying `text`.
fn envelope(from: &str, routing: serde_json::Value, text: &str) -> Vec<u8> {
    let mut m = json!({
        "id": cotald::protocol::new_message_id(),
        "ts": 1,
        "space": "main",
        "from": {"id": from, "name": "mallory"},
        "parts": [{"kind": "text", "text": text}],
    });
    m.as_object_mut()
        .unwrap()
        .extend(routing.as_object().unwrap().clone());
    m.to_string().into_bytes()
}

/// The frames: a name, the header block as written, and whether the body is an envelope.
/// JetStream stores each but the last header block, which is over its 64 KiB: that one reaches
/// only the live readers.
fn poison() -> Vec<(&'static str, Vec<u8>, bool)> {
    let block = |bytes: usize| format!("NATS/1.0\r\nX-Pad: {}\r\n\r\n", "p".repeat(bytes));
    vec![
        (
            "a bare CR in a value",
            b"NATS/1.0\r\nX-Note: a\rb\r\n\r\n".to_vec(),
            true,
        ),
        (
            "a value that is not UTF-8",
            b"NATS/1.0\r\nX-Note: \xff\xfe\r\n\r\n".to_vec(),
            true,
        ),
        (
            "a line with no colon",
            b"NATS/1.0\r\nX-Note\r\n\r\n".to_vec(),
            true,
        ),
        ("a bad status line", b"NATS/1.0 abc\r\n\r\n".to_vec(), true),
        (
            "a huge status line",
            format!("NATS/1.0 {}\r\n\r\n", "9".repeat(4096)).into_bytes(),
            true,
        ),
        (
            "a forged status",
            b"NATS/1.0 409 Consumer Deleted\r\n\r\n".to_vec(),
            true,
        ),
        ("an empty header block", Vec::new(), true),
        ("a large header block", block(60_000).into_bytes(), true),
        (
            "a body that is not an envelope",
            b"NATS/1.0\r\n\r\n".to_vec(),
            false,
        ),
        (
            "a header block over 64 KiB",
            block(200_000).into_bytes(),
            true,
        ),
    ]
}

/// Receives until every text of `want` surfaced (acking each), bounded.
async fn receive_all(conn: &mut Connection, want: &BTreeSet<String>, who: &str) {
    let mut got = BTreeSet::new();
    let outcome = tokio::time::timeout(2 * TIMEOUT, async {
        while !want.is_subset(&got) {
            let Some(d) = conn.deliveries.next().await else {
                break;
            };
            got.insert(text(&d));
            if d.needs_ack() {
                d.ack().await.unwrap();
            }
        }
    })
    .await;
    let missing: Vec<&String> = want.difference(&got).collect();
    assert!(
        outcome.is_ok() && missing.is_empty(),
        "{who} is missing {} of {}: {missing:?}",
        missing.len(),
        want.len()
    );
}

#[tokio::test]
async fn a_malformed_frame_costs_its_own_message_only() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let grants = ["--allow-publish", "general,lounge"];
    let mallory = mint(tmp.path(), "mallory", "main", &grants).await;
    let bob = mint(
        tmp.path(),
        "bob",
        "main",
        &["--subscribe", "general,lounge"],
    )
    .await;
    let carol = mint(tmp.path(), "carol", "main", &["--subscribe", "general"]).await;
    let op = crate::helper::operator_endpoint(tmp.path(), &bob, false).await;
    crate::helper::set_channel(&op, "lounge", json!({"deliveryClass": "live"})).await;
    join_durable_and_leave_the_room(&carol, "general").await;
    let mut b = endpoint(&bob, |_| {}).await;
    b.client.join("general", Replay::Off).await.unwrap();
    b.client.join("lounge", Replay::Off).await.unwrap();
    let site = Site::of(&c).await;
    let mut feed = site.events("").await;

    let ca = tmp.path().join("tls/ca.pem");
    let mut raw = RawClient::connect(&c.state().listen.to_string(), &mallory.creds, &ca).await;
    let id = raw.id.clone();
    let subjects = [
        (
            "general",
            format!("cotal.main.chat.{id}.general"),
            json!({"channel": "general"}),
        ),
        (
            "lounge",
            format!("cotal.main.chat.{id}.lounge"),
            json!({"channel": "lounge"}),
        ),
        (
            "dm",
            format!("cotal.main.inst.{}.{id}", bob.id),
            json!({"to": bob.id}),
        ),
    ];
    let (mut to_bob, mut to_carol, mut to_feed) = (BTreeSet::new(), BTreeSet::new(), Vec::new());
    let mut stored_on_general = 0;
    for (case, header, is_envelope) in poison() {
        for (route, subject, routing) in &subjects {
            let body = match is_envelope {
                true => envelope(&id, routing.clone(), &format!("poison: {case}")),
                false => b"not json at all".to_vec(),
            };
            let ack = raw.hpub(subject, &header, &body).await;
            let stored = !ack.contains("\"error\"");
            assert_eq!(
                stored,
                !case.contains("over 64 KiB"),
                "{case} on {route}: {ack}"
            );
            if stored && *route == "general" {
                stored_on_general += 1;
            }
            for i in 0..20 {
                let text = format!("{case} / {route} / {i}");
                let id_line = format!("NATS/1.0\r\nNats-Msg-Id: {}\r\n\r\n", uuid_like(&text));
                let body = envelope(&id, routing.clone(), &text);
                let ack = raw.hpub(subject, id_line.as_bytes(), &body).await;
                assert!(!ack.contains("\"error\""), "{text}: {ack}");
                if *route == "general" {
                    stored_on_general += 1;
                }
                to_bob.insert(text.clone());
                match *route {
                    "general" => {
                        to_carol.insert(text.clone());
                        to_feed.push(text);
                    }
                    "lounge" => to_feed.push(text),
                    _ => {}
                }
            }
        }
    }
    eprintln!(
        "{} malformed frames, then 20 ordinary messages after each",
        poison().len() * subjects.len()
    );
    // The online member: every ordinary message, on both channels and as DMs.
    receive_all(&mut b, &to_bob, "the online member").await;
    // The dashboard's live feed: every ordinary message of both channels.
    for text in &to_feed {
        feed.until(&html_escape(text)).await;
    }
    // Away, the durable member's backlog is every message stored on its channel since it
    // joined, the refused ones among them (its next session refuses them in turn).
    let out = cotald_in(tmp.path(), &["status", "--json"]).await;
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let away = said["delivery"]["main"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == carol.id.as_str())
        .unwrap_or_else(|| panic!("carol among the durable members: {said:#}"))
        .clone();
    assert_eq!(away["online"], false, "{away}");
    assert_eq!(away["backlog"].as_u64(), Some(stored_on_general), "{away}");
    assert!(away["oldest_pending_secs"].is_u64(), "{away}");
    // The durable member catching up: every ordinary message of the durable channel.
    let mut cc = endpoint(&carol, |_| {}).await;
    receive_all(&mut cc, &to_carol, "the durable member catching up").await;
    // Healthy again, as `status` says, within 10 s.
    let healthy = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let out = cotald_in(tmp.path(), &["status", "--json"]).await;
            if out.status.success() {
                return serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("status --json says healthy within 10 s");
    assert!(healthy["healthy"].as_bool().unwrap(), "{healthy}");
    let refused = &healthy["delivery"]["main"]["refused"]["malformed-header"];
    assert!(refused.as_u64().unwrap_or(0) > 0, "counted: {healthy}");

    for conn in [b, cc, op] {
        conn.client.close().await;
    }
    let log = c.stop_for_log().await;
    assert!(!log.contains("panicked"), "no panic:\n{log}");
    // The members' joins were confirmed without a subscription the broker refuses (and logs).
    assert!(!log.contains("Subscription Violation"), "{log}");
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("message refused") && l.contains(&id))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "the refusal is logged once with its sender:\n{log}"
    );
}

/// A subject may hold any bytes but space and tab: one with Unicode whitespace in a token
/// (U+3000), published with a header block on a DM subject (the appliance follows every DM),
/// costs its own message only: the appliance's connections stay up, what follows is delivered,
/// and `status` stays healthy.
#[tokio::test]
async fn a_subject_with_unicode_whitespace_costs_its_own_message_only() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let mallory = mint(
        tmp.path(),
        "mallory",
        "main",
        &["--allow-publish", "general"],
    )
    .await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let mut b = endpoint(&bob, |_| {}).await;
    b.client.join("general", Replay::Off).await.unwrap();
    let ca = tmp.path().join("tls/ca.pem");
    let mut raw = RawClient::connect(&c.state().listen.to_string(), &mallory.creds, &ca).await;
    let id = raw.id.clone();
    let hostile = format!("cotal.main.inst.a\u{3000}b.{id}");
    let body = envelope(&id, json!({"to": "a\u{3000}b"}), "hostile");
    let ack = raw
        .hpub(&hostile, b"NATS/1.0\r\nX-Note: hi\r\n\r\n", &body)
        .await;
    assert!(!ack.contains("\"error\""), "stored: {ack}");
    let routes = [
        (
            format!("cotal.main.chat.{id}.general"),
            json!({"channel": "general"}),
        ),
        (
            format!("cotal.main.inst.{}.{id}", bob.id),
            json!({"to": bob.id}),
        ),
    ];
    let mut want = BTreeSet::new();
    for i in 0..10 {
        for (subject, routing) in &routes {
            let text = format!("after / {subject} / {i}");
            let id_line = format!("NATS/1.0\r\nNats-Msg-Id: {}\r\n\r\n", uuid_like(&text));
            let body = envelope(&id, routing.clone(), &text);
            let ack = raw.hpub(subject, id_line.as_bytes(), &body).await;
            assert!(!ack.contains("\"error\""), "{text}: {ack}");
            want.insert(text);
        }
    }
    receive_all(&mut b, &want, "the online member").await;
    let out = cotald_in(tmp.path(), &["status", "--json"]).await;
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "status healthy: {said}");
    b.client.close().await;
    let log = c.stop_for_log().await;
    assert!(!log.contains("panicked"), "no panic:\n{log}");
    let running = log.split("phase: shutting down").next().unwrap_or_default();
    assert!(
        !running.contains("disconnected") && !running.contains("reconnect"),
        "no connection of the appliance dropped while it ran:\n{log}"
    );
}

/// A stable message id for `text` (the broker's duplicate window keys on it).
fn uuid_like(text: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// `text` as the dashboard writes it into a page.
fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}
