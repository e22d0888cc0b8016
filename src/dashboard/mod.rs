//! The live web dashboard `cotald up` serves: per space, the roster (§6), the channels (§7)
//! and the feed of channel messages as they arrive; for the appliance, the broker's health
//! and every service's.
//!
//! # What it may see
//!
//! Each space is read through an **observer** identity of the appliance (Appendix B: chat
//! content and metadata, CHAT history, presence, the channel registry; DMs invisible, no
//! application publish): never the SYS or the manager credential. A DM therefore cannot reach
//! a page, whatever the code below does. The broker's figures come from its monitoring
//! endpoint (loopback), the services' health from the runtime state.
//!
//! # Who may see it
//!
//! A random token per data dir ([`Token`]) is the only key: the URL `cotald up` prints
//! carries it once (`/?token=…`), the answer sets it as an HttpOnly, SameSite=Strict cookie
//! and redirects to the same page without it. No token: 401; a wrong one: 403. Every response
//! sets a strict Content-Security-Policy (only the dashboard's own script and style),
//! `X-Content-Type-Options: nosniff` and no referrer, and every string from the wire is
//! escaped (`pages::esc`). It listens on loopback unless the profile says otherwise.
//!
//! # How it is built
//!
//! A service of the appliance's [`ServiceSet`](crate::services::ServiceSet) (like the admin
//! socket): it owns its listener and the observers, and stops when its context is cancelled.
//! HTTP/1.1 is a small strict parser over `tokio::net::TcpListener` (`http`): the
//! dashboard serves a handful of GETs to one browser, which needs no HTTP stack. Pages are
//! rendered on the server; the feed follows a server-sent event stream whose events are
//! rendered the same way. HTML, CSS and JS are compiled into the binary.

mod http;
mod observer;
mod pages;
mod token;

pub use token::{Token, TokenError};

use crate::supervisor::monitor::Monitor;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, broadcast, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::ConnectOptions;
use crate::datadir::RuntimeState;
use crate::services::{Context, Health, Service, ServiceError};
use http::{Refusal, Request, Response};
use observer::Observer;
use pages::Tab;

const APP_CSS: &str = include_str!("assets/app.css");
const APP_JS: &str = include_str!("assets/app.js");

/// How many connections are served at once (each open feed page holds one).
const MAX_CONNECTIONS: usize = 64;
/// How often an idle event stream sends a comment, so that proxies and the browser keep it.
const KEEPALIVE: Duration = Duration::from_secs(15);
/// The bound on each question to the broker about itself.
const MONITOR_TIMEOUT: Duration = Duration::from_secs(2);

/// One space the dashboard shows, and how its observer connects.
#[derive(Clone)]
pub struct SpaceAccess {
    /// The space.
    pub name: String,
    /// The observer's connect options (its credential, the appliance's own listener).
    pub connect: ConnectOptions,
}

/// The appliance's runtime state, read on each health page.
pub type StateView = Arc<dyn Fn() -> RuntimeState + Send + Sync>;

/// Whether the dashboard is served, as the ready banner and `cotald status` tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// `[dashboard] enabled = false`.
    Disabled,
    /// Served at this URL (with the token).
    Serving(String),
    /// Enabled, but it could not be served; the reason says why and what to do.
    NotServed(String),
}

/// The dashboard service.
pub struct Dashboard {
    listener: std::sync::Mutex<Option<TcpListener>>,
    addr: SocketAddr,
    token: Token,
    /// The spaces to show: those served at start, then each one added while running.
    spaces: watch::Receiver<Vec<SpaceAccess>>,
    state: StateView,
    monitor: Monitor,
}

impl Dashboard {
    /// Binds `listen` (before the service starts, so that a taken port is reported at once).
    pub fn bind(
        listen: SocketAddr,
        token: Token,
        spaces: watch::Receiver<Vec<SpaceAccess>>,
        state: StateView,
        monitor: Monitor,
    ) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        Ok(Dashboard {
            listener: std::sync::Mutex::new(Some(listener)),
            addr,
            token,
            spaces,
            state,
            monitor,
        })
    }

    /// The URL that opens it, token included; a wildcard listener is opened on loopback.
    pub fn url(&self) -> String {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        format!("http://{addr}/?token={}", self.token.as_str())
    }
}

impl Service for Dashboard {
    fn name(&self) -> &'static str {
        "dashboard"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let listener = match self.listener.lock().ok().and_then(|mut l| l.take()) {
            Some(l) => l,
            // A restart after a failure: bind again.
            None => TcpListener::bind(self.addr)
                .await
                .map_err(ServiceError::at("binding the dashboard listener"))?,
        };
        let mut spaces = self.spaces.clone();
        let mut observers = BTreeMap::new();
        let at_start = spaces.borrow_and_update().clone();
        for access in at_start {
            match Observer::start(&access.name, access.connect).await {
                Ok(o) => {
                    observers.insert(access.name, Arc::new(o));
                }
                Err(e) => {
                    close_all(observers).await;
                    return Err(e);
                }
            }
        }
        let site = Arc::new(Site {
            token: self.token.clone(),
            cookie: format!("cotald_{}", self.addr.port()),
            observers: std::sync::RwLock::new(observers),
            state: self.state.clone(),
            monitor: self.monitor.clone(),
        });
        ctx.report(Health::Running);
        tracing::info!(addr = %self.addr, "dashboard listening");
        let connections = TaskTracker::new();
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let outcome = loop {
            tokio::select! {
                () = ctx.cancelled() => break Ok(()),
                Ok(()) = spaces.changed() => {
                    let now = spaces.borrow_and_update().clone();
                    site.observe_added(now).await;
                }
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let site = site.clone();
                        let token = ctx.token().clone();
                        let slot = slots.clone().try_acquire_owned();
                        connections.spawn(async move {
                            let Ok(_slot) = slot else {
                                let mut stream = stream;
                                let _ = Response::text(503, "too many connections")
                                    .write(&mut stream)
                                    .await;
                                return;
                            };
                            tokio::select! {
                                () = serve(site, stream, token.clone()) => {}
                                () = token.cancelled() => {}
                            }
                        });
                    }
                    Err(e) => break Err(ServiceError::new("accepting on the dashboard listener", e)),
                },
            }
        };
        connections.close();
        connections.wait().await;
        drop(listener);
        if let Ok(site) = Arc::try_unwrap(site) {
            close_all(
                site.observers
                    .into_inner()
                    .unwrap_or_else(|e| e.into_inner()),
            )
            .await;
        }
        outcome
    }
}

async fn close_all(observers: BTreeMap<String, Arc<Observer>>) {
    for (_, observer) in observers {
        if let Ok(observer) = Arc::try_unwrap(observer) {
            observer.close().await;
        }
    }
}

/// What every request is served from.
struct Site {
    token: Token,
    /// The cookie's name: per port, so that two appliances on one machine keep their own.
    cookie: String,
    observers: std::sync::RwLock<BTreeMap<String, Arc<Observer>>>,
    state: StateView,
    monitor: Monitor,
}

impl Site {
    fn observers(&self) -> BTreeMap<String, Arc<Observer>> {
        self.observers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn spaces(&self) -> Vec<String> {
        self.observers().into_keys().collect()
    }

    /// Observes the spaces of `spaces` not observed yet (added while running). One that
    /// cannot be observed is logged and left out; the others are shown.
    async fn observe_added(&self, spaces: Vec<SpaceAccess>) {
        let known = self.spaces();
        for access in spaces.into_iter().filter(|a| !known.contains(&a.name)) {
            match Observer::start(&access.name, access.connect).await {
                Ok(o) => {
                    self.observers
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(access.name, Arc::new(o));
                }
                Err(e) => tracing::warn!(
                    space = access.name,
                    error = %crate::ops::error_text(&e),
                    "dashboard: a space added while running is not shown"
                ),
            }
        }
    }

    /// `None` when the request may proceed; otherwise the answer.
    fn authorize(&self, req: &Request) -> Option<Response> {
        if let Some(given) = req.param("token") {
            if !self.token.matches(given) {
                return Some(refuse(403, "wrong token"));
            }
            // The token leaves the address bar at once: the cookie carries it from now on.
            let rest: Vec<String> = req
                .query
                .iter()
                .filter(|(k, _)| k != "token")
                .map(|(k, v)| format!("{}={}", http::encode(k), http::encode(v)))
                .collect();
            // Always a path on this site (`//host` would leave it).
            let mut location = format!("/{}", req.path.trim_start_matches('/'));
            if !rest.is_empty() {
                location.push('?');
                location.push_str(&rest.join("&"));
            }
            let mut r = Response::see_other(location);
            r.headers.push((
                "Set-Cookie",
                format!(
                    "{}={}; HttpOnly; SameSite=Strict; Path=/",
                    self.cookie,
                    self.token.as_str()
                ),
            ));
            return Some(r);
        }
        match req.cookie(&self.cookie) {
            Some(given) if self.token.matches(given) => None,
            Some(_) => Some(refuse(403, "wrong token")),
            None => Some(refuse(401, "no token")),
        }
    }

    async fn route(&self, req: &Request) -> Route {
        let segments: Vec<&str> = req.path.split('/').filter(|s| !s.is_empty()).collect();
        match segments.as_slice() {
            ["assets", "app.css"] => Route::Done(asset("text/css; charset=utf-8", APP_CSS)),
            ["assets", "app.js"] => Route::Done(asset("text/javascript; charset=utf-8", APP_JS)),
            [] => Route::Done(self.index()),
            ["health"] => Route::Done(self.health().await),
            ["spaces", space, page] => {
                let Some(observer) = self.observers().get(*space).cloned() else {
                    return Route::Done(not_found());
                };
                match *page {
                    "roster" => Route::Done(self.roster(&observer).await),
                    "channels" => Route::Done(self.channels(&observer).await),
                    "feed" => Route::Done(self.feed(&observer, req).await),
                    "events" => Route::Events(observer),
                    _ => Route::Done(not_found()),
                }
            }
            _ => Route::Done(not_found()),
        }
    }

    fn index(&self) -> Response {
        let rows: Vec<(String, usize, usize)> = self
            .observers()
            .iter()
            .map(|(name, o)| {
                let roster = o.client.roster();
                let present = roster
                    .peers()
                    .keys()
                    .filter(|id| {
                        roster
                            .status(id)
                            .is_some_and(|s| s != crate::protocol::PresenceStatus::Offline)
                    })
                    .count();
                (name.clone(), present, o.kept().len())
            })
            .collect();
        page("Spaces", &self.spaces(), None, true, &pages::index(&rows))
    }

    async fn roster(&self, observer: &Observer) -> Response {
        let roster = observer.client.roster();
        let mut peers: Vec<_> = roster
            .peers()
            .into_iter()
            .filter_map(|(id, peer)| {
                let status = roster.status(&id)?;
                Some((id, peer, status))
            })
            .collect();
        // The present first, then by name.
        peers.sort_by(|a, b| {
            (a.2 == crate::protocol::PresenceStatus::Offline)
                .cmp(&(b.2 == crate::protocol::PresenceStatus::Offline))
                .then_with(|| a.1.presence.card.name.cmp(&b.1.presence.card.name))
        });
        let ids: Vec<&str> = peers.iter().map(|(id, ..)| id.as_str()).collect();
        let memberships = observer.memberships(&ids).await;
        let body = pages::roster(&observer.space, &peers, &memberships, roster.is_stale());
        page(
            &format!("roster of {}", observer.space),
            &self.spaces(),
            Some((&observer.space, Tab::Roster)),
            true,
            &body,
        )
    }

    async fn channels(&self, observer: &Observer) -> Response {
        let body = match observer.client.channels().await {
            Ok(channels) => pages::channels(&observer.space, &channels, &observer.kept()),
            Err(e) => format!(
                r#"<p class="warn">The channels cannot be read: {}</p>"#,
                pages::esc(&crate::ops::error_text(&e))
            ),
        };
        page(
            &format!("channels of {}", observer.space),
            &self.spaces(),
            Some((&observer.space, Tab::Channels)),
            true,
            &body,
        )
    }

    async fn feed(&self, observer: &Observer, req: &Request) -> Response {
        let channel = req.param("channel").filter(|c| !c.is_empty());
        // The stream resumes after the last message rendered (none kept: from the start).
        let kept = observer.kept();
        let last = kept.last().map_or(0, |i| i.seq);
        let mut names: Vec<String> = match observer.client.channels().await {
            Ok(channels) => channels
                .into_iter()
                .map(|c| c.channel.as_str().to_owned())
                .collect(),
            Err(_) => Vec::new(),
        };
        names.extend(kept.iter().map(|i| i.channel.clone()));
        names.sort();
        names.dedup();
        let body = pages::feed(&observer.space, channel, &names, &kept, last);
        page(
            &format!("feed of {}", observer.space),
            &self.spaces(),
            Some((&observer.space, Tab::Feed)),
            false,
            &body,
        )
    }

    async fn health(&self) -> Response {
        let state = (self.state)();
        let (varz, jsz) = tokio::join!(
            self.monitor.varz(MONITOR_TIMEOUT),
            self.monitor.jsz(true, MONITOR_TIMEOUT)
        );
        let body = pages::health(&state, varz.ok().as_ref(), jsz.ok().as_ref());
        page("health", &self.spaces(), None, true, &body)
    }
}

/// What a request is answered with.
enum Route {
    /// A complete response.
    Done(Response),
    /// The event stream of a space's feed.
    Events(Arc<Observer>),
}

fn page(
    title: &str,
    spaces: &[String],
    here: Option<(&str, Tab)>,
    refresh: bool,
    body: &str,
) -> Response {
    Response::html(200, pages::layout(title, spaces, here, refresh, body))
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    Response {
        status: 200,
        content_type,
        headers: Vec::new(),
        body: text.as_bytes().to_vec(),
    }
}

fn not_found() -> Response {
    Response::html(404, pages::refusal("Not found", "There is no such page."))
}

fn refuse(status: u16, what: &str) -> Response {
    let text = format!(
        "The dashboard refused this request: {what}. Open the URL `cotald up` printed (or the \
         \"dashboard\" of `cotald status --json`): it carries the access token."
    );
    Response::html(status, pages::refusal("Access token needed", &text))
}

async fn serve(site: Arc<Site>, mut stream: TcpStream, cancel: CancellationToken) {
    let req = match http::read_request(&mut stream).await {
        Ok(Some(req)) => req,
        Ok(None) => return,
        Err(refusal) => {
            let _ = refusal_response(refusal).write(&mut stream).await;
            return;
        }
    };
    if let Some(answer) = site.authorize(&req) {
        let _ = answer.write(&mut stream).await;
        return;
    }
    match site.route(&req).await {
        Route::Done(response) => {
            let _ = response.write(&mut stream).await;
        }
        Route::Events(observer) => {
            let _ = events(&observer, &req, &mut stream, cancel).await;
        }
    }
}

fn refusal_response(refusal: Refusal) -> Response {
    let text = match refusal {
        Refusal::BadRequest => "malformed request",
        Refusal::MethodNotAllowed => "only GET is served",
        Refusal::TooLarge => "request head too large",
        Refusal::Version => "only HTTP/1.x is served",
    };
    Response::text(refusal.status(), text)
}

/// The feed as server-sent events: each message after `after` (or the browser's
/// `Last-Event-ID` when it reconnects), rendered as on the page, then each arrival.
async fn events(
    observer: &Observer,
    req: &Request,
    stream: &mut TcpStream,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let after = req
        .header("last-event-id")
        .or(req.param("after"))
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    let channel = req.param("channel").filter(|c| !c.is_empty());
    let wanted = |item: &observer::FeedItem| channel.is_none_or(|c| c == item.channel);
    let (kept, mut arrivals) = observer.follow(after);
    stream
        .write_all(http::event_stream_head().as_bytes())
        .await?;
    stream.write_all(b"retry: 2000\n: following\n\n").await?;
    for item in kept.iter().filter(|i| wanted(i)) {
        stream.write_all(event(item).as_bytes()).await?;
    }
    stream.flush().await?;
    let mut keepalive = tokio::time::interval(KEEPALIVE);
    keepalive.tick().await;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            arrived = arrivals.recv() => match arrived {
                Ok(item) if wanted(&item) => stream.write_all(event(&item).as_bytes()).await?,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    stream
                        .write_all(format!("event: lagged\ndata: {missed}\n\n").as_bytes())
                        .await?;
                }
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            },
            _ = keepalive.tick() => stream.write_all(b": keepalive\n\n").await?,
        }
        stream.flush().await?;
    }
}

/// One message as an SSE event: its feed position as the id, its HTML as the data (one
/// `data:` line per line; the browser joins them with newlines).
fn event(item: &observer::FeedItem) -> String {
    let html = pages::message(item);
    let mut out = format!("id: {}\n", item.seq);
    for line in html.trim_end_matches('\n').split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    out
}
