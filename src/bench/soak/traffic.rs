//! What the team sends: a message a tick at the soak's rate, from a random agent, of a kind
//! drawn by weight (durable and live posts, DMs, mentions, tasks, replies), each recorded in the
//! ledger with who it is owed to once the broker acknowledged it; and the canary, a DM a second
//! between two agents of the soak's own, whose arrivals say whether delivery progresses.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::agents::{CHATTER, Minted, TEAM};
use super::ledger::{Kind, Ledger, Owe, Token, tagged};
use super::team::{Member, ROLES, Soak, Team, live_members};
use crate::client::{Client, ConnectOptions};
use crate::protocol::{JoinLink, Routing};

/// How many sends may be in flight at once.
const IN_FLIGHT: usize = 128;

/// One message to send: from whom, to whom, owed to whom.
struct Planned {
    token: Token,
    kind: Kind,
    sender: Arc<Member>,
    routing: Routing,
    owed: Vec<Owe>,
    mentions: Vec<String>,
}

/// Draws the next message among `live` members (two at least).
fn plan(rng: &mut fastrand::Rng, live: &[(usize, Arc<Member>)], token: Token) -> Planned {
    let (from, sender) = live[rng.usize(..live.len())].clone();
    let (to, target) = loop {
        let other = live[rng.usize(..live.len())].clone();
        if other.0 != from {
            break other;
        }
    };
    let kind = match rng.u8(0..100) {
        0..35 => Kind::Durable,
        35..50 => Kind::Live,
        50..70 => Kind::Dm,
        70..80 => Kind::Mention,
        80..90 => Kind::Task,
        _ => Kind::Reply,
    };
    let role = ROLES[rng.usize(..ROLES.len())];
    let (routing, owed, mentions) = match kind {
        Kind::Durable | Kind::Reply => (
            Routing::Channel(TEAM.into()),
            vec![Owe::Members { sender: from }],
            vec![],
        ),
        Kind::Live => (Routing::Channel(CHATTER.into()), vec![], vec![]),
        Kind::Dm => (Routing::To(target.id.clone()), vec![Owe::Agent(to)], vec![]),
        // On a live channel a mention is stored for its target (§4); on a durable one only
        // the channel's members get it, as any post.
        Kind::Mention => (
            Routing::Channel(CHATTER.into()),
            vec![Owe::Agent(to)],
            vec![target.name.clone()],
        ),
        Kind::Task => (
            Routing::ToService(role.into()),
            vec![Owe::Role(role.into())],
            vec![],
        ),
    };
    Planned {
        token,
        kind,
        sender,
        routing,
        owed,
        mentions,
    }
}

/// Sends at `rate` per second from random agents until `stop`, each send recorded.
pub(super) async fn traffic(
    team: Team,
    ledger: Arc<Mutex<Ledger>>,
    mut rng: fastrand::Rng,
    rate: f64,
    stop: CancellationToken,
) {
    let tokens = AtomicU64::new(1);
    let last_post: Arc<Mutex<Option<String>>> = Arc::default();
    let mut sends = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let live = live_members(&team);
        if live.len() < 2 {
            continue;
        }
        let planned = plan(&mut rng, &live, tokens.fetch_add(1, Ordering::Relaxed));
        if sends.len() >= IN_FLIGHT {
            sends.join_next().await;
        }
        sends.spawn(send(planned, ledger.clone(), last_post.clone()));
    }
    while sends.join_next().await.is_some() {}
}

/// Sends one message and records the outcome: owed once the broker acknowledged it. A reply
/// answers the last durable post whose id its sender knew.
async fn send(p: Planned, ledger: Arc<Mutex<Ledger>>, last_post: Arc<Mutex<Option<String>>>) {
    let text = tagged(p.token, "from the soak");
    let reply_to = match p.kind {
        Kind::Reply => last_post.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        _ => None,
    };
    let at = Instant::now();
    let sent = p
        .sender
        .agent
        .send(p.routing, text, &p.mentions, reply_to)
        .await;
    if let (Ok(Some(id)), Kind::Durable) = (&sent, p.kind) {
        *last_post.lock().unwrap_or_else(|e| e.into_inner()) = Some(id.clone());
    }
    let mut ledger = ledger.lock().unwrap_or_else(|e| e.into_inner());
    match sent {
        Ok(_) => ledger.sent(p.token, p.kind, p.owed, at, Instant::now()),
        Err(_) => ledger.send_failed(),
    }
}

/// A DM every second from one canary to another: whether delivery progresses, as a person
/// would see it.
pub(super) struct Canary {
    sender: Client,
    receiver: Client,
    pub(super) last: Arc<Mutex<Instant>>,
    tasks: tokio::task::JoinSet<()>,
}

impl Canary {
    pub(super) async fn start(soak: &Soak) -> anyhow::Result<Canary> {
        let connect = async |name: &str| -> anyhow::Result<crate::client::Connection> {
            let out = soak
                .cli(&[
                    "mint",
                    name,
                    "--space",
                    &soak.space,
                    "--json",
                    "--subscribe",
                    CHATTER,
                ])
                .await?;
            let minted: Minted = serde_json::from_slice(&out)?;
            let mut opts = ConnectOptions::new(
                JoinLink::parse(&minted.link)?,
                std::fs::read_to_string(&minted.creds)?,
            );
            opts.ca = Some(minted.ca);
            Ok(Client::connect(opts).await?)
        };
        let sender = connect("canary-a").await?.client;
        let receiving = connect("canary-b").await?;
        let receiver = receiving.client.clone();
        let last = Arc::new(Mutex::new(Instant::now()));
        let mut tasks = tokio::task::JoinSet::new();
        let mut deliveries = receiving.deliveries;
        let seen = last.clone();
        tasks.spawn(async move {
            while let Some(delivery) = deliveries.next().await {
                *seen.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                let _ = delivery.ack().await;
            }
        });
        let (from, to) = (sender.clone(), receiver.id().clone());
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let send = from.send_text(Routing::to(&to), "canary");
                let _ = tokio::time::timeout(Duration::from_secs(5), send).await;
            }
        });
        Ok(Canary {
            sender,
            receiver,
            last,
            tasks,
        })
    }

    pub(super) async fn close(mut self) {
        self.tasks.shutdown().await;
        self.sender.close().await;
        self.receiver.close().await;
    }
}
