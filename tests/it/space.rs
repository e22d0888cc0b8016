//! Spaces from profiles: bootstrap configs field by field, `=defaults` from the deployment
//! profile, idempotent restarts that report drift instead of overwriting it, runtime spaces,
//! and `cotald mint` refusals and provisioning.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use async_nats::jetstream::stream::{DiscardPolicy, RetentionPolicy, StorageType};
use cotald::binding::SpaceNames;
use cotald::binding::streams::{self, Retention};
use serde_json::json;

use cotald::protocol::Routing;

use crate::helper::{Cotald, Probe, cotald_bin, cotald_in, mint, mint_raw};

fn own(c: &Cotald, space: &str) -> std::path::PathBuf {
    c.data_dir
        .join(format!("spaces/{space}/local-operator.creds"))
}

async fn stream_config(p: &mut Probe, name: &str) -> async_nats::jetstream::stream::Config {
    let js = async_nats::jetstream::new(p.client.clone());
    js.get_stream(name)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone()
}

async fn registry(p: &mut Probe, space: &str, key: &str) -> serde_json::Value {
    let js = async_nats::jetstream::new(p.client.clone());
    let kv = js
        .get_key_value(format!("cotal_channels_{space}"))
        .await
        .unwrap();
    let bytes = kv.get(key).await.unwrap().expect("registry key present");
    serde_json::from_slice(&bytes).unwrap()
}

async fn cli(data_dir: &Path, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(cotald_bin())
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .await
        .unwrap()
}

/// A space's retention as served: its profile's, fitted to the quota the appliance granted it
/// (what fits on this disk, `daemon/budget.rs`), read from the account's JetStream limits.
async fn served_retention(p: &Probe, config: &cotald::profile::SpaceConfig) -> Retention {
    let mut retention = config.retention();
    retention.store_budget = async_nats::jetstream::new(p.client.clone())
        .query_account()
        .await
        .unwrap()
        .limits
        .max_storage
        .expect("the account has a storage quota");
    retention
}

#[tokio::test]
async fn bootstrap_creates_exactly_the_section_8_configs() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let mut p = Probe::connect(&c, &own(&c, "main")).await;
    let names = SpaceNames::new("main");
    let profile = cotald::profile::Profile::embedded().unwrap();
    let retention = served_retention(&p, &profile.spaces["main"]).await;

    for expected in streams::all(&names, &retention) {
        let actual = stream_config(&mut p, &expected.name).await;
        assert_eq!(streams::drift(&expected, &actual), [], "{}", expected.name);
    }
    let chat = stream_config(&mut p, "CHAT_main").await;
    assert_eq!(chat.subjects, ["cotal.main.chat.>"]);
    assert_eq!(chat.storage, StorageType::File);
    assert_eq!(chat.retention, RetentionPolicy::Limits);
    assert_eq!(chat.max_messages_per_subject, 1000);
    assert_eq!(chat.discard, DiscardPolicy::Old);
    assert!(chat.allow_direct);
    let dm = stream_config(&mut p, "DM_main").await;
    assert_eq!(dm.subjects, ["cotal.main.inst.>"]);
    assert_eq!(dm.storage, StorageType::File);
    assert!(!dm.allow_direct);
    assert_eq!(
        dm.max_age,
        Duration::from_secs(30 * 86400),
        "DM is bounded by the profile"
    );
    assert_eq!(dm.max_bytes, 1 << 30);
    let task = stream_config(&mut p, "TASK_main").await;
    assert_eq!(task.subjects, ["cotal.main.svc.>"]);
    assert_eq!(task.retention, RetentionPolicy::WorkQueue);
    assert!(!task.allow_direct);
    assert_eq!(task.storage, StorageType::File);
    let backstop = stream_config(&mut p, "INBOX_main").await;
    assert!(!backstop.allow_direct);
    let presence = stream_config(&mut p, "KV_cotal_presence_main").await;
    assert_eq!(presence.max_age, Duration::from_millis(6000));
    assert_eq!(presence.subjects, ["$KV.cotal_presence_main.>"]);
    for bucket in [
        "cotal_channels_main",
        "cotal_membership_main",
        "cotal_members_main",
    ] {
        let config = stream_config(&mut p, &format!("KV_{bucket}")).await;
        assert_eq!(config.max_age, Duration::ZERO, "{bucket}: no TTL");
        assert!(!config.allow_direct, "{bucket}");
    }

    assert_eq!(
        registry(&mut p, "main", "=defaults").await,
        json!({"deliveryClass": "durable", "replay": true}),
        "local ⇒ durable (§7)"
    );
    let general = registry(&mut p, "main", "general").await;
    assert!(
        general["description"]
            .as_str()
            .unwrap()
            .starts_with("Everyone")
    );
    c.stop().await;
}

#[tokio::test]
async fn restart_is_idempotent_and_reports_drift_without_overwriting() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let mut p = Probe::connect(&c, &own(&c, "main")).await;
    let js = async_nats::jetstream::new(p.client.clone());
    js.publish("cotal.main.chat.x.general", "kept".into())
        .await
        .unwrap()
        .await
        .unwrap();
    // Someone changes a stream and a registry value behind cotald's back.
    let mut changed = stream_config(&mut p, "CHAT_main").await;
    changed.max_messages_per_subject = 10;
    js.update_stream(changed).await.unwrap();
    let kv = js.get_key_value("cotal_channels_main").await.unwrap();
    kv.put("=defaults", r#"{"deliveryClass":"live"}"#.into())
        .await
        .unwrap();
    drop(p);
    c.stop().await;

    let mut c = Cotald::spawn(tmp.path(), &[]);
    let drift = c.wait_stderr("stream config drift").await;
    assert!(
        drift.contains("CHAT_main: max_msgs_per_subject is 10 but cotald expects 1000"),
        "{drift}"
    );
    let kept = c.wait_stderr("channel registry value differs").await;
    assert!(kept.contains("=defaults"), "{kept}");
    c.wait_stdout("cotald is ready").await;
    let mut p = Probe::connect(&c, &own(&c, "main")).await;
    assert_eq!(
        stream_config(&mut p, "CHAT_main")
            .await
            .max_messages_per_subject,
        10,
        "not overwritten"
    );
    assert_eq!(
        registry(&mut p, "main", "=defaults").await,
        json!({"deliveryClass": "live"})
    );
    let js = async_nats::jetstream::new(p.client.clone());
    let mut chat = js.get_stream("CHAT_main").await.unwrap();
    assert_eq!(chat.info().await.unwrap().state.messages, 1, "no data lost");
    c.stop().await;
}

#[tokio::test]
async fn a_space_added_at_runtime_is_served_and_remembered() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let out = cli(tmp.path(), &["space", "add", "lab", "--profile", "public"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "cotals://127.0.0.1:{}/lab",
            c.state().listen.port()
        )),
        "{text}"
    );
    let again = cli(tmp.path(), &["space", "add", "lab"]).await;
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    let bad = cli(tmp.path(), &["space", "add", "a.b"]).await;
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("[A-Za-z0-9_-]"));

    let mut p = Probe::connect(&c, &own(&c, "lab")).await;
    assert_eq!(
        registry(&mut p, "lab", "=defaults").await,
        json!({"deliveryClass": "live"}),
        "public ⇒ live"
    );
    let lab = SpaceNames::new("lab");
    let public =
        cotald::profile::SpaceConfig::with_profile(cotald::profile::DeploymentProfile::Public);
    for expected in streams::all(&lab, &served_retention(&p, &public).await) {
        let actual = stream_config(&mut p, &expected.name).await;
        assert_eq!(streams::drift(&expected, &actual), [], "{}", expected.name);
    }
    let agent = mint(tmp.path(), "worker", "lab", &["--role", "builder"]).await;
    Probe::connect(&c, &agent.creds).await;
    drop(p);
    c.stop().await;

    let c = Cotald::up(tmp.path()).await;
    let list = cli(tmp.path(), &["space", "list", "--json"]).await;
    assert!(list.status.success());
    let spaces: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let names: Vec<&str> = spaces
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["lab", "main"]);
    assert_eq!(c.state().spaces, ["lab", "main"]);
    Probe::connect(&c, &agent.creds).await;
    c.stop().await;
}

#[tokio::test]
async fn mint_refuses_bad_requests_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let creds_dir = tmp.path().join("spaces/main/creds");
    let cases: &[(&[&str], &str)] = &[
        (&["--subscribe", "foo/bar"], "foo/bar"),
        (&["--allow-subscribe", "a.>.b"], "a.>.b"),
        (&["--allow-publish", "a..b"], "a..b"),
        (
            &["--subscribe", "ops", "--allow-subscribe", "team.>"],
            "not within --allow-subscribe",
        ),
        (&["--role", "re/viewer"], "role"),
        (
            &["--profile", "observer", "--allow-publish", "general"],
            "apply to agents",
        ),
    ];
    for (args, expect) in cases {
        let out = mint_raw(tmp.path(), "alice", "main", args).await;
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
    let out = mint_raw(tmp.path(), "alice", "nope", &[]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown space `nope`"));
    let existing = tmp.path().join("taken.creds");
    std::fs::write(&existing, "keep me").unwrap();
    let out = mint_raw(
        tmp.path(),
        "alice",
        "main",
        &["--out", existing.to_str().unwrap()],
    )
    .await;
    assert!(!out.status.success());
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me");
    assert!(!creds_dir.exists(), "nothing written by refused requests");
    assert!(!tmp.path().join("spaces/main/identities").exists());

    let ok = mint(tmp.path(), "alice", "main", &[]).await;
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&ok.creds).unwrap().permissions().mode() & 0o777,
        0o600
    );
    c.stop().await;
}

/// Every file and directory under `root`, with its size and modification time.
fn tree(root: &Path) -> Vec<(std::path::PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_owned()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                todo.push(entry.path());
            }
            out.push((entry.path(), meta.len(), meta.modified().unwrap()));
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn mint_refuses_bad_names_before_writing_anything() {
    let long = "x".repeat(10_000);
    let bad = [
        "",
        ".",
        "..",
        ".hidden",
        "a/b",
        "../../escape",
        "a b",
        "tab\tname",
        "esc\u{1b}]0;owned\u{7}",
        "bidi\u{202e}",
        &long[..65],
        &long,
    ];
    let refuse_all = |dir: std::path::PathBuf| async move {
        for name in bad {
            let out = mint_raw(&dir, name, "main", &[]).await;
            assert!(!out.status.success(), "{name:?} accepted");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("use 1 to 64 characters from [A-Za-z0-9_.-]"),
                "{name:?}: {err}"
            );
            assert!(err.len() < 300, "a short message: {err}");
            assert!(!err.contains('\u{1b}'), "{err:?}");
        }
    };

    // No data dir yet: none is created.
    let tmp = tempfile::tempdir().unwrap();
    let fresh = tmp.path().join("fresh");
    refuse_all(fresh.clone()).await;
    assert!(!fresh.exists(), "no data dir created: {:?}", tree(&fresh));

    // The appliance running: nothing new in the spaces.
    let dir = tmp.path().join("data");
    let c = Cotald::up(&dir).await;
    let spaces = tree(&dir.join("spaces"));
    refuse_all(dir.clone()).await;
    assert_eq!(tree(&dir.join("spaces")), spaces);
    c.stop().await;

    // Stopped: the data dir is left exactly as it was, lock file included.
    let before = tree(&dir);
    refuse_all(dir.clone()).await;
    assert_eq!(tree(&dir), before);
}

#[tokio::test]
async fn minting_without_the_appliance_provisions_at_the_next_start() {
    let tmp = tempfile::tempdir().unwrap();
    Cotald::up(tmp.path()).await.stop().await;
    let out = mint_raw(tmp.path(), "late", "main", &["--role", "reviewer"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let minted: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = minted["id"].as_str().unwrap().to_owned();

    let c = Cotald::up(tmp.path()).await;
    let mut p = Probe::connect(&c, Path::new(minted["creds"].as_str().unwrap())).await;
    let info = p
        .request(&format!("$JS.API.CONSUMER.INFO.DM_main.dm_{id}"), json!({}))
        .await;
    assert_eq!(info["config"]["durable_name"], format!("dm_{id}"), "{info}");
    let svc = p
        .request("$JS.API.CONSUMER.INFO.TASK_main.svc_reviewer", json!({}))
        .await;
    assert_eq!(svc["config"]["durable_name"], "svc_reviewer", "{svc}");
    c.stop().await;
}

#[tokio::test]
async fn a_space_that_cannot_be_served_fails_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let out = cli(tmp.path(), &["space", "add", "lab"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Someone with the space's keys turns Direct Get on for its DMs: serving it would expose
    // every DM, so the appliance refuses to serve `lab` from now on.
    let p = Probe::connect(&c, &own(&c, "lab")).await;
    let js = async_nats::jetstream::new(p.client.clone());
    let mut config = js
        .get_stream("DM_lab")
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    config.allow_direct = true;
    js.update_stream(config).await.unwrap();
    drop(js);
    p.client.drain().await.unwrap();
    let listen = c.state().listen.to_string();
    c.stop().await;

    // A damaged record of another runtime space is reported the same way.
    std::fs::create_dir_all(tmp.path().join("spaces/broken")).unwrap();
    std::fs::write(tmp.path().join("spaces/broken/space.toml"), "profile = 7\n").unwrap();

    let mut c = Cotald::spawn(tmp.path(), &["--listen", &listen]);
    c.wait_stdout("cotald is ready").await;
    let banner = c.wait_stdout("NOT SERVED").await;
    assert!(
        banner.contains("lab") || banner.contains("broken"),
        "{banner}"
    );
    let state = c.state();
    assert_eq!(state.spaces, ["main"]);
    let unserved: BTreeMap<_, _> = state
        .unserved
        .iter()
        .map(|u| (u.name.as_str(), u.reason.as_str()))
        .collect();
    assert!(unserved["lab"].contains("allow_direct"), "{unserved:?}");
    assert!(unserved["broken"].contains("malformed"), "{unserved:?}");
    let status = cli(tmp.path(), &["status"]).await;
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("NOT SERVED  lab: "), "{text}");
    // `main` serves: a minted agent connects and round-trips.
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let mut a = Probe::connect(&c, &alice.creds).await;
    a.barrier().await;
    c.stop().await;
}

/// Agents connect, join and receive while the operator mints, re-issues and revokes other
/// identities: every one of them succeeds. Each re-issue and revoke pushes the space's account
/// JWT, and while the broker applies it the account's import of the JetStream API is rebuilt:
/// a request of that instant finds no responder (async-nats says "requested JetStream resource
/// does not exist"), which a client retries rather than fail its start.
#[tokio::test]
async fn agents_connect_while_identities_are_minted_reissued_and_revoked() {
    const AGENTS: usize = 30;
    const ROUNDS: usize = 3;
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let mut agents = Vec::new();
    for i in 0..AGENTS {
        agents.push(mint(tmp.path(), &format!("agent{i}"), "main", &[]).await);
    }
    let sender = crate::helper::operator_endpoint(tmp.path(), &agents[0], false).await;
    // The operator's churn: one identity re-issued again and again, another minted and
    // revoked, each change pushing the account.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (dir, stop) = (tmp.path().to_owned(), stop.clone());
        tokio::spawn(async move {
            let mut changes = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                mint(&dir, "churned", "main", &["--replace"]).await;
                mint(&dir, "revoked", "main", &["--replace"]).await;
                let out = cotald_in(&dir, &["revoke", "revoked", "--space", "main"]).await;
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                changes += 3;
            }
            changes
        })
    };
    let general = cotald::protocol::Channel::new("general").unwrap();
    let mut failures = Vec::new();
    let mut delivered = 0;
    for round in 0..ROUNDS {
        for i in 0..AGENTS {
            // Its own credential re-issued right before it starts, as a host restarting an
            // agent with fresh credentials does.
            let agent = &mint(tmp.path(), &format!("agent{i}"), "main", &["--replace"]).await;
            let link = cotald::protocol::JoinLink::parse(&agent.link).unwrap();
            let mut opts = cotald::client::ConnectOptions::new(
                link,
                std::fs::read_to_string(&agent.creds).unwrap(),
            );
            opts.ca = Some(agent.ca.clone());
            let attempt = async {
                let mut conn = cotald::client::Client::connect(opts).await?;
                conn.client
                    .join("general", cotald::client::Replay::Off)
                    .await?;
                let text = format!("round {round} agent {i}");
                sender
                    .client
                    .send_text(Routing::channel(&general), &text)
                    .await?;
                loop {
                    let d = crate::helper::delivery(&mut conn.deliveries).await;
                    let mine = d.message.parts[0] == cotald::protocol::Part::text(&text);
                    d.ack().await?;
                    if mine {
                        break;
                    }
                }
                conn.client.close().await;
                anyhow::Ok(())
            };
            match tokio::time::timeout(crate::helper::TIMEOUT, attempt).await {
                Ok(Ok(())) => delivered += 1,
                Ok(Err(e)) => failures.push(format!("round {round} agent{i}: {e:#}")),
                Err(_) => failures.push(format!("round {round} agent{i}: timed out")),
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let changes = churn.await.unwrap();
    eprintln!(
        "{delivered} of {} connects delivered while the operator made {changes} changes",
        AGENTS * ROUNDS
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    c.stop().await;
}
