//! The broker-enforced ACL battery (Appendix B, §9): minted credentials against the real
//! broker, each case asserting the broker's verdict: accepted, or refused with a permission
//! violation (or, for JetStream API requests it lets through, the server's own error).

use std::path::PathBuf;

use serde_json::json;

use crate::helper::{Cotald, Probe, TIMEOUT, mint, next};

const BOB: &str = "UDI36ZKVNUM5WMO4QQ6HDQU7F4OH2RCXOJRX6GAIOS5SKVNNSKCDNLJA";

fn own_creds(c: &Cotald, space: &str) -> PathBuf {
    c.data_dir
        .join(format!("spaces/{space}/local-operator.creds"))
}

/// The witness (the space's unrestricted local operator) sees what an allowed publish sends.
async fn witness_receives(witness: &mut Probe, subject: &str, send: impl AsyncFnOnce()) {
    let mut sub = witness.client.subscribe(subject.to_owned()).await.unwrap();
    witness.barrier().await;
    send().await;
    let msg = next(&mut sub).await;
    assert_eq!(msg.subject.as_str(), subject);
}

/// `subscriber` receives what the witness publishes on `subject` (the subscription is live).
async fn subscription_receives(
    subscriber: &mut Probe,
    witness: &Probe,
    pattern: &str,
    subject: &str,
) {
    let mut sub = subscriber
        .client
        .subscribe(pattern.to_owned())
        .await
        .unwrap();
    subscriber.barrier().await;
    witness
        .client
        .publish(subject.to_owned(), "x".into())
        .await
        .unwrap();
    let msg = next(&mut sub).await;
    assert_eq!(msg.subject.as_str(), subject);
}

fn history_body(id: &str, filter: &str) -> serde_json::Value {
    json!({
        "stream_name": "CHAT_main",
        "config": {
            "name": format!("chathist_{id}"),
            "filter_subject": filter,
            "ack_policy": "none",
            "deliver_policy": "all",
            "mem_storage": true,
            "inactive_threshold": 30_000_000_000u64,
        }
    })
}

#[tokio::test]
async fn agent_profile_is_enforced_by_the_broker() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(
        tmp.path(),
        "alice",
        "main",
        &[
            "--subscribe",
            "general",
            "--allow-subscribe",
            "general,team.>",
            "--allow-publish",
            "general",
            "--role",
            "reviewer",
        ],
    )
    .await;
    assert!(
        alice.link.ends_with("/main?channel=general"),
        "{}",
        alice.link
    );
    assert!(alice.ca.ends_with("tls/ca.pem"));
    let id = alice.id.clone();
    let mut a = Probe::connect(&c, &alice.creds).await;
    let mut w = Probe::connect(&c, &own_creds(&c, "main")).await;
    let mut cases = 0;

    // Publish: own chat subject on an allowPublish channel ✓, everything else ✗.
    let own = format!("cotal.main.chat.{id}.general");
    witness_receives(&mut w, &own, async || {
        a.client.publish(own.clone(), "hi".into()).await.unwrap();
    })
    .await;
    cases += 1;
    for subject in [
        format!("cotal.main.chat.{id}.random"),
        format!("cotal.main.chat.{BOB}.general"),
        format!("cotal.main.chat.{id}.*"),
        format!("cotal.main.chat.{id}.team.backend"),
    ] {
        a.denied_pub(&subject).await;
        cases += 1;
    }
    let dm_to_bob = format!("cotal.main.inst.{BOB}.{id}");
    witness_receives(&mut w, &dm_to_bob, async || {
        a.client
            .publish(dm_to_bob.clone(), "dm".into())
            .await
            .unwrap();
    })
    .await;
    a.denied_pub(&format!("cotal.main.inst.{id}.{BOB}")).await;
    a.denied_pub(&format!("cotal.main.ctl.admin.{id}")).await;
    cases += 3;

    // Subscribe: within allowSubscribe ✓ (also under `team.>`), the rest ✗.
    subscription_receives(
        &mut a,
        &w,
        "cotal.main.chat.*.general",
        &format!("cotal.main.chat.{BOB}.general"),
    )
    .await;
    subscription_receives(
        &mut a,
        &w,
        "cotal.main.chat.*.team.backend",
        &format!("cotal.main.chat.{BOB}.team.backend"),
    )
    .await;
    cases += 2;
    for subject in [
        "cotal.main.chat.*.team".to_owned(),
        "cotal.main.chat.*.random".to_owned(),
        "_INBOX.>".to_owned(),
        format!("_INBOX_{BOB}.>"),
        "cotal.main.>".to_owned(),
        "cotal.main.inst.>".to_owned(),
    ] {
        a.denied_sub(&subject).await;
        cases += 1;
    }

    // History: the pinned single-filter create ✓ for an allowed channel only.
    let create = |filter: &str| format!("$JS.API.CONSUMER.CREATE.CHAT_main.chathist_{id}.{filter}");
    let ok = a
        .request(
            &create("cotal.main.chat.*.general"),
            history_body(&id, "cotal.main.chat.*.general"),
        )
        .await;
    assert!(ok.get("error").is_none(), "pinned create: {ok}");
    let _ = a
        .request(
            &format!("$JS.API.CONSUMER.DELETE.CHAT_main.chathist_{id}"),
            json!({}),
        )
        .await;
    let ok = a
        .request(
            &create("cotal.main.chat.*.team.>"),
            history_body(&id, "cotal.main.chat.*.team.>"),
        )
        .await;
    assert!(
        ok.get("error").is_none(),
        "pinned create under team.>: {ok}"
    );
    let _ = a
        .request(
            &format!("$JS.API.CONSUMER.DELETE.CHAT_main.chathist_{id}"),
            json!({}),
        )
        .await;
    cases += 2;
    a.denied_request(
        &create("cotal.main.chat.*.random"),
        history_body(&id, "cotal.main.chat.*.random"),
    )
    .await;
    cases += 1;
    let mismatch = a
        .request(
            &create("cotal.main.chat.*.general"),
            history_body(&id, "cotal.main.chat.*.random"),
        )
        .await;
    assert_eq!(
        mismatch["error"]["err_code"], 10131,
        "body filter ≠ subject filter: {mismatch}"
    );
    cases += 1;
    a.denied_request(
        "$JS.API.CONSUMER.CREATE.CHAT_main",
        history_body(&id, "cotal.main.chat.>"),
    )
    .await;
    a.denied_request(
        &format!("$JS.API.CONSUMER.CREATE.CHAT_main.chathist_{id}"),
        json!({}),
    )
    .await;
    a.denied_request("$JS.API.CONSUMER.DURABLE.CREATE.CHAT_main.x", json!({}))
        .await;
    a.denied_request("$JS.API.DIRECT.GET.CHAT_main", json!({"seq": 1}))
        .await;
    a.denied_request("$JS.API.DIRECT.GET.DM_main", json!({"seq": 1}))
        .await;
    a.denied_request("$JS.API.STREAM.MSG.GET.CHAT_main", json!({"seq": 1}))
        .await;
    cases += 6;

    // DM: the pre-created dm_<id> is bound (INFO) and read; another's, and any create, ✗.
    let info = a
        .request(&format!("$JS.API.CONSUMER.INFO.DM_main.dm_{id}"), json!({}))
        .await;
    assert_eq!(
        info["config"]["durable_name"],
        format!("dm_{id}"),
        "dm_<id> pre-created on mint: {info}"
    );
    cases += 1;
    let js = async_nats::jetstream::new(w.client.clone());
    js.publish(format!("cotal.main.inst.{id}.{BOB}"), "for alice".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let consumer = async_nats::jetstream::new(a.client.clone())
        .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
            format!("dm_{id}"),
            "DM_main",
        )
        .await
        .expect("bind dm_<id> with CONSUMER.INFO only");
    let mut batch = consumer.fetch().max_messages(1).messages().await.unwrap();
    use futures_util::StreamExt;
    let dm = tokio::time::timeout(TIMEOUT, batch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(&dm.payload[..], b"for alice");
    dm.double_ack().await.expect("the ack is accepted");
    cases += 1;
    a.denied_request(
        &format!("$JS.API.CONSUMER.INFO.DM_main.dm_{BOB}"),
        json!({}),
    )
    .await;
    a.denied_request(
        &format!("$JS.API.CONSUMER.MSG.NEXT.DM_main.dm_{BOB}"),
        json!({"batch": 1}),
    )
    .await;
    cases += 2;
    for subject in [
        format!("$JS.API.CONSUMER.CREATE.DM_main.x.cotal.main.inst.{id}.*"),
        "$JS.API.CONSUMER.CREATE.DM_main".to_owned(),
        "$JS.API.CONSUMER.DURABLE.CREATE.DM_main.x".to_owned(),
        "$JS.API.CONSUMER.CREATE.TASK_main.x.cotal.main.svc.reviewer.*".to_owned(),
        "$JS.API.CONSUMER.DURABLE.CREATE.TASK_main.x".to_owned(),
        "$JS.API.CONSUMER.CREATE.INBOX_main.x.cotal.main.backstop.>".to_owned(),
        "$JS.API.CONSUMER.DELETE.DM_main.x".to_owned(),
        "$JS.API.STREAM.CREATE.EVIL".to_owned(),
        "$JS.API.STREAM.DELETE.CHAT_main".to_owned(),
        "$JS.API.STREAM.PURGE.DM_main".to_owned(),
    ] {
        a.denied_request(&subject, json!({})).await;
        cases += 1;
    }
    // Appendix B grants STREAM.INFO on DM (and CHAT, TASK, presence, registry) to agents.
    let dm_info = a.request("$JS.API.STREAM.INFO.DM_main", json!({})).await;
    assert_eq!(dm_info["config"]["name"], "DM_main", "{dm_info}");
    cases += 1;

    // Anycast: the role's pre-created svc_<role> is bound.
    let svc = a
        .request("$JS.API.CONSUMER.INFO.TASK_main.svc_reviewer", json!({}))
        .await;
    assert_eq!(svc["config"]["durable_name"], "svc_reviewer", "{svc}");
    a.denied_request("$JS.API.CONSUMER.INFO.TASK_main.svc_other", json!({}))
        .await;
    cases += 2;

    // Presence: own key ✓, another's ✗; the registries are not the agent's to write.
    let ajs = async_nats::jetstream::new(a.client.clone());
    let ack = ajs
        .publish(format!("$KV.cotal_presence_main.{id}"), "{}".into())
        .await
        .unwrap();
    tokio::time::timeout(TIMEOUT, ack)
        .await
        .unwrap()
        .expect("own presence key is writable");
    cases += 1;
    for subject in [
        format!("$KV.cotal_presence_main.{BOB}"),
        "$KV.cotal_channels_main.general".to_owned(),
        "$KV.cotal_channels_main.=defaults".to_owned(),
        format!("$KV.cotal_members_main.general/{id}"),
        format!("$KV.cotal_membership_main.{id}"),
    ] {
        a.denied_pub(&subject).await;
        cases += 1;
    }
    // The channel registry is readable (STREAM.MSG.GET, Appendix B).
    let defaults = a
        .request(
            "$JS.API.STREAM.MSG.GET.KV_cotal_channels_main",
            json!({"last_by_subj": "$KV.cotal_channels_main.=defaults"}),
        )
        .await;
    assert!(defaults["message"]["data"].is_string(), "{defaults}");
    cases += 1;

    eprintln!("agent ACL cases: {cases}");
    assert!(cases >= 45, "{cases}");
    c.stop().await;
}

#[tokio::test]
async fn observer_and_admin_profiles_are_enforced() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let w = Probe::connect(&c, &own_creds(&c, "main")).await;
    let obs = mint(tmp.path(), "dash", "main", &["--profile", "observer"]).await;
    let adm = mint(tmp.path(), "root", "main", &["--profile", "admin"]).await;
    // A DM to an agent that exists: the warden purges those to anyone else.
    let bob = mint(tmp.path(), "bob", "main", &[]).await;
    let mut o = Probe::connect(&c, &obs.creds).await;
    let mut ad = Probe::connect(&c, &adm.creds).await;

    // A message on chat and one DM, stored by the streams.
    let js = async_nats::jetstream::new(w.client.clone());
    for subject in [
        format!("cotal.main.chat.{BOB}.general"),
        format!("cotal.main.inst.{}.{BOB}", bob.id),
    ] {
        js.publish(subject, "x".into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    // Observer: live chat ✓, CHAT history ✓, registry ✓; publish ✗, DMs ✗.
    subscription_receives(
        &mut o,
        &w,
        "cotal.main.chat.>",
        &format!("cotal.main.chat.{BOB}.ops"),
    )
    .await;
    let ojs = async_nats::jetstream::new(o.client.clone());
    let chat = ojs.get_stream("CHAT_main").await.expect("STREAM.INFO CHAT");
    let history = chat
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            filter_subject: "cotal.main.chat.>".into(),
            ..Default::default()
        })
        .await
        .expect("observer reads CHAT history");
    let mut batch = history.fetch().max_messages(1).messages().await.unwrap();
    use futures_util::StreamExt;
    let first = tokio::time::timeout(TIMEOUT, batch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        first.subject.as_str(),
        format!("cotal.main.chat.{BOB}.general")
    );
    first.ack().await.unwrap();
    o.denied_pub(&format!("cotal.main.chat.{}.general", obs.id))
        .await;
    o.denied_pub(&format!("cotal.main.inst.{BOB}.{}", obs.id))
        .await;
    o.denied_sub("cotal.main.inst.>").await;
    o.denied_request("$JS.API.STREAM.INFO.DM_main", json!({}))
        .await;
    o.denied_request("$JS.API.CONSUMER.CREATE.DM_main", json!({}))
        .await;
    o.denied_pub("$KV.cotal_channels_main.general").await;

    // Admin: the whole space live ✓ (DMs included), DM history ✓; publish ✗.
    subscription_receives(
        &mut ad,
        &w,
        "cotal.main.>",
        &format!("cotal.main.inst.{}.{BOB}", bob.id),
    )
    .await;
    let ajs = async_nats::jetstream::new(ad.client.clone());
    let dm = ajs
        .get_stream("DM_main")
        .await
        .expect("admin STREAM.INFO DM");
    let reader = dm
        .create_consumer(async_nats::jetstream::consumer::pull::Config::default())
        .await
        .expect("admin reads DM history");
    let mut batch = reader.fetch().max_messages(1).messages().await.unwrap();
    let first = tokio::time::timeout(TIMEOUT, batch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(first.subject.as_str().starts_with("cotal.main.inst."));
    ad.denied_pub(&format!("cotal.main.chat.{}.general", adm.id))
        .await;
    ad.denied_pub(&format!("cotal.main.svc.reviewer.{}", adm.id))
        .await;
    ad.denied_pub(&format!("$KV.cotal_presence_main.{}", adm.id))
        .await;
    c.stop().await;
}

#[tokio::test]
async fn spaces_are_isolated() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let added = tokio::process::Command::new(crate::helper::cotald_bin())
        .args(["space", "add", "lab", "--profile", "public", "--data-dir"])
        .arg(tmp.path())
        .output()
        .await
        .unwrap();
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );

    let mut main_all = Probe::connect(&c, &own_creds(&c, "main")).await;
    let mut lab_all = Probe::connect(&c, &own_creds(&c, "lab")).await;
    let mut sub = main_all.client.subscribe("cotal.>").await.unwrap();
    main_all.barrier().await;
    lab_all
        .client
        .publish("cotal.lab.chat.x.general", "secret".into())
        .await
        .unwrap();
    lab_all
        .client
        .publish(
            "cotal.main.chat.x.general",
            "same name, other account".into(),
        )
        .await
        .unwrap();
    lab_all.barrier().await;
    main_all
        .client
        .publish("cotal.main.marker", "m".into())
        .await
        .unwrap();
    // Had anything of lab crossed over, it would have arrived before the marker.
    let msg = next(&mut sub).await;
    assert_eq!(
        msg.subject.as_str(),
        "cotal.main.marker",
        "space main saw {}",
        msg.subject
    );
    let info = main_all
        .request("$JS.API.STREAM.INFO.CHAT_lab", json!({}))
        .await;
    assert_eq!(
        info["error"]["err_code"], 10059,
        "lab's streams do not exist in main: {info}"
    );

    // A lab agent cannot read main's history either: its account has no such stream.
    let lab_agent = mint(tmp.path(), "x", "lab", &[]).await;
    let mut la = Probe::connect(&c, &lab_agent.creds).await;
    la.denied_sub("cotal.main.chat.*.general").await;
    c.stop().await;
}

/// The broker refuses the credential: at connect, or (for an account it has to look up) with
/// an authorization violation right after; the connection never carries a request.
async fn refused(c: &Cotald, creds: &std::path::Path) {
    let mut p = match Probe::try_connect(c, creds).await {
        Err(e) => {
            assert_eq!(
                e.kind(),
                async_nats::ConnectErrorKind::AuthorizationViolation,
                "{}: refused for the wrong reason: {e}",
                creds.display()
            );
            return;
        }
        Ok(p) => p,
    };
    let seen = tokio::time::timeout(TIMEOUT, async {
        while let Some(event) = p.events.recv().await {
            if matches!(
                event,
                async_nats::Event::ServerError(async_nats::ServerError::AuthorizationViolation)
            ) {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(seen, Ok(true)),
        "{} was not refused",
        creds.display()
    );
}

#[tokio::test]
async fn forged_expired_and_spliced_credentials_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let keys = cotald::provision::KeyStore::open(&tmp.path().join("keys")).unwrap();
    let space = keys.space("main").unwrap();
    let perms = cotald::binding::UserPermissions::unrestricted();
    let write = |name: &str, creds: &cotald::binding::Creds| {
        let path = tmp.path().join(name);
        std::fs::write(&path, creds.render()).unwrap();
        path
    };

    // Control: a correctly signed, unexpired credential connects.
    let user = nkeys::KeyPair::new_user();
    let good = space.mint("good", &user, &perms).unwrap();
    Probe::connect(&c, &write("good.creds", &good)).await;

    // Forged issuer: signed by a key the operator never vouched for.
    let foreign_dir = tempfile::tempdir().unwrap();
    let foreign = cotald::provision::KeyStore::load_or_create(foreign_dir.path()).unwrap();
    let forged = foreign
        .ensure_space("main")
        .unwrap()
        .mint("forged", &user, &perms)
        .unwrap();
    refused(&c, &write("forged.creds", &forged)).await;

    // Expired an hour ago.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let expired = space
        .mint_at("expired", &user, &perms, now - 7200, Some(now - 3600))
        .unwrap();
    refused(&c, &write("expired.creds", &expired)).await;

    // A seed that does not match the JWT.
    let other = nkeys::KeyPair::new_user();
    let spliced = cotald::binding::Creds {
        jwt: good.jwt.clone(),
        seed: other.seed().unwrap(),
    };
    refused(&c, &write("spliced.creds", &spliced)).await;
    c.stop().await;
}

/// nats-server does not check a push consumer's `deliver_subject` against its creator's publish
/// permissions. On the buckets Appendix B grants creates on, such a consumer could carry what
/// the agent writes to its own presence key onto Bob's chat subject; the consumer guard deletes
/// any bucket consumer delivering outside its creator's inbox (`it::fairness` shows the
/// deletion), and nats-server 2.15.1 delivers nothing there meanwhile. On CHAT the broker refuses
/// a delivery into a chat subject (a cycle). The forged message the attacker stores on its own
/// subject reaches Bob live and is rejected there: a receiver derives the sender from the
/// subject (§3, §4). Nothing is surfaced as a message from the victim.
#[tokio::test]
async fn deliver_subject_injection_is_rejected_by_the_receiver() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let mallory = mint(
        tmp.path(),
        "mallory",
        "main",
        &["--subscribe", "general", "--allow-publish", "general"],
    )
    .await;
    let bob = mint(tmp.path(), "bob", "main", &["--subscribe", "general"]).await;
    let mut b = crate::helper::endpoint(&bob, |o| o.presence = false).await;
    b.client
        .join("general", cotald::client::Replay::Off)
        .await
        .unwrap();
    let mut m = Probe::connect(&c, &mallory.creds).await;

    let target = format!("cotal.main.chat.{}.general", bob.id);
    let own_key = format!("$KV.cotal_presence_main.{}", mallory.id);
    let forged = json!({
        "id": cotald::protocol::new_message_id(), "ts": 1, "space": "main",
        "from": {"id": bob.id, "name": "bob"}, "channel": "general",
        "parts": [{"kind": "text", "text": "forged"}],
    });
    async_nats::jetstream::new(m.client.clone())
        .publish(
            format!("cotal.main.chat.{}.general", mallory.id),
            forged.to_string().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    // The same payload in Mallory's presence key, and a watch of that key delivering to Bob.
    async_nats::jetstream::new(m.client.clone())
        .publish(own_key.clone(), forged.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
    let reply = m
        .request(
            &format!("$JS.API.CONSUMER.CREATE.KV_cotal_presence_main.inject.{own_key}"),
            json!({"stream_name": "KV_cotal_presence_main", "config": {
                "name": "inject", "filter_subject": own_key, "deliver_subject": target,
                "ack_policy": "none", "deliver_policy": "all"}}),
        )
        .await;
    assert!(
        reply.get("error").is_none(),
        "Appendix B grants the create: {reply}"
    );
    let filter = "cotal.main.chat.*.general";
    let history = format!("chathist_{}", mallory.id);
    let body = json!({"stream_name": "CHAT_main", "config": {
        "name": history, "filter_subject": filter, "deliver_subject": target,
        "ack_policy": "none", "deliver_policy": "all"}});
    let reply = m
        .request(
            &format!("$JS.API.CONSUMER.CREATE.CHAT_main.{history}.{filter}"),
            body,
        )
        .await;
    assert_eq!(
        reply["error"]["err_code"], 10081,
        "the broker refuses a delivery into the stream the consumer reads: {reply}"
    );
    // The forged message Bob was sent live carries the attacker's subject and Bob's id in the
    // payload: a spoofed sender, rejected. A real message sent afterwards is what Bob sees.
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let a = crate::helper::endpoint(&alice, |o| o.presence = false).await;
    let (real, _) = a
        .client
        .send_text(
            cotald::protocol::Routing::channel(&cotald::protocol::Channel::new("general").unwrap()),
            "real",
        )
        .await
        .unwrap();
    let d = crate::helper::delivery(&mut b.deliveries).await;
    assert_eq!(d.message.id, real.id, "the forged message was not surfaced");
    match crate::helper::notice(&mut b.deliveries).await {
        cotald::client::Notice::Rejected(a) => {
            assert_eq!(a.reason, cotald::protocol::RejectReason::SenderMismatch)
        }
        other => panic!("{other:?}"),
    }
    c.stop().await;
}

/// The first message one fetch from `consumer` brings, and its body.
async fn first_fetched(
    consumer: &async_nats::jetstream::consumer::PullConsumer,
) -> (async_nats::jetstream::Message, serde_json::Value) {
    use futures_util::StreamExt;
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(std::time::Duration::from_secs(5))
        .messages()
        .await
        .unwrap();
    let msg = tokio::time::timeout(TIMEOUT, batch.next())
        .await
        .expect("a message within the timeout")
        .expect("the fetch brings one")
        .unwrap();
    let body = serde_json::from_slice(&msg.payload).unwrap();
    (msg, body)
}

/// A client that does only what Appendix B grants an agent, as clients written to it do (the
/// TypeScript reference among them): KV watches of presence and of the channel registry
/// through consumer creates, history through the pinned `chathist_<id>` create, its `dm_<id>`
/// and `svc_<role>` bound. It connects, watches and receives.
#[tokio::test]
async fn a_client_written_to_appendix_b_connects_watches_and_receives() {
    use async_nats::jetstream::consumer::{self, pull};
    use futures_util::StreamExt;

    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let peer = mint(
        tmp.path(),
        "peer",
        "main",
        &["--subscribe", "general", "--role", "reviewer"],
    )
    .await;
    let p = Probe::connect(&c, &peer.creds).await;
    let js = async_nats::jetstream::new(p.client.clone());

    // Presence: its own heartbeat, and Alice's, through a KV watch.
    let presence = js.get_key_value("cotal_presence_main").await.unwrap();
    let mut roster = crate::helper::appendix_watch(&p.client, "cotal_presence_main").await;
    let card = json!({"card": {"id": peer.id, "name": "peer", "kind": "agent",
        "protocolVersion": "0.2"}, "status": "idle", "ts": 1});
    presence
        .put(&peer.id, card.to_string().into())
        .await
        .expect("own presence key");
    let a = crate::helper::endpoint(&alice, |_| {}).await;
    let mut seen = std::collections::BTreeSet::new();
    tokio::time::timeout(TIMEOUT, async {
        while seen.len() < 2 {
            seen.insert(roster.next().await.unwrap());
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the presence watch saw {seen:?}"));
    assert!(
        seen.contains(&alice.id) && seen.contains(&peer.id),
        "{seen:?}"
    );

    // The channel registry, watched the same way.
    let mut channels = crate::helper::appendix_watch(&p.client, "cotal_channels_main").await;
    let first = tokio::time::timeout(TIMEOUT, channels.next())
        .await
        .expect("the registry watch delivers")
        .unwrap();
    assert!(
        ["=defaults", "general"].contains(&first.as_str()),
        "{first}"
    );

    // Alice posts, sends a DM and an anycast.
    let general =
        cotald::protocol::Routing::channel(&cotald::protocol::Channel::new("general").unwrap());
    let (post, _) = a.client.send_text(general, "history").await.unwrap();
    let me = cotald::protocol::InstanceId::from_user_nkey(&peer.id).unwrap();
    let (dm, _) = a
        .client
        .send_text(cotald::protocol::Routing::to(&me), "unicast")
        .await
        .unwrap();
    let (task, _) = a
        .client
        .send_text(cotald::protocol::Routing::to_service("reviewer"), "anycast")
        .await
        .unwrap();

    // History through the pinned create, then deleted.
    let chat = js.get_stream("CHAT_main").await.unwrap();
    let history = format!("chathist_{}", peer.id);
    let reader = chat
        .create_consumer(pull::Config {
            name: Some(history.clone()),
            filter_subject: "cotal.main.chat.*.general".into(),
            ack_policy: consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .expect("the pinned history create");
    let (_, body) = first_fetched(&reader).await;
    assert_eq!(body["id"], post.id.to_string());
    chat.delete_consumer(&history)
        .await
        .expect("its own history consumer deleted");

    // Its DM and its role's task, bound (never created) and acked.
    for (stream, durable, id) in [
        ("DM_main", format!("dm_{}", peer.id), dm.id.to_string()),
        ("TASK_main", "svc_reviewer".to_owned(), task.id.to_string()),
    ] {
        let bound: consumer::PullConsumer = js
            .get_stream_no_info(stream)
            .await
            .unwrap()
            .get_consumer(&durable)
            .await
            .unwrap_or_else(|e| panic!("binding {durable}: {e}"));
        let (msg, body) = first_fetched(&bound).await;
        assert_eq!(body["id"], id, "{durable}");
        msg.ack().await.unwrap();
    }
    c.stop().await;
}
