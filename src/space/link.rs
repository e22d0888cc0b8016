//! The provisioner's connection to the broker, which every service of the space shares, and
//! what is known of its state.
//!
//! The NATS library reconnects on its own after a drop, and says so by its events; this keeps
//! when the connection went down (`None` while it is up), so that the connection watch
//! (`services::link`) reports a space that cannot reach its broker. A connection whose task
//! ended for good (closed; before async-nats 0.52 a malformed frame could panic it) answers
//! nothing ever again: [`Link::redial`] replaces it, and each service, restarted when its
//! subscriptions end, takes the new one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use async_nats::jetstream::{self, context::KeyValueError, kv};
use tokio::sync::watch;

use crate::binding::Creds;
use crate::client::DialError;

/// Whether the connection is up, and since when it is not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkState {
    /// When it went down, while it is down.
    pub down_since: Option<Instant>,
    /// How many times it went down.
    pub drops: u64,
}

/// The connection, the JetStream context over it, and the key-value handles opened over it.
#[derive(Clone)]
struct Conn {
    client: async_nats::Client,
    js: jetstream::Context,
    /// By bucket. Opening a handle asks the broker for the bucket's stream info: a handle kept
    /// spares that round trip to every read and write of a key after the first (a durable
    /// join read the channel registry and wrote the members registry through handles opened
    /// anew, two `STREAM.INFO`s each). They go with the connection they were opened on.
    stores: Arc<Mutex<HashMap<String, kv::Store>>>,
}

/// The space's connection, replaceable.
pub(super) struct Link {
    creds: Creds,
    name: String,
    ca: PathBuf,
    addr: SocketAddr,
    conn: RwLock<Conn>,
    /// Grows with every new connection: what holds a handle made over an older one makes it
    /// again.
    generation: AtomicU64,
    state: watch::Sender<LinkState>,
}

impl Link {
    /// Dials the broker at `addr` as `creds` (TLS, trusting `ca`).
    pub(super) async fn dial(
        creds: Creds,
        name: String,
        ca: PathBuf,
        addr: SocketAddr,
    ) -> Result<Link, DialError> {
        let (state, _) = watch::channel(LinkState::default());
        let conn = connect(&creds, &name, &ca, addr, &state).await?;
        Ok(Link {
            creds,
            name,
            ca,
            addr,
            conn: RwLock::new(conn),
            generation: AtomicU64::new(0),
            state,
        })
    }

    /// The connection (a cheap handle).
    pub(super) fn client(&self) -> async_nats::Client {
        self.read().client
    }

    /// JetStream over the connection.
    pub(super) fn jetstream(&self) -> jetstream::Context {
        self.read().js
    }

    /// The key-value bucket `bucket` over the connection, opened at its first use.
    pub(super) async fn key_value(&self, bucket: &str) -> Result<kv::Store, KeyValueError> {
        let conn = self.read();
        let kept = conn.stores.lock().ok().and_then(|s| s.get(bucket).cloned());
        if let Some(store) = kept {
            return Ok(store);
        }
        let store = conn.js.get_key_value(bucket).await?;
        if let Ok(mut stores) = conn.stores.lock() {
            stores.insert(bucket.to_owned(), store.clone());
        }
        Ok(store)
    }

    fn read(&self) -> Conn {
        self.conn.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Which connection this is: grows with each [`Link::redial`].
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The broker's address.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the connection is up.
    pub(super) fn state(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }

    /// Another connection as the same user, named `<name>-<purpose>`, for a service whose
    /// traffic must not wait behind the shared connection's (or hold it up); not tracked: its
    /// owner drops it, and dials again when it closed for good.
    pub(super) async fn dial_another(
        &self,
        purpose: &str,
    ) -> Result<async_nats::Client, DialError> {
        dial_other(&self.creds, &self.name, &self.ca, self.addr, purpose).await
    }

    /// Replaces a connection that closed for good with a new one.
    pub(super) async fn redial(&self) -> Result<(), DialError> {
        let fresh = connect(&self.creds, &self.name, &self.ca, self.addr, &self.state).await?;
        let old = std::mem::replace(
            &mut *self.conn.write().unwrap_or_else(|e| e.into_inner()),
            fresh,
        );
        drop(old);
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.state.send_modify(|s| s.down_since = None);
        Ok(())
    }
}

/// A connection as `creds`, named `<name>-<purpose>`, beside the link named `name`
/// ([`Link::dial_another`]).
pub(super) async fn dial_other(
    creds: &Creds,
    name: &str,
    ca: &std::path::Path,
    addr: SocketAddr,
    purpose: &str,
) -> Result<async_nats::Client, DialError> {
    crate::client::dial(creds, format!("{name}-{purpose}"), ca, addr).await
}

async fn connect(
    creds: &Creds,
    name: &str,
    ca: &std::path::Path,
    addr: SocketAddr,
    state: &watch::Sender<LinkState>,
) -> Result<Conn, DialError> {
    let events = state.clone();
    let client = crate::client::nats_options(creds, name, Some(ca), true)?
        .event_callback(move |event| {
            let events = events.clone();
            async move {
                match event {
                    async_nats::Event::Disconnected => events.send_modify(|s| {
                        s.down_since.get_or_insert_with(Instant::now);
                        s.drops += 1;
                    }),
                    async_nats::Event::Connected => events.send_modify(|s| s.down_since = None),
                    _ => {}
                }
            }
        })
        .connect(format!("tls://{addr}"))
        .await?;
    let js = jetstream::new(client.clone());
    Ok(Conn {
        client,
        js,
        stores: Arc::default(),
    })
}
