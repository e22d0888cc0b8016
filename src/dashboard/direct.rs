//! The direct page: the person's conversations with each agent, both ways, what needs them,
//! whether each DM they sent was read; and what a page says of a message just sent.

use maud::{Markup, html};

use super::http::{Request, space_url};
use super::observer::{FeedItem, Observer};
use super::pages::{csrf_field, parts_html, short_id, when};
use super::person::DirectItem;
use crate::protocol::CotalMessage;

/// The person's direct messages (`person`, its name `me`): how many wait unread, what needs
/// them (the DMs to them, the channel messages that mention them: newest first), then each
/// conversation both ways (newest conversation first) with a form to answer in it. `read`
/// says of a DM the person sent, by id, whether it was read.
pub(super) fn direct(
    space: &str,
    csrf: &str,
    me: &str,
    unread: Option<u64>,
    dms: &[std::sync::Arc<DirectItem>],
    read: &std::collections::HashMap<String, String>,
    mentions: &[&FeedItem],
) -> Markup {
    let unread = match unread {
        Some(0) => "no direct message waits unread".to_owned(),
        Some(1) => "1 direct message waits unread (`cotald tail --dm` reads it)".to_owned(),
        Some(n) => format!("{n} direct messages wait unread (`cotald tail --dm` reads them)"),
        None => "how many wait unread is unknown (the broker did not say)".to_owned(),
    };
    // Conversations by peer, the one with the newest message first.
    let mut peers: Vec<(&str, Vec<&DirectItem>)> = Vec::new();
    for d in dms.iter().rev() {
        match peers.iter_mut().find(|(p, _)| *p == d.peer) {
            Some((_, items)) => items.push(d),
            None => peers.push((d.peer.as_str(), vec![d])),
        }
    }
    html! {
        p class="unread" { (me) ": " (unread) }
        h2 { "Needs you" }
        ol class="feed needs" { (needs_you(dms, mentions)) }
        h2 { "Conversations" }
        @for (peer, items) in &peers {
            (conversation(space, csrf, peer, items, read))
        }
        @if peers.is_empty() {
            p { "No direct message to or from you yet: send one from the roster." }
        }
    }
}

/// The person's conversation with `peer` (`items` newest first), with a form to answer.
fn conversation(
    space: &str,
    csrf: &str,
    peer: &str,
    items: &[&DirectItem],
    read: &std::collections::HashMap<String, String>,
) -> Markup {
    let name = items
        .iter()
        .find(|d| d.incoming)
        .map_or("a peer", |d| d.message.from.name.as_str());
    html! {
        section class="conversation" {
            h3 { (name) " " (short_id(peer)) }
            ol class="feed" {
                @for d in items.iter().rev() {
                    @if d.incoming {
                        (direct_entry(&d.message, "dm in", Markup::default(), Markup::default()))
                    } @else {
                        @let state = html! {
                            @if let Some(words) = read.get(&d.message.id) { p class="read" { (words) } }
                        };
                        (direct_entry(&d.message, "dm out", html! { "→ " }, state))
                    }
                }
            }
            form method="post" action=(space_url(space, "dm", &[])) class="compose dm" {
                (csrf_field(csrf))
                input type="hidden" name="to" value=(peer);
                textarea name="text" rows="2" required placeholder={ "answer " (name) } {}
                button type="submit" { "send DM" }
            }
        }
    }
}

/// What a page says of the message the person just sent: where it went.
pub(super) fn sent(receipt: &str) -> Markup {
    html! { p class="receipt" { "Sent: " (receipt) } }
}

/// One message of the direct page, `place` before its sender, `after` after its parts.
fn direct_entry(m: &CotalMessage, class: &str, place: Markup, after: Markup) -> Markup {
    let (datetime, time) = when(m);
    html! {
        li class={ "msg " (class) } {
            div class="meta" {
                (place)
                span class="from" { (m.from.name) }
                " " (short_id(&m.from.id))
                " " time datetime=(datetime) { (time) }
            }
            (parts_html(m))
            (after)
        }
    }
}

/// "Needs you": the DMs to the person and the channel messages mentioning them, newest
/// first, at most 50.
fn needs_you(dms: &[std::sync::Arc<DirectItem>], mentions: &[&FeedItem]) -> Markup {
    let mut needs: Vec<(u64, Markup)> = dms
        .iter()
        .filter(|d| d.incoming)
        .map(|d| {
            let ts = d.message.ts.as_u64().unwrap_or(0);
            let place = html! { "DM " };
            (
                ts,
                direct_entry(&d.message, "dm in", place, Markup::default()),
            )
        })
        .collect();
    needs.extend(mentions.iter().map(|i| {
        let place = html! { span class="chan" { "#" (i.channel) } " " };
        let ts = i.message.ts.as_u64().unwrap_or(0);
        (
            ts,
            direct_entry(&i.message, "mention", place, Markup::default()),
        )
    }));
    needs.sort_by_key(|n| std::cmp::Reverse(n.0));
    html! { @for (_, entry) in needs.into_iter().take(50) { (entry) } }
}

/// What the page says of the message the person just sent (`?sent=<id>`): its receipt, as
/// taken when it was sent.
pub(super) fn sent_banner(observer: &Observer, req: &Request) -> Markup {
    req.param("sent")
        .and_then(|id| observer.person.receipt(id))
        .map(|receipt| sent(&receipt))
        .unwrap_or_default()
}
