//! The web dashboard of a real appliance: the token, the pages, the live feed, escaping, DMs
//! out of sight, the CSP, forms a person sends with (and only they), and a profile that turns
//! it off.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cotald::client::Replay;
use cotald::protocol::{Channel, CotalMessage, InstanceId, Part, Routing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helper::{Cotald, TIMEOUT, cotald_in, delivery, endpoint, eventually, mint};

/// One answer: status, header fields (names lower case), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Where the dashboard listens, and its token, from `cotald status --json`'s URL.
pub(crate) struct Site {
    addr: SocketAddr,
    token: String,
}

impl Site {
    pub(crate) async fn of(c: &Cotald) -> Site {
        let out = cotald_in(&c.data_dir, &["status", "--json"]).await;
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let url = status["dashboard"]
            .as_str()
            .expect("status --json carries the dashboard URL")
            .to_owned();
        let rest = url.strip_prefix("http://").unwrap();
        let (addr, token) = rest.split_once("/?token=").unwrap();
        Site {
            addr: addr.parse().unwrap(),
            token: token.to_owned(),
        }
    }

    fn cookie(&self) -> String {
        format!("cotald_{}={}", self.addr.port(), self.token)
    }

    async fn get(&self, target: &str, cookie: Option<&str>) -> Answer {
        let cookie = cookie
            .map(|c| format!("Cookie: {c}\r\n"))
            .unwrap_or_default();
        self.exchange(&format!(
            "GET {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n{cookie}\r\n",
            self.addr
        ))
        .await
    }

    /// A form posted with the cookie and `extra` header lines (each ending in CR LF).
    async fn post(&self, target: &str, form: &str, extra: &str) -> Answer {
        self.exchange(&format!(
            "POST {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nCookie: {}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n{extra}\r\n{form}",
            self.addr,
            self.cookie(),
            form.len()
        ))
        .await
    }

    async fn exchange(&self, request: &str) -> Answer {
        let mut stream = TcpStream::connect(self.addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        tokio::time::timeout(TIMEOUT, stream.read_to_end(&mut raw))
            .await
            .expect("an answer in time")
            .unwrap();
        let text = String::from_utf8(raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Answer {
            status,
            headers,
            body: body.to_owned(),
        }
    }

    /// A page, with the cookie.
    async fn page(&self, target: &str) -> String {
        let answer = self.get(target, Some(&self.cookie())).await;
        assert_eq!(answer.status, 200, "{target}: {}", answer.body);
        answer.body
    }

    /// Reloads `target` until it contains every one of `needles` (the observer's view follows
    /// the broker's presence and traffic asynchronously).
    pub(crate) async fn page_with(&self, target: &str, needles: &[&str]) -> String {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let body = self.page(target).await;
            if needles.iter().all(|n| body.contains(n)) {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "{target} never showed {needles:?}:\n{body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Opens the feed's event stream of `main`.
    pub(crate) async fn events(&self, query: &str) -> Events {
        self.stream(&format!("/spaces/main/events{query}"), ": following")
            .await
    }

    /// Opens the event stream at `target` and reads until `ready`.
    async fn stream(&self, target: &str, ready: &str) -> Events {
        let mut stream = TcpStream::connect(self.addr).await.unwrap();
        let request = format!(
            "GET {target} HTTP/1.1\r\nHost: {}\r\nCookie: {}\r\n\r\n",
            self.addr,
            self.cookie()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut events = Events {
            stream,
            seen: String::new(),
        };
        events.until(ready).await;
        assert!(events.seen.starts_with("HTTP/1.1 200"), "{}", events.seen);
        assert!(events.seen.contains("text/event-stream"), "{}", events.seen);
        events
    }
}

/// An open event stream and what it carried so far.
pub(crate) struct Events {
    stream: TcpStream,
    pub(crate) seen: String,
}

impl Events {
    /// Reads until what arrived contains `needle`; returns how long that took.
    pub(crate) async fn until(&mut self, needle: &str) -> Duration {
        let start = Instant::now();
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let mut buf = [0u8; 4096];
        while !self.seen.contains(needle) {
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("no {needle:?} in the event stream:\n{}", self.seen))
                .unwrap();
            assert!(n > 0, "the event stream ended:\n{}", self.seen);
            self.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        start.elapsed()
    }
}

fn general() -> Routing {
    Routing::channel(&Channel::new("general").unwrap())
}

#[tokio::test]
async fn the_token_is_required_then_carried_by_a_strict_cookie() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cotald::up(tmp.path()).await;
    let banner = c.wait_stdout("  dashboard ").await;
    let site = Site::of(&c).await;
    assert!(
        banner.contains(&format!("http://{}/?token={}", site.addr, site.token)),
        "{banner}"
    );
    assert!(site.addr.ip().is_loopback());
    assert_eq!(site.token.len(), 64);

    let none = site.get("/", None).await;
    assert_eq!(none.status, 401, "{}", none.body);
    assert!(none.body.contains("access token"), "{}", none.body);
    let wrong_cookie = format!("cotald_{}={}", site.addr.port(), "0".repeat(64));
    assert_eq!(site.get("/", Some(&wrong_cookie)).await.status, 403);
    assert_eq!(
        site.get("/spaces/main/feed?token=nope", None).await.status,
        403
    );
    assert_eq!(site.get("/spaces/main/events", None).await.status, 401);

    let login = site
        .get(
            &format!("/spaces/main/feed?token={}&channel=general", site.token),
            None,
        )
        .await;
    assert_eq!(login.status, 303);
    assert_eq!(
        login.header("location"),
        Some("/spaces/main/feed?channel=general")
    );
    let away = site
        .get(&format!("//elsewhere.example/?token={}", site.token), None)
        .await;
    assert_eq!(away.header("location"), Some("/elsewhere.example/"));
    let cookie = login.header("set-cookie").unwrap();
    assert!(cookie.starts_with(&site.cookie()), "{cookie}");
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Strict"), "{cookie}");

    for target in [
        "/",
        "/spaces/main/roster",
        "/health",
        "/assets/app.js",
        "/nowhere",
    ] {
        let answer = site.get(target, Some(&site.cookie())).await;
        let csp = answer.header("content-security-policy").unwrap_or_default();
        assert!(csp.contains("default-src 'none'"), "{target}: {csp}");
        assert!(csp.contains("script-src 'self'"), "{target}: {csp}");
        assert!(!csp.contains("unsafe-inline"), "{target}: {csp}");
        assert_eq!(answer.header("x-content-type-options"), Some("nosniff"));
    }
    // The 401 carries them too.
    assert_eq!(none.header("x-content-type-options"), Some("nosniff"));
    assert!(none.header("content-security-policy").is_some());

    let health = site.page("/health").await;
    assert!(
        health.contains(r#"<p class="verdict"><span class="health-running">healthy</span>"#),
        "{health}"
    );
    let state = c.state();
    assert!(health.contains(&state.broker_version), "{health}");
    assert!(
        health.contains(r#"<tr class="stream"><td>CHAT_main</td>"#),
        "{health}"
    );
    assert!(
        health.contains(r#"<td>manager</td><td><span class="health-running">"#),
        "{health}"
    );

    // A space added while running gets its pages too.
    let out = cotald_in(&c.data_dir, &["space", "add", "lab"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let index = site.page_with("/", &[r#"href="/spaces/lab/roster""#]).await;
    assert!(index.contains(r#"href="/spaces/main/roster""#), "{index}");
    let roster = site.page("/spaces/lab/roster").await;
    assert!(roster.contains("Roster of lab"), "{roster}");
    c.stop().await;
}

#[tokio::test]
async fn pages_show_the_roster_the_channels_and_the_live_feed() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let site = Site::of(&c).await;
    let grants = ["--allow-publish", "general"];
    let alice = mint(tmp.path(), "alice", "main", &grants).await;
    let bob = mint(tmp.path(), "bob", "main", &grants).await;
    let a = endpoint(&alice, |_| {}).await;
    let b = endpoint(&bob, |_| {}).await;

    let roster = site
        .page_with(
            "/spaces/main/roster",
            &[
                r#"<td class="name">alice</td>"#,
                r#"<td class="name">bob</td>"#,
            ],
        )
        .await;
    assert_eq!(
        roster.matches(r#"<tr class="peer">"#).count(),
        2,
        "{roster}"
    );
    assert!(roster.contains(&alice.id[..10]), "{roster}");
    assert!(!roster.contains("status-offline"), "{roster}");
    // Channel membership, from the membership feed (§8): general is durable on a local space.
    b.client.join("general", Replay::Off).await.unwrap();
    let roster = site
        .page_with(
            "/spaces/main/roster",
            &["<div>live: #general</div><div>durable: #general</div>"],
        )
        .await;
    assert_eq!(roster.matches("durable: #general").count(), 1, "{roster}");
    assert!(
        !roster.contains("http-equiv"),
        "live by its event stream, not reloads"
    );
    assert!(
        roster.contains(r#"data-live="/spaces/main/roster?live=1""#),
        "{roster}"
    );

    let mut events = site.events("").await;
    let sent = Instant::now();
    a.client
        .send_text(general(), "hello from alice")
        .await
        .unwrap();
    events.until("hello from alice").await;
    let latency = sent.elapsed();
    assert!(latency < Duration::from_secs(1), "{latency:?}");
    assert!(
        events.seen.contains(r#"<span class="from">alice</span>"#),
        "{}",
        events.seen
    );
    assert!(events.seen.contains(&alice.id[..10]), "{}", events.seen);

    let channels = site
        .page_with("/spaces/main/channels", &["#general", "hello from alice"])
        .await;
    assert!(channels.contains("durable"), "{channels}");
    assert!(channels.contains("Everyone's channel"), "{channels}");

    // History on load: a page opened now shows what was sent before.
    let loading = Instant::now();
    let feed = site.page("/spaces/main/feed").await;
    eprintln!(
        "the feed page with a message in the space: {:?}",
        loading.elapsed()
    );
    assert!(feed.contains("hello from alice"), "{feed}");
    let filtered = site.page("/spaces/main/feed?channel=elsewhere").await;
    assert!(!filtered.contains("hello from alice"), "{filtered}");
    // A channel removed with its messages is offered no more (the feed still shows them).
    let made = cotald_in(tmp.path(), &["send", "--channel", "scratch", "--new", "x"]).await;
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    site.page_with("/spaces/main/feed", &[r#"<option value="scratch""#])
        .await;
    let removed = cotald_in(tmp.path(), &["channels", "rm", "scratch", "--purge"]).await;
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    let feed = site.page("/spaces/main/feed").await;
    assert!(!feed.contains(r#"<option value="scratch""#), "{feed}");
    // The observer asked the broker for nothing its grants refuse (a refused request waits
    // out its timeout: the pages took 10 s once a message existed).
    let log = c.stop_for_log().await;
    assert!(!log.contains("Violation"), "{log}");
}

#[tokio::test]
async fn a_hostile_message_is_shown_as_text_and_dms_stay_out_of_sight() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let site = Site::of(&c).await;
    let grants = ["--allow-publish", "general"];
    let alice = mint(tmp.path(), "alice", "main", &grants).await;
    let bob = mint(tmp.path(), "bob", "main", &grants).await;
    let a = endpoint(&alice, |_| {}).await;
    let mut b = endpoint(&bob, |_| {}).await;
    let mut events = site.events("").await;

    a.client
        .send(
            general(),
            vec![cotald::protocol::Part::text(
                "<script>alert('pwned')</script> ping @bob",
            )],
            &["bob".to_owned()],
        )
        .await
        .unwrap();
    let to_bob = Routing::to(&InstanceId::from_user_nkey(&bob.id).unwrap());
    a.client.send_text(to_bob, "secret for bob").await.unwrap();
    // Bob has it: the DM was delivered, to him only.
    let got = loop {
        let d = crate::helper::delivery(&mut b.deliveries).await;
        if d.channel.is_none() {
            break d;
        }
    };
    assert!(format!("{:?}", got.message.parts).contains("secret for bob"));
    a.client.send_text(general(), "after the dm").await.unwrap();
    events.until("after the dm").await;

    assert!(
        events
            .seen
            .contains("&lt;script&gt;alert('pwned')&lt;/script&gt;"),
        "{}",
        events.seen
    );
    assert!(!events.seen.contains("<script>"), "{}", events.seen);
    assert!(
        events.seen.contains(r#"<mark class="mention">@bob</mark>"#),
        "{}",
        events.seen
    );
    assert!(!events.seen.contains("secret for bob"), "{}", events.seen);
    let feed = site.page("/spaces/main/feed").await;
    assert!(feed.contains("&lt;script&gt;alert("), "{feed}");
    assert!(!feed.contains("<script>alert"), "{feed}");
    assert!(!feed.contains("secret for bob"), "{feed}");
    c.stop().await;
}

/// Markup in everything an agent or an admin writes that a page shows: a post (its text and
/// a data part), a DM to the person, a presence activity, a channel's description and
/// instructions. (Names, ids, spaces and channels are grammar tokens: no markup gets through.)
const HOSTILE: &str = r#"<script>alert(1)</script> "><img src=x onerror=alert(1)> &amp; &lt;b&gt;"#;
/// [`HOSTILE`] as it must appear in HTML: escaped once, so that it shows as typed.
const ESCAPED: &str = "&lt;script&gt;alert(1)&lt;/script&gt; &quot;&gt;&lt;img src=x \
                       onerror=alert(1)&gt; &amp;amp; &amp;lt;b&amp;gt;";

/// That `html` shows each of `labels` followed by [`HOSTILE`] as text, and carries none of its
/// tags: no script but the page's own `app.js` (`scripts` of them), no image at all.
fn shown_as_text(target: &str, html: &str, labels: &[&str], scripts: usize) {
    for label in labels {
        assert!(
            html.contains(&format!("{label}{ESCAPED}")),
            "{target}: no escaped {label:?}:\n{html}"
        );
        assert!(
            !html.contains(&format!("{label}{HOSTILE}")),
            "{target}: {label:?} raw:\n{html}"
        );
    }
    assert_eq!(
        html.matches("<script").count(),
        scripts,
        "{target}:\n{html}"
    );
    assert!(!html.contains("<script>"), "{target}:\n{html}");
    assert!(!html.contains("<img"), "{target}:\n{html}");
}

#[tokio::test]
async fn hostile_text_is_escaped_on_every_page_that_shows_it() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let site = Site::of(&c).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let mut a = endpoint(&alice, |_| {}).await;
    a.client
        .set_status(
            cotald::protocol::PresenceStatus::Working,
            Some(format!("activity {HOSTILE}")),
        )
        .await
        .unwrap();
    let set = cotald_in(
        tmp.path(),
        &[
            "channels",
            "set",
            "general",
            "--description",
            &format!("description {HOSTILE}"),
            "--instructions",
            &format!("instructions {HOSTILE}"),
        ],
    )
    .await;
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let (post, _) = a
        .client
        .send(
            general(),
            vec![
                Part::text(format!("post {HOSTILE} @local-operator")),
                Part::Data {
                    data: serde_json::json!({ "data": HOSTILE }),
                    extra: Default::default(),
                },
            ],
            &["local-operator".to_owned()],
        )
        .await
        .unwrap();
    // The person asks alice from the roster's form; she answers.
    let page = site.page_with("/spaces/main/roster", &["alice"]).await;
    let asked = site
        .post(
            "/spaces/main/dm",
            &format!("csrf={}&to={}&text=well%3F", csrf_of(&page), alice.id),
            "",
        )
        .await;
    assert_eq!(asked.status, 303, "{}", asked.body);
    let asked = delivery(&mut a.deliveries).await;
    let operator = InstanceId::from_user_nkey(&asked.message.from.id).unwrap();
    a.client
        .send_text(Routing::to(&operator), &format!("dm {HOSTILE}"))
        .await
        .unwrap();

    let roster = "/spaces/main/roster";
    let page = site.page_with(roster, &["activity "]).await;
    shown_as_text(roster, &page, &["activity "], 1);
    let channels = "/spaces/main/channels";
    let page = site
        .page_with(channels, &["description ", "instructions "])
        .await;
    shown_as_text(channels, &page, &["description ", "instructions "], 1);
    let feed = "/spaces/main/feed";
    let page = site.page_with(feed, &["post "]).await;
    // The data part is pretty-printed JSON: its string is JSON-escaped, then HTML-escaped.
    assert!(
        page.contains("&quot;data&quot;: &quot;&lt;script&gt;alert(1)"),
        "{page}"
    );
    shown_as_text(feed, &page, &["post "], 1);
    // A reply's form quotes what it answers.
    let reply = format!("/spaces/main/feed?channel=general&reply={}", post.id);
    let page = site.page_with(&reply, &["replying to"]).await;
    shown_as_text(&reply, &page, &["post "], 1);
    let mut events = site.events("").await;
    events.until(&format!("post {ESCAPED}")).await;
    events.until("</li>").await;
    shown_as_text("the feed's events", &events.seen, &["post "], 0);
    // The direct page: the DM in its conversation, the post under "Needs you".
    let direct = "/spaces/main/direct";
    let page = site.page_with(direct, &["dm ", "post "]).await;
    shown_as_text(direct, &page, &["dm ", "post "], 1);
    let mut live = site
        .stream("/spaces/main/direct?live=1", "event: part")
        .await;
    live.until(&format!("dm {ESCAPED}")).await;
    live.until("</section>").await;
    shown_as_text("the direct page's events", &live.seen, &["dm ", "post "], 0);
    a.client.close().await;
    c.stop().await;
}

/// How many connections named `name` the broker holds, asked over the system account.
async fn connections_named(c: &Cotald, name: &str) -> usize {
    let keys = cotald::provision::KeyStore::open(&c.data_dir.join("keys")).unwrap();
    let creds = keys.system_user_creds().unwrap();
    let ca = c.data_dir.join("tls/ca.pem");
    let monitor = cotald::supervisor::monitor::Monitor::connect(&creds, &ca, c.state().listen)
        .await
        .unwrap();
    let connz = monitor
        .ask("CONNZ", serde_json::json!({ "limit": 1024 }), TIMEOUT)
        .await
        .unwrap();
    let connections = connz["connections"].as_array().cloned().unwrap_or_default();
    connections.iter().filter(|c| c["name"] == name).count()
}

/// The connection name of the dashboard's observer.
const OBSERVER: &str = "cotal:dashboard";

/// An appliance nobody watches holds no observer: the dashboard connects to a space at the
/// first page a person opens, which shows it.
#[tokio::test]
async fn a_space_is_observed_from_the_first_page_not_before() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let site = Site::of(&c).await;
    assert_eq!(
        connections_named(&c, OBSERVER).await,
        0,
        "observed before any page"
    );

    let index = site.page("/").await;
    assert!(
        index.contains("/spaces/main/"),
        "the first page lists main:\n{index}"
    );
    assert_eq!(
        connections_named(&c, OBSERVER).await,
        1,
        "observed once by the first page"
    );
    site.page("/spaces/main/roster").await;
    assert_eq!(
        connections_named(&c, OBSERVER).await,
        1,
        "observed once, whatever the pages"
    );
}

#[tokio::test]
async fn a_disabled_dashboard_serves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let profile = tmp.path().join("profile.toml");
    let text = cotald::profile::EMBEDDED_LOCAL.replace("enabled = true", "enabled = false");
    assert_ne!(text, cotald::profile::EMBEDDED_LOCAL);
    std::fs::write(&profile, text).unwrap();
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap();
    drop(free);
    let dir = tmp.path().join("data");
    let mut c = Cotald::spawn(
        &dir,
        &[
            "--config",
            profile.to_str().unwrap(),
            "--dashboard",
            &port.to_string(),
        ],
    );
    c.wait_stdout("cotald is ready").await;
    assert_eq!(c.state().dashboard, None);
    assert!(TcpStream::connect(port).await.is_err(), "{port} answers");
    assert!(!dir.join("dashboard.token").exists());
    let out = cotald_in(&dir, &["status", "--json"]).await;
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(status.get("dashboard").is_none(), "{status}");
    c.stop().await;
}

/// A WebDriver session with headless Chromium (`chromedriver`), over plain HTTP/1.1.
struct Browser {
    driver: tokio::process::Child,
    addr: SocketAddr,
    session: String,
}

impl Browser {
    /// `None` when chromedriver is not installed, unless `COTALD_REQUIRE_BROWSER` is set
    /// (CI installs Debian's `chromium` and `chromium-driver` and sets it): then a panic.
    async fn start() -> Option<Browser> {
        let Some(exe) = std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("chromedriver"))
                .find(|p| p.is_file())
        }) else {
            assert!(
                std::env::var_os("COTALD_REQUIRE_BROWSER").is_none(),
                "chromedriver is required (apt-get install chromium chromium-driver)"
            );
            eprintln!("no chromedriver: the browser test is skipped");
            return None;
        };
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        let driver = tokio::process::Command::new(exe)
            .arg(format!("--port={}", addr.port()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut browser = Browser {
            driver,
            addr,
            session: String::new(),
        };
        let deadline = Instant::now() + TIMEOUT;
        while TcpStream::connect(addr).await.is_err() {
            assert!(Instant::now() < deadline, "chromedriver does not listen");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let created = browser
            .call(
                "POST",
                "/session",
                serde_json::json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {"args": ["--headless", "--no-sandbox", "--disable-gpu"]}
                }}}),
            )
            .await;
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_owned();
        Some(browser)
    }

    async fn call(&self, method: &str, path: &str, body: serde_json::Value) -> serde_json::Value {
        let body = body.to_string();
        let mut stream = TcpStream::connect(self.addr).await.unwrap();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        // chromedriver keeps the connection open: read the head, then Content-Length bytes.
        let read = async {
            let mut raw = Vec::new();
            let mut buf = [0u8; 8192];
            loop {
                let n = stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "chromedriver hung up");
                raw.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&raw).into_owned();
                let Some((head, body)) = text.split_once("\r\n\r\n") else {
                    continue;
                };
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .expect("a Content-Length");
                if body.len() >= length {
                    return body[..length].to_owned();
                }
            }
        };
        let json = tokio::time::timeout(TIMEOUT, read)
            .await
            .expect("chromedriver answers in time");
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        value["value"].clone()
    }

    async fn open(&self, url: &str) {
        let path = format!("/session/{}/url", self.session);
        self.call("POST", &path, serde_json::json!({ "url": url }))
            .await;
    }

    /// What `script` returns in the page.
    async fn eval(&self, script: &str) -> serde_json::Value {
        let path = format!("/session/{}/execute/sync", self.session);
        self.call(
            "POST",
            &path,
            serde_json::json!({ "script": script, "args": [] }),
        )
        .await
    }

    /// Evaluates `script` until `done` holds of its value (the page updates by itself).
    async fn eval_until(
        &self,
        script: &str,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let value = self.eval(script).await;
            if done(&value) {
                return value;
            }
            assert!(Instant::now() < deadline, "{script} stayed {value}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn quit(mut self) {
        let path = format!("/session/{}", self.session);
        self.call("DELETE", &path, serde_json::json!({})).await;
        let _ = self.driver.kill().await;
    }
}

#[tokio::test]
async fn a_real_browser_shows_the_roster_and_follows_the_feed() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let site = Site::of(&c).await;
    let grants = ["--allow-publish", "general"];
    let alice = mint(tmp.path(), "alice", "main", &grants).await;
    let bob = mint(tmp.path(), "bob", "main", &grants).await;
    let a = endpoint(&alice, |_| {}).await;
    let _b = endpoint(&bob, |_| {}).await;

    // The token in the URL once; the cookie from then on.
    let base = format!("http://{}", site.addr);
    browser
        .open(&format!("{base}/spaces/main/roster?token={}", site.token))
        .await;
    let names = browser
        .eval_until(
            "return [...document.querySelectorAll('tr.peer td.name')].map(e => e.textContent)",
            |v| v.to_string().contains("alice") && v.to_string().contains("bob"),
        )
        .await;
    assert_eq!(names, serde_json::json!(["alice", "bob"]));
    assert_eq!(
        browser.eval("return location.search").await,
        serde_json::json!("")
    );
    // The roster follows presence in place: no reload (the page's script state stays).
    browser.eval("window.stayed = true; return true").await;
    let carol = mint(tmp.path(), "carol", "main", &[]).await;
    let _c = endpoint(&carol, |_| {}).await;
    browser
        .eval_until(
            "return [...document.querySelectorAll('tr.peer td.name')].map(e => e.textContent)",
            |v| v.to_string().contains("carol"),
        )
        .await;
    assert_eq!(
        browser.eval("return window.stayed === true").await,
        true,
        "updated without a reload"
    );

    browser.open(&format!("{base}/spaces/main/feed")).await;
    browser
        .eval_until("return document.getElementById('live').textContent", |v| {
            v == "live"
        })
        .await;
    let hostile = "<script>window.pwned = 1</script><img src=x onerror=\"window.pwned = 2\"> sent after the page loaded";
    a.client.send_text(general(), hostile).await.unwrap();
    let shown = browser
        .eval_until(
            "return [...document.querySelectorAll('li.msg.fresh .text')].map(e => e.textContent)",
            |v| v.as_array().is_some_and(|a| !a.is_empty()),
        )
        .await;
    assert_eq!(shown, serde_json::json!([hostile]), "rendered as text");
    assert_eq!(
        browser
            .eval("return [typeof window.pwned, document.querySelectorAll('li.msg script, li.msg img').length]")
            .await,
        serde_json::json!(["undefined", 0])
    );
    browser.quit().await;
    c.stop().await;
}

/// The anti-forgery value the dashboard's forms carry, read from a page.
fn csrf_of(page: &str) -> String {
    let (_, rest) = page
        .split_once(r#"name="csrf" value=""#)
        .expect("a form with its anti-forgery field");
    rest.split('"').next().unwrap().to_owned()
}

#[tokio::test]
async fn forms_need_the_cookie_the_anti_forgery_field_and_this_origin() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let site = Site::of(&c).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let mut a = endpoint(&alice, |_| {}).await;
    a.client.join("general", Replay::Off).await.unwrap();
    let feed = site.page("/spaces/main/feed?channel=general").await;
    let csrf = csrf_of(&feed);

    let form = |csrf: &str, channel: &str, text: &str| {
        format!("csrf={csrf}&channel={channel}&text={text}")
    };
    let forged = site
        .post("/spaces/main/post", &form("0000", "general", "forged"), "")
        .await;
    assert_eq!(forged.status, 403, "{}", forged.body);
    let elsewhere = site
        .post(
            "/spaces/main/post",
            &form(&csrf, "general", "from+elsewhere"),
            "Origin: http://evil.example\r\n",
        )
        .await;
    assert_eq!(elsewhere.status, 403, "{}", elsewhere.body);
    let typo = site
        .post("/spaces/main/post", &form(&csrf, "generl", "typo"), "")
        .await;
    assert_eq!(typo.status, 400, "{}", typo.body);
    assert!(
        typo.body.contains("general"),
        "the names that exist: {}",
        typo.body
    );

    let sent = site
        .post(
            "/spaces/main/post",
            &form(&csrf, "general", "hello+%40alice%0D%0Asecond+line"),
            &format!("Origin: http://{}\r\n", site.addr),
        )
        .await;
    assert_eq!(sent.status, 303, "{}", sent.body);
    let got = delivery(&mut a.deliveries).await;
    assert_eq!(
        sent.header("location"),
        Some(format!("/spaces/main/feed?channel=general&sent={}", got.message.id).as_str())
    );
    // The feed it returns to says where the post went.
    let back = site.page(sent.header("location").unwrap()).await;
    assert!(
        back.contains(r#"<p class="receipt">Sent: "#) && back.contains("received it live"),
        "{back}"
    );
    assert_eq!(got.message.from.name, "local-operator");
    assert_eq!(got.message.mentions, ["alice"]);
    match &got.message.parts[0] {
        Part::Text { text, .. } => assert_eq!(text, "hello @alice\r\nsecond line"),
        other => panic!("{other:?}"),
    }
    // A direct message from the roster's form.
    let dm = site
        .post(
            "/spaces/main/dm",
            &format!("csrf={csrf}&to={}&text=just+for+you", alice.id),
            "",
        )
        .await;
    assert_eq!(dm.status, 303, "{}", dm.body);
    let got = delivery(&mut a.deliveries).await;
    assert_eq!(got.kind, cotald::protocol::DeliveryKind::Dm);
    assert!(matches!(&got.message.parts[0], Part::Text { text, .. } if text == "just for you"));
    got.ack().await.unwrap();
    // A task for a role nobody holds would be discarded: refused, naming the roles held.
    mint(tmp.path(), "rita", "main", &["--role", "reviewer"]).await;
    let typo = site
        .post(
            "/spaces/main/task",
            &format!("csrf={csrf}&role=reviewr&text=please"),
            "",
        )
        .await;
    assert_eq!(typo.status, 400, "{}", typo.body);
    assert!(
        typo.body
            .contains("no agent of this space holds role `reviewr`")
            && typo.body.contains("roles held: reviewer"),
        "{}",
        typo.body
    );
    let task = site
        .post(
            "/spaces/main/task",
            &format!("csrf={csrf}&role=reviewer&text=please"),
            "",
        )
        .await;
    assert_eq!(task.status, 303, "{}", task.body);
    a.client.close().await;
    c.stop().await;
}

/// A person and their agents, both ways, at the dashboard: the person DMs an agent from the
/// roster's form, the agent answers the operator by name, and the answer shows on the person's
/// direct page as it arrives (its live part), waiting unread until `cotald tail --dm` reads
/// it. Nothing is purged as addressed to no agent.
#[tokio::test]
async fn the_person_sees_an_agents_answer_on_the_direct_page_live() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let site = Site::of(&c).await;
    let alice = mint(tmp.path(), "alice", "main", &[]).await;
    let mut a = endpoint(&alice, |_| {}).await;
    let roster = site.page_with("/spaces/main/roster", &["alice"]).await;
    let csrf = csrf_of(&roster);
    let empty = site.page("/spaces/main/direct").await;
    assert!(
        empty.contains("No direct message to or from you yet"),
        "{empty}"
    );
    let mut live = site
        .stream(
            "/spaces/main/direct?live=1",
            "no direct message waits unread",
        )
        .await;

    let dm = site
        .post(
            "/spaces/main/dm",
            &format!("csrf={csrf}&to={}&text=can+you+review+%231%3F", alice.id),
            "",
        )
        .await;
    assert_eq!(dm.status, 303, "{}", dm.body);
    let asked = delivery(&mut a.deliveries).await;
    assert_eq!(asked.message.from.name, "local-operator");
    // Back on the direct page, which says where the DM went.
    assert_eq!(
        dm.header("location"),
        Some(format!("/spaces/main/direct?sent={}", asked.message.id).as_str())
    );
    let back = site.page(dm.header("location").unwrap()).await;
    assert!(
        back.contains(r#"<p class="receipt">Sent: stored in alice"#)
            && back.contains("alice is online"),
        "{back}"
    );
    // Delivered, then read once alice acknowledged it.
    let unread = site.page("/spaces/main/direct").await;
    assert!(
        unread.contains(r#"<p class="read">delivered to the recipient, not acknowledged yet</p>"#),
        "{unread}"
    );
    asked.ack().await.unwrap();
    eventually("the DM read on the direct page", || async {
        let page = site.page("/spaces/main/direct").await;
        page.contains(r#"<p class="read">read: the recipient acknowledged it</p>"#)
            .then_some(())
    })
    .await;
    live.until("can you review #1?").await;

    // The agent answers the person by name, as a person would be addressed.
    let operator = a.client.roster().resolve("local-operator").unwrap();
    a.client
        .send_text(Routing::to(&operator), "reviewed: <b>ship it</b>")
        .await
        .unwrap();
    live.until("reviewed: &lt;b&gt;ship it&lt;/b&gt;").await;
    live.until("1 direct message waits unread").await;
    let direct = site.page("/spaces/main/direct").await;
    let needs = direct
        .split_once("<h2>Needs you</h2>")
        .and_then(|(_, rest)| rest.split_once("<h2>Conversations</h2>"))
        .map(|(needs, _)| needs)
        .unwrap();
    assert!(
        needs.contains("ship it") && !needs.contains("can you review"),
        "{needs}"
    );
    assert!(
        direct.contains(&format!(r#"name="to" value="{}""#, alice.id)),
        "{direct}"
    );

    let tail = cotald_in(tmp.path(), &["tail", "--dm", "--count", "1", "--json"]).await;
    assert!(
        tail.status.success(),
        "{}",
        String::from_utf8_lossy(&tail.stderr)
    );
    let line: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&tail.stdout).trim()).unwrap();
    assert_eq!(line["from"]["name"], "alice", "{line}");
    assert_eq!(
        line["parts"][0]["text"], "reviewed: <b>ship it</b>",
        "{line}"
    );
    live.seen.clear();
    live.until("no direct message waits unread").await;

    a.client.close().await;
    let log = c.stop_for_log().await;
    assert!(!log.contains("purged messages"), "nothing purged:\n{log}");
}

#[tokio::test]
async fn a_person_posts_from_the_browser_and_an_agents_reply_appears_under_it_live() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let site = Site::of(&c).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let mut a = endpoint(&alice, |_| {}).await;
    a.client.join("general", Replay::Off).await.unwrap();

    let base = format!("http://{}", site.addr);
    browser
        .open(&format!(
            "{base}/spaces/main/feed?channel=general&token={}",
            site.token
        ))
        .await;
    browser
        .eval_until("return document.getElementById('live').textContent", |v| {
            v == "live"
        })
        .await;
    // Typed and sent as a person does: the form posts, the page comes back.
    browser
        .eval(
            "const f = document.querySelector('form.post'); \
             f.querySelector('textarea').value = 'can you look at the build, @alice?'; \
             f.requestSubmit(); return true",
        )
        .await;
    let asked = delivery(&mut a.deliveries).await;
    assert_eq!(asked.message.from.name, "local-operator");
    assert_eq!(asked.message.mentions, ["alice"]);
    assert!(matches!(
        &asked.message.parts[0],
        Part::Text { text, .. } if text == "can you look at the build, @alice?"
    ));

    // The page after the post, followed live; alice's reply lands under the question.
    browser
        .eval_until(
            "return document.readyState === 'complete' && \
             document.getElementById('live').textContent",
            |v| v == "live",
        )
        .await;
    browser.eval("window.stayed = true; return true").await;
    let mut reply = CotalMessage::new(
        "main",
        a.client.endpoint(),
        Routing::channel(&Channel::new("general").unwrap()),
        vec![Part::text("on it: the linker is out of memory")],
    );
    reply.reply_to = Some(asked.message.id.clone());
    a.client.publish(&reply).await.unwrap();
    let under = format!(
        "const m = document.getElementById('m-{}'); \
         const r = m && m.querySelector('ol.replies li.msg .text'); \
         return r ? r.textContent : null",
        asked.message.id
    );
    let shown = browser.eval_until(&under, |v| v.is_string()).await;
    assert_eq!(shown, "on it: the linker is out of memory");
    assert_eq!(
        browser.eval("return window.stayed === true").await,
        true,
        "shown without a reload"
    );
    let time = browser
        .eval(&format!(
            "return document.querySelector('#m-{} time').textContent",
            asked.message.id
        ))
        .await;
    assert!(
        time.as_str().is_some_and(|t| t.contains("20")),
        "a date in the reader's locale: {time}"
    );
    browser.quit().await;
    a.client.close().await;
    c.stop().await;
}

/// Every page of the dashboard in a real browser with 10,000 messages in the space: each loads
/// in full (the feed shows the newest message), and the load times are reported (Navigation
/// Timing: from the request to the page's load event, and the server's part of it).
#[tokio::test]
async fn every_page_loads_in_a_browser_with_ten_thousand_messages() {
    use futures_util::StreamExt;
    let Some(browser) = Browser::start().await else {
        return;
    };
    const MESSAGES: usize = 10_000;
    let tmp = tempfile::tempdir().unwrap();
    let c = Cotald::up(tmp.path()).await;
    let site = Site::of(&c).await;
    let alice = mint(tmp.path(), "alice", "main", &["--allow-publish", "general"]).await;
    let a = endpoint(&alice, |o| o.presence = false).await;
    let stored = Instant::now();
    futures_util::stream::iter(0..MESSAGES)
        .map(|i| {
            let client = a.client.clone();
            async move { client.send_text(general(), &format!("m{i}")).await.unwrap() }
        })
        .buffer_unordered(256)
        .collect::<Vec<_>>()
        .await;
    a.client
        .send_text(general(), "the newest message")
        .await
        .unwrap();
    eprintln!("{MESSAGES} messages stored in {:?}", stored.elapsed());
    let base = format!("http://{}", site.addr);
    browser.open(&format!("{base}/?token={}", site.token)).await;
    let timing = "const t = performance.getEntriesByType('navigation')[0]; \
                  return [Math.round(t.loadEventEnd - t.requestStart), \
                          Math.round(t.responseEnd - t.requestStart), \
                          Math.round(t.domInteractive - t.responseEnd), \
                          Math.round(t.domContentLoadedEventEnd - t.domInteractive), \
                          Math.round(t.loadEventEnd - t.domContentLoadedEventEnd), t.transferSize]";
    let mut report = Vec::new();
    for (page, shows) in [
        ("/", "main"),
        ("/health", "CHAT_main"),
        ("/spaces/main/roster", "Roster of main"),
        ("/spaces/main/channels", "#general"),
        ("/spaces/main/feed", "older messages are not shown here"),
        ("/spaces/main/feed?channel=general", "the newest message"),
    ] {
        browser.open(&format!("{base}{page}")).await;
        let text = browser.eval("return document.body.innerText").await;
        assert!(
            text.as_str().is_some_and(|t| t.contains(shows)),
            "{page} shows {shows:?}: {text}"
        );
        let t = browser.eval(timing).await;
        report.push(format!(
            "{page}: loaded in {} ms (server {} ms; parse {}, scripts {}, load {}; {} bytes)",
            t[0], t[1], t[2], t[3], t[4], t[5]
        ));
    }
    eprintln!(
        "with {MESSAGES} messages in the space:\n  {}",
        report.join("\n  ")
    );
    browser.quit().await;
    a.client.close().await;
    c.stop().await;
}
