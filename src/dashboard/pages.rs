//! The pages, rendered on the server with `maud::html!`, which escapes every string spliced into
//! the markup, in text and in attribute values alike: a message body `<script>…`, a name, a
//! channel's description are shown as text, and there is no escaping call to forget. The rest
//! of the dashboard's markup is built the same way (the direct page in `direct`, the health page
//! in `health`); only the fixed CSS and JS of `assets/` are sent as they are, as files.
//! Addresses carry their query values form-encoded (`http::space_url`). The pages hold no
//! inline script or style (the CSP allows neither); `app.js` follows the event streams (the
//! feed's messages, each page's live part) and shows times in the reader's own locale and zone.
//! Forms post to the dashboard itself with its anti-forgery field.

use std::collections::BTreeMap;

use maud::{DOCTYPE, Markup, html};

use super::http::space_url;
use super::observer::FeedItem;
use crate::client::{ChannelInfo, Peer};
use crate::protocol::{CotalMessage, EpochMillis, Part, PresenceStatus};
use crate::services::membership::MembershipEntry;

/// Which page of a space is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tab {
    /// Who is there.
    Roster,
    /// The person's direct messages.
    Direct,
    /// The channels.
    Channels,
    /// The messages.
    Feed,
}

impl Tab {
    /// Every tab, in the order the header shows them.
    const ALL: [Tab; 4] = [Tab::Roster, Tab::Direct, Tab::Channels, Tab::Feed];

    /// The page's last path segment.
    pub(super) fn path(self) -> &'static str {
        match self {
            Tab::Roster => "roster",
            Tab::Direct => "direct",
            Tab::Channels => "channels",
            Tab::Feed => "feed",
        }
    }
}

/// A whole page: the header with every space's tabs and the health link, then `body`.
pub(super) fn layout(
    title: &str,
    spaces: &[String],
    here: Option<(&str, Tab)>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · cotald" }
                link rel="stylesheet" href="/assets/app.css";
                script src="/assets/app.js" defer {}
            }
            body {
                header {
                    a href="/" class="brand" { "cotald" }
                    nav {
                        @for space in spaces {
                            span class="space" { (space) }
                            @for tab in Tab::ALL {
                                @let current = here == Some((space.as_str(), tab));
                                a href=(space_url(space, tab.path(), &[]))
                                    class=[current.then_some("current")] { (tab.path()) }
                            }
                        }
                        a href="/health" class="health" { "health" }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The part of a page that changes, kept current by its event stream at `url` (each `part`
/// event replaces it; what a reader opened stays open).
pub(super) fn live(url: &str, part: Markup) -> Markup {
    html! { div id="part" data-live=(url) { (part) } }
}

/// The overview: one line per space.
pub(super) fn index(spaces: &[(String, usize, usize)]) -> Markup {
    html! {
        table {
            thead { tr { th { "space" } th { "present" } th { "recent messages" } th {} } }
            tbody {
                @for (space, online, messages) in spaces {
                    tr {
                        td { a href=(space_url(space, "roster", &[])) { (space) } }
                        td { (online) }
                        td { (messages) }
                        td {
                            a href=(space_url(space, "feed", &[])) { "feed" }
                            " · "
                            a href=(space_url(space, "channels", &[])) { "channels" }
                        }
                    }
                }
            }
        }
    }
}

/// How long ago `ts` was, in words (`4s`, `3m`, `2h`, `5d`).
fn age(ts: &EpochMillis) -> String {
    let (Some(then), Some(now)) = (ts.as_u64(), EpochMillis::now().as_u64()) else {
        return "?".into();
    };
    let s = now.saturating_sub(then) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// The wire word of a serializable value (`"durable"`, `"dnd"`, …).
fn word<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// An instance id, shortened to its first ten characters (the whole id in its title).
pub(super) fn short_id(id: &str) -> Markup {
    let short: String = id.chars().take(10).collect();
    html! { code class="id" title=(id) { (short) "…" } }
}

/// The hidden anti-forgery field every form carries.
pub(super) fn csrf_field(csrf: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(csrf); }
}

/// The table head of `columns`.
pub(super) fn thead(columns: &[&str]) -> Markup {
    html! { thead { tr { @for c in columns { th { (c) } } } } }
}

/// The roster: every instance from presence, with its status by the liveness rule (§6).
pub(super) fn roster(
    peers: &[(String, Peer, PresenceStatus)],
    memberships: &BTreeMap<String, MembershipEntry>,
    stale: bool,
) -> Markup {
    const COLUMNS: [&str; 9] = [
        "name",
        "id",
        "kind",
        "role",
        "status",
        "activity",
        "channels",
        "attention",
        "heartbeat",
    ];
    html! {
        @if stale {
            p class="warn" { "The connection to the broker is down: this is the last roster seen." }
        }
        table {
            (thead(&COLUMNS))
            tbody {
                @for (id, peer, status) in peers {
                    (roster_row(id, peer, *status, memberships.get(id)))
                }
                @if peers.is_empty() {
                    tr { td colspan="9" class="empty" { "nobody has announced presence yet" } }
                }
            }
        }
    }
}

/// One instance of the roster.
fn roster_row(
    id: &str,
    peer: &Peer,
    status: PresenceStatus,
    membership: Option<&MembershipEntry>,
) -> Markup {
    let p = &peer.presence;
    html! {
        tr class="peer" {
            td class="name" { (p.card.name) }
            td { (short_id(id)) }
            td { (word(&p.card.kind)) }
            td { (p.card.role.as_deref().unwrap_or("")) }
            td { span class={ "status status-" (status.as_str()) } { (status.as_str()) } }
            td class="activity" { (p.activity.as_deref().unwrap_or("")) }
            td class="channels" {
                @if let Some(m) = membership {
                    (channel_list("live", &m.live))
                    (channel_list("durable", &m.durable))
                }
            }
            td {
                (p.attention.map(|a| word(&a)).unwrap_or_default())
                @if !p.channel_modes.is_empty() {
                    div class="modes" {
                        @for (i, (channel, mode)) in p.channel_modes.iter().enumerate() {
                            @if i > 0 { ", " }
                            "#" (channel) " " (word(mode))
                        }
                    }
                }
            }
            td { (age(&p.ts)) }
        }
    }
}

/// `kind: #a, #b` (nothing when there is no channel).
fn channel_list(kind: &str, channels: &[String]) -> Markup {
    html! {
        @if !channels.is_empty() {
            div {
                (kind) ": "
                @for (i, channel) in channels.iter().enumerate() {
                    @if i > 0 { ", " }
                    "#" (channel)
                }
            }
        }
    }
}

/// The roster's forms: a direct message to an instance, a task for a role (the roles the
/// roster shows are offered; any other may be typed).
pub(super) fn roster_forms(
    space: &str,
    csrf: &str,
    peers: &[(String, Peer, PresenceStatus)],
) -> Markup {
    let mut roles: Vec<&str> = peers
        .iter()
        .filter_map(|(_, p, _)| p.presence.card.role.as_deref())
        .collect();
    roles.sort_unstable();
    roles.dedup();
    html! {
        div class="forms" {
            form method="post" action=(space_url(space, "dm", &[])) class="compose dm" {
                (csrf_field(csrf))
                label {
                    "direct message to "
                    select name="to" required {
                        @for (id, peer, status) in peers {
                            @let short: String = id.chars().take(10).collect();
                            option value=(id) {
                                (peer.presence.card.name) " (" (status.as_str()) ", " (short) ")"
                            }
                        }
                    }
                }
                textarea name="text" rows="2" required placeholder="what to say" {}
                button type="submit" { "send DM" }
            }
            form method="post" action=(space_url(space, "task", &[])) class="compose task" {
                (csrf_field(csrf))
                label {
                    "task for role "
                    input name="role" list="roles" required autocomplete="off";
                }
                datalist id="roles" { @for role in &roles { option value=(role); } }
                textarea name="text" rows="2" required placeholder="what to do" {}
                button type="submit" { "send task" }
            }
        }
    }
}

/// The channels: effective config, stored messages, the last message seen.
pub(super) fn channels(
    space: &str,
    channels: &[ChannelInfo],
    feed: &[std::sync::Arc<FeedItem>],
) -> Markup {
    const COLUMNS: [&str; 7] = [
        "channel",
        "class",
        "replay",
        "window",
        "description",
        "messages",
        "last message",
    ];
    html! {
        table {
            (thead(&COLUMNS))
            tbody {
                @for c in channels { (channel_row(space, c, feed)) }
                @if channels.is_empty() {
                    tr { td colspan="7" class="empty" { "no channel is configured or has messages" } }
                }
            }
        }
    }
}

/// One channel of the channels page; `feed` gives its last message.
fn channel_row(space: &str, c: &ChannelInfo, feed: &[std::sync::Arc<FeedItem>]) -> Markup {
    let name = c.channel.as_str();
    let e = &c.effective;
    let config = c.config.as_ref();
    let last = feed.iter().rev().find(|i| i.channel == name);
    html! {
        tr class="channel" {
            td { a href=(space_url(space, "feed", &[("channel", name)])) { "#" (name) } }
            td { (word(&e.delivery_class)) }
            td { @if e.replay { "yes" } @else { "no" } }
            td {
                @match &e.replay_window {
                    Some(window) => (window),
                    None => "∞",
                }
            }
            td {
                @if let Some(description) = config.and_then(|c| c.description.as_ref()) {
                    (description.as_str())
                }
                @if let Some(instructions) = config.and_then(|c| c.instructions.as_ref()) {
                    details data-key={ "instructions-" (name) } {
                        summary { "instructions" }
                        pre { (instructions.as_str()) }
                    }
                }
            }
            td {
                @match c.messages {
                    Some(m) => (m),
                    None => "?",
                }
            }
            td {
                @if let Some(i) = last {
                    @let text: String = summary(&i.message.parts).chars().take(80).collect();
                    span class="from" { (i.message.from.name) }
                    ": " (text) " "
                    span class="age" { (age(&i.message.ts)) " ago" }
                }
            }
        }
    }
}

/// A message's text parts, joined (for one-line summaries).
fn summary(parts: &[Part]) -> String {
    parts
        .iter()
        .map(|p| match p {
            Part::Text { text, .. } => text.clone(),
            Part::Data { .. } => "[data]".into(),
            Part::Extension { kind, .. } => format!("[{}]", kind.as_str()),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// How many messages a feed page opens with.
pub(super) const FEED_SHOWN: usize = 150;

/// The feed page: the compose form, the channel filter, the newest kept messages as
/// conversations (a reply under the message it answers, §5 `replyTo`), and where the live
/// stream starts.
pub(super) fn feed(
    space: &str,
    channel: Option<&str>,
    channels: &[String],
    items: &[std::sync::Arc<FeedItem>],
    last_seq: u64,
    compose: Markup,
) -> Markup {
    let matching: Vec<&FeedItem> = items
        .iter()
        .map(|i| i.as_ref())
        .filter(|i| channel.is_none_or(|c| c == i.channel))
        .collect();
    // The newest FEED_SHOWN: the page stays light (each message is about half a KiB of HTML,
    // and the browser lays out all of it before the page is usable); what arrives next is
    // added live.
    let shown = &matching[matching.len().saturating_sub(FEED_SHOWN)..];
    let older = matching.len() - shown.len();
    let after = last_seq.to_string();
    let mut query = vec![("after", after.as_str())];
    query.extend(channel.map(|c| ("channel", c)));
    html! {
        (compose)
        form method="get" class="filter" {
            label {
                "channel "
                select name="channel" {
                    option value="" { "every channel" }
                    (channel_options(channels, channel))
                }
            }
            " "
            button type="submit" { "show" }
            " "
            span id="live" class="live" { "connecting…" }
        }
        ol id="feed" class="feed" data-events=(space_url(space, "events", &query)) {
            (conversations(shown))
        }
        @if older > 0 {
            p class="older" {
                (older) " older messages are not shown here (`cotald tail --channel CH` prints a \
                channel's history)."
            }
        }
    }
}

/// An option per channel, `selected` the one chosen.
fn channel_options(channels: &[String], selected: Option<&str>) -> Markup {
    html! {
        @for c in channels {
            option value=(c) selected[Some(c.as_str()) == selected] { "#" (c) }
        }
    }
}

/// Messages as conversations: the newest conversation first, each reply under the message it
/// answers (oldest reply first), as far as the answered message is shown.
fn conversations(items: &[&FeedItem]) -> Markup {
    let shown: std::collections::HashSet<&str> =
        items.iter().map(|i| i.message.id.as_str()).collect();
    let mut replies: BTreeMap<&str, Vec<&FeedItem>> = BTreeMap::new();
    let mut roots = Vec::new();
    for item in items {
        match item.message.reply_to.as_deref() {
            Some(parent) if shown.contains(parent) && parent != item.message.id => {
                replies.entry(parent).or_default().push(item)
            }
            _ => roots.push(*item),
        }
    }
    fn render(item: &FeedItem, replies: &BTreeMap<&str, Vec<&FeedItem>>, depth: usize) -> Markup {
        let children = match replies.get(item.message.id.as_str()) {
            Some(children) if depth < 16 => children.as_slice(),
            _ => &[],
        };
        message_with(
            item,
            html! { @for c in children { (render(c, replies, depth + 1)) } },
        )
    }
    html! { @for root in roots.iter().rev() { (render(root, &replies, 0)) } }
}

/// The compose form of the feed: a post on a channel, or a reply to `reply` (its channel, its
/// id as `replyTo`, its thread as `contextId`: the thread it was in, else itself).
pub(super) fn compose(
    space: &str,
    csrf: &str,
    channel: Option<&str>,
    channels: &[String],
    reply: Option<&FeedItem>,
) -> Markup {
    let selected = reply.map(|r| r.channel.as_str()).or(channel);
    html! {
        form method="post" action=(space_url(space, "post", &[])) class="compose post" {
            @if let Some(r) = reply {
                @let text: String = summary(&r.message.parts).chars().take(120).collect();
                p class="replying" {
                    "replying to " span class="from" { (r.message.from.name) } ": " (text)
                }
            }
            (csrf_field(csrf))
            @if let Some(r) = reply {
                @let context = r.message.context_id.as_deref().unwrap_or(&r.message.id);
                input type="hidden" name="reply_to" value=(r.message.id);
                input type="hidden" name="context_id" value=(context);
            }
            label {
                "to "
                select name="channel" required { (channel_options(channels, selected)) }
            }
            textarea name="text" rows="3" required
                placeholder="write to the channel (@name mentions someone)" {}
            button type="submit" { @if reply.is_some() { "reply" } @else { "post" } }
        }
    }
}

/// One message as a list item, with nothing under it (the event stream renders arrivals so;
/// the browser puts a reply under the message it answers).
pub(super) fn message(item: &FeedItem) -> Markup {
    message_with(item, Markup::default())
}

/// One message as a list item, `replies` rendered under it.
fn message_with(item: &FeedItem, replies: Markup) -> Markup {
    let m = &item.message;
    let (datetime, time) = when(m);
    let reply = space_url(
        &m.space,
        "feed",
        &[("channel", &item.channel), ("reply", &m.id)],
    );
    html! {
        li class="msg" id={ "m-" (m.id) } data-channel=(item.channel)
            data-reply-to=[m.reply_to.as_deref()] {
            div class="meta" {
                span class="chan" { "#" (item.channel) }
                " " span class="from" { (m.from.name) }
                " " (short_id(&m.from.id))
                " " time datetime=(datetime) { (time) }
                @if !m.mentions.is_empty() {
                    " "
                    span class="mentions" {
                        @for (i, name) in m.mentions.iter().enumerate() {
                            @if i > 0 { " " }
                            mark class="mention" { "@" (name) }
                        }
                    }
                }
                " " a class="reply" href=(reply) { "reply" }
            }
            (parts_html(m))
            ol class="replies" { (replies) }
        }
        "\n"
    }
}

/// When a message was sent: (RFC 3339, shown as UTC until `app.js` puts it in the reader's
/// locale and zone).
pub(super) fn when(m: &CotalMessage) -> (String, String) {
    let datetime =
        m.ts.as_u64()
            .map(|ms| crate::provision::rfc3339((ms / 1000) as i64))
            .unwrap_or_default();
    let time = datetime.replacen('T', " ", 1).replace('Z', " UTC");
    (datetime, time)
}

/// A message's parts: text (its `@mentions` marked), data and extension parts folded.
pub(super) fn parts_html(m: &CotalMessage) -> Markup {
    html! {
        @for part in &m.parts {
            @match part {
                Part::Text { text, .. } => div class="text" { (marked(text, &m.mentions)) },
                Part::Data { data, .. } => details class="data" {
                    summary { "data" }
                    pre { (serde_json::to_string_pretty(data).unwrap_or_default()) }
                },
                Part::Extension { kind, fields } => details class="data" {
                    summary { (kind.as_str()) }
                    pre { (serde_json::to_string_pretty(fields).unwrap_or_default()) }
                },
            }
        }
    }
}

/// `text` with each `@name` of `mentions` in it marked (the longest where two start at one
/// place).
fn marked(text: &str, mentions: &[String]) -> Markup {
    let mut pieces: Vec<(&str, bool)> = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let next = mentions
            .iter()
            .filter(|name| !name.is_empty())
            .filter_map(|name| {
                let at = rest.find(&format!("@{name}"))?;
                Some((at, at + 1 + name.len()))
            })
            .min_by_key(|&(at, end)| (at, std::cmp::Reverse(end)));
        let Some((at, end)) = next else {
            pieces.push((rest, false));
            break;
        };
        pieces.push((&rest[..at], false));
        pieces.push((&rest[at..end], true));
        rest = &rest[end..];
    }
    html! {
        @for (piece, mention) in pieces {
            @if mention { mark class="mention" { (piece) } } @else { (piece) }
        }
    }
}

/// A refusal page.
pub(super) fn refusal(title: &str, text: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) }
                link rel="stylesheet" href="/assets/app.css";
            }
            body { main { h1 { (title) } p { (text) } } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{CotalMessage, EndpointRef, Routing};

    const HOSTILE: &str = r#""><img src=x onerror=alert(1)>"#;

    fn hostile_message() -> CotalMessage {
        let mut message = CotalMessage::new(
            "main",
            EndpointRef {
                id: "A".repeat(56),
                name: "<b>eve</b>".into(),
                role: None,
                extra: Default::default(),
            },
            Routing::Channel("general".into()),
            vec![
                Part::text("<script>alert(1)</script> hi @bob &amp; @bobby"),
                Part::Data {
                    data: serde_json::json!({"k": "</pre><script>"}),
                    extra: Default::default(),
                },
            ],
        );
        message.mentions = vec!["bob".into(), "bobby".into()];
        message.id = format!("x{HOSTILE}");
        message.reply_to = Some(HOSTILE.into());
        message
    }

    #[test]
    fn wire_strings_are_shown_as_text() {
        let html = super::message(&FeedItem {
            seq: 1,
            channel: HOSTILE.into(),
            message: hostile_message(),
        })
        .into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("<b>"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(!html.contains(HOSTILE), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{html}"
        );
        assert!(html.contains("&amp;amp;"), "{html}");
        assert!(html.contains("&lt;/pre&gt;&lt;script&gt;"), "{html}");
        // In attribute values too: the quote cannot end one.
        let attribute = "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;";
        assert!(html.contains(&format!(r#"id="m-x{attribute}""#)), "{html}");
        assert!(
            html.contains(&format!(r#"data-reply-to="{attribute}""#)),
            "{html}"
        );
        // A query value is form-encoded, then escaped as an attribute.
        assert!(
            html.contains("feed?channel=%22%3E%3Cimg+src%3Dx+onerror%3Dalert%281%29%3E&amp;reply="),
            "{html}"
        );
    }

    #[test]
    fn each_mention_is_marked_the_longest_first() {
        let html = parts_html(&hostile_message()).into_string();
        assert!(
            html.contains(
                r#"hi <mark class="mention">@bob</mark> &amp;amp; <mark class="mention">@bobby</mark></div>"#
            ),
            "{html}"
        );
        let html = marked("@bob, @bob@bob", &["bob".into()]).into_string();
        assert_eq!(
            html,
            r#"<mark class="mention">@bob</mark>, <mark class="mention">@bob</mark><mark class="mention">@bob</mark>"#
        );
        assert_eq!(marked("no one", &[]).into_string(), "no one");
    }
}
