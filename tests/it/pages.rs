//! Bounded, DM-first inbox pages and threads read back: an inbox holding 500 channel messages
//! and 3 DMs answers the DMs first, never over 64 KB, and says what is left; a text larger than
//! a page comes in pieces under one id; a thread of 5 replies, across a channel and DMs, is
//! read back in order.

use serde_json::{Value, json};

use cotald::protocol::{Channel, InstanceId, Part, Routing};

use crate::helper::{Cotald, TIMEOUT, endpoint, mint};
use crate::mcp::{Agent, agent, call, call_raw, inbox_until, text};

/// The most bytes one answer carries.
const PAGE: usize = 64 * 1024;

/// Reads one inbox page (`args`), checking that the answer, as structured content and as the
/// text content that repeats it, stays within a page.
async fn page(agent: &Agent, args: Value) -> Value {
    let raw = call_raw(agent, "cotal_inbox", args).await;
    assert_ne!(raw.is_error, Some(true), "{raw:?}");
    let structured = raw.structured_content.expect("structured content");
    let bytes = serde_json::to_vec(&structured).unwrap().len();
    assert!(bytes <= PAGE, "an answer of {bytes} bytes");
    for c in &raw.content {
        if let Some(t) = c.as_text() {
            assert!(
                t.text.len() <= PAGE,
                "a text content of {} bytes",
                t.text.len()
            );
        }
    }
    structured
}

#[tokio::test]
async fn an_inbox_of_500_channel_messages_and_3_dms_answers_the_dms_first_within_64_kb() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let sender = endpoint(&alice, |o| o.presence = false).await;
    let b = agent(&bob).await;
    call(&b, "cotal_orientation", json!({})).await;

    // 500 channel messages of ~400 bytes (200 KB in all), then 3 DMs, all while bob is busy.
    let general = Routing::channel(&Channel::new("general").unwrap());
    for i in 0..500 {
        let text = format!("channel {i:03} {}", "x".repeat(400));
        sender
            .client
            .send(general.clone(), vec![Part::text(text)], &[])
            .await
            .unwrap();
    }
    let to_bob = Routing::to(&InstanceId::from_user_nkey(&bob.id).unwrap());
    for i in 0..3 {
        sender
            .client
            .send_text(to_bob.clone(), &format!("dm {i}"))
            .await
            .unwrap();
    }
    // Until all 503 wait (a peek takes nothing).
    tokio::time::timeout(TIMEOUT, async {
        loop {
            let seen = page(&b, json!({"peek": true, "limit": 1, "wait": 1})).await;
            let waiting = seen["messages"].as_array().unwrap().len()
                + seen["remaining"].as_u64().unwrap() as usize;
            if waiting >= 503 {
                break;
            }
        }
    })
    .await
    .expect("503 waiting");

    // The first page: the DMs first, then as many channel messages as fit in 64 KB.
    let first = page(&b, json!({"limit": 200})).await;
    let messages = first["messages"].as_array().unwrap();
    let texts: Vec<&str> = messages.iter().map(text).collect();
    assert_eq!(texts[..3], ["dm 0", "dm 1", "dm 2"], "DMs first");
    assert!(messages[3..].iter().all(|m| m["kind"] == "channel"));
    assert!(
        messages.len() < 200,
        "the page, not the limit, bounded it: {}",
        messages.len()
    );
    let remaining = first["remaining"].as_u64().unwrap();
    assert!(remaining > 0);
    assert_eq!(
        first["left"],
        json!({"direct": 0, "mentions": 0, "channel": remaining}),
        "what is left, by kind"
    );

    // The rest over further pages, each within 64 KB: every channel message once read.
    let mut read: Vec<String> = texts[3..].iter().map(|t| t[..11].to_owned()).collect();
    let mut pages = 1;
    loop {
        let next = page(&b, json!({"limit": 200})).await;
        pages += 1;
        for m in next["messages"].as_array().unwrap() {
            read.push(text(m)[..11].to_owned());
        }
        if next["remaining"] == 0 {
            break;
        }
        assert!(pages < 50, "the pages end");
    }
    read.sort_unstable();
    read.dedup();
    assert_eq!(read.len(), 500, "every channel message, over {pages} pages");

    // A DM larger than a page comes in pieces under one id, and is consumed with its last.
    let big: String = (0..150_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    sender.client.send_text(to_bob.clone(), &big).await.unwrap();
    let (first_piece, _) = inbox_until(&b, |m| m["kind"] == "dm").await;
    let id = first_piece["id"].as_str().unwrap().to_owned();
    let mut whole = text(&first_piece).to_owned();
    assert_eq!(first_piece["text_part"]["from"], 0);
    assert_eq!(first_piece["text_part"]["of"], big.len());
    while whole.len() < big.len() {
        let next = page(&b, json!({})).await;
        let piece = &next["messages"][0];
        assert_eq!(piece["id"], id.as_str(), "the same message goes on");
        assert_eq!(piece["text_part"]["from"], whole.len());
        whole.push_str(text(piece));
    }
    assert_eq!(whole, big);
    let after = page(&b, json!({})).await;
    assert_eq!(
        after["remaining"], 0,
        "consumed with its last piece: {after}"
    );
    assert!(after["messages"].as_array().unwrap().is_empty());

    b.cancel().await.unwrap();
    sender.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn a_thread_of_5_replies_is_read_back_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(
        tmp.path(),
        "alice",
        "main",
        &["--allow-publish", "general", "--subscribe", "general"],
    )
    .await;
    let bob = mint(
        tmp.path(),
        "bob",
        "main",
        &["--allow-publish", "general", "--subscribe", "general"],
    )
    .await;
    let a = agent(&alice).await;
    let b = agent(&bob).await;
    call(&a, "cotal_orientation", json!({})).await;
    call(&b, "cotal_orientation", json!({})).await;

    // The question on the channel; the answers alternate: bob by DM, alice on the channel.
    let root = call(
        &a,
        "cotal_send",
        json!({"channel": "general", "text": "which port?"}),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut last = root.clone();
    for n in 1..=5 {
        let reply = format!("reply {n}");
        let from = if n % 2 == 1 { &b } else { &a };
        // The replier has the message it answers.
        inbox_until(from, |m| m["id"] == last.as_str()).await;
        let sent = if n % 2 == 1 {
            call(
                from,
                "cotal_dm",
                json!({"to": "alice", "text": reply, "reply_to": last}),
            )
            .await
        } else {
            call(
                from,
                "cotal_send",
                json!({"channel": "general", "text": reply, "reply_to": last}),
            )
            .await
        };
        last = sent["id"].as_str().unwrap().to_owned();
    }
    let (seen, _) = inbox_until(&a, |m| m["id"] == last.as_str()).await;
    assert_eq!(seen["thread"], root.as_str(), "a reply names its thread");

    // Read back from the last reply: the question and its 5 replies, in order.
    let thread = call(&a, "cotal_thread", json!({"id": last})).await;
    assert_eq!(thread["thread"], root.as_str());
    let texts: Vec<&str> = thread["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert_eq!(
        texts,
        [
            "which port?",
            "reply 1",
            "reply 2",
            "reply 3",
            "reply 4",
            "reply 5"
        ]
    );
    assert_eq!(thread["more"], 0);
    // Bounded: two at a time from the third.
    let part = call(
        &a,
        "cotal_thread",
        json!({"id": root, "start": 2, "limit": 2}),
    )
    .await;
    let texts: Vec<&str> = part["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert_eq!(texts, ["reply 2", "reply 3"]);
    assert_eq!(part["more"], 2);

    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
    c.stop().await;
}
