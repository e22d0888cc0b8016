//! The exact JetStream configurations of a space (§8): streams, KV buckets (as their backing
//! streams, so that every field is pinned), the provisioner-created durables, and the field-by-
//! field comparison that reports drift instead of overwriting it.

use std::time::Duration;

use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy};
use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType};

use super::names::{SpaceNames, dm_durable, svc_durable};

/// CHAT keeps this many messages per subject, i.e. per (sender, channel) (§8).
pub const CHAT_MAX_MSGS_PER_SUBJECT: i64 = 1000;
/// The broker's largest message, headers included: nats-server's default `max_payload`,
/// which cotald does not change.
pub const BROKER_MAX_PAYLOAD: i32 = 1 << 20;
/// What the trusted reader adds beside a stored message when it hands a copy over (its
/// subject, at most the broker's 4 KiB control line, a token and a length) or stores a
/// mention copy (the same subject in a header), with room to spare.
pub const HANDOFF_MARGIN: i32 = 8 << 10;
/// CHAT stores no message larger than this (headers included), so that every durable or
/// mention copy of it still fits the broker's limit: a larger channel publish is refused to
/// its sender (not acknowledged, so nothing was promised) instead of being stored
/// undeliverable.
pub const CHAT_MAX_MESSAGE_BYTES: i32 = BROKER_MAX_PAYLOAD - HANDOFF_MARGIN;
/// Presence entries expire with the bucket's `max_age` (§6, §8).
pub const PRESENCE_TTL: Duration = Duration::from_millis(6000);
/// Redelivery delay of DM and anycast copies that were not acked (§8).
pub const ACK_WAIT: Duration = Duration::from_millis(60_000);
/// The membership feed's size cap.
pub const MEMBERSHIP_MAX_BYTES: i64 = 64 << 20;
/// DM keeps at most this many messages per subject, i.e. per (target, sender) pair; one more is
/// refused to its sender (`discard_new_per_subject`), never evicting the pair's older DMs nor
/// anyone else's. The trusted warden trims the DMs a target has already read from a pair once
/// it holds a few hundred (`services/warden/`), so the bound is on what waits unread: a
/// sender is refused only when its reader is this far behind. It is far above what a reader
/// that keeps up leaves unread (a pipelined sender keeps a few hundred in flight) plus what the
/// warden has not trimmed yet (at 20,000 DMs a second, half a second of trims): a client
/// written to the spec, which does not wait and send again as cotald's does, is not refused
/// while its reader keeps up. At 1,000 it was (3,536 of 5,000 DMs sent 256 at a time).
pub const DM_MAX_MSGS_PER_PAIR: i64 = 10_000;
/// Every stream of a space admits this many consumers. nats-server 2.15 gives a stream that
/// sets none (or `-1`) a limit of 1,000, which one `dm_<id>` per agent, one backstop reader
/// per online durable member or the appendix's bucket watches of a large team reach; this
/// leaves room for the whole legitimate population of a space (a few thousand clients, each
/// with its watches), and the consumer guard (`services/consumers.rs`) keeps any one identity
/// to a handful on the presence and registry buckets, so no identity can fill it for others.
pub const MAX_CONSUMERS: i32 = 10_000;
/// TASK keeps at most this many unconsumed tasks per subject, i.e. per (role, sender) pair;
/// one more is refused to its sender (work queue: a consumed task is gone).
pub const TASK_MAX_MSGS_PER_PAIR: i64 = 256;

/// Size and age limits of one stream; zero means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamLimits {
    /// Oldest message kept.
    pub max_age: Duration,
    /// Total bytes kept.
    pub max_bytes: i64,
    /// Total messages kept.
    pub max_msgs: i64,
}

/// The retention a space's profile sets (the spec fixes the rest of each config).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// CHAT (on top of the fixed 1000 per subject).
    pub chat: StreamLimits,
    /// DM: bounded, unlike the reference's unbounded DM stream.
    pub dm: StreamLimits,
    /// TASK.
    pub task: StreamLimits,
    /// The space's JetStream file quota (its account limit), which the byte limits of its
    /// streams must fit together; zero means no quota to fit.
    pub store_budget: i64,
    /// Replicas of every stream and bucket (a cluster's `replicas`); 0 and 1 both mean one.
    pub replicas: usize,
}

/// Each of CHAT, the backstop, DM and TASK may hold at most this share of the space's quota,
/// and the membership feed half of it, so that their reservations together (nats-server
/// reserves a stream's `max_bytes` in its account) fit the quota with room for the small
/// buckets: 4/5 + 1/10.
const STREAM_SHARE: i64 = 5;

impl Retention {
    /// `l` with its byte limit cut to its share of the quota (an unlimited one gets the share).
    fn fit(&self, l: StreamLimits) -> StreamLimits {
        if self.store_budget <= 0 {
            return l;
        }
        // A clustered account's quota counts every replica's bytes.
        let share = self.store_budget / STREAM_SHARE / self.replicas() as i64;
        StreamLimits {
            max_bytes: match l.max_bytes {
                0 => share,
                b => b.min(share),
            },
            ..l
        }
    }

    /// The replicas streams are created with (at least one).
    pub fn replicas(&self) -> usize {
        self.replicas.max(1)
    }

    /// The membership feed's size cap within the quota.
    fn membership_bytes(&self) -> i64 {
        match self.store_budget {
            b if b > 0 => MEMBERSHIP_MAX_BYTES.min(b / (2 * STREAM_SHARE) / self.replicas() as i64),
            _ => MEMBERSHIP_MAX_BYTES,
        }
    }
}

fn limits(config: &mut Config, l: StreamLimits) {
    config.max_age = l.max_age;
    config.max_bytes = if l.max_bytes == 0 { -1 } else { l.max_bytes };
    config.max_messages = if l.max_msgs == 0 { -1 } else { l.max_msgs };
}

fn base(name: String, subject: String, retention: RetentionPolicy) -> Config {
    Config {
        name,
        subjects: vec![subject],
        retention,
        storage: StorageType::File,
        discard: DiscardPolicy::Old,
        max_bytes: -1,
        max_messages: -1,
        max_messages_per_subject: -1,
        max_message_size: -1,
        max_consumers: MAX_CONSUMERS,
        num_replicas: 1,
        ..Default::default()
    }
}

/// `CHAT_<space>`: file, `max_msgs_per_subject=1000`, discard old, `allow_direct`.
pub fn chat(n: &SpaceNames, r: &Retention) -> Config {
    let mut c = base(
        n.chat_stream(),
        format!("{}.chat.>", n.prefix()),
        RetentionPolicy::Limits,
    );
    c.max_messages_per_subject = CHAT_MAX_MSGS_PER_SUBJECT;
    c.max_message_size = CHAT_MAX_MESSAGE_BYTES;
    c.allow_direct = true;
    limits(&mut c, r.fit(r.chat));
    c
}

/// The fairness bounds of a stream one sender writes for others (DM, TASK): a full pair or a
/// full stream refuses the new message to its sender instead of evicting an older,
/// acknowledged one (which may be someone else's).
fn refuse_new(config: &mut Config, per_pair: i64) {
    config.discard = DiscardPolicy::New;
    config.discard_new_per_subject = true;
    config.max_messages_per_subject = per_pair;
}

/// `DM_<space>`: file, limits retention from the profile, no Direct Get (§8: it would bypass
/// the consumer-create deny that keeps DMs confidential); at most [`DM_MAX_MSGS_PER_PAIR`] per
/// (target, sender), and nothing acknowledged is ever evicted by someone else's DMs.
pub fn dm(n: &SpaceNames, r: &Retention) -> Config {
    let mut c = base(
        n.dm_stream(),
        format!("{}.inst.>", n.prefix()),
        RetentionPolicy::Limits,
    );
    limits(&mut c, r.fit(r.dm));
    refuse_new(&mut c, DM_MAX_MSGS_PER_PAIR);
    c
}

/// `TASK_<space>`: file, work queue, no Direct Get; at most [`TASK_MAX_MSGS_PER_PAIR`]
/// unconsumed tasks per (role, sender).
pub fn task(n: &SpaceNames, r: &Retention) -> Config {
    let mut c = base(
        n.task_stream(),
        format!("{}.svc.>", n.prefix()),
        RetentionPolicy::WorkQueue,
    );
    limits(&mut c, r.fit(r.task));
    refuse_new(&mut c, TASK_MAX_MSGS_PER_PAIR);
    c
}

/// The fields [`refuse_new`] sets, by their names in [`Drift`].
const FAIRNESS_FIELDS: [&str; 3] = ["discard", "discard_new_per_subject", "max_msgs_per_subject"];

/// `existing` with the bounds of `expected` that it lacks and that only narrow what it
/// stores, and the names of the fields changed; `None` when there is none. The bootstrap
/// applies them to a stream made before them: the per-sender bounds of DM and TASK, a
/// largest message where there was none or a larger one (CHAT), and an explicit consumer
/// limit where the broker's default stood ([`MAX_CONSUMERS`]). Anything else that differs
/// is drift, reported and left alone.
pub fn narrowed(existing: &Config, expected: &Config) -> Option<(Config, Vec<&'static str>)> {
    let mut c = existing.clone();
    let mut fields = Vec::new();
    let differs = drift(expected, existing);
    let fairness_differs = differs.iter().any(|d| FAIRNESS_FIELDS.contains(&d.field));
    if expected.discard_new_per_subject && fairness_differs {
        c.discard = expected.discard;
        c.discard_new_per_subject = expected.discard_new_per_subject;
        c.max_messages_per_subject = expected.max_messages_per_subject;
        fields.extend(FAIRNESS_FIELDS);
    }
    let unbounded = |size: i32| size < 0;
    if !unbounded(expected.max_message_size)
        && (unbounded(existing.max_message_size)
            || existing.max_message_size > expected.max_message_size)
    {
        c.max_message_size = expected.max_message_size;
        fields.push("max_msg_size");
    }
    // A stream made before [`MAX_CONSUMERS`] was set has the broker's default of 1,000.
    if existing.max_consumers <= 0 && expected.max_consumers > 0 {
        c.max_consumers = expected.max_consumers;
        fields.push("max_consumers");
    }
    (!fields.is_empty()).then_some((c, fields))
}

/// `INBOX_<space>`: the backstop store for `@mention` copies; no Direct Get.
pub fn backstop(n: &SpaceNames, r: &Retention) -> Config {
    let mut c = base(
        n.backstop_stream(),
        n.backstop_subjects(),
        RetentionPolicy::Limits,
    );
    c.max_messages_per_subject = CHAT_MAX_MSGS_PER_SUBJECT;
    limits(&mut c, r.fit(r.chat));
    c
}

/// A KV bucket's backing stream, with every field pinned. Direct Get is off, so clients read
/// single keys with `STREAM.MSG.GET`, the verb Appendix B grants.
fn bucket(name: String, history: i64, max_age: Duration, max_bytes: i64) -> Config {
    let mut c = base(
        SpaceNames::kv_stream(&name),
        format!("$KV.{name}.>"),
        RetentionPolicy::Limits,
    );
    c.max_messages_per_subject = history;
    c.max_age = max_age;
    c.max_bytes = max_bytes;
    c.discard = DiscardPolicy::New;
    c.allow_rollup = true;
    c.deny_delete = true;
    c
}

/// `cotal_presence_<space>`: TTL 6000 ms (§8).
pub fn presence_bucket(n: &SpaceNames) -> Config {
    bucket(n.presence_bucket(), 1, PRESENCE_TTL, -1)
}

/// `cotal_channels_<space>`: no TTL; a few revisions kept for audit.
pub fn channels_bucket(n: &SpaceNames) -> Config {
    bucket(n.channels_bucket(), 5, Duration::ZERO, -1)
}

/// `cotal_membership_<space>`: no TTL, latest value only, [`MEMBERSHIP_MAX_BYTES`] at most
/// (less in a small quota).
pub fn membership_bucket(n: &SpaceNames, r: &Retention) -> Config {
    bucket(
        n.membership_bucket(),
        1,
        Duration::ZERO,
        r.membership_bytes(),
    )
}

/// `cotal_members_<space>`: no TTL, latest value only (writes use revisions).
pub fn members_bucket(n: &SpaceNames) -> Config {
    bucket(n.members_bucket(), 1, Duration::ZERO, -1)
}

/// Every stream of a space, in creation order, with the retention's replicas.
pub fn all(n: &SpaceNames, r: &Retention) -> Vec<Config> {
    let mut all = vec![
        chat(n, r),
        dm(n, r),
        task(n, r),
        backstop(n, r),
        presence_bucket(n),
        channels_bucket(n),
        membership_bucket(n, r),
        members_bucket(n),
    ];
    for c in &mut all {
        c.num_replicas = r.replicas();
    }
    all
}

/// `dm_<id>` on DM: filter `P.inst.<id>.*`, deliver all, explicit ack, `ack_wait` 60 s.
pub fn dm_consumer(n: &SpaceNames, id: &str) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(dm_durable(id)),
        filter_subject: format!("{}.inst.{id}.*", n.prefix()),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        ..Default::default()
    }
}

/// `svc_<role>` on TASK: filter `P.svc.<role>.*`, explicit ack, `ack_wait` 60 s.
pub fn svc_consumer(n: &SpaceNames, role: &str) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(svc_durable(role)),
        filter_subject: format!("{}.svc.{role}.*", n.prefix()),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        ..Default::default()
    }
}

/// One field of an existing stream that differs from what the binding requires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// The stream.
    pub stream: String,
    /// The field.
    pub field: &'static str,
    /// What the binding requires.
    pub expected: String,
    /// What the server has.
    pub actual: String,
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} is {} but cotald expects {}",
            self.stream, self.field, self.actual, self.expected
        )
    }
}

/// The fields of `actual` that differ from `expected`, among those the binding pins.
pub fn drift(expected: &Config, actual: &Config) -> Vec<Drift> {
    let mut out = Vec::new();
    let mut check = |field: &'static str, e: String, a: String| {
        if e != a {
            out.push(Drift {
                stream: expected.name.clone(),
                field,
                expected: e,
                actual: a,
            });
        }
    };
    // Each pinned field, compared by its Debug text (what the report shows).
    macro_rules! pinned {
        ($($field:ident => $name:literal),* $(,)?) => {
            $(check($name, format!("{:?}", expected.$field), format!("{:?}", actual.$field));)*
        };
    }
    pinned!(
        subjects => "subjects",
        retention => "retention",
        storage => "storage",
        discard => "discard",
        discard_new_per_subject => "discard_new_per_subject",
        max_messages_per_subject => "max_msgs_per_subject",
        max_messages => "max_msgs",
        max_message_size => "max_msg_size",
        max_bytes => "max_bytes",
        max_age => "max_age",
        allow_direct => "allow_direct",
        allow_rollup => "allow_rollup",
        deny_delete => "deny_delete",
        republish => "republish",
    );
    let names = |v: &Option<Vec<async_nats::jetstream::stream::Source>>| {
        format!(
            "{:?}",
            v.as_ref()
                .map(|v| v.iter().map(|s| s.name.clone()).collect::<Vec<_>>())
        )
    };
    check(
        "mirror",
        format!("{:?}", expected.mirror.as_ref().map(|m| &m.name)),
        format!("{:?}", actual.mirror.as_ref().map(|m| &m.name)),
    );
    check("sources", names(&expected.sources), names(&actual.sources));
    out
}

impl Drift {
    /// Whether serving on top of this drift would break a confidentiality boundary (§8, §9):
    /// a stream capturing other subjects, copying its messages elsewhere, or (DM, TASK and the
    /// backstop) readable with Direct Get.
    pub fn is_unsafe(&self) -> bool {
        match self.field {
            "subjects" | "republish" | "mirror" | "sources" => true,
            "allow_direct" => !self.stream.starts_with("CHAT_") && self.actual == "true",
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_configs_match_section_8() {
        let n = SpaceNames::new("main");
        let r = Retention::default();
        let c = chat(&n, &r);
        assert_eq!(c.subjects, ["cotal.main.chat.>"]);
        assert_eq!(c.max_message_size, (1 << 20) - (8 << 10));
        assert_eq!(dm(&n, &r).max_message_size, -1);
        assert_eq!(c.storage, StorageType::File);
        assert_eq!(c.retention, RetentionPolicy::Limits);
        assert_eq!(c.max_messages_per_subject, 1000);
        assert_eq!(c.discard, DiscardPolicy::Old);
        assert!(c.allow_direct);
        for c in [dm(&n, &r), task(&n, &r), backstop(&n, &r)] {
            assert!(!c.allow_direct, "{}: no Direct Get", c.name);
            assert_eq!(c.storage, StorageType::File);
        }
        for (c, per_pair) in [(dm(&n, &r), 10_000), (task(&n, &r), 256)] {
            assert_eq!(
                c.discard,
                DiscardPolicy::New,
                "{}: refuse, never evict",
                c.name
            );
            assert!(c.discard_new_per_subject, "{}", c.name);
            assert_eq!(c.max_messages_per_subject, per_pair, "{}", c.name);
        }
        assert_eq!(task(&n, &r).retention, RetentionPolicy::WorkQueue);
        assert_eq!(presence_bucket(&n).max_age, Duration::from_millis(6000));
        assert_eq!(presence_bucket(&n).subjects, ["$KV.cotal_presence_main.>"]);
        assert_eq!(channels_bucket(&n).max_age, Duration::ZERO);
    }

    #[test]
    fn profile_retention_bounds_dm() {
        let n = SpaceNames::new("main");
        let r = Retention {
            dm: StreamLimits {
                max_age: Duration::from_secs(86400),
                max_bytes: 1 << 30,
                max_msgs: 0,
            },
            ..Default::default()
        };
        let c = dm(&n, &r);
        assert_eq!(c.max_age, Duration::from_secs(86400));
        assert_eq!(c.max_bytes, 1 << 30);
        assert_eq!(c.max_messages, -1);
    }

    #[test]
    fn bounded_streams_fit_the_space_quota_together() {
        let n = SpaceNames::new("main");
        let r = Retention {
            dm: StreamLimits {
                max_bytes: 1 << 30,
                ..Default::default()
            },
            store_budget: 100 << 20,
            ..Default::default()
        };
        let reserved: i64 = all(&n, &r).iter().map(|c| c.max_bytes.max(0)).sum();
        assert!(reserved <= r.store_budget, "{reserved}");
        assert_eq!(dm(&n, &r).max_bytes, 20 << 20);
        assert_eq!(
            chat(&n, &r).max_bytes,
            20 << 20,
            "an unlimited stream gets its share"
        );
        let roomy = Retention {
            store_budget: 10 << 30,
            ..r
        };
        assert_eq!(
            dm(&n, &roomy).max_bytes,
            1 << 30,
            "the profile's limit when it fits"
        );
        assert_eq!(
            membership_bucket(&n, &roomy).max_bytes,
            MEMBERSHIP_MAX_BYTES
        );
        let replicated = Retention { replicas: 3, ..r };
        let reserved: i64 = all(&n, &replicated)
            .iter()
            .map(|c| c.max_bytes.max(0) * c.num_replicas as i64)
            .sum();
        assert!(
            reserved <= r.store_budget,
            "every replica counts: {reserved}"
        );
        assert!(all(&n, &replicated).iter().all(|c| c.num_replicas == 3));
        assert!(all(&n, &r).iter().all(|c| c.num_replicas == 1));
    }

    #[test]
    fn drift_names_each_changed_field() {
        let n = SpaceNames::new("main");
        let expected = chat(&n, &Retention::default());
        let mut actual = expected.clone();
        assert!(drift(&expected, &actual).is_empty());
        actual.max_messages_per_subject = 10;
        actual.allow_direct = false;
        let d = drift(&expected, &actual);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].field, "max_msgs_per_subject");
        assert_eq!(
            d[1].to_string(),
            "CHAT_main: allow_direct is false but cotald expects true"
        );
    }

    #[test]
    fn confidentiality_drift_is_unsafe() {
        let n = SpaceNames::new("main");
        let expected = dm(&n, &Retention::default());
        let mut actual = expected.clone();
        actual.allow_direct = true;
        actual.max_age = Duration::from_secs(1);
        let d = drift(&expected, &actual);
        assert_eq!(d.len(), 2);
        assert!(d.iter().any(|d| d.field == "allow_direct" && d.is_unsafe()));
        assert!(d.iter().any(|d| d.field == "max_age" && !d.is_unsafe()));
        let mut chat_actual = chat(&n, &Retention::default());
        chat_actual.allow_direct = false;
        assert!(
            drift(&chat(&n, &Retention::default()), &chat_actual)
                .iter()
                .all(|d| !d.is_unsafe())
        );
    }

    #[test]
    fn durables_follow_section_8() {
        let n = SpaceNames::new("main");
        let c = dm_consumer(&n, "UABC");
        assert_eq!(c.durable_name.as_deref(), Some("dm_UABC"));
        assert_eq!(c.filter_subject, "cotal.main.inst.UABC.*");
        assert_eq!(c.ack_policy, AckPolicy::Explicit);
        assert_eq!(c.ack_wait, Duration::from_secs(60));
        assert_eq!(
            svc_consumer(&n, "reviewer").filter_subject,
            "cotal.main.svc.reviewer.*"
        );
    }

    #[test]
    fn only_missing_bounds_are_applied_to_an_existing_stream() {
        let n = SpaceNames::new("main");
        let r = Retention::default();
        let (dm, chat) = (dm(&n, &r), chat(&n, &r));
        assert!(narrowed(&dm, &dm).is_none());
        assert!(narrowed(&chat, &chat).is_none());

        let mut old_dm = dm.clone();
        old_dm.discard = DiscardPolicy::Old;
        old_dm.discard_new_per_subject = false;
        old_dm.max_messages_per_subject = -1;
        let (bounded, fields) = narrowed(&old_dm, &dm).unwrap();
        assert_eq!(fields, FAIRNESS_FIELDS);
        assert!(drift(&dm, &bounded).is_empty());

        // A CHAT made before the largest message gets it; one narrowed further by its
        // operator keeps its own per-subject count (drift, reported elsewhere).
        let mut old_chat = chat.clone();
        old_chat.max_message_size = -1;
        old_chat.max_messages_per_subject = 10;
        let (bounded, fields) = narrowed(&old_chat, &chat).unwrap();
        assert_eq!(fields, ["max_msg_size"]);
        assert_eq!(bounded.max_message_size, CHAT_MAX_MESSAGE_BYTES);
        assert_eq!(bounded.max_messages_per_subject, 10);
        let mut smaller = chat.clone();
        smaller.max_message_size = 1024;
        assert!(narrowed(&smaller, &chat).is_none(), "never widened");

        // A bucket made with the broker's default consumer limit gets the space's; one an
        // operator set stays as set.
        let presence = presence_bucket(&n);
        let mut old = presence.clone();
        old.max_consumers = -1;
        let (bounded, fields) = narrowed(&old, &presence).unwrap();
        assert_eq!(fields, ["max_consumers"]);
        assert_eq!(bounded.max_consumers, MAX_CONSUMERS);
        old.max_consumers = 50;
        assert!(narrowed(&old, &presence).is_none());
    }
}
