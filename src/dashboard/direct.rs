//! The direct page: the person's conversations with each agent, both ways, what needs them,
//! whether each DM they sent was read; and what a page says of a message just sent.

use std::fmt::Write;

use super::http::Request;
use super::http::encode;
use super::observer::{FeedItem, Observer};
use super::pages::{esc, parts_html, short_id, when};
use crate::protocol::CotalMessage;

/// The person's direct messages (`person`, its name `me`): how many wait unread, what needs
/// them (the DMs to them, the channel messages that mention them: newest first), then each
/// conversation both ways (newest conversation first) with a form to answer in it. `names`
/// gives a peer's name as its messages sign it.
pub(super) fn direct(
    space: &str,
    csrf: &str,
    me: &str,
    unread: Option<u64>,
    dms: &[std::sync::Arc<super::person::DirectItem>],
    read: &std::collections::HashMap<String, String>,
    mentions: &[&FeedItem],
) -> String {
    let s = encode(space);
    let unread = match unread {
        Some(0) => "no direct message waits unread".to_owned(),
        Some(1) => "1 direct message waits unread (`cotald tail --dm` reads it)".to_owned(),
        Some(n) => format!("{n} direct messages wait unread (`cotald tail --dm` reads them)"),
        None => "how many wait unread is unknown (the broker did not say)".to_owned(),
    };
    let needs = needs_you(dms, mentions);
    // Conversations by peer, the one with the newest message first.
    let mut peers: Vec<(&str, Vec<&super::person::DirectItem>)> = Vec::new();
    for d in dms.iter().rev() {
        match peers.iter_mut().find(|(p, _)| *p == d.peer) {
            Some((_, items)) => items.push(d),
            None => peers.push((d.peer.as_str(), vec![d])),
        }
    }
    let mut conversations = String::new();
    for (peer, items) in &peers {
        let name = items
            .iter()
            .find(|d| d.incoming)
            .map_or("a peer", |d| d.message.from.name.as_str());
        let list: String = items
            .iter()
            .rev()
            .map(|d| match d.incoming {
                true => direct_entry(&d.message, "dm in", "", ""),
                false => {
                    let state = read.get(&d.message.id).map_or(String::new(), |words| {
                        format!(r#"<p class="read">{}</p>"#, esc(words))
                    });
                    direct_entry(&d.message, "dm out", "→ ", &state)
                }
            })
            .collect();
        let _ = write!(
            conversations,
            r#"<section class="conversation"><h3>{name} {short}</h3><ol class="feed">{list}</ol><form method="post" action="/spaces/{s}/dm" class="compose dm"><input type="hidden" name="csrf" value="{csrf}"><input type="hidden" name="to" value="{to}"><textarea name="text" rows="2" required placeholder="answer {name}"></textarea><button type="submit">send DM</button></form></section>"#,
            name = esc(name),
            short = short_id(peer),
            to = esc(peer),
            csrf = esc(csrf),
        );
    }
    if conversations.is_empty() {
        conversations =
            "<p>No direct message to or from you yet: send one from the roster.</p>".to_owned();
    }
    format!(
        r#"<p class="unread">{me}: {unread}</p><h2>Needs you</h2><ol class="feed needs">{needs}</ol><h2>Conversations</h2>{conversations}"#,
        me = esc(me),
        unread = esc(&unread),
    )
}

/// What a page says of the message the person just sent: where it went.
pub(super) fn sent(receipt: &str) -> String {
    format!(r#"<p class="receipt">Sent: {}</p>"#, esc(receipt))
}

/// One message of the direct page, `place` (HTML) before its sender, `after` (HTML) after
/// its parts.
fn direct_entry(m: &CotalMessage, class: &str, place: &str, after: &str) -> String {
    let (datetime, time) = when(m);
    format!(
        r#"<li class="msg {class}"><div class="meta">{place}<span class="from">{from}</span> {sender} <time datetime="{datetime}">{time}</time></div>{parts}{after}</li>"#,
        from = esc(&m.from.name),
        sender = short_id(&m.from.id),
        parts = parts_html(m),
    )
}

/// "Needs you": the DMs to the person and the channel messages mentioning them, newest
/// first, at most 50.
fn needs_you(dms: &[std::sync::Arc<super::person::DirectItem>], mentions: &[&FeedItem]) -> String {
    let mut needs: Vec<(u64, String)> = dms
        .iter()
        .filter(|d| d.incoming)
        .map(|d| {
            let ts = d.message.ts.as_u64().unwrap_or(0);
            (ts, direct_entry(&d.message, "dm in", "DM ", ""))
        })
        .collect();
    needs.extend(mentions.iter().map(|i| {
        let place = format!(r#"<span class="chan">#{}</span> "#, esc(&i.channel));
        let ts = i.message.ts.as_u64().unwrap_or(0);
        (ts, direct_entry(&i.message, "mention", &place, ""))
    }));
    needs.sort_by_key(|n| std::cmp::Reverse(n.0));
    needs.into_iter().take(50).map(|(_, html)| html).collect()
}

/// What the page says of the message the person just sent (`?sent=<id>`): its receipt, as
/// taken when it was sent.
pub(super) fn sent_banner(observer: &Observer, req: &Request) -> String {
    req.param("sent")
        .and_then(|id| observer.person.receipt(id))
        .map(|receipt| sent(&receipt))
        .unwrap_or_default()
}
