//! Waking the agent through its host's push when something is addressed to it.
//!
//! An agent idle in its host reads its inbox only when it runs; without a push it sits idle
//! while its peers wait. What wakes it: a DM, a task for its role, a channel message that
//! mentions it (§5 `mentions`), and every message of a channel where it asked for that
//! (`cotal_channel_mode` `all`). Its attention (§6) is honoured: `dnd` wakes for nothing, a
//! `muted` channel wakes for nothing, a `quiet` one and `focus` only for mentions. History
//! replayed by a join never wakes.
//!
//! A wake goes out in two forms, both read by hosts that know them and ignored by others:
//! Claude Code's channel event (capability `experimental."claude/channel"`, notification
//! `notifications/claude/channel` with `content` and string `meta`), and the standard
//! `notifications/resources/updated` for [`INBOX_RESOURCE`] once the host subscribed to it.
//! The content names who and where, never a message's text: what another agent wrote reaches
//! the model through `cotal_inbox`, framed as a message, not as the host's event.
//!
//! At most one wake is outstanding: until the agent reads its inbox (or peeks), what arrives
//! joins the next wake instead of raising another. A wake the host missed (one sent while it
//! was still registering its listener, or lost with it) is repeated while what it announced
//! waits unread, after 30 s, then twice as long each time, up to 10 minutes. Nothing is
//! announced before the host said it is initialized.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rmcp::model::{CustomNotification, ResourceUpdatedNotificationParam, ServerNotification};
use rmcp::{Peer, RoleServer};
use tokio::time::Instant;

use super::inbox::Inbox;
use crate::client::{Declared, Delivery};
use crate::protocol::{AttentionMode, ChannelMode, DeliveryKind};

/// The inbox as a resource a host may subscribe to.
pub const INBOX_RESOURCE: &str = "cotal://inbox";
/// The method of Claude Code's channel event.
pub const CHANNEL_EVENT: &str = "notifications/claude/channel";
/// The experimental capability that declares it.
pub const CHANNEL_CAPABILITY: &str = "claude/channel";

/// The first repeat of an unread wake; each next one waits twice as long, up to [`REPEAT_MAX`].
const REPEAT_FIRST: Duration = Duration::from_secs(30);
const REPEAT_MAX: Duration = Duration::from_secs(600);

/// Why a copy wakes the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A direct message from `from`.
    Dm { from: String },
    /// A task for the agent's role from `from`.
    Task { from: String },
    /// A message on `channel` mentioning the agent.
    Mention { channel: String },
    /// A message on a channel where every message wakes the agent.
    Channel { channel: String },
}

/// What decides whether a copy wakes the agent: its name, its attention, and the channels
/// where it asked to be woken by every message.
pub struct Prefs {
    /// The agent's name, lower case (mentions are lower-cased names, §5).
    pub me: String,
    /// Channels where every message wakes the agent.
    pub every_message: Mutex<HashSet<String>>,
}

impl Prefs {
    /// Why `d` wakes the agent, given what it declares; `None` when it does not.
    pub fn reason(&self, d: &Delivery, declared: &Declared) -> Option<Reason> {
        if d.historical || declared.attention == Some(AttentionMode::Dnd) {
            return None;
        }
        let from = d.message.from.name.clone();
        let Some(channel) = &d.channel else {
            return match d.kind {
                DeliveryKind::Anycast => Some(Reason::Task { from }),
                _ => Some(Reason::Dm { from }),
            };
        };
        let mode = declared.channel_modes.get(channel);
        if mode == Some(&ChannelMode::Muted) {
            return None;
        }
        if d.message.mentions.contains(&self.me) {
            return Some(Reason::Mention {
                channel: channel.clone(),
            });
        }
        let ambient = mode.is_none()
            && declared.attention != Some(AttentionMode::Focus)
            && self
                .every_message
                .lock()
                .is_ok_and(|every| every.contains(channel));
        ambient.then(|| Reason::Channel {
            channel: channel.clone(),
        })
    }
}

/// The host end: the peer once the host is initialized, and whether it subscribed to the
/// inbox resource.
#[derive(Default)]
pub struct Host {
    peer: OnceLock<Peer<RoleServer>>,
    ready: tokio::sync::Notify,
    subscribed: std::sync::atomic::AtomicBool,
}

impl Host {
    /// The host said it is initialized: announcements may go out.
    pub fn initialized(&self, peer: Peer<RoleServer>) {
        let _ = self.peer.set(peer);
        self.ready.notify_waiters();
    }

    /// The peer, once initialized.
    pub fn peer(&self) -> Option<&Peer<RoleServer>> {
        self.peer.get()
    }

    /// The host (un)subscribed to the inbox resource.
    pub fn subscribe(&self, on: bool) {
        self.subscribed
            .store(on, std::sync::atomic::Ordering::Release);
        self.ready.notify_waiters();
    }
}

/// The wake outstanding: when it went out, how many inbox reads there had been then, how many
/// times it was repeated.
#[derive(Clone, Copy)]
struct Outstanding {
    at: Instant,
    reads: u64,
    repeats: u32,
}

impl Outstanding {
    fn repeat_at(&self) -> Instant {
        let wait = REPEAT_FIRST
            .saturating_mul(1 << self.repeats.min(8))
            .min(REPEAT_MAX);
        self.at + wait
    }
}

/// Announces what wakes the agent, for the session's life.
pub async fn run(inbox: Arc<Inbox>, host: Arc<Host>) {
    let mut outstanding: Option<Outstanding> = None;
    loop {
        let changed = inbox.changed();
        let ready = host.ready.notified();
        if let Some(peer) = host.peer() {
            let now = Instant::now();
            let mut repeat = false;
            let due = inbox
                .announce(|unannounced, unread, reads| {
                    if outstanding.is_some_and(|o| reads > o.reads) {
                        outstanding = None;
                    }
                    match outstanding {
                        None => unannounced > 0,
                        Some(o) => {
                            repeat = unread > 0 && now >= o.repeat_at();
                            repeat
                        }
                    }
                })
                .await;
            if let Some((reasons, reads)) = due {
                send(peer, &host, &reasons, repeat).await;
                outstanding = Some(Outstanding {
                    at: now,
                    reads,
                    repeats: outstanding.map_or(0, |o| o.repeats + 1),
                });
            }
        }
        let repeat_at = outstanding.map(|o| o.repeat_at());
        tokio::select! {
            () = changed => {}
            () = ready => {}
            () = async {
                match repeat_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

/// Sends one wake for `reasons` (everything that wakes the agent and waits unread).
async fn send(peer: &Peer<RoleServer>, host: &Host, reasons: &[Reason], repeat: bool) {
    let (content, meta) = describe(reasons, repeat);
    let event = CustomNotification::new(
        CHANNEL_EVENT,
        Some(serde_json::json!({ "content": content, "meta": meta })),
    );
    if let Err(e) = peer
        .send_notification(ServerNotification::CustomNotification(event))
        .await
    {
        tracing::debug!(error = %e, "wake not sent");
    }
    if host.subscribed.load(std::sync::atomic::Ordering::Acquire) {
        let updated = ResourceUpdatedNotificationParam::new(INBOX_RESOURCE);
        if let Err(e) = peer.notify_resource_updated(updated).await {
            tracing::debug!(error = %e, "inbox update not sent");
        }
    }
}

/// The wake's words and its attributes: how many, of which kinds, from whom and where.
pub fn describe(reasons: &[Reason], repeat: bool) -> (String, BTreeMap<&'static str, String>) {
    let mut dms: BTreeMap<&str, usize> = BTreeMap::new();
    let mut tasks: BTreeMap<&str, usize> = BTreeMap::new();
    let mut mentions: BTreeMap<&str, usize> = BTreeMap::new();
    let mut channels: BTreeMap<&str, usize> = BTreeMap::new();
    for r in reasons {
        match r {
            Reason::Dm { from } => *dms.entry(from).or_default() += 1,
            Reason::Task { from } => *tasks.entry(from).or_default() += 1,
            Reason::Mention { channel, .. } => *mentions.entry(channel).or_default() += 1,
            Reason::Channel { channel } => *channels.entry(channel).or_default() += 1,
        }
    }
    let total = |m: &BTreeMap<&str, usize>| m.values().sum::<usize>();
    let list = |m: &BTreeMap<&str, usize>, sep: &str| {
        m.keys()
            .map(|k| format!("{sep}{k}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let plural = |n: usize, one: &str, many: &str| match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    };
    let mut parts = Vec::new();
    if !dms.is_empty() {
        let n = total(&dms);
        parts.push(format!(
            "{} from {}",
            plural(n, "DM", "DMs"),
            list(&dms, "")
        ));
    }
    if !tasks.is_empty() {
        let n = total(&tasks);
        let what = plural(n, "task for your role", "tasks for your role");
        parts.push(format!("{what} from {}", list(&tasks, "")));
    }
    if !mentions.is_empty() {
        let n = total(&mentions);
        let what = plural(n, "mention", "mentions");
        parts.push(format!("{what} in {}", list(&mentions, "#")));
    }
    if !channels.is_empty() {
        let n = total(&channels);
        let what = plural(n, "message", "messages");
        parts.push(format!("{what} in {}", list(&channels, "#")));
    }
    let still = if repeat { "still " } else { "" };
    let content = format!(
        "{} {still}waiting for you in Cotal: {}. Call cotal_inbox to read them.",
        reasons.len(),
        parts.join("; ")
    );
    let meta = BTreeMap::from([
        ("count", reasons.len().to_string()),
        ("dms", total(&dms).to_string()),
        ("tasks", total(&tasks).to_string()),
        ("mentions", total(&mentions).to_string()),
        ("channel_messages", total(&channels).to_string()),
    ]);
    (content, meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Channel, CotalMessage, EndpointRef, InstanceId, Part, Routing};

    fn delivery(channel: Option<&str>, mentions: &[&str]) -> Delivery {
        let from = InstanceId::from_user_nkey(&nkeys::KeyPair::new_user().public_key()).unwrap();
        let routing = match channel {
            Some(c) => Routing::channel(&Channel::new(c).unwrap()),
            None => Routing::to(&from),
        };
        let message = CotalMessage::new(
            "main",
            EndpointRef::new(&from, "bob"),
            routing,
            vec![Part::text("hi")],
        )
        .with_mentions(mentions.iter().map(|m| m.to_string()).collect::<Vec<_>>());
        match channel {
            Some(c) => Delivery::live(message, c),
            None => Delivery::dm(message),
        }
    }

    fn prefs() -> Prefs {
        Prefs {
            me: "alice".into(),
            every_message: Mutex::new(HashSet::from(["ops".to_owned()])),
        }
    }

    #[test]
    fn what_is_addressed_to_the_agent_wakes_it_as_its_attention_allows() {
        let p = prefs();
        let mut declared = Declared::default();
        let dm = delivery(None, &[]);
        let mention = delivery(Some("general"), &["alice"]);
        let other = delivery(Some("general"), &["carol"]);
        let ops = delivery(Some("ops"), &[]);
        assert_eq!(
            p.reason(&dm, &declared),
            Some(Reason::Dm { from: "bob".into() })
        );
        assert!(matches!(
            p.reason(&mention, &declared),
            Some(Reason::Mention { .. })
        ));
        assert_eq!(p.reason(&other, &declared), None);
        assert!(matches!(
            p.reason(&ops, &declared),
            Some(Reason::Channel { .. })
        ));

        declared.attention = Some(AttentionMode::Focus);
        assert_eq!(p.reason(&ops, &declared), None, "focus: no ambient wakes");
        assert!(p.reason(&mention, &declared).is_some());
        declared.attention = None;
        declared
            .channel_modes
            .insert("general".into(), ChannelMode::Muted);
        assert_eq!(p.reason(&mention, &declared), None, "muted");
        declared.attention = Some(AttentionMode::Dnd);
        assert_eq!(p.reason(&dm, &declared), None, "dnd");
    }

    #[test]
    fn a_burst_is_described_in_one_wake() {
        let reasons = [
            Reason::Dm { from: "bob".into() },
            Reason::Dm { from: "bob".into() },
            Reason::Mention {
                channel: "ops".into(),
            },
        ];
        let (content, meta) = describe(&reasons, false);
        assert_eq!(
            content,
            "3 waiting for you in Cotal: 2 DMs from bob; 1 mention in #ops. Call cotal_inbox to \
             read them."
        );
        assert_eq!(meta["count"], "3");
        assert_eq!(meta["dms"], "2");
        assert!(
            meta.keys()
                .all(|k| k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        );
        let (again, _) = describe(&reasons[..1], true);
        assert!(again.starts_with("1 still waiting"), "{again}");
    }

    #[test]
    fn an_unread_wake_is_repeated_ever_later_up_to_ten_minutes() {
        let at = Instant::now();
        let o = |repeats| Outstanding {
            at,
            reads: 0,
            repeats,
        };
        assert_eq!(o(0).repeat_at() - at, Duration::from_secs(30));
        assert_eq!(o(1).repeat_at() - at, Duration::from_secs(60));
        assert_eq!(o(5).repeat_at() - at, REPEAT_MAX);
        assert_eq!(o(40).repeat_at() - at, REPEAT_MAX);
    }
}
