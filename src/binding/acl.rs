//! The credential profiles of Appendix B as pure builders: what a user JWT of each profile
//! may publish and subscribe to. Every subject comes from the same names as §3 and §8.
//!
//! Every grant the appendix lists is minted, as it lists it: it is the contract a client
//! written to the appendix codes against, so none is left out. What the appliance adds, each
//! a coverage fix that reads nothing the profile could not read already:
//! - JetStream acks: nats-server may deliver with the v1 ack subject
//!   (`$JS.ACK.<stream>.<consumer>.…`) or the v2 form with domain and account hash
//!   (`$JS.ACK.<domain>.<hash>.<stream>.<consumer>.…`); each ack grant covers both.
//! - The roster without a consumer: a core subscription to `$KV.cotal_presence_<space>.>` (the
//!   records a presence watch delivers) and `STREAM.MSG.GET` on the presence bucket (the read
//!   verb the appendix grants on the channel registry), which cotald's own client uses.
//! - The in-process identities (manager, backstop reader, membership daemon) get what their job
//!   needs; Appendix B leaves the manager allow-all in v0, which the appliance's own
//!   provisioning connection is.
//!
//! The consumer creates the appendix grants on the presence and registry buckets
//! (`$JS.API.CONSUMER.CREATE.<KV|CHKV>.>`) take any consumer name, so one identity could
//! create consumers until the stream's limit. That is contained by attribution, not by
//! withholding the grant: the consumer guard (`services/consumers.rs`) bounds each identity's
//! consumers on those buckets and deletes durable ones.

use crate::protocol::{ChannelPattern, InstanceId};

use super::credential::{Permission, UserPermissions};
use super::names::{MANAGER_SERVICE, SpaceNames, chat_history_consumer, dm_durable, svc_durable};

/// What an agent may do (§9: its channel scope is three lists).
#[derive(Debug, Clone)]
pub struct AgentScope {
    /// The agent's id (its user public key).
    pub id: InstanceId,
    /// Its anycast role, a clean token, if any.
    pub role: Option<String>,
    /// `allowSubscribe`: the read ACL.
    pub allow_subscribe: Vec<ChannelPattern>,
    /// `allowPublish`: the post ACL (default deny).
    pub allow_publish: Vec<ChannelPattern>,
}

fn inbox(id: &InstanceId) -> String {
    format!("_INBOX_{}.>", id.as_str())
}

/// Every presence update as it is written: the roster's live half (no consumer needed).
fn presence_updates(n: &SpaceNames) -> String {
    format!("$KV.{}.>", n.presence_bucket())
}

/// Both ack-subject forms for one consumer of `stream`: the appendix's `$JS.ACK.<stream>.<consumer>.>`
/// and the v2 form.
fn acks(stream: &str, consumer: &str) -> [String; 2] {
    [
        format!("$JS.ACK.{stream}.{consumer}.>"),
        format!("$JS.ACK.*.*.{stream}.{consumer}.>"),
    ]
}

/// Both ack-subject forms for every consumer of `stream`: the appendix's `$JS.ACK.<stream>.>`
/// and the v2 form.
fn acks_of_all(stream: &str) -> [String; 2] {
    [
        format!("$JS.ACK.{stream}.>"),
        format!("$JS.ACK.*.*.{stream}.>"),
    ]
}

/// The `agent` profile (Appendix B).
pub fn agent(n: &SpaceNames, scope: &AgentScope) -> UserPermissions {
    UserPermissions {
        publish: Permission {
            allow: agent_publish(n, scope),
            deny: agent_deny(n),
        },
        subscribe: Permission {
            allow: agent_subscribe(n, scope),
            deny: Vec::new(),
        },
    }
}

/// What an agent subscribes to: its inbox, every presence update, the chat its read ACL
/// covers.
fn agent_subscribe(n: &SpaceNames, scope: &AgentScope) -> Vec<String> {
    let p = n.prefix();
    let mut sub = vec![inbox(&scope.id), presence_updates(n)];
    sub.extend(
        scope
            .allow_subscribe
            .iter()
            .map(|c| format!("{p}.chat.*.{}", c.as_str())),
    );
    sub
}

/// What an agent publishes: its posts (within its post ACL), DMs, tasks and requests to the
/// manager; the streams' info; the reads of its history consumer, its DM consumer, the
/// presence and registry buckets, and its role's task consumer.
fn agent_publish(n: &SpaceNames, scope: &AgentScope) -> Vec<String> {
    let p = n.prefix();
    let id = scope.id.as_str();
    let mut publish: Vec<String> = scope
        .allow_publish
        .iter()
        .map(|c| format!("{p}.chat.{id}.{}", c.as_str()))
        .collect();
    publish.extend([
        format!("{p}.inst.*.{id}"),
        format!("{p}.svc.*.{id}"),
        format!("{p}.ctl.{MANAGER_SERVICE}.{id}"),
        "$JS.API.INFO".to_owned(),
    ]);
    let kv = SpaceNames::kv_stream(&n.presence_bucket());
    let chkv = SpaceNames::kv_stream(&n.channels_bucket());
    for stream in [
        &n.chat_stream(),
        &n.dm_stream(),
        &n.task_stream(),
        &kv,
        &chkv,
    ] {
        publish.push(format!("$JS.API.STREAM.INFO.{stream}"));
    }
    publish.extend(history_reads(n, scope));
    publish.extend(dm_reads(n, id));
    publish.extend([
        format!("$JS.API.CONSUMER.CREATE.{kv}.>"),
        format!("$JS.API.CONSUMER.INFO.{kv}.>"),
        "$JS.FC.>".to_owned(),
        format!("$KV.{}.{id}", n.presence_bucket()),
        format!("$JS.API.STREAM.MSG.GET.{chkv}"),
        format!("$JS.API.CONSUMER.CREATE.{chkv}.>"),
        format!("$JS.API.CONSUMER.INFO.{chkv}.>"),
        // Added: the roster's snapshot read without a consumer (see the module doc).
        format!("$JS.API.STREAM.MSG.GET.{kv}"),
    ]);
    if let Some(role) = &scope.role {
        let (task, svcd) = (n.task_stream(), svc_durable(role));
        publish.extend([
            format!("$JS.API.CONSUMER.INFO.{task}.{svcd}"),
            format!("$JS.API.CONSUMER.MSG.NEXT.{task}.{svcd}"),
        ]);
        publish.extend(acks(&task, &svcd));
    }
    publish
}

/// The reads of an agent's pinned history consumer on CHAT (`chathist_<id>`), created with a
/// filter its read ACL covers.
fn history_reads(n: &SpaceNames, scope: &AgentScope) -> Vec<String> {
    let (p, chat) = (n.prefix(), n.chat_stream());
    let hist = chat_history_consumer(scope.id.as_str());
    let mut reads: Vec<String> = scope
        .allow_subscribe
        .iter()
        .map(|c| {
            format!(
                "$JS.API.CONSUMER.CREATE.{chat}.{hist}.{p}.chat.*.{}",
                c.as_str()
            )
        })
        .collect();
    reads.extend([
        format!("$JS.API.CONSUMER.INFO.{chat}.{hist}"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{chat}.{hist}"),
        format!("$JS.API.CONSUMER.DELETE.{chat}.{hist}"),
    ]);
    reads
}

/// The reads of agent `id`'s DM consumer (`dm_<id>`, made by the appliance) and its acks.
fn dm_reads(n: &SpaceNames, id: &str) -> Vec<String> {
    let (dm, dmd) = (n.dm_stream(), dm_durable(id));
    let mut reads = vec![
        format!("$JS.API.CONSUMER.INFO.{dm}.{dmd}"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{dm}.{dmd}"),
    ];
    reads.extend(acks(&dm, &dmd));
    reads
}

/// No agent creates a consumer on DM, TASK or the backstop store: the appliance makes those
/// it may read.
fn agent_deny(n: &SpaceNames) -> Vec<String> {
    let mut deny = Vec::new();
    for stream in [&n.dm_stream(), &n.task_stream(), &n.backstop_stream()] {
        deny.extend([
            format!("$JS.API.CONSUMER.CREATE.{stream}"),
            format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
            format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>"),
        ]);
    }
    deny
}

/// The observer's read verbs (Appendix B): CHAT history, presence, channel registry.
fn observer_publish(n: &SpaceNames) -> Vec<String> {
    let chat = n.chat_stream();
    let kv = SpaceNames::kv_stream(&n.presence_bucket());
    let chkv = SpaceNames::kv_stream(&n.channels_bucket());
    let mut out = vec![
        "$JS.API.INFO".to_owned(),
        format!("$JS.API.STREAM.INFO.{chat}"),
        format!("$JS.API.STREAM.INFO.{kv}"),
        format!("$JS.API.STREAM.INFO.{chkv}"),
        format!("$JS.API.CONSUMER.CREATE.{chat}"),
        format!("$JS.API.CONSUMER.CREATE.{chat}.>"),
        format!("$JS.API.CONSUMER.INFO.{chat}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{chat}.>"),
        format!("$JS.API.CONSUMER.DELETE.{chat}.>"),
    ];
    out.extend(acks_of_all(&chat));
    out.extend([
        format!("$JS.API.CONSUMER.CREATE.{kv}.>"),
        format!("$JS.API.CONSUMER.INFO.{kv}.>"),
        format!("$JS.API.STREAM.MSG.GET.{kv}"),
        format!("$JS.API.STREAM.MSG.GET.{chkv}"),
        format!("$JS.API.CONSUMER.CREATE.{chkv}.>"),
        format!("$JS.API.CONSUMER.INFO.{chkv}.>"),
        format!("$JS.API.CONSUMER.DELETE.{chkv}.>"),
        "$JS.FC.>".to_owned(),
    ]);
    out
}

/// The `observer` profile: reads chat, CHAT history, presence and the channel registry; no
/// application publish; DMs invisible.
pub fn observer(n: &SpaceNames, id: &InstanceId) -> UserPermissions {
    UserPermissions {
        publish: Permission {
            allow: observer_publish(n),
            deny: Vec::new(),
        },
        subscribe: Permission {
            allow: vec![
                format!("{}.chat.>", n.prefix()),
                inbox(id),
                presence_updates(n),
            ],
            deny: Vec::new(),
        },
    }
}

/// The appliance's dashboard reader: the `observer` profile plus reading the derived
/// membership feed, which §8 writes "for the admin/observer profile" to show silent readers
/// and live-channel membership, though Appendix B's observer list names no grant on it. Only
/// the read verbs (`STREAM.INFO`, `STREAM.MSG.GET`): no consumer, no write.
pub fn dashboard_observer(n: &SpaceNames, id: &InstanceId) -> UserPermissions {
    let mut p = observer(n, id);
    let feed = SpaceNames::kv_stream(&n.membership_bucket());
    p.publish.allow.extend([
        format!("$JS.API.STREAM.INFO.{feed}"),
        format!("$JS.API.STREAM.MSG.GET.{feed}"),
    ]);
    p
}

/// The `admin` profile: the observer's grants, the whole space's live tap, DM history; still no
/// application publish.
pub fn admin(n: &SpaceNames, id: &InstanceId) -> UserPermissions {
    let dm = n.dm_stream();
    let mut publish = observer_publish(n);
    publish.extend([
        format!("$JS.API.STREAM.INFO.{dm}"),
        format!("$JS.API.CONSUMER.CREATE.{dm}"),
        format!("$JS.API.CONSUMER.CREATE.{dm}.>"),
        format!("$JS.API.CONSUMER.INFO.{dm}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{dm}.>"),
        format!("$JS.API.CONSUMER.DELETE.{dm}.>"),
    ]);
    publish.extend(acks_of_all(&dm));
    UserPermissions {
        publish: Permission {
            allow: publish,
            deny: Vec::new(),
        },
        subscribe: Permission {
            allow: vec![format!("{}.>", n.prefix()), inbox(id), presence_updates(n)],
            deny: Vec::new(),
        },
    }
}

/// The membership daemon, a user of the SYS account: it may only ask the broker for one
/// space account's connections (`CONNZ`) and hear their connect/disconnect events.
pub fn membership_daemon(account: &str, id: &InstanceId) -> UserPermissions {
    UserPermissions {
        publish: Permission {
            allow: vec![format!("$SYS.REQ.ACCOUNT.{account}.CONNZ")],
            deny: Vec::new(),
        },
        subscribe: Permission {
            allow: vec![
                inbox(id),
                format!("$SYS.ACCOUNT.{account}.CONNECT"),
                format!("$SYS.ACCOUNT.{account}.DISCONNECT"),
            ],
            deny: Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    const ALICE: &str = "UAQGWOEVJKMIO4WXSYOTLARXYOZTCXFK67JASEH6AFFFYK6FOPSKQCAD";

    fn scope(role: Option<&str>) -> AgentScope {
        AgentScope {
            id: InstanceId::from_user_nkey(ALICE).unwrap(),
            role: role.map(str::to_owned),
            allow_subscribe: vec![
                ChannelPattern::from_policy("general").unwrap(),
                ChannelPattern::from_policy("team.>").unwrap(),
            ],
            allow_publish: vec![ChannelPattern::from_policy("general").unwrap()],
        }
    }

    /// Appendix B's lines for space `main`, with its placeholders filled in: `P`, `CHAT`, …
    /// and the agent's `id`, `role` and channels.
    fn appendix(lines: &[&str], channels: &[&str]) -> BTreeSet<String> {
        let fill = |line: &str| {
            line.replace("<CHAT>", "CHAT_main")
                .replace("<DM>", "DM_main")
                .replace("<TASK>", "TASK_main")
                .replace("<BSTOP>", "INBOX_main")
                .replace("<KV>", "KV_cotal_presence_main")
                .replace("<CHKV>", "KV_cotal_channels_main")
                .replace("<chatHistD>", &format!("chathist_{ALICE}"))
                .replace("<dmD>", &format!("dm_{ALICE}"))
                .replace("<svcD>", "svc_reviewer")
                .replace("<space>", "main")
                .replace("<manager>", "manager")
                .replace("<id>", ALICE)
                .replace("inbox", &format!("_INBOX_{ALICE}.>"))
                .replace("P.", "cotal.main.")
        };
        let mut out = BTreeSet::new();
        for line in lines {
            if line.contains("<ch>") {
                out.extend(channels.iter().map(|ch| fill(&line.replace("<ch>", ch))));
            } else {
                out.insert(fill(line));
            }
        }
        out
    }

    fn set(list: &[String]) -> BTreeSet<String> {
        let out: BTreeSet<String> = list.iter().cloned().collect();
        assert_eq!(out.len(), list.len(), "a grant minted twice: {list:?}");
        out
    }

    /// The minted list is the appendix's lines, every one of them, plus exactly `added`.
    fn assert_appendix(what: &str, minted: &[String], lines: BTreeSet<String>, added: &[String]) {
        let minted = set(minted);
        let missing: Vec<&String> = lines.difference(&minted).collect();
        assert!(
            missing.is_empty(),
            "{what}: Appendix B grants not minted: {missing:?}"
        );
        let mut expected = lines;
        expected.extend(added.iter().cloned());
        let extra: Vec<&String> = minted.difference(&expected).collect();
        assert!(
            extra.is_empty(),
            "{what}: grants beyond the appendix and the documented additions: {extra:?}"
        );
    }

    // Appendix B, line by line (`<ch>` lines once per channel of the scope).
    const AGENT_SUB: &[&str] = &["inbox", "P.chat.*.<ch>"];
    const AGENT_PUB: &[&str] = &[
        "P.inst.*.<id>",
        "P.svc.*.<id>",
        "P.ctl.<manager>.<id>",
        "$JS.API.INFO",
        "$JS.API.STREAM.INFO.<CHAT>",
        "$JS.API.STREAM.INFO.<DM>",
        "$JS.API.STREAM.INFO.<TASK>",
        "$JS.API.STREAM.INFO.<KV>",
        "$JS.API.STREAM.INFO.<CHKV>",
        "$JS.API.CONSUMER.CREATE.<CHAT>.<chatHistD>.P.chat.*.<ch>",
        "$JS.API.CONSUMER.INFO.<CHAT>.<chatHistD>",
        "$JS.API.CONSUMER.MSG.NEXT.<CHAT>.<chatHistD>",
        "$JS.API.CONSUMER.DELETE.<CHAT>.<chatHistD>",
        "$JS.API.CONSUMER.INFO.<DM>.<dmD>",
        "$JS.API.CONSUMER.MSG.NEXT.<DM>.<dmD>",
        "$JS.ACK.<DM>.<dmD>.>",
        "$JS.API.CONSUMER.CREATE.<KV>.>",
        "$JS.API.CONSUMER.INFO.<KV>.>",
        "$JS.FC.>",
        "$KV.cotal_presence_<space>.<id>",
        "$JS.API.STREAM.MSG.GET.<CHKV>",
        "$JS.API.CONSUMER.CREATE.<CHKV>.>",
        "$JS.API.CONSUMER.INFO.<CHKV>.>",
    ];
    const AGENT_ROLE_PUB: &[&str] = &[
        "$JS.API.CONSUMER.INFO.<TASK>.<svcD>",
        "$JS.API.CONSUMER.MSG.NEXT.<TASK>.<svcD>",
        "$JS.ACK.<TASK>.<svcD>.>",
    ];
    const AGENT_DENY: &[&str] = &[
        "$JS.API.CONSUMER.CREATE.<DM>",
        "$JS.API.CONSUMER.CREATE.<DM>.>",
        "$JS.API.CONSUMER.DURABLE.CREATE.<DM>.>",
        "$JS.API.CONSUMER.CREATE.<TASK>",
        "$JS.API.CONSUMER.CREATE.<TASK>.>",
        "$JS.API.CONSUMER.DURABLE.CREATE.<TASK>.>",
        "$JS.API.CONSUMER.CREATE.<BSTOP>",
        "$JS.API.CONSUMER.CREATE.<BSTOP>.>",
        "$JS.API.CONSUMER.DURABLE.CREATE.<BSTOP>.>",
    ];
    const OBSERVER_SUB: &[&str] = &["P.chat.>", "inbox"];
    const OBSERVER_PUB: &[&str] = &[
        "$JS.API.INFO",
        "$JS.API.STREAM.INFO.<CHAT>",
        "$JS.API.STREAM.INFO.<KV>",
        "$JS.API.STREAM.INFO.<CHKV>",
        "$JS.API.CONSUMER.CREATE.<CHAT>",
        "$JS.API.CONSUMER.CREATE.<CHAT>.>",
        "$JS.API.CONSUMER.INFO.<CHAT>.>",
        "$JS.API.CONSUMER.MSG.NEXT.<CHAT>.>",
        "$JS.API.CONSUMER.DELETE.<CHAT>.>",
        "$JS.ACK.<CHAT>.>",
        "$JS.API.CONSUMER.CREATE.<KV>.>",
        "$JS.API.CONSUMER.INFO.<KV>.>",
        "$JS.API.STREAM.MSG.GET.<CHKV>",
        "$JS.API.CONSUMER.CREATE.<CHKV>.>",
        "$JS.API.CONSUMER.INFO.<CHKV>.>",
        "$JS.API.CONSUMER.DELETE.<CHKV>.>",
        "$JS.FC.>",
    ];
    const ADMIN_SUB: &[&str] = &["P.>", "inbox"];
    const ADMIN_DM_PUB: &[&str] = &[
        "$JS.API.STREAM.INFO.<DM>",
        "$JS.API.CONSUMER.CREATE.<DM>",
        "$JS.API.CONSUMER.CREATE.<DM>.>",
        "$JS.API.CONSUMER.INFO.<DM>.>",
        "$JS.API.CONSUMER.MSG.NEXT.<DM>.>",
        "$JS.API.CONSUMER.DELETE.<DM>.>",
        "$JS.ACK.<DM>.>",
    ];

    /// What every profile adds to the appendix: the roster without a consumer.
    fn roster_additions() -> (String, String) {
        (
            "$KV.cotal_presence_main.>".to_owned(),
            "$JS.API.STREAM.MSG.GET.KV_cotal_presence_main".to_owned(),
        )
    }

    #[test]
    fn agent_grants_are_appendix_b_line_by_line() {
        let n = SpaceNames::new("main");
        let (updates, snapshot) = roster_additions();
        let channels = ["general", "team.>"];
        for role in [Some("reviewer"), None] {
            let p = agent(&n, &scope(role));
            assert_appendix(
                "agent sub.allow",
                &p.subscribe.allow,
                appendix(AGENT_SUB, &channels),
                std::slice::from_ref(&updates),
            );
            let mut lines = appendix(AGENT_PUB, &channels);
            // allowPublish is `general` only: `P.chat.<id>.<ch>` for it alone.
            lines.insert(format!("cotal.main.chat.{ALICE}.general"));
            let mut added = vec![
                snapshot.clone(),
                format!("$JS.ACK.*.*.DM_main.dm_{ALICE}.>"),
            ];
            if role.is_some() {
                lines.extend(appendix(AGENT_ROLE_PUB, &channels));
                added.push("$JS.ACK.*.*.TASK_main.svc_reviewer.>".to_owned());
            }
            assert_appendix("agent pub.allow", &p.publish.allow, lines, &added);
            assert_appendix(
                "agent pub.deny",
                &p.publish.deny,
                appendix(AGENT_DENY, &channels),
                &[],
            );
            assert!(p.subscribe.deny.is_empty());
        }
    }

    #[test]
    fn observer_and_admin_grants_are_appendix_b_line_by_line() {
        let n = SpaceNames::new("main");
        let id = InstanceId::from_user_nkey(ALICE).unwrap();
        let (updates, snapshot) = roster_additions();
        let o = observer(&n, &id);
        assert_appendix(
            "observer sub.allow",
            &o.subscribe.allow,
            appendix(OBSERVER_SUB, &[]),
            std::slice::from_ref(&updates),
        );
        let observer_added = [snapshot, "$JS.ACK.*.*.CHAT_main.>".to_owned()];
        assert_appendix(
            "observer pub.allow",
            &o.publish.allow,
            appendix(OBSERVER_PUB, &[]),
            &observer_added,
        );
        let a = admin(&n, &id);
        assert_appendix(
            "admin sub.allow",
            &a.subscribe.allow,
            appendix(ADMIN_SUB, &[]),
            &[updates],
        );
        let mut lines = appendix(OBSERVER_PUB, &[]);
        lines.extend(appendix(ADMIN_DM_PUB, &[]));
        let mut added = observer_added.to_vec();
        added.push("$JS.ACK.*.*.DM_main.>".to_owned());
        assert_appendix("admin pub.allow", &a.publish.allow, lines, &added);
        for p in [o, a] {
            assert!(p.publish.deny.is_empty() && p.subscribe.deny.is_empty());
        }
    }

    #[test]
    fn membership_daemon_may_only_ask_for_its_account_connections() {
        let id = InstanceId::from_user_nkey(ALICE).unwrap();
        let p = membership_daemon("AACCOUNT", &id);
        assert_eq!(p.publish.allow, ["$SYS.REQ.ACCOUNT.AACCOUNT.CONNZ"]);
        assert_eq!(
            p.subscribe.allow,
            [
                format!("_INBOX_{ALICE}.>"),
                "$SYS.ACCOUNT.AACCOUNT.CONNECT".to_owned(),
                "$SYS.ACCOUNT.AACCOUNT.DISCONNECT".to_owned(),
            ]
        );
    }

    #[test]
    fn observer_and_admin_publish_nothing_of_the_application() {
        let n = SpaceNames::new("main");
        let id = InstanceId::from_user_nkey(ALICE).unwrap();
        for p in [
            observer(&n, &id),
            dashboard_observer(&n, &id),
            admin(&n, &id),
        ] {
            assert!(p.publish.allow.iter().all(|s| s.starts_with('$')), "{p:?}");
        }
        assert!(
            !observer(&n, &id)
                .publish
                .allow
                .iter()
                .any(|s| s.contains("DM_main"))
        );
        assert!(
            admin(&n, &id)
                .subscribe
                .allow
                .contains(&"cotal.main.>".to_owned())
        );
    }

    #[test]
    fn the_dashboard_reads_the_membership_feed_and_nothing_more_than_an_observer() {
        let n = SpaceNames::new("main");
        let id = InstanceId::from_user_nkey(ALICE).unwrap();
        let (o, d) = (observer(&n, &id), dashboard_observer(&n, &id));
        let added: Vec<&String> = d
            .publish
            .allow
            .iter()
            .filter(|s| !o.publish.allow.contains(s))
            .collect();
        assert_eq!(
            added,
            [
                "$JS.API.STREAM.INFO.KV_cotal_membership_main",
                "$JS.API.STREAM.MSG.GET.KV_cotal_membership_main"
            ]
        );
        assert_eq!(d.subscribe.allow, o.subscribe.allow);
    }
}
