//! Fixtures: run `cotald` as a child process, mint users from its key store, connect clients.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use cotald::binding::UserPermissions;
use cotald::datadir::{DataDir, RuntimeState};
use cotald::provision::KeyStore;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// The bound on every wait in these tests.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);

/// Polls `probe` every 20 ms until it yields `Some`, for at most [`TIMEOUT`]; panics naming
/// `what` if it never does. The one way these tests wait for a state nothing announces (a
/// consumer's counters, the runtime state file, a roster seen by another process).
pub(crate) async fn eventually<T, F>(what: &str, probe: impl FnMut() -> F) -> T
where
    F: std::future::Future<Output = Option<T>>,
{
    eventually_within(TIMEOUT, what, probe).await
}

/// [`eventually`] with another bound (a cluster forming takes longer than [`TIMEOUT`]).
pub(crate) async fn eventually_within<T, F>(
    bound: Duration,
    what: &str,
    mut probe: impl FnMut() -> F,
) -> T
where
    F: std::future::Future<Output = Option<T>>,
{
    let polled = async {
        loop {
            if let Some(found) = probe().await {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(bound, polled)
        .await
        .unwrap_or_else(|_| panic!("{what}: not seen within {bound:?}"))
}

pub(crate) fn cotald_bin() -> &'static str {
    env!("CARGO_BIN_EXE_cotald")
}

/// A running `cotald up`.
pub(crate) struct Cotald {
    pub(crate) child: Child,
    pub(crate) data_dir: PathBuf,
    stdout: mpsc::UnboundedReceiver<String>,
    stderr: mpsc::UnboundedReceiver<String>,
}

impl Cotald {
    /// Spawns `cotald up --data-dir DIR --listen 127.0.0.1:0 --dashboard 127.0.0.1:0 ARGS…`
    /// without waiting (free ports: appliances of parallel tests must not collide).
    pub(crate) fn spawn(data_dir: &Path, args: &[&str]) -> Cotald {
        Self::spawn_with_env(data_dir, args, &[])
    }

    /// [`Cotald::spawn`] with extra environment variables (`COTALD_LISTEN` replaces the
    /// loopback listener).
    pub(crate) fn spawn_with_env(data_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Cotald {
        let listen: &[&str] =
            if args.contains(&"--listen") || env.iter().any(|(name, _)| *name == "COTALD_LISTEN") {
                &[]
            } else {
                &["--listen", "127.0.0.1:0"]
            };
        let dashboard: &[&str] = if args.contains(&"--dashboard") {
            &[]
        } else {
            &["--dashboard", "127.0.0.1:0"]
        };
        let mut child = Command::new(cotald_bin())
            .arg("up")
            .arg("--data-dir")
            .arg(data_dir)
            .args(listen)
            .args(dashboard)
            .args(args)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn cotald");
        let stdout = lines(child.stdout.take().unwrap());
        let stderr = lines(child.stderr.take().unwrap());
        Cotald {
            child,
            data_dir: data_dir.to_owned(),
            stdout,
            stderr,
        }
    }

    /// Spawns `cotald up` and waits until it prints that it is ready.
    pub(crate) async fn up(data_dir: &Path) -> Cotald {
        let mut c = Self::spawn(data_dir, &[]);
        c.wait_stdout("cotald is ready").await;
        c
    }

    /// Waits for a stdout line containing `needle`; panics with stderr on timeout or exit.
    pub(crate) async fn wait_stdout(&mut self, needle: &str) -> String {
        self.wait_stdout_within(needle, TIMEOUT).await
    }

    /// [`Cotald::wait_stdout`] with another bound (a cluster forming takes longer).
    pub(crate) async fn wait_stdout_within(&mut self, needle: &str, bound: Duration) -> String {
        let found = tokio::time::timeout(bound, async {
            while let Some(line) = self.stdout.recv().await {
                if line.contains(needle) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            _ => panic!(
                "cotald never printed {needle:?}; stderr:\n{}",
                self.drain_stderr().await
            ),
        }
    }

    /// Waits for a stderr line containing `needle`.
    pub(crate) async fn wait_stderr(&mut self, needle: &str) -> String {
        tokio::time::timeout(TIMEOUT, async {
            while let Some(line) = self.stderr.recv().await {
                if line.contains(needle) {
                    return line;
                }
            }
            panic!("stderr closed before {needle:?}");
        })
        .await
        .unwrap_or_else(|_| panic!("no stderr line {needle:?} within {TIMEOUT:?}"))
    }

    /// Whatever stderr holds until it closes (bounded).
    pub(crate) async fn drain_stderr(&mut self) -> String {
        let mut out = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(line) = self.stderr.recv().await {
                out.push_str(&line);
                out.push('\n');
            }
        })
        .await;
        out
    }

    /// The runtime state the appliance recorded.
    pub(crate) fn state(&self) -> RuntimeState {
        DataDir::new(&self.data_dir)
            .read_state()
            .unwrap()
            .expect("state.json exists while running")
    }

    /// Sends a signal to cotald.
    pub(crate) fn signal(&self, sig: i32) {
        let pid = self.child.id().expect("cotald still running") as i32;
        // SAFETY: plain syscall on our own child.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    /// Waits for cotald to exit.
    pub(crate) async fn wait_exit(&mut self) -> ExitStatus {
        tokio::time::timeout(TIMEOUT, self.child.wait())
            .await
            .expect("cotald exits in time")
            .unwrap()
    }

    /// SIGTERM, then wait; asserts a clean exit.
    pub(crate) async fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let status = self.wait_exit().await;
        assert!(status.success(), "cotald exited with {status}");
    }

    /// [`Cotald::stop`], then what it logged.
    pub(crate) async fn stop_for_log(mut self) -> String {
        self.signal(libc::SIGTERM);
        let status = self.wait_exit().await;
        assert!(status.success(), "cotald exited with {status}");
        self.drain_stderr().await
    }
}

fn lines(
    stream: impl tokio::io::AsyncRead + Unpin + Send + 'static,
) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Mints an unrestricted user of `space` from the data dir's key store; writes its `.creds`.
pub(crate) fn mint_user(data_dir: &Path, space: &str, out: &Path) -> PathBuf {
    let keys = KeyStore::open(&data_dir.join("keys")).unwrap();
    let user = nkeys::KeyPair::new_user();
    let creds = keys
        .space(space)
        .unwrap()
        .mint("test-user", &user, &UserPermissions::unrestricted())
        .unwrap();
    std::fs::write(out, creds.render()).unwrap();
    out.to_owned()
}

/// Waits for an event matching `pred`.
pub(crate) async fn wait_event(
    events: &mut mpsc::UnboundedReceiver<async_nats::Event>,
    what: &str,
    pred: impl Fn(&async_nats::Event) -> bool,
) {
    tokio::time::timeout(TIMEOUT, async {
        while let Some(event) = events.recv().await {
            if pred(&event) {
                return;
            }
        }
        panic!("event stream closed before {what}");
    })
    .await
    .unwrap_or_else(|_| panic!("no {what} event within {TIMEOUT:?}"));
}

/// Whether a process exists.
pub(crate) fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only probes.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// Whether a process is gone: no such pid, or only its exit status is left (a zombie, which an
/// orphan stays until init reaps it).
pub(crate) fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) state …`: comm may hold spaces and parentheses, the state follows the last.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// What `cotald mint --json` prints.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct Minted {
    pub(crate) id: String,
    pub(crate) creds: PathBuf,
    pub(crate) link: String,
    pub(crate) ca: PathBuf,
}

/// Runs `cotald mint NAME --space SPACE ARGS… --json` against the appliance's data dir.
pub(crate) async fn mint(data_dir: &Path, name: &str, space: &str, args: &[&str]) -> Minted {
    let out = mint_raw(data_dir, name, space, args).await;
    assert!(
        out.status.success(),
        "mint failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("mint --json output")
}

/// Runs `cotald mint` and returns its raw output.
pub(crate) async fn mint_raw(
    data_dir: &Path,
    name: &str,
    space: &str,
    args: &[&str],
) -> std::process::Output {
    tokio::time::timeout(
        TIMEOUT,
        Command::new(cotald_bin())
            .args(["mint", name, "--space", space, "--json", "--data-dir"])
            .arg(data_dir)
            .args(args)
            .output(),
    )
    .await
    .expect("mint finishes")
    .unwrap()
}

/// Runs the real `cotald ARGS…` with its stdout a pipe whose reader is already gone.
pub(crate) async fn into_a_closed_pipe(args: &[&str]) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    // Not `output()`: it would replace stdout with a pipe of its own.
    let child = tokio::process::Command::new(cotald_bin())
        .args(args)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::timeout(TIMEOUT, child.wait_with_output())
        .await
        .expect("exits in time")
        .unwrap()
}

/// A client with its event stream, to read the broker's verdicts.
pub(crate) struct Probe {
    pub(crate) client: async_nats::Client,
    pub(crate) events: mpsc::UnboundedReceiver<async_nats::Event>,
}

impl Probe {
    /// Connects with `creds` and the per-identity inbox prefix `_INBOX_<id>` (§10).
    pub(crate) async fn connect(c: &Cotald, creds: &Path) -> Probe {
        Self::try_connect(c, creds).await.expect("connect")
    }

    /// Like [`Probe::connect`], returning the connect error.
    pub(crate) async fn try_connect(
        c: &Cotald,
        creds: &Path,
    ) -> Result<Probe, async_nats::ConnectError> {
        let text = std::fs::read_to_string(creds).unwrap();
        let id = cotald::binding::Creds::parse(&text)
            .ok()
            .and_then(|c| c.public_key().ok())
            .unwrap_or_default();
        let (tx, events) = mpsc::unbounded_channel();
        let client = async_nats::ConnectOptions::with_credentials(&text)
            .unwrap()
            .custom_inbox_prefix(format!("_INBOX_{id}"))
            .add_root_certificates(c.data_dir.join("tls/ca.pem"))
            .require_tls(true)
            .event_callback(move |event| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(event);
                }
            })
            .connect(format!("tls://{}", c.state().listen))
            .await?;
        Ok(Probe { client, events })
    }

    /// Waits for the broker's permission violation naming `verb` ("Publish" or
    /// "Subscription") and `subject`.
    pub(crate) async fn violation(&mut self, verb: &str, subject: &str) {
        let needle = format!("Permissions Violation for {verb} to \"{subject}\"");
        let seen = tokio::time::timeout(TIMEOUT, async {
            while let Some(event) = self.events.recv().await {
                if let async_nats::Event::ServerError(async_nats::ServerError::Other(text)) = &event
                    && text.contains(&needle)
                {
                    return true;
                }
            }
            false
        })
        .await;
        assert!(matches!(seen, Ok(true)), "no violation: {needle}");
    }

    /// Publishes and expects the broker to refuse it.
    pub(crate) async fn denied_pub(&mut self, subject: &str) {
        self.client
            .publish(subject.to_owned(), "x".into())
            .await
            .unwrap();
        self.violation("Publish", subject).await;
    }

    /// Subscribes and expects the broker to refuse it.
    pub(crate) async fn denied_sub(&mut self, subject: &str) {
        let _sub = self.client.subscribe(subject.to_owned()).await.unwrap();
        self.violation("Subscription", subject).await;
    }

    /// A request that must be answered (the broker let it through); returns the reply.
    pub(crate) async fn request(
        &mut self,
        subject: &str,
        body: serde_json::Value,
    ) -> serde_json::Value {
        let reply = tokio::time::timeout(
            TIMEOUT,
            self.client
                .request(subject.to_owned(), body.to_string().into()),
        )
        .await
        .unwrap_or_else(|_| panic!("no reply to {subject}"))
        .unwrap_or_else(|e| panic!("request {subject}: {e}"));
        serde_json::from_slice(&reply.payload).unwrap_or(serde_json::Value::Null)
    }

    /// A request whose publish the broker must refuse.
    pub(crate) async fn denied_request(&mut self, subject: &str, body: serde_json::Value) {
        let client = self.client.clone();
        let subject_owned = subject.to_owned();
        // The refused request never gets a reply; the violation event is the verdict.
        let pending = tokio::spawn(async move {
            let _ = client.request(subject_owned, body.to_string().into()).await;
        });
        self.violation("Publish", subject).await;
        pending.abort();
    }

    /// A round trip that proves the broker has processed everything sent before it.
    pub(crate) async fn barrier(&mut self) {
        let info = self.request("$JS.API.INFO", serde_json::json!({})).await;
        assert!(info.get("error").is_none(), "$JS.API.INFO: {info}");
    }
}

/// Waits for one message on `sub`.
pub(crate) async fn next(sub: &mut async_nats::Subscriber) -> async_nats::Message {
    use futures_util::StreamExt;
    tokio::time::timeout(TIMEOUT, sub.next())
        .await
        .expect("message within timeout")
        .expect("subscription open")
}

/// The text of a delivery's first part.
pub(crate) fn next_text_of(d: &cotald::client::Delivery) -> String {
    match &d.message.parts[0] {
        cotald::protocol::Part::Text { text, .. } => text.clone(),
        other => panic!("not a text part: {other:?}"),
    }
}

/// The text of the next message surfaced to `conn` (bounded), acknowledged.
pub(crate) async fn next_text(conn: &mut cotald::client::Connection) -> String {
    let d = delivery(&mut conn.deliveries).await;
    let text = match &d.message.parts[0] {
        cotald::protocol::Part::Text { text, .. } => text.clone(),
        other => panic!("not a text part: {other:?}"),
    };
    if d.needs_ack() {
        d.ack().await.unwrap();
    }
    text
}

/// Connects a client endpoint with a minted identity.
pub(crate) async fn endpoint(
    m: &Minted,
    tweak: impl FnOnce(&mut cotald::client::ConnectOptions),
) -> cotald::client::Connection {
    let link = cotald::protocol::JoinLink::parse(&m.link).unwrap();
    let mut opts =
        cotald::client::ConnectOptions::new(link, std::fs::read_to_string(&m.creds).unwrap());
    opts.ca = Some(m.ca.clone());
    tweak(&mut opts);
    tokio::time::timeout(TIMEOUT, cotald::client::Client::connect(opts))
        .await
        .expect("connect in time")
        .expect("connect")
}

/// The next surfaced message (bounded).
pub(crate) async fn delivery(d: &mut cotald::client::Deliveries) -> cotald::client::Delivery {
    tokio::time::timeout(TIMEOUT, d.next())
        .await
        .expect("a delivery within the timeout")
        .expect("the client is alive")
}

/// The next notice (bounded).
pub(crate) async fn notice(d: &mut cotald::client::Deliveries) -> cotald::client::Notice {
    tokio::time::timeout(TIMEOUT, d.next_notice())
        .await
        .expect("a notice within the timeout")
        .expect("the client is alive")
}

/// A TCP relay to the broker that the test can cut: a client connected through it loses its
/// connection (and cannot reconnect) while the relay is closed, and nobody else does.
pub(crate) struct Relay {
    pub(crate) addr: std::net::SocketAddr,
    open: tokio::sync::watch::Sender<bool>,
}

impl Relay {
    /// A relay on a random loopback port to `target`, open.
    pub(crate) async fn start(target: std::net::SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (open, watch) = tokio::sync::watch::channel(true);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !*watch.borrow() {
                    continue; // dropped: refused while closed
                }
                let mut closed = watch.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = closed.wait_for(|open| !*open) => {}
                    }
                });
            }
        });
        Relay { addr, open }
    }

    /// Cuts every relayed connection and refuses new ones until [`Relay::open`].
    pub(crate) fn close(&self) {
        self.open.send_replace(false);
    }

    /// Relays again.
    pub(crate) fn open(&self) {
        self.open.send_replace(true);
    }
}

/// Joins `ch` durably (live half without history) and disconnects: the membership stays while
/// the member is away.
pub(crate) async fn join_durable_and_leave_the_room(member: &Minted, ch: &str) {
    let conn = endpoint(member, |o| o.receive_backstop = false).await;
    let report = conn
        .client
        .join(ch, cotald::client::Replay::Off)
        .await
        .unwrap();
    assert_eq!(
        report.durable,
        cotald::client::DurableState::Established,
        "{report:?}"
    );
    conn.client.close().await;
}

/// The machine operator's own endpoint in `main` (unrestricted; it reads neither its DMs nor
/// a backstop here), reached like `like`. `presence` says whether it heartbeats and watches the roster.
pub(crate) async fn operator_endpoint(
    data_dir: &Path,
    like: &Minted,
    presence: bool,
) -> cotald::client::Connection {
    let machine = Minted {
        id: String::new(),
        creds: data_dir.join("spaces/main/local-operator.creds"),
        link: like.link.clone(),
        ca: like.ca.clone(),
    };
    endpoint(&machine, |o| {
        o.presence = presence;
        o.receive_dms = false;
        o.receive_backstop = false;
    })
    .await
}

/// Writes a channel's config through the manager (`channels-set`, as the machine operator).
pub(crate) async fn set_channel(
    op: &cotald::client::Connection,
    channel: &str,
    config: serde_json::Value,
) {
    op.client
        .manager::<serde_json::Value>(&cotald::ops::Request::ChannelsSet(
            cotald::ops::ChannelsSet {
                space: None,
                channel: channel.into(),
                config: serde_json::from_value(config).unwrap(),
            },
        ))
        .await
        .unwrap();
}

/// Runs the real `cotald ARGS… --data-dir DIR` to completion (bounded).
pub(crate) async fn cotald_in(data_dir: &Path, args: &[&str]) -> std::process::Output {
    tokio::time::timeout(
        TIMEOUT,
        Command::new(cotald_bin())
            .args(args)
            .arg("--data-dir")
            .arg(data_dir)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("cotald finishes")
    .unwrap()
}

/// A KV watch of `bucket` (its latest value per key, then every update) made the way Appendix B
/// grants it: an ordered push consumer created on the named form
/// `$JS.API.CONSUMER.CREATE.KV_<bucket>.<name>.$KV.<bucket>.>` (async-nats's own `watch` uses the
/// bare create subject, which the appendix does not grant). Yields each entry's key.
pub(crate) async fn appendix_watch(
    client: &async_nats::Client,
    bucket: &str,
) -> impl futures_util::Stream<Item = String> + Unpin + use<> {
    use async_nats::jetstream::consumer::{DeliverPolicy, push};
    use futures_util::StreamExt;
    let js = async_nats::jetstream::new(client.clone());
    let stream = js.get_stream_no_info(format!("KV_{bucket}")).await.unwrap();
    let prefix = format!("$KV.{bucket}.");
    let inbox = client.new_inbox();
    let unique = inbox.rsplit('.').next().unwrap_or_default().to_owned();
    let consumer = stream
        .create_consumer(push::OrderedConfig {
            name: Some(format!("oc_{unique}")),
            deliver_subject: inbox,
            filter_subject: format!("{prefix}>"),
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("watching {bucket}: {e}"));
    let messages = consumer.messages().await.unwrap();
    Box::pin(messages.map(move |m| {
        let m = m.expect("the watch delivers");
        m.subject.as_str().trim_start_matches(&prefix).to_owned()
    }))
}
