//! The live web dashboard `cotald up` serves: per space, the roster (§6), the channels (§7)
//! and the feed of channel messages as they arrive; for the appliance, the broker's health
//! and every service's.
//!
//! # What it may see
//!
//! Each space is read through an **observer** identity of the appliance (Appendix B: chat
//! content and metadata, CHAT history, presence, the channel registry; DMs invisible, no
//! application publish): never the SYS or the manager credential. A DM therefore cannot reach
//! a page, whatever the code below does. The broker's figures come from the broker itself
//! over the system account (`supervisor::monitor`), the services' health from the runtime
//! state.
//!
//! # Who may see it
//!
//! A random token per data dir ([`Token`]) is the only key: the URL `cotald up` prints
//! carries it once (`/?token=…`), the answer sets it as an HttpOnly, SameSite=Strict cookie
//! and redirects to the same page without it. No token: 401; a wrong one: 403. Every response
//! sets a strict Content-Security-Policy (only the dashboard's own script and style),
//! `X-Content-Type-Options: nosniff` and no referrer, and every string from the wire is
//! escaped by construction: pages are `maud` markup, in which a spliced string cannot be
//! anything but text (`pages`). It listens on loopback unless the profile says otherwise.
//!
//! # How it is built
//!
//! A service of the appliance's [`ServiceSet`](crate::services::ServiceSet) (like the admin
//! socket): it owns its listener and the observers, and stops when its context is cancelled.
//! HTTP/1.1 is hyper's, over `tokio::net::TcpListener` (`http` keeps the dashboard's own
//! strictness: GETs and form POSTs only, bounded bodies, nothing decoded with a control
//! character). Pages are
//! rendered on the server; the feed follows a server-sent event stream whose events are
//! rendered the same way. HTML, CSS and JS are compiled into the binary.

mod compose;
mod direct;
mod events;
mod health;
mod http;
mod observer;
mod pages;
mod person;
mod token;

pub use token::{Token, TokenError};

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use maud::{Markup, html};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::ConnectOptions;
use crate::datadir::RuntimeState;
use crate::protocol::PresenceStatus;
use crate::services::{Context, Health, Service, ServiceError};
use crate::supervisor::monitor::Monitor;
use compose::Form;
use http::{Answer, Method, Request, Response};
use observer::Observer;
use pages::Tab;

const APP_CSS: &str = include_str!("assets/app.css");
const APP_JS: &str = include_str!("assets/app.js");

/// How many connections are served at once (each open feed page holds one).
const MAX_CONNECTIONS: usize = 64;
/// The bound on each question to the broker about itself.
const MONITOR_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a space whose observer could not connect is left before a request tries it again.
const OBSERVER_RETRY: Duration = Duration::from_secs(5);
/// How long a request waits for the observers it needs to connect.
const OBSERVER_START: Duration = Duration::from_secs(10);

/// One space the dashboard shows, and how its observer connects.
#[derive(Clone)]
pub struct SpaceAccess {
    /// The space.
    pub name: String,
    /// The observer's connect options (its credential, the appliance's own listener).
    pub connect: ConnectOptions,
    /// The machine operator's, whose voice a person at the dashboard speaks with (posts,
    /// replies, DMs, tasks).
    pub voice: ConnectOptions,
    /// The identities minted for the space: who holds which role (a task for a role nobody
    /// holds would be discarded).
    pub identities: Arc<crate::space::Identities>,
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
    /// The spaces to show, each handed over as it is served (at start or while running).
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

    /// Where it listens, as bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
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
        let mut handed_over = self.spaces.clone();
        let connections = TaskTracker::new();
        let site = Arc::new(Site {
            tasks: connections.clone(),
            token: self.token.clone(),
            cookie: format!("cotald_{}", self.addr.port()),
            offered: self.spaces.clone(),
            observers: std::sync::RwLock::new(BTreeMap::new()),
            starting: tokio::sync::Mutex::new(BTreeMap::new()),
            state: self.state.clone(),
            monitor: self.monitor.clone(),
        });
        ctx.report(Health::Running);
        tracing::info!(addr = %self.addr, "dashboard listening");
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        // Each space handed over is observed at the first request that needs it; one taken
        // back is no longer observed.
        let outcome = loop {
            tokio::select! {
                () = ctx.cancelled() => break Ok(()),
                Ok(()) = handed_over.changed() => {
                    handed_over.borrow_and_update();
                    close_all(site.withdrawn()).await;
                }
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let site = site.clone();
                        let token = ctx.token().clone();
                        let slot = slots.clone().try_acquire_owned().ok();
                        connections.spawn(async move {
                            tokio::select! {
                                () = serve(site, stream, token.clone(), slot) => {}
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
    /// Where connections and event streams run (waited for at a stop).
    tasks: TaskTracker,
    token: Token,
    /// The cookie's name: per port, so that two appliances on one machine keep their own.
    cookie: String,
    /// The spaces handed over: each is observed once a request needs it.
    offered: watch::Receiver<Vec<SpaceAccess>>,
    observers: std::sync::RwLock<BTreeMap<String, Arc<Observer>>>,
    /// Held while observers start, so that requests arriving together start each once; with
    /// the spaces whose observer failed, and when (not tried again before [`OBSERVER_RETRY`]).
    starting: tokio::sync::Mutex<BTreeMap<String, tokio::time::Instant>>,
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

    /// Takes out the observers of the spaces no longer offered (a space whose services could
    /// not start after it was handed over), to close.
    fn withdrawn(&self) -> BTreeMap<String, Arc<Observer>> {
        let names: BTreeSet<String> = self
            .offered
            .borrow()
            .iter()
            .map(|a| a.name.clone())
            .collect();
        let mut observers = self.observers.write().unwrap_or_else(|e| e.into_inner());
        let (kept, gone) = std::mem::take(&mut *observers)
            .into_iter()
            .partition(|(name, _)| names.contains(name));
        *observers = kept;
        gone
    }

    /// Observes every space offered and not observed yet, all at once: the first request
    /// after a space is handed over waits for its observer (a start connects none, so that
    /// an appliance nobody watches holds no observer). One that cannot be observed is
    /// logged and left out, and tried again by a request after [`OBSERVER_RETRY`]; the
    /// others are shown.
    async fn observe_offered(&self) {
        let unobserved = |failed: &BTreeMap<String, tokio::time::Instant>| -> Vec<SpaceAccess> {
            let observers = self.observers.read().unwrap_or_else(|e| e.into_inner());
            self.offered
                .borrow()
                .iter()
                .filter(|a| !observers.contains_key(&a.name))
                .filter(|a| {
                    failed
                        .get(&a.name)
                        .is_none_or(|at| at.elapsed() >= OBSERVER_RETRY)
                })
                .cloned()
                .collect()
        };
        if unobserved(&BTreeMap::new()).is_empty() {
            return;
        }
        let mut failed = self.starting.lock().await;
        let starts = unobserved(&failed).into_iter().map(|access| async move {
            let space = access.name.clone();
            let started = tokio::time::timeout(OBSERVER_START, Observer::start(access)).await;
            let started = started.unwrap_or_else(|_| {
                Err(ServiceError::msg(format!(
                    "space `{space}`: the observer did not connect within {OBSERVER_START:?}"
                )))
            });
            (space, started)
        });
        for (space, started) in futures_util::future::join_all(starts).await {
            let observer = match started {
                Ok(observer) => observer,
                Err(e) => {
                    tracing::warn!(
                        space,
                        error = %crate::ops::error_text(&e),
                        retry = ?OBSERVER_RETRY,
                        "dashboard: space not shown"
                    );
                    failed.insert(space, tokio::time::Instant::now());
                    continue;
                }
            };
            failed.remove(&space);
            let still_offered = self.offered.borrow().iter().any(|a| a.name == space);
            if still_offered {
                self.observers
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(space, Arc::new(observer));
            } else {
                observer.close().await;
            }
        }
    }

    /// `None` when the request may proceed; otherwise the answer. A form must also carry the
    /// anti-forgery field and, when the browser names an origin, come from this site: the
    /// SameSite=Strict cookie keeps other sites' forms out already, these keep them out of
    /// a browser that ignores it.
    fn authorize(&self, req: &Request) -> Option<Response> {
        if req.method == Method::Post {
            if let Some(refused) = self.authorize_cookie(req) {
                return Some(refused);
            }
            if !req
                .field("csrf")
                .is_some_and(|f| self.token.csrf_matches(f))
            {
                return Some(refuse(
                    403,
                    "a form without this dashboard's anti-forgery field",
                ));
            }
            let origin = req.header("origin");
            let host = req.header("host").unwrap_or_default();
            if origin.is_some_and(|o| o != format!("http://{host}")) {
                return Some(refuse(403, "a form posted from another site"));
            }
            return None;
        }
        if let Some(given) = req.param("token") {
            if !self.token.matches(given) {
                return Some(refuse(403, "wrong token"));
            }
            // The token leaves the address bar at once: the cookie carries it from now on.
            let rest: Vec<(&str, &str)> = req
                .query
                .iter()
                .filter(|(k, _)| k != "token")
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let mut r = Response::see_other(http::site_url(&req.path, &rest));
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
        self.authorize_cookie(req)
    }

    fn authorize_cookie(&self, req: &Request) -> Option<Response> {
        match req.cookie(&self.cookie) {
            Some(given) if self.token.matches(given) => None,
            Some(_) => Some(refuse(403, "wrong token")),
            None => Some(refuse(401, "no token")),
        }
    }

    async fn route(&self, req: &Request) -> Route {
        let segments: Vec<&str> = req.path.split('/').filter(|s| !s.is_empty()).collect();
        if segments.first() != Some(&"assets") {
            self.observe_offered().await;
        }
        if req.method == Method::Post {
            return Route::Done(match segments.as_slice() {
                ["spaces", space, form] => match (self.observers().get(*space), Form::of(form)) {
                    (Some(observer), Some(form)) => self.compose(observer, form, req).await,
                    _ => not_found(),
                },
                _ => Response::text(405, "only the forms of the dashboard are posted"),
            });
        }
        let live = req.param("live").is_some();
        match segments.as_slice() {
            ["assets", "app.css"] => Route::Done(asset("text/css; charset=utf-8", APP_CSS)),
            ["assets", "app.js"] => Route::Done(asset("text/javascript; charset=utf-8", APP_JS)),
            [] if live => Route::Live(Part::Index),
            [] => Route::Done(self.page(Part::Index, req).await),
            ["health"] if live => Route::Live(Part::Health),
            ["health"] => Route::Done(self.page(Part::Health, req).await),
            ["spaces", space, page] => {
                let Some(observer) = self.observers().get(*space).cloned() else {
                    return Route::Done(not_found());
                };
                let part = match *page {
                    "roster" => Part::Roster(observer),
                    "direct" => Part::Direct(observer),
                    "channels" => Part::Channels(observer),
                    "feed" => return Route::Done(self.feed(&observer, req).await),
                    "events" => return Route::Events(observer),
                    _ => return Route::Done(not_found()),
                };
                match live {
                    true => Route::Live(part),
                    false => Route::Done(self.page(part, req).await),
                }
            }
            _ => Route::Done(not_found()),
        }
    }

    /// A form sent, then back to the page it came from; or the reason it was not.
    async fn compose(&self, observer: &Observer, form: Form, req: &Request) -> Response {
        match compose::send(observer, form, req).await {
            Ok(posted) => {
                let receipt = match observer.voice.receipt(&posted.routing).await {
                    Ok(r) => r.words(),
                    Err(e) => format!("where it went is unknown: {}", crate::ops::error_text(&e)),
                };
                observer.person.sent(person::Sent {
                    id: posted.id.clone(),
                    sequence: posted.sequence,
                    receipt,
                });
                let join = if posted.back.contains('?') { '&' } else { '?' };
                let sent = form_urlencoded::Serializer::new(String::new())
                    .append_pair("sent", &posted.id)
                    .finish();
                Response::see_other(format!("{}{join}{sent}", posted.back))
            }
            Err(refused) => {
                let status = match refused {
                    compose::Refused::NotSent(_) => 502,
                    _ => 400,
                };
                let text = format!(
                    "{refused}. Go back, correct it and send it again (what you typed is still in \
                     the form)."
                );
                Response::html(status, pages::refusal("Not sent", &text))
            }
        }
    }

    /// A page whose part that changes is kept current by its event stream.
    async fn page(&self, part: Part, req: &Request) -> Response {
        let body = self.part(&part).await;
        let (title, here, head) = match &part {
            Part::Index => ("Spaces".to_owned(), None, html! { h1 { "Spaces" } }),
            Part::Health => ("health".to_owned(), None, html! { h1 { "Health" } }),
            Part::Roster(o) => {
                let peers = roster_peers(o);
                let forms = pages::roster_forms(&o.space, &self.token.csrf(), &peers);
                (
                    format!("roster of {}", o.space),
                    Some((o.space.as_str(), Tab::Roster)),
                    html! { h1 { "Roster of " (o.space) } (forms) },
                )
            }
            Part::Direct(o) => (
                format!("direct messages in {}", o.space),
                Some((o.space.as_str(), Tab::Direct)),
                html! { h1 { "Direct messages in " (o.space) } },
            ),
            Part::Channels(o) => (
                format!("channels of {}", o.space),
                Some((o.space.as_str(), Tab::Channels)),
                html! { h1 { "Channels of " (o.space) } },
            ),
        };
        let banner = match &part {
            Part::Roster(o) | Part::Direct(o) | Part::Channels(o) => direct::sent_banner(o, req),
            Part::Index | Part::Health => Markup::default(),
        };
        let body = html! { (head) (banner) (pages::live(&part.live_url(), body)) };
        Response::html(200, pages::layout(&title, &self.spaces(), here, body))
    }

    /// The part of a page that changes, rendered now.
    async fn part(&self, part: &Part) -> Markup {
        match part {
            Part::Index => self.index(),
            Part::Health => self.health().await,
            Part::Roster(o) => {
                let peers = roster_peers(o);
                let ids: Vec<&str> = peers.iter().map(|(id, ..)| id.as_str()).collect();
                let memberships = o.memberships(&ids).await;
                pages::roster(&peers, &memberships, o.client.roster().is_stale())
            }
            Part::Direct(o) => {
                let me = crate::ops::OPERATOR;
                let kept = o.kept();
                let mentions: Vec<&observer::FeedItem> = kept
                    .iter()
                    .map(|i| i.as_ref())
                    .filter(|i| i.message.mentions.iter().any(|m| m == me))
                    .collect();
                direct::direct(
                    &o.space,
                    &self.token.csrf(),
                    me,
                    o.person.unread(&o.voice).await,
                    &o.person.kept(),
                    &o.person.read_states(&o.voice).await,
                    &mentions,
                )
            }
            Part::Channels(o) => match o.client.channels().await {
                Ok(channels) => pages::channels(&o.space, &channels, &o.kept()),
                Err(e) => html! {
                    p class="warn" { "The channels cannot be read: " (crate::ops::error_text(&e)) }
                },
            },
        }
    }

    fn index(&self) -> Markup {
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
        pages::index(&rows)
    }

    async fn feed(&self, observer: &Observer, req: &Request) -> Response {
        let channel = req.param("channel").filter(|c| !c.is_empty());
        // The stream resumes after the last message rendered (none kept: from the start).
        let kept = observer.kept();
        let last = kept.last().map_or(0, |i| i.seq);
        let names = compose::known_channels(observer).await;
        let reply = req
            .param("reply")
            .and_then(|id| kept.iter().find(|i| i.message.id == id));
        let form = pages::compose(
            &observer.space,
            &self.token.csrf(),
            channel,
            &names,
            reply.map(|r| r.as_ref()),
        );
        let body = html! {
            h1 { "Feed of " (observer.space) }
            (direct::sent_banner(observer, req))
            (pages::feed(&observer.space, channel, &names, &kept, last, form))
        };
        Response::html(
            200,
            pages::layout(
                &format!("feed of {}", observer.space),
                &self.spaces(),
                Some((&observer.space, Tab::Feed)),
                body,
            ),
        )
    }

    async fn health(&self) -> Markup {
        let state = (self.state)();
        let (varz, jsz) = tokio::join!(
            self.monitor.varz(MONITOR_TIMEOUT),
            self.monitor.jsz(true, MONITOR_TIMEOUT)
        );
        health::page(&state, varz.ok().as_ref(), jsz.ok().as_ref())
    }
}

/// The roster's instances with their status by the liveness rule (§6): the present first,
/// then by name.
fn roster_peers(observer: &Observer) -> Vec<(String, crate::client::Peer, PresenceStatus)> {
    let roster = observer.client.roster();
    let mut peers: Vec<_> = roster
        .peers()
        .into_iter()
        .filter_map(|(id, peer)| {
            let status = roster.status(&id)?;
            Some((id, peer, status))
        })
        .collect();
    peers.sort_by(|a, b| {
        (a.2 == PresenceStatus::Offline)
            .cmp(&(b.2 == PresenceStatus::Offline))
            .then_with(|| a.1.presence.card.name.cmp(&b.1.presence.card.name))
    });
    peers
}

/// A page's part that changes.
enum Part {
    /// The spaces.
    Index,
    /// The broker and the services.
    Health,
    /// A space's roster.
    Roster(Arc<Observer>),
    /// The direct messages of the person at the dashboard.
    Direct(Arc<Observer>),
    /// A space's channels.
    Channels(Arc<Observer>),
}

impl Part {
    /// The address of the part's event stream.
    fn live_url(&self) -> String {
        let live = [("live", "1")];
        match self {
            Part::Index => http::site_url("/", &live),
            Part::Health => http::site_url("/health", &live),
            Part::Roster(o) => http::space_url(&o.space, Tab::Roster.path(), &live),
            Part::Direct(o) => http::space_url(&o.space, Tab::Direct.path(), &live),
            Part::Channels(o) => http::space_url(&o.space, Tab::Channels.path(), &live),
        }
    }
}

/// What a request is answered with.
enum Route {
    /// A complete response.
    Done(Response),
    /// The event stream of a space's feed.
    Events(Arc<Observer>),
    /// The event stream of a page's part.
    Live(Part),
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

/// Serves one connection with hyper; one over [`MAX_CONNECTIONS`] (no `slot`) is answered
/// 503 to every request.
async fn serve(
    site: Arc<Site>,
    stream: TcpStream,
    cancel: CancellationToken,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    let service = hyper::service::service_fn(move |req| {
        let site = site.clone();
        let cancel = cancel.clone();
        let full = slot.is_none();
        async move {
            if full {
                return Ok::<_, Infallible>(Response::text(503, "too many connections").answer());
            }
            Ok(handle(site, req, cancel).await)
        }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(http::READ_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "dashboard connection ended");
    }
}

/// One request: read, authorized, routed.
async fn handle(
    site: Arc<Site>,
    req: hyper::Request<Incoming>,
    cancel: CancellationToken,
) -> Answer {
    let req = match http::read(req).await {
        Ok(req) => req,
        Err(refusal) => return Response::text(refusal.status(), refusal.text()).answer(),
    };
    if let Some(answer) = site.authorize(&req) {
        return answer.answer();
    }
    match site.route(&req).await {
        Route::Done(response) => response.answer(),
        Route::Events(observer) => {
            let after = req
                .header("last-event-id")
                .or(req.param("after"))
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0);
            let channel = req
                .param("channel")
                .filter(|c| !c.is_empty())
                .map(str::to_owned);
            let (chunks, stream) = mpsc::channel(64);
            site.tasks.spawn(async move {
                let _ = events::events(&observer, after, channel, chunks, cancel).await;
            });
            http::event_stream(stream)
        }
        Route::Live(part) => {
            let (chunks, stream) = mpsc::channel(8);
            let tasks = site.tasks.clone();
            tasks.spawn(async move {
                let _ = events::live(&site, part, chunks, cancel).await;
            });
            http::event_stream(stream)
        }
    }
}
