//! The pages, rendered on the server: every string that came from the wire or a peer goes
//! through [`esc`] before it reaches HTML, so a message body `<script>…` is shown as text. The
//! pages hold no inline script or style (the CSP allows neither); `app.js` follows the event
//! streams (the feed's messages, each page's live part) and shows times in the reader's own
//! locale and zone. Forms post to the dashboard itself with its anti-forgery field.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::http::encode;
use super::observer::FeedItem;
use crate::client::{ChannelInfo, Peer};
use crate::datadir::RuntimeState;
use crate::protocol::{CotalMessage, EpochMillis, Part, PresenceStatus};
use crate::services::Health;
use crate::services::membership::MembershipEntry;

/// `s` escaped for HTML text and attribute values. A carriage return becomes a character
/// reference too: an event stream would take it for a line end.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\r' => out.push_str("&#13;"),
            c => out.push(c),
        }
    }
    out
}

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
    fn path(self) -> &'static str {
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
    body: &str,
) -> String {
    let mut nav = String::new();
    for space in spaces {
        let _ = write!(nav, r#"<span class="space">{}</span>"#, esc(space));
        for tab in [Tab::Roster, Tab::Direct, Tab::Channels, Tab::Feed] {
            let current = here == Some((space.as_str(), tab));
            let _ = write!(
                nav,
                r#"<a href="/spaces/{}/{}"{}>{}</a>"#,
                encode(space),
                tab.path(),
                if current { r#" class="current""# } else { "" },
                tab.path()
            );
        }
    }
    let _ = write!(nav, r#"<a href="/health" class="health">health</a>"#);
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · cotald</title><link rel="stylesheet" href="/assets/app.css"><script src="/assets/app.js" defer></script></head>
<body><header><a href="/" class="brand">cotald</a><nav>{nav}</nav></header>
<main>{body}</main></body></html>
"#,
        title = esc(title),
    )
}

/// The part of a page that changes, kept current by its event stream at `url` (each `part`
/// event replaces it; what a reader opened stays open).
pub(super) fn live(url: &str, part: &str) -> String {
    format!(r#"<div id="part" data-live="{}">{part}</div>"#, esc(url))
}

/// The overview: one line per space.
pub(super) fn index(spaces: &[(String, usize, usize)]) -> String {
    let mut rows = String::new();
    for (space, online, messages) in spaces {
        let s = encode(space);
        let _ = write!(
            rows,
            r#"<tr><td><a href="/spaces/{s}/roster">{}</a></td><td>{online}</td><td>{messages}</td><td><a href="/spaces/{s}/feed">feed</a> · <a href="/spaces/{s}/channels">channels</a></td></tr>"#,
            esc(space)
        );
    }
    format!(
        r#"<table><thead><tr><th>space</th><th>present</th><th>recent messages</th><th></th></tr></thead><tbody>{rows}</tbody></table>"#
    )
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

pub(super) fn short_id(id: &str) -> String {
    let short: String = id.chars().take(10).collect();
    format!(
        r#"<code class="id" title="{}">{}…</code>"#,
        esc(id),
        esc(&short)
    )
}

/// The roster: every instance from presence, with its status by the liveness rule (§6).
pub(super) fn roster(
    peers: &[(String, Peer, PresenceStatus)],
    memberships: &BTreeMap<String, MembershipEntry>,
    stale: bool,
) -> String {
    let mut rows = String::new();
    for (id, peer, status) in peers {
        let channels = memberships
            .get(id)
            .map(|m| {
                let list = |kind: &str, channels: &[String]| {
                    if channels.is_empty() {
                        return String::new();
                    }
                    let names: Vec<String> =
                        channels.iter().map(|c| format!("#{}", esc(c))).collect();
                    format!("<div>{kind}: {}</div>", names.join(", "))
                };
                list("live", &m.live) + &list("durable", &m.durable)
            })
            .unwrap_or_default();
        let p = &peer.presence;
        let modes: Vec<String> = p
            .channel_modes
            .iter()
            .map(|(c, m)| format!("#{} {}", esc(c), esc(&word(m))))
            .collect();
        let _ = write!(
            rows,
            r#"<tr class="peer"><td class="name">{name}</td><td>{id}</td><td>{kind}</td><td>{role}</td><td><span class="status status-{status}">{status}</span></td><td class="activity">{activity}</td><td class="channels">{channels}</td><td>{attention}{modes}</td><td>{age}</td></tr>"#,
            name = esc(&p.card.name),
            id = short_id(id),
            kind = esc(&word(&p.card.kind)),
            role = esc(p.card.role.as_deref().unwrap_or("")),
            status = status.as_str(),
            activity = esc(p.activity.as_deref().unwrap_or("")),
            attention = esc(&p.attention.map(|a| word(&a)).unwrap_or_default()),
            modes = if modes.is_empty() {
                String::new()
            } else {
                format!(r#"<div class="modes">{}</div>"#, modes.join(", "))
            },
            age = age(&p.ts),
        );
    }
    if peers.is_empty() {
        rows.push_str(
            r#"<tr><td colspan="9" class="empty">nobody has announced presence yet</td></tr>"#,
        );
    }
    let stale = if stale {
        r#"<p class="warn">The connection to the broker is down: this is the last roster seen.</p>"#
    } else {
        ""
    };
    format!(
        r#"{stale}<table><thead><tr><th>name</th><th>id</th><th>kind</th><th>role</th><th>status</th><th>activity</th><th>channels</th><th>attention</th><th>heartbeat</th></tr></thead><tbody>{rows}</tbody></table>"#
    )
}

/// The roster's forms: a direct message to an instance, a task for a role (the roles the
/// roster shows are offered; any other may be typed).
pub(super) fn roster_forms(
    space: &str,
    csrf: &str,
    peers: &[(String, Peer, PresenceStatus)],
) -> String {
    let s = encode(space);
    let mut to = String::new();
    for (id, peer, status) in peers {
        let _ = write!(
            to,
            r#"<option value="{id}">{name} ({status}, {short})</option>"#,
            id = esc(id),
            name = esc(&peer.presence.card.name),
            status = status.as_str(),
            short = esc(&id.chars().take(10).collect::<String>()),
        );
    }
    let mut roles: Vec<&str> = peers
        .iter()
        .filter_map(|(_, p, _)| p.presence.card.role.as_deref())
        .collect();
    roles.sort_unstable();
    roles.dedup();
    let roles: String = roles
        .iter()
        .map(|r| format!(r#"<option value="{}">"#, esc(r)))
        .collect();
    format!(
        r#"<div class="forms"><form method="post" action="/spaces/{s}/dm" class="compose dm"><input type="hidden" name="csrf" value="{csrf}"><label>direct message to <select name="to" required>{to}</select></label><textarea name="text" rows="2" required placeholder="what to say"></textarea><button type="submit">send DM</button></form><form method="post" action="/spaces/{s}/task" class="compose task"><input type="hidden" name="csrf" value="{csrf}"><label>task for role <input name="role" list="roles" required autocomplete="off"></label><datalist id="roles">{roles}</datalist><textarea name="text" rows="2" required placeholder="what to do"></textarea><button type="submit">send task</button></form></div>"#,
        csrf = esc(csrf),
    )
}

/// The channels: effective config, stored messages, the last message seen.
pub(super) fn channels(
    space: &str,
    channels: &[ChannelInfo],
    feed: &[std::sync::Arc<FeedItem>],
) -> String {
    let mut rows = String::new();
    for c in channels {
        let name = c.channel.as_str();
        let e = &c.effective;
        let config = c.config.as_ref();
        let description = config
            .and_then(|c| c.description.as_ref())
            .map(|d| esc(d.as_str()))
            .unwrap_or_default();
        let instructions = config
            .and_then(|c| c.instructions.as_ref())
            .map(|i| {
                format!(
                    r#"<details data-key="instructions-{}"><summary>instructions</summary><pre>{}</pre></details>"#,
                    esc(name),
                    esc(i.as_str())
                )
            })
            .unwrap_or_default();
        let last = feed
            .iter()
            .rev()
            .find(|i| i.channel == name)
            .map(|i| {
                let text: String = summary(&i.message.parts).chars().take(80).collect();
                format!(
                    r#"<span class="from">{}</span>: {} <span class="age">{} ago</span>"#,
                    esc(&i.message.from.name),
                    esc(&text),
                    age(&i.message.ts)
                )
            })
            .unwrap_or_default();
        let _ = write!(
            rows,
            r#"<tr class="channel"><td><a href="/spaces/{s}/feed?channel={n}">#{name}</a></td><td>{class}</td><td>{replay}</td><td>{window}</td><td>{description}{instructions}</td><td>{messages}</td><td>{last}</td></tr>"#,
            s = encode(space),
            n = encode(name),
            name = esc(name),
            class = esc(&word(&e.delivery_class)),
            replay = if e.replay { "yes" } else { "no" },
            window = e
                .replay_window
                .as_ref()
                .map(|w| esc(&w.to_string()))
                .unwrap_or_else(|| "∞".into()),
            messages = c
                .messages
                .map(|m| m.to_string())
                .unwrap_or_else(|| "?".into()),
        );
    }
    if channels.is_empty() {
        rows.push_str(r#"<tr><td colspan="7" class="empty">no channel is configured or has messages</td></tr>"#);
    }
    format!(
        r#"<table><thead><tr><th>channel</th><th>class</th><th>replay</th><th>window</th><th>description</th><th>messages</th><th>last message</th></tr></thead><tbody>{rows}</tbody></table>"#
    )
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
    compose: &str,
) -> String {
    let mut options = String::from(r#"<option value="">every channel</option>"#);
    for c in channels {
        let _ = write!(
            options,
            r#"<option value="{v}"{sel}>#{v}</option>"#,
            v = esc(c),
            sel = if Some(c.as_str()) == channel {
                " selected"
            } else {
                ""
            }
        );
    }
    let matching: Vec<&FeedItem> = items
        .iter()
        .map(|i| i.as_ref())
        .filter(|i| channel.is_none_or(|c| c == i.channel))
        .collect();
    // The newest FEED_SHOWN: the page stays light (each message is about half a KiB of HTML,
    // and the browser lays out all of it before the page is usable); what arrives next is
    // added live.
    let shown = &matching[matching.len().saturating_sub(FEED_SHOWN)..];
    let older = match matching.len() - shown.len() {
        0 => String::new(),
        n => format!(
            r#"<p class="older">{n} older messages are not shown here (`cotald tail --channel CH` prints a channel's history).</p>"#
        ),
    };
    let list = conversations(shown);
    let events = format!(
        "/spaces/{}/events?after={last_seq}{}",
        encode(space),
        channel
            .map(|c| format!("&channel={}", encode(c)))
            .unwrap_or_default()
    );
    format!(
        r#"{compose}<form method="get" class="filter"><label>channel <select name="channel">{options}</select></label> <button type="submit">show</button> <span id="live" class="live">connecting…</span></form><ol id="feed" class="feed" data-events="{events}">{list}</ol>{older}"#,
        events = esc(&events),
    )
}

/// Messages as conversations: the newest conversation first, each reply under the message it
/// answers (oldest reply first), as far as the answered message is shown.
fn conversations(items: &[&FeedItem]) -> String {
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
    fn render(item: &FeedItem, replies: &BTreeMap<&str, Vec<&FeedItem>>, depth: usize) -> String {
        let nested: String = match replies.get(item.message.id.as_str()) {
            Some(children) if depth < 16 => children
                .iter()
                .map(|c| render(c, replies, depth + 1))
                .collect(),
            _ => String::new(),
        };
        message_with(item, &nested)
    }
    roots.iter().rev().map(|r| render(r, &replies, 0)).collect()
}

/// The compose form of the feed: a post on a channel, or a reply to `reply` (its channel, its
/// id as `replyTo`, its thread as `contextId`: the thread it was in, else itself).
pub(super) fn compose(
    space: &str,
    csrf: &str,
    channel: Option<&str>,
    channels: &[String],
    reply: Option<&FeedItem>,
) -> String {
    let selected = reply.map(|r| r.channel.as_str()).or(channel);
    let mut options = String::new();
    for c in channels {
        let _ = write!(
            options,
            r#"<option value="{v}"{sel}>#{v}</option>"#,
            v = esc(c),
            sel = if Some(c.as_str()) == selected {
                " selected"
            } else {
                ""
            }
        );
    }
    let (replying, hidden) = match reply {
        Some(r) => {
            let context = r.message.context_id.as_deref().unwrap_or(&r.message.id);
            (
                format!(
                    r#"<p class="replying">replying to <span class="from">{}</span>: {}</p>"#,
                    esc(&r.message.from.name),
                    esc(&summary(&r.message.parts)
                        .chars()
                        .take(120)
                        .collect::<String>())
                ),
                format!(
                    r#"<input type="hidden" name="reply_to" value="{}"><input type="hidden" name="context_id" value="{}">"#,
                    esc(&r.message.id),
                    esc(context)
                ),
            )
        }
        None => (String::new(), String::new()),
    };
    format!(
        r#"<form method="post" action="/spaces/{s}/post" class="compose post">{replying}<input type="hidden" name="csrf" value="{csrf}">{hidden}<label>to <select name="channel" required>{options}</select></label><textarea name="text" rows="3" required placeholder="write to the channel (@name mentions someone)"></textarea><button type="submit">{verb}</button></form>"#,
        s = encode(space),
        csrf = esc(csrf),
        verb = if reply.is_some() { "reply" } else { "post" },
    )
}

/// One message as a list item, with nothing under it (the event stream renders arrivals so;
/// the browser puts a reply under the message it answers).
pub(super) fn message(item: &FeedItem) -> String {
    message_with(item, "")
}

/// One message as a list item, `replies` rendered under it.
fn message_with(item: &FeedItem, replies: &str) -> String {
    let m = &item.message;
    let (datetime, time) = when(m);
    let parts = parts_html(m);
    let mentions = if m.mentions.is_empty() {
        String::new()
    } else {
        let names: Vec<String> = m
            .mentions
            .iter()
            .map(|n| format!(r#"<mark class="mention">@{}</mark>"#, esc(n)))
            .collect();
        format!(r#" <span class="mentions">{}</span>"#, names.join(" "))
    };
    let reply_to = m
        .reply_to
        .as_deref()
        .map(|r| format!(r#" data-reply-to="{}""#, esc(r)))
        .unwrap_or_default();
    format!(
        r#"<li class="msg" id="m-{id}" data-channel="{channel}"{reply_to}><div class="meta"><span class="chan">#{channel}</span> <span class="from">{from}</span> {sender} <time datetime="{datetime}">{time}</time>{mentions} <a class="reply" href="/spaces/{space}/feed?channel={c}&amp;reply={i}">reply</a></div>{parts}<ol class="replies">{replies}</ol></li>"#,
        id = esc(&m.id),
        channel = esc(&item.channel),
        from = esc(&m.from.name),
        sender = short_id(&m.from.id),
        space = encode(&m.space),
        c = encode(&item.channel),
        i = encode(&m.id),
    ) + "\n"
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

/// A message's parts, escaped: text (its `@mentions` marked), data and extension parts folded.
pub(super) fn parts_html(m: &CotalMessage) -> String {
    let mut parts = String::new();
    for part in &m.parts {
        match part {
            Part::Text { text, .. } => {
                let mut html = esc(text);
                for name in &m.mentions {
                    let at = esc(&format!("@{name}"));
                    html = html.replace(&at, &format!(r#"<mark class="mention">{at}</mark>"#));
                }
                let _ = write!(parts, r#"<div class="text">{html}</div>"#);
            }
            Part::Data { data, .. } => {
                let json = serde_json::to_string_pretty(data).unwrap_or_default();
                let _ = write!(
                    parts,
                    r#"<details class="data"><summary>data</summary><pre>{}</pre></details>"#,
                    esc(&json)
                );
            }
            Part::Extension { kind, fields } => {
                let json = serde_json::to_string_pretty(fields).unwrap_or_default();
                let _ = write!(
                    parts,
                    r#"<details class="data"><summary>{}</summary><pre>{}</pre></details>"#,
                    esc(kind.as_str()),
                    esc(&json)
                );
            }
        }
    }
    parts
}

/// The health page: the broker as it reports itself (`VARZ`, `JSZ`), the appliance's
/// services as the runtime state records them.
pub(super) fn health(
    state: &RuntimeState,
    varz: Option<&serde_json::Value>,
    jsz: Option<&serde_json::Value>,
) -> String {
    let mut out = String::new();
    // The verdict first, as `cotald status` gives it: what keeps delivery from progressing.
    let mut degraded = crate::ops::status::services_degraded(&state.services);
    if varz.is_none() {
        degraded.insert(0, "broker: it did not answer".to_owned());
    }
    match degraded.is_empty() {
        true => out.push_str(
            r#"<p class="verdict"><span class="health-running">healthy</span>: the broker answers and every service runs</p>"#,
        ),
        false => {
            let reasons: String = degraded
                .iter()
                .map(|why| format!("<li>{}</li>", esc(why)))
                .collect();
            let _ = write!(
                out,
                r#"<div class="verdict warn"><span class="health-degraded">DEGRADED</span><ul>{reasons}</ul></div>"#
            );
        }
    }
    let field = |v: Option<&serde_json::Value>, key: &str| {
        v.and_then(|v| v.get(key))
            .map(|x| match x {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .unwrap_or_else(|| "?".into())
    };
    let _ = write!(
        out,
        r#"<h2>Broker</h2><table class="kv"><tbody><tr><th>nats-server</th><td>{version}</td></tr><tr><th>pid</th><td>{pid} (restarts {restarts})</td></tr><tr><th>uptime</th><td>{uptime}</td></tr><tr><th>connections</th><td>{conns} (total {total})</td></tr><tr><th>memory</th><td>{mem}</td></tr><tr><th>slow consumers</th><td>{slow}</td></tr><tr><th>client listener</th><td>{listen}</td></tr></tbody></table>"#,
        version = esc(&field(varz, "version")),
        pid = state.broker_pid,
        restarts = state.broker_restarts,
        uptime = esc(&field(varz, "uptime")),
        conns = esc(&field(varz, "connections")),
        total = esc(&field(varz, "total_connections")),
        mem = varz
            .and_then(|v| v["mem"].as_u64())
            .map_or_else(|| "?".to_owned(), crate::profile::human_size),
        slow = esc(&field(varz, "slow_consumers")),
        listen = esc(&state.listen.to_string()),
    );
    if varz.is_none() {
        out.push_str(r#"<p class="warn">The broker did not answer.</p>"#);
    }
    let mut streams = String::new();
    let accounts = jsz
        .and_then(|j| j.get("account_details"))
        .and_then(|a| a.as_array())
        .cloned()
        .unwrap_or_default();
    for account in &accounts {
        for stream in account
            .get("stream_detail")
            .and_then(|s| s.as_array())
            .into_iter()
            .flatten()
        {
            let state = stream.get("state");
            let _ = write!(
                streams,
                r#"<tr class="stream"><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
                esc(&field(Some(stream), "name")),
                esc(&field(state, "messages")),
                esc(&field(state, "bytes")),
                esc(&field(state, "consumer_count")),
            );
        }
    }
    let _ = write!(
        out,
        r#"<h2>Streams</h2><table><thead><tr><th>stream</th><th>messages</th><th>bytes</th><th>consumers</th></tr></thead><tbody>{streams}</tbody></table>"#
    );
    let mut services = String::new();
    for s in &state.services {
        let (word, reason) = match &s.health {
            Health::Running => ("running", String::new()),
            Health::Starting => ("starting", String::new()),
            Health::Stopped => ("stopped", String::new()),
            Health::Degraded(why) => ("degraded", why.clone()),
        };
        let _ = write!(
            services,
            r#"<tr class="service"><td>{}</td><td>{}</td><td><span class="health-{word}">{word}</span> {}</td><td>{}</td></tr>"#,
            esc(&s.scope),
            esc(&s.name),
            esc(&reason),
            s.restarts
        );
    }
    for u in &state.unserved {
        let _ = write!(
            services,
            r#"<tr class="service"><td>{}</td><td>(space)</td><td><span class="health-degraded">not served</span> {}</td><td></td></tr>"#,
            esc(&u.name),
            esc(&u.reason)
        );
    }
    let _ = write!(
        out,
        r#"<h2>Services</h2><table><thead><tr><th>scope</th><th>service</th><th>health</th><th>restarts</th></tr></thead><tbody>{services}</tbody></table>"#
    );
    out
}

/// A refusal page.
pub(super) fn refusal(title: &str, text: &str) -> String {
    format!(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{t}</title><link rel="stylesheet" href="/assets/app.css"></head><body><main><h1>{t}</h1><p>{x}</p></main></body></html>"#,
        t = esc(title),
        x = esc(text)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{CotalMessage, EndpointRef, Routing};

    #[test]
    fn wire_strings_are_shown_as_text() {
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
                Part::text("<script>alert(1)</script> hi @bob\r\nx"),
                Part::Data {
                    data: serde_json::json!({"k": "</pre><script>"}),
                    extra: Default::default(),
                },
            ],
        );
        message.mentions = vec!["bob".into()];
        let html = message_html(message);
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("<b>"), "{html}");
        assert!(!html.contains('\r'), "{html}");
        assert!(
            html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{html}"
        );
        assert!(
            html.contains(r#"<mark class="mention">@bob</mark>"#),
            "{html}"
        );
        assert!(html.contains("&lt;/pre&gt;&lt;script&gt;"), "{html}");
    }

    fn message_html(message: CotalMessage) -> String {
        super::message(&FeedItem {
            seq: 1,
            channel: "general".into(),
            message,
        })
    }
}
