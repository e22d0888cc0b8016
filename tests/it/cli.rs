//! The command line as a person uses it: endpoint commands with no connection flags on the
//! appliance's machine, saved contexts and environment variables for remote use, names instead
//! of ids, the identities, roster and channels commands, and refusals that say what to do.
//! Every test runs the real binary against a real appliance.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::helper::{Cotald, TIMEOUT, cotald_bin, endpoint, mint};

/// `cotald` run as a person would: the data dir and the config dir of the test, and none of
/// the connection variables of whoever runs the tests.
struct Cli {
    data_dir: PathBuf,
    config: tempfile::TempDir,
}

impl Cli {
    fn new(data_dir: &Path) -> Cli {
        Cli {
            data_dir: data_dir.to_owned(),
            config: tempfile::tempdir().unwrap(),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(cotald_bin());
        cmd.args(args)
            .env("COTALD_DATA_DIR", &self.data_dir)
            .env("XDG_CONFIG_HOME", self.config.path())
            .env_remove("COTALD_LINK")
            .env_remove("COTALD_CREDS")
            .env_remove("COTALD_CA")
            .env_remove("COTALD_CONTEXT")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    async fn output(&self, mut cmd: Command) -> Output {
        let args: Vec<String> = cmd
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        tokio::time::timeout(TIMEOUT, cmd.output())
            .await
            .unwrap_or_else(|_| panic!("cotald {args:?} did not finish within {TIMEOUT:?}"))
            .unwrap()
    }

    /// Runs `cotald ARGS…`, which must succeed; returns its stdout.
    async fn ok(&self, args: &[&str]) -> String {
        self.ok_with(self.command(args)).await
    }

    async fn ok_with(&self, cmd: Command) -> String {
        let out = self.output(cmd).await;
        assert!(
            out.status.success(),
            "failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs `cotald ARGS…`, which must fail saying each of `hints`; returns its stderr.
    async fn refused(&self, args: &[&str], hints: &[&str]) -> String {
        self.refused_with(self.command(args), hints).await
    }

    async fn refused_with(&self, cmd: Command, hints: &[&str]) -> String {
        let out = self.output(cmd).await;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "accepted; stderr: {stderr}");
        for hint in hints {
            assert!(stderr.contains(hint), "no {hint:?} in: {stderr}");
        }
        assert!(!stderr.contains("\u{1b}["), "no terminal codes: {stderr}");
        stderr
    }

    /// `ARGS… --json` parsed.
    async fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        serde_json::from_str(&self.ok(&args).await).expect("one JSON document")
    }

    /// What `tail ARGS… --json` printed, one document per message.
    async fn tail(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["tail", "--json"];
        all.extend_from_slice(args);
        self.ok(&all)
            .await
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn texts(messages: &[Value]) -> Vec<&str> {
    messages
        .iter()
        .map(|m| m["parts"][0]["text"].as_str().unwrap())
        .collect()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test]
async fn zero_flag_commands_act_as_the_local_operator() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let cli = Cli::new(tmp.path());

    mint(tmp.path(), "bob", "main", &[]).await;
    assert!(
        cli.ok(&["send", "--channel", "general", "one"])
            .await
            .starts_with("sent ")
    );
    // The local link names `general`: it is the default channel of send and tail.
    cli.ok(&["send", "two"]).await;
    // --as acts as a minted identity, found by name.
    let got = cli.tail(&["--as", "bob", "--count", "2"]).await;
    assert_eq!(texts(&got), ["one", "two"]);
    assert!(got.iter().all(|m| m["from"]["name"] == "local-operator"));

    // The roster shows who is connected, and not the command that reads it.
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let a = endpoint(&alice, |_| {}).await;
    let roster = cli.json(&["roster"]).await;
    let rows = roster.as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alice", "bob"], "{roster}");
    assert_eq!(rows[0]["id"], alice.id.as_str());
    assert_eq!(rows[0]["status"], "idle");
    assert_eq!(rows[1]["status"], "offline", "bob's tail has ended");
    assert!(rows[0]["lastSeen"].is_string(), "{roster}");
    let text = cli.ok(&["roster"]).await;
    assert!(text.starts_with("NAME") && text.contains("alice"), "{text}");

    // --watch prints the roster again when it changes: alice leaves.
    let mut watch = Running::spawn(&cli, &["roster", "--watch", "--json"]);
    let first = watch.messages(1).await.remove(0);
    assert_eq!(first[0]["status"], "idle", "{first}");
    a.client.clone().close().await;
    let changed = watch.messages(1).await.remove(0);
    assert_eq!(changed[0]["name"], "alice");
    assert_eq!(
        changed[0]["status"], "offline",
        "the next roster printed is the change: {changed}"
    );
    watch.child.kill().await.unwrap();

    let channels = cli.json(&["channels"]).await;
    let general = &channels.as_array().unwrap()[0];
    assert_eq!(general["channel"], "general");
    assert_eq!(general["class"], "durable");
    assert_eq!(general["replay"], true);
    assert_eq!(general["messages"], 2);
    assert!(general["lastActivity"].is_string(), "{general}");

    // The operator's own tail shows what others post (its own posts are not echoed to it).
    cli.ok(&["send", "--as", "alice", "from alice"]).await;
    let got = cli.tail(&["--count", "1"]).await;
    assert_eq!(texts(&got), ["from alice"]);
    assert_eq!(got[0]["from"]["name"], "alice");
    let joined = cli.ok(&["join", "general", "--as", "bob"]).await;
    assert_eq!(joined.trim(), "joined durable general");
    let left = cli.ok(&["leave", "general", "--as", "bob"]).await;
    assert!(left.starts_with("left durable general"), "{left}");

    // --space selects another local space.
    let added = cli.ok(&["space", "add", "lab"]).await;
    assert!(added.contains("lab"), "{added}");
    mint(tmp.path(), "carol", "lab", &[]).await;
    cli.ok(&["send", "--space", "lab", "in the lab"]).await;
    let got = cli
        .tail(&["--space", "lab", "--as", "carol", "--count", "1"])
        .await;
    assert_eq!(texts(&got), ["in the lab"]);

    c.stop().await;
}

#[tokio::test]
async fn contexts_and_environment_variables_reach_a_remote_appliance() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    // The client's own data dir holds no appliance: everything comes from the context.
    let elsewhere = tempfile::tempdir().unwrap();
    let remote = Cli::new(elsewhere.path());
    let local = Cli::new(tmp.path());

    remote
        .refused(
            &["send", "x"],
            &["no cotald is running", "cotald context add"],
        )
        .await;
    let saved = remote
        .ok(&[
            "context",
            "add",
            "work",
            "--link",
            &alice.link,
            "--creds",
            path(&alice.creds),
            "--ca",
            path(&alice.ca),
            "--use",
        ])
        .await;
    assert_eq!(saved.trim(), "saved context work (current)");
    let listed = remote.json(&["context", "ls"]).await;
    assert_eq!(listed[0]["name"], "work");
    assert_eq!(listed[0]["current"], true);
    assert!(remote.ok(&["context", "ls"]).await.starts_with("* work"));

    remote.ok(&["send", "via the context"]).await;
    let got = local.tail(&["--space", "main", "--count", "1"]).await;
    assert_eq!(got[0]["from"]["name"], "alice");

    // COTALD_CONTEXT names one; an unknown name lists the known ones.
    let mut cmd = remote.command(&["send", "x"]);
    cmd.env("COTALD_CONTEXT", "nope");
    remote
        .refused_with(cmd, &["no context named `nope`", "known: work"])
        .await;
    remote
        .refused(
            &[
                "context",
                "add",
                "bad",
                "--link",
                &alice.link,
                "--creds",
                path(&alice.creds),
                "--ca",
                path(&alice.creds),
            ],
            &[
                "is not a PEM certificate (it is a .creds file)",
                "tls/ca.pem",
            ],
        )
        .await;
    // A malformed context is listed as broken beside the good ones, and `rm` removes it.
    std::fs::write(
        remote.config.path().join("cotald/contexts/torn.json"),
        "{\"link\":",
    )
    .unwrap();
    let listed = remote.ok(&["context", "ls"]).await;
    assert!(listed.contains("* work"), "{listed}");
    assert!(
        listed.contains("torn  BROKEN: context `torn`")
            && listed.contains("cotald context rm torn"),
        "{listed}"
    );
    assert_eq!(remote.json(&["context", "ls"]).await[0]["name"], "torn");
    assert_eq!(
        remote.ok(&["context", "rm", "torn"]).await.trim(),
        "removed context torn"
    );
    assert_eq!(
        remote.ok(&["context", "rm", "work"]).await.trim(),
        "removed context work"
    );
    remote
        .refused(&["send", "x"], &["no cotald is running"])
        .await;

    // Environment variables, and an explicit flag wins over them.
    let mut cmd = remote.command(&["send", "via the environment"]);
    cmd.env("COTALD_LINK", &alice.link)
        .env("COTALD_CREDS", "/nonexistent.creds")
        .env("COTALD_CA", &alice.ca)
        .args(["--creds", path(&alice.creds)]);
    remote.ok_with(cmd).await;
    let got = local.tail(&["--count", "2"]).await;
    // Both sends arrived. Their order is not what is checked: the operator's earlier tail may
    // have made it a durable member of the channel, and then the second message comes from its
    // backlog (at connect) and from the history (at join), whichever is first.
    let mut got = texts(&got);
    got.sort_unstable();
    assert_eq!(got, ["via the context", "via the environment"]);
    let mut cmd = remote.command(&["send", "x"]);
    cmd.env("COTALD_LINK", &alice.link)
        .env("COTALD_CREDS", "/nonexistent.creds")
        .env("COTALD_CA", &alice.ca);
    remote
        .refused_with(cmd, &["cannot read the credential /nonexistent.creds"])
        .await;
    c.stop().await;
}

#[tokio::test]
async fn peers_are_named_not_keyed() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let cli = Cli::new(tmp.path());
    mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let bob = mint(tmp.path(), "bob", "main", &[]).await;

    // bob never connected: he is found among the identities minted here.
    cli.ok(&["send", "--as", "alice", "--to", "bob", "hello bob"])
        .await;
    cli.ok(&["send", "--as", "alice", "--to", &bob.id, "by id"])
        .await;
    let got = cli.tail(&["--as", "bob", "--dm", "--count", "2"]).await;
    assert_eq!(texts(&got), ["hello bob", "by id"]);
    assert!(got.iter().all(|m| m["kind"] == "dm"));

    cli.refused(
        &["send", "--as", "alice", "--to", "nobody", "x"],
        &[
            "--to nobody",
            "nobody named `nobody`",
            "known names: alice, bob",
        ],
    )
    .await;
    cli.refused(
        &["send", "--as", "alice", "--mention", "ghost", "x"],
        &["--mention ghost", "nobody named `ghost`"],
    )
    .await;
    cli.ok(&["send", "--as", "alice", "--mention", "bob", "ping"])
        .await;

    // Two online instances carry one name: the error lists both, with their ids.
    let x = mint(tmp.path(), "twin-x", "main", &[]).await;
    let y = mint(tmp.path(), "twin-y", "main", &[]).await;
    let tx = endpoint(&x, |o| o.name = Some("twin".into())).await;
    let ty = endpoint(&y, |o| o.name = Some("twin".into())).await;
    // Two commands of one identity in quick succession each read the roster.
    for _ in 0..2 {
        let roster = cli.json(&["roster", "--as", "alice"]).await;
        let twins = roster
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["name"] == "twin")
            .count();
        assert_eq!(twins, 2, "{roster}");
    }
    let err = cli
        .refused(
            &["send", "--as", "alice", "--to", "twin", "x"],
            &["--to twin", "`twin` names 2 instances", "give the id"],
        )
        .await;
    assert!(err.contains(&x.id) && err.contains(&y.id), "{err}");
    tx.client.close().await;
    ty.client.close().await;
    c.stop().await;
}

#[tokio::test]
async fn identities_are_listed_and_a_name_is_minted_once() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let cli = Cli::new(tmp.path());
    let first = mint(
        tmp.path(),
        "alice",
        "main",
        &["--allow-publish", "general", "--expires", "30d"],
    )
    .await;
    let out = crate::helper::mint_raw(tmp.path(), "alice", "main", &[]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("identity `alice` already exists in space main") && err.contains("--replace"),
        "{err}"
    );
    let again = mint(tmp.path(), "alice", "main", &["--replace"]).await;
    assert_eq!(again.id, first.id, "a replacement keeps the identity");
    mint(tmp.path(), "watcher", "main", &["--profile", "observer"]).await;
    // An --out that cannot be written is refused before anything is minted.
    let blocker = tmp.path().join("a-file");
    std::fs::write(&blocker, "").unwrap();
    let unwritable = blocker.join("ghost.creds");
    let out = crate::helper::mint_raw(
        tmp.path(),
        "ghost",
        "main",
        &["--out", unwritable.to_str().unwrap()],
    )
    .await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing was minted"), "{err}");

    let listed = cli.json(&["identities"]).await;
    let rows = listed.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{listed}");
    assert_eq!(rows[0]["name"], "alice");
    assert_eq!(rows[0]["id"], first.id.as_str());
    assert_eq!(rows[0]["profile"], "agent");
    assert_eq!(rows[0]["allowSubscribe"], serde_json::json!(["general"]));
    assert_eq!(
        rows[0]["expiresAt"],
        Value::Null,
        "replaced without --expires"
    );
    assert!(rows[0]["issuedAt"].is_string());
    assert_eq!(rows[0]["creds"], path(&again.creds));
    assert_eq!(rows[1]["profile"], "observer");
    let text = cli.ok(&["identities"]).await;
    assert!(text.contains("read general post -"), "{text}");
    cli.refused(
        &["identities", "--space", "nope"],
        &["space `nope` does not exist"],
    )
    .await;

    // Listing reads the data dir: it works with the appliance stopped.
    c.stop().await;
    assert_eq!(cli.json(&["identities"]).await, listed);
}

#[tokio::test]
async fn channel_configs_are_written_by_admins() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let cli = Cli::new(tmp.path());
    cli.ok(&[
        "channels",
        "set",
        "ops",
        "--class",
        "live",
        "--window",
        "24h",
        "--description",
        "on call",
    ])
    .await;
    let find = |all: &Value, name: &str| {
        all.as_array()
            .unwrap()
            .iter()
            .find(|c| c["channel"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {all}"))
    };
    let ops = find(&cli.json(&["channels"]).await, "ops");
    assert_eq!(ops["class"], "live");
    assert_eq!(ops["replayWindow"], "24h");
    assert_eq!(ops["description"], "on call");
    assert_eq!(ops["messages"], 0);

    mint(tmp.path(), "alice", "main", &[]).await;
    cli.refused(
        &["channels", "set", "ops", "--no-replay", "--as", "alice"],
        &[
            "cannot configure channel ops",
            "only the machine operator may",
            "no --as",
        ],
    )
    .await;
    // Admin identities publish nothing (Appendix B), so they cannot reach the manager either.
    mint(tmp.path(), "root", "main", &["--profile", "admin"]).await;
    cli.refused(
        &["channels", "set", "ops", "--no-replay", "--as", "root"],
        &["only the machine operator may"],
    )
    .await;
    cli.ok(&["channels", "set", "ops", "--no-replay"]).await;
    let ops = find(&cli.json(&["channels"]).await, "ops");
    assert_eq!(ops["replay"], false);
    assert_eq!(ops["class"], "live", "flags not given keep their value");
    assert_eq!(ops["description"], "on call");
    cli.refused(
        &["channels", "set", "bad/chan", "--replay"],
        &["invalid channel"],
    )
    .await;
    c.stop().await;
}

/// A channel made by mistake can be undone: `channels rm` removes its config (its messages
/// stay and it still shows), `--purge` its history too (it shows nowhere); a name the space
/// does not know is refused with the closest it knows; a member may not remove.
#[tokio::test]
async fn a_channel_is_removed_and_with_purge_forgotten() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let cli = Cli::new(tmp.path());
    let listed = |all: &Value, name: &str| {
        all.as_array()
            .unwrap()
            .iter()
            .find(|c| c["channel"] == name)
            .cloned()
    };
    cli.ok(&["channels", "set", "generl", "--description", "a typo"])
        .await;
    cli.ok(&["send", "--channel", "generl", "one"]).await;
    cli.ok(&["send", "--channel", "generl", "two"]).await;
    cli.refused(
        &["channels", "rm", "genrl"],
        &[
            "channel `genrl` has no config",
            "did you mean `generl`?",
            "nothing to remove",
        ],
    )
    .await;
    mint(tmp.path(), "alice", "main", &[]).await;
    cli.refused(
        &["channels", "rm", "generl", "--as", "alice"],
        &[
            "cannot remove channel generl",
            "only the machine operator may",
        ],
    )
    .await;

    let said = cli.ok(&["channels", "rm", "generl"]).await;
    assert!(
        said.contains("its config removed; its messages are kept"),
        "{said}"
    );
    let kept = listed(&cli.json(&["channels"]).await, "generl").expect("still posted to");
    assert_eq!(kept["configured"], false);
    assert_eq!(kept["messages"], 2);

    let said = cli.ok(&["channels", "rm", "generl", "--purge"]).await;
    assert!(
        said.contains("it had no config, 2 stored messages deleted"),
        "{said}"
    );
    assert_eq!(listed(&cli.json(&["channels"]).await, "generl"), None);
    assert!(
        listed(&cli.json(&["channels"]).await, "general").is_some(),
        "the other channels stay"
    );
    cli.refused(
        &["send", "--channel", "generl", "three"],
        &["channel `generl` has no config and no messages yet"],
    )
    .await;
    c.stop().await;
}

/// Where and as whom to act may be said before the command as well as after it; after it
/// wins, before it wins over the environment, and an option a command does not take is
/// refused there too.
#[tokio::test]
async fn connection_options_are_accepted_before_the_command() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let elsewhere = tempfile::tempdir().unwrap();
    // The environment names another data dir: the one given before the command wins.
    let cli = Cli::new(elsewhere.path());
    let dir = path(tmp.path());
    let status = cli.ok(&["--data-dir", dir, "status", "--json"]).await;
    assert!(
        status.contains("\"running\": true") || status.contains("\"running\":true"),
        "{status}"
    );
    cli.ok(&[
        "--data-dir",
        dir,
        "mint",
        "alice",
        "--allow-publish",
        "general",
    ])
    .await;
    let sent = cli
        .ok(&[
            "--data-dir",
            dir,
            "--as",
            "alice",
            "send",
            "from before the command",
        ])
        .await;
    assert!(sent.starts_with("sent "), "{sent}");
    // After the command wins over before it.
    let listed = cli
        .json(&[
            "--space",
            "nowhere",
            "--data-dir",
            dir,
            "identities",
            "--space",
            "main",
        ])
        .await;
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["name"] == "alice"),
        "{listed}"
    );
    cli.refused(
        &["--data-dir", dir, "--as", "alice", "up"],
        &["--as does not apply to this command"],
    )
    .await;
    cli.refused(&["--context", "nowhere", "send", "hi"], &["nowhere"])
        .await;
    c.stop().await;
}

#[tokio::test]
async fn refusals_say_what_was_refused_and_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let cli = Cli::new(tmp.path());
    cli.refused(&["send", "x"], &["cotald up"]).await;

    let c = Cotald::up(tmp.path()).await;
    mint(tmp.path(), "reader", "main", &[]).await;
    cli.refused(
        &["send", "--as", "reader", "--channel", "general", "x"],
        &["may not post to channel general", "--allow-publish general"],
    )
    .await;
    cli.refused(
        &["send", "--channel", "bad/chan", "x"],
        &["invalid --channel \"bad/chan\""],
    )
    .await;
    cli.refused(&["tail", "--channel", "a..b"], &["invalid --channel"])
        .await;
    cli.refused(
        &["send", "--as", "ghost", "x"],
        &["no identity named `ghost`", "cotald mint ghost"],
    )
    .await;
    let operator = tmp.path().join("spaces/main/local-operator.creds");
    cli.refused(
        &["send", "x", "--ca", path(&operator)],
        &[
            "is not a PEM certificate (it is a .creds file)",
            "tls/ca.pem",
        ],
    )
    .await;

    // A link naming no channel: tail says it has nothing to join.
    let listen = c.state().listen;
    let bare = format!("cotals://{listen}/main");
    cli.refused(
        &["tail", "--link", &bare],
        &["nothing to tail", "--channel"],
    )
    .await;

    // Without the appliance's CA (and no local one to fall back on).
    let empty = tempfile::tempdir().unwrap();
    let elsewhere = Cli::new(empty.path());
    elsewhere
        .refused(
            &[
                "send",
                "--channel",
                "general",
                "x",
                "--link",
                &bare,
                "--creds",
                path(&operator),
            ],
            &[
                "not signed by a CA this client trusts",
                "--ca",
                "tls/ca.pem",
            ],
        )
        .await;

    // A credential of another space.
    cli.ok(&["space", "add", "lab"]).await;
    let lab = mint(tmp.path(), "dan", "lab", &["--allow-publish", "general"]).await;
    cli.refused(
        &["send", "x", "--creds", path(&lab.creds)],
        &[
            "this credential belongs to space lab",
            "the link names space main",
        ],
    )
    .await;

    // A credential of another appliance.
    let other_dir = tempfile::tempdir().unwrap();
    let other = Cotald::up(other_dir.path()).await;
    let stranger = mint(
        other_dir.path(),
        "eve",
        "main",
        &["--allow-publish", "general"],
    )
    .await;
    cli.refused(
        &["send", "x", "--creds", path(&stranger.creds)],
        &["refused this credential", "signed by another appliance"],
    )
    .await;
    other.stop().await;

    let out = crate::helper::mint_raw(tmp.path(), "soon", "main", &["--expires", "5"]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--expires \"5\": give a number and a unit, e.g. 90s"),
        "{err}"
    );

    // An expired credential.
    let brief = mint(tmp.path(), "brief", "main", &["--expires", "1s"]).await;
    // The expiry is a time on the wall clock, not an event: wait past it.
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    cli.refused(
        &["send", "x", "--creds", path(&brief.creds)],
        &["this credential expired at ", "--replace"],
    )
    .await;

    // A post to a channel nobody made is taken for a typo; --new creates it.
    cli.refused(
        &["send", "--channel", "generl", "x"],
        &[
            "channel `generl` has no config and no messages yet",
            "did you mean `general`?",
            "--new",
        ],
    )
    .await;
    // An empty message is never meant.
    cli.refused(&["send", "  "], &["nothing to send: the text is empty"])
        .await;
    // So are a join and a tail of one (a join on a durable channel makes a membership).
    for args in [
        &["join", "genral"][..],
        &["tail", "--channel", "genral", "--count", "1"],
    ] {
        cli.refused(
            args,
            &[
                "channel `genral` has no config and no messages yet",
                "did you mean `general`?",
                "pass --new to join it",
            ],
        )
        .await;
    }
    cli.ok(&["join", "genral", "--new"]).await;
    cli.ok(&["send", "--channel", "generl", "--new", "x"]).await;
    cli.ok(&["send", "--channel", "generl", "again"]).await;

    // A join outside the read ACL names the channels the credential may read.
    cli.refused(
        &["join", "random", "--as", "reader"],
        &["cannot join random", "this credential may read general"],
    )
    .await;

    // A mint into a data dir no appliance ever used is refused, and leaves nothing there.
    let wrong = tempfile::tempdir().unwrap();
    cli.refused(
        &["mint", "stray", "--data-dir", path(wrong.path())],
        &["no appliance was ever started on data dir"],
    )
    .await;
    assert_eq!(
        std::fs::read_dir(wrong.path()).unwrap().count(),
        0,
        "nothing left behind"
    );

    // A task for a role no agent holds would be discarded by the warden: it is refused.
    cli.refused(
        &["send", "--service", "reviewer", "please review"],
        &[
            "no agent of this space holds role reviewer",
            "--role reviewer",
        ],
    )
    .await;
    // Once an agent holds it, a task waits for it while it is offline, and the receipt says so.
    mint(tmp.path(), "rita", "main", &["--role", "reviewer"]).await;
    let out = cli
        .output(cli.command(&["send", "--service", "reviewer", "please review"]))
        .await;
    assert!(out.status.success());
    let receipt = String::from_utf8_lossy(&out.stdout);
    assert!(
        receipt.contains("queued: nobody holding the role is online"),
        "{receipt}"
    );
    c.stop().await;
}

/// A running `cotald` command with its output read line by line.
struct Running {
    child: tokio::process::Child,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    stderr: tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
}

impl Running {
    fn spawn(cli: &Cli, args: &[&str]) -> Running {
        let mut cmd = cli.command(args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        Running {
            child,
            stdout,
            stderr,
        }
    }

    /// The next stderr line containing `needle`.
    async fn stderr_line(&mut self, needle: &str) -> String {
        tokio::time::timeout(TIMEOUT, async {
            while let Some(line) = self.stderr.next_line().await.unwrap() {
                if line.contains(needle) {
                    return line;
                }
            }
            panic!("stderr ended before {needle:?}");
        })
        .await
        .unwrap_or_else(|_| panic!("no {needle:?} on stderr within {TIMEOUT:?}"))
    }

    /// The next `n` JSON documents printed.
    async fn messages(&mut self, n: usize) -> Vec<Value> {
        let mut out = Vec::new();
        while out.len() < n {
            let line = tokio::time::timeout(TIMEOUT, self.stdout.next_line())
                .await
                .expect("a line within the timeout")
                .unwrap()
                .expect("still running");
            out.push(serde_json::from_str(&line).unwrap());
        }
        out
    }
}

#[tokio::test]
async fn tail_reports_a_broker_restart_and_loses_nothing_on_a_durable_channel() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::up(tmp.path()).await;
    let cli = Cli::new(tmp.path());
    mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    mint(tmp.path(), "bob", "main", &[]).await;
    cli.ok(&["join", "general", "--as", "bob"]).await;
    let mut tail = Running::spawn(
        &cli,
        &[
            "tail",
            "--json",
            "--as",
            "bob",
            "--no-history",
            "--count",
            "6",
        ],
    );
    tail.stderr_line("joined durable general").await;
    for i in 0..3 {
        cli.ok(&["send", "--as", "alice", &format!("before {i}")])
            .await;
    }
    assert_eq!(
        texts(&tail.messages(3).await),
        ["before 0", "before 1", "before 2"]
    );

    let broker = c.state().broker_pid;
    // SAFETY: plain syscall on the appliance's own child.
    assert_eq!(unsafe { libc::kill(broker as i32, libc::SIGKILL) }, 0);
    tail.stderr_line("connection to the appliance lost; reconnecting")
        .await;
    c.wait_stderr("nats-server restarted").await;
    // Posted while the tail may still be reconnecting: the durable backlog keeps them.
    for i in 0..3 {
        let text = format!("after {i}");
        let posted = tokio::time::timeout(TIMEOUT, async {
            loop {
                let out = cli
                    .output(cli.command(&["send", "--as", "alice", &text]))
                    .await;
                if out.status.success() {
                    return;
                }
            }
        })
        .await;
        assert!(posted.is_ok(), "{text} posted after the restart");
    }
    let line = tail.stderr_line("reconnected after").await;
    let seconds: f64 = line
        .trim_start_matches("reconnected after ")
        .trim_end_matches(" s")
        .parse()
        .unwrap_or_else(|_| panic!("{line}"));
    assert!(seconds < 5.0, "{line}");
    let mut after = texts(&tail.messages(3).await)
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    after.sort();
    assert_eq!(after, ["after 0", "after 1", "after 2"]);
    let status = tokio::time::timeout(TIMEOUT, tail.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    c.stop().await;
}

/// The README's quickstart block, one command per line, comments dropped, each command split
/// into its words as a shell would (double quotes group).
fn quickstart() -> Vec<Vec<String>> {
    readme_commands("quickstart")
}

/// The README.
pub(crate) fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md")
}

/// The commands of the README's fenced block ```` ```sh TAG ````, split into words (comments
/// and comment lines dropped).
pub(crate) fn readme_commands(tag: &str) -> Vec<Vec<String>> {
    let readme = readme();
    let block = readme
        .split_once(&format!("```sh {tag}\n"))
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .map(|(block, _)| block)
        .unwrap_or_else(|| panic!("a fenced `sh {tag}` block in README.md"));
    block
        .lines()
        .map(|line| line.split_once("  #").map_or(line, |(cmd, _)| cmd).trim())
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let mut words = Vec::new();
            let mut word = String::new();
            let mut quoted = false;
            for c in line.chars() {
                match c {
                    '"' => quoted = !quoted,
                    ' ' if !quoted => {
                        if !word.is_empty() {
                            words.push(std::mem::take(&mut word));
                        }
                    }
                    c => word.push(c),
                }
            }
            assert!(!quoted, "unbalanced quotes in {line:?}");
            words.push(word);
            words
        })
        .collect()
}

#[tokio::test]
async fn the_readme_quickstart_runs_as_written() {
    let commands = quickstart();
    assert!(commands.len() > 5, "{commands:?}");
    assert_eq!(
        commands[0],
        ["cotald", "up", "&"],
        "the quickstart starts the appliance first"
    );
    let tmp = tempfile::tempdir().unwrap();
    // `up` on a free port rather than 4222, which another appliance may hold.
    let c = Cotald::up(tmp.path()).await;
    let cli = Cli::new(tmp.path());
    for words in &commands[1..] {
        assert_eq!(words[0], "cotald", "{words:?}");
        let args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
        let out = cli.ok(&args).await;
        if args[0] == "tail" {
            assert_eq!(out.lines().count(), 3, "{words:?} printed: {out}");
            assert!(out.contains("a direct message"), "{out}");
        }
    }
    c.stop().await;
}

/// The Quickstart pasted as a block: `cotald up &`, then at once `cotald send` and `cotald
/// status --wait`. Each waits for the appliance that is starting (with a note) instead of
/// saying that none is running.
#[tokio::test]
async fn commands_right_after_up_wait_for_it_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::spawn(tmp.path(), &[]);
    let (send, status) = tokio::join!(
        crate::helper::cotald_in(tmp.path(), &["send", "--channel", "general", "right away"]),
        crate::helper::cotald_in(tmp.path(), &["status", "--wait"]),
    );
    let said = |o: &Output| {
        format!(
            "stdout: {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(send.status.success(), "{}", said(&send));
    assert!(
        String::from_utf8_lossy(&send.stdout).contains("sent "),
        "{}",
        said(&send)
    );
    assert!(status.status.success(), "{}", said(&status));
    assert!(
        String::from_utf8_lossy(&status.stdout).contains(": healthy"),
        "{}",
        said(&status)
    );
    let mut c = c;
    c.wait_stdout("cotald is ready").await;
    c.stop().await;
}
