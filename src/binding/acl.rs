//! The credential profiles of Appendix B as pure builders: what a user JWT of each profile
//! may publish and subscribe to. Every subject comes from the same names as §3 and §8.
//!
//! Two additions to the appendix's lists, both narrowing what it intends:
//! - JetStream acks: nats-server may deliver with the v1 ack subject
//!   (`$JS.ACK.<stream>.<consumer>.…`) or the v2 form with domain and account hash
//!   (`$JS.ACK.<domain>.<hash>.<stream>.<consumer>.…`); each ack grant covers both.
//! - The in-process identities (manager, backstop reader, membership daemon) get what their job
//!   needs; Appendix B leaves the manager allow-all in v0, which the appliance's own
//!   provisioning connection is.
//!
//! One narrowing and its replacement, so that no agent can stop presence for the others: the
//! appendix's consumer creates on the presence and channel-registry buckets
//! (`$JS.API.CONSUMER.CREATE.<KV|CHKV>.>`) take any consumer name, so one agent could create
//! consumers until the broker's limit and every other roster watch would fail. They are not
//! granted. The roster needs no consumer: KV updates are ordinary subjects, so it is a core
//! subscription to `$KV.cotal_presence_<space>.>` plus a snapshot read of each key with
//! `STREAM.MSG.GET` (the read verb the appendix already grants on CHKV); neither creates state in
//! the broker. The channel registry is read key by key with `STREAM.MSG.GET` as before. The
//! agent's remaining consumer create (the pinned `chathist_<id>`) names one consumer per
//! identity, so it is bounded by the identities minted.

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

/// Both ack-subject forms for one consumer (or, with `consumer = ">"`-style wildcards, many).
fn acks(stream: &str, consumer: &str) -> [String; 2] {
    [
        format!("$JS.ACK.{stream}.{consumer}.>"),
        format!("$JS.ACK.*.*.{stream}.{consumer}.>"),
    ]
}

/// The `agent` profile (Appendix B).
pub fn agent(n: &SpaceNames, scope: &AgentScope) -> UserPermissions {
    let p = n.prefix();
    let id = scope.id.as_str();
    let (chat, dm, task, bstop) = (
        n.chat_stream(),
        n.dm_stream(),
        n.task_stream(),
        n.backstop_stream(),
    );
    let kv = SpaceNames::kv_stream(&n.presence_bucket());
    let chkv = SpaceNames::kv_stream(&n.channels_bucket());
    let hist = chat_history_consumer(id);
    let dmd = dm_durable(id);

    let mut sub = vec![inbox(&scope.id), presence_updates(n)];
    sub.extend(
        scope
            .allow_subscribe
            .iter()
            .map(|c| format!("{p}.chat.*.{}", c.as_str())),
    );

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
    for stream in [&chat, &dm, &task, &kv, &chkv] {
        publish.push(format!("$JS.API.STREAM.INFO.{stream}"));
    }
    publish.extend(scope.allow_subscribe.iter().map(|c| {
        format!(
            "$JS.API.CONSUMER.CREATE.{chat}.{hist}.{p}.chat.*.{}",
            c.as_str()
        )
    }));
    publish.extend([
        format!("$JS.API.CONSUMER.INFO.{chat}.{hist}"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{chat}.{hist}"),
        format!("$JS.API.CONSUMER.DELETE.{chat}.{hist}"),
        format!("$JS.API.CONSUMER.INFO.{dm}.{dmd}"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{dm}.{dmd}"),
    ]);
    publish.extend(acks(&dm, &dmd));
    publish.extend([
        format!("$KV.{}.{id}", n.presence_bucket()),
        format!("$JS.API.STREAM.MSG.GET.{kv}"),
        format!("$JS.API.STREAM.MSG.GET.{chkv}"),
    ]);
    if let Some(role) = &scope.role {
        let svcd = svc_durable(role);
        publish.extend([
            format!("$JS.API.CONSUMER.INFO.{task}.{svcd}"),
            format!("$JS.API.CONSUMER.MSG.NEXT.{task}.{svcd}"),
        ]);
        publish.extend(acks(&task, &svcd));
    }

    let mut deny = Vec::new();
    for stream in [&dm, &task, &bstop] {
        deny.extend([
            format!("$JS.API.CONSUMER.CREATE.{stream}"),
            format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
            format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>"),
        ]);
    }
    UserPermissions {
        publish: Permission {
            allow: publish,
            deny,
        },
        subscribe: Permission {
            allow: sub,
            deny: Vec::new(),
        },
    }
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
    out.extend(acks(&chat, "*"));
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
    publish.extend(acks(&dm, "*"));
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

    #[test]
    fn agent_grants_follow_appendix_b() {
        let n = SpaceNames::new("main");
        let p = agent(&n, &scope(Some("reviewer")));
        let has = |list: &[String], s: &str| list.iter().any(|x| x == s);
        let sub = &p.subscribe.allow;
        assert!(has(sub, &format!("_INBOX_{ALICE}.>")));
        assert!(has(sub, "cotal.main.chat.*.general"));
        assert!(has(sub, "cotal.main.chat.*.team.>"));
        assert!(has(sub, "$KV.cotal_presence_main.>"));
        assert_eq!(
            sub.len(),
            4,
            "inbox, presence updates and the read ACL, nothing else: {sub:?}"
        );
        let publish = &p.publish.allow;
        assert!(has(publish, &format!("cotal.main.chat.{ALICE}.general")));
        assert!(
            !publish
                .iter()
                .any(|s| s.starts_with("cotal.main.chat.") && s.ends_with("team.>"))
        );
        assert!(has(publish, &format!("cotal.main.ctl.manager.{ALICE}")));
        assert!(has(
            publish,
            &format!("$JS.API.CONSUMER.CREATE.CHAT_main.chathist_{ALICE}.cotal.main.chat.*.team.>")
        ));
        assert!(has(publish, &format!("$JS.ACK.DM_main.dm_{ALICE}.>")));
        assert!(has(publish, &format!("$JS.ACK.*.*.DM_main.dm_{ALICE}.>")));
        assert!(has(
            publish,
            "$JS.API.CONSUMER.MSG.NEXT.TASK_main.svc_reviewer"
        ));
        assert!(has(publish, &format!("$KV.cotal_presence_main.{ALICE}")));
        assert!(!publish.iter().any(|s| s.contains("DIRECT.GET")));
        assert!(
            !publish.iter().any(|s| s.contains("CONSUMER.CREATE.KV_")),
            "no consumer create on the buckets: {publish:?}"
        );
        assert!(has(
            publish,
            "$JS.API.STREAM.MSG.GET.KV_cotal_presence_main"
        ));
        assert!(has(&p.publish.deny, "$JS.API.CONSUMER.CREATE.INBOX_main.>"));
        assert!(has(
            &p.publish.deny,
            "$JS.API.CONSUMER.DURABLE.CREATE.DM_main.>"
        ));
        assert!(!p.publish.deny.iter().any(|s| s.contains("CHAT_main")));

        let no_role = agent(&n, &scope(None));
        assert!(
            !no_role
                .publish
                .allow
                .iter()
                .any(|s| s.contains("TASK_main.svc_"))
        );
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
