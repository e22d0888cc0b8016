//! Phases 2 to 4: what the appliance prepares before its broker starts. The broker executable
//! installed, the listeners claimed, keys and TLS provisioned (every space's account keys
//! included), the JetStream storage budget read from the disk, and the broker's configuration
//! rendered from all of it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::renewal::ServerCertificate;
use super::{DaemonError, Options, Prepared, READY_TIMEOUT, STOP_DEADLINE, budget, cluster};
use crate::datadir::DataDir;
use crate::profile::{ClusterConfig, Profile};
use crate::provision::{KeyStore, ProvisionError, TlsFiles};
use crate::space::store;
use crate::supervisor::{self, BrokerSpec, ServerConf};

/// Installs the broker, provisions keys and TLS, and renders the broker's configuration; the
/// data dir is locked already.
pub(super) async fn prepare(opts: &Options) -> Result<(Prepared, BrokerSpec), DaemonError> {
    let dir = &opts.data_dir;
    let executable = opts.broker.install(&dir.bin(), &dir.broker_verified())?;
    let broker_version = opts.broker.version().unwrap_or("unknown").to_owned();
    let (listen, cluster) = claim_listeners(opts, &executable).await?;
    let hostnames = hostnames(opts, listen);
    let keys = KeyStore::load_or_create(&dir.keys())?;
    let lifetime = opts.profile.broker.certificate_lifetime.duration();
    let tls = TlsFiles::ensure(&dir.tls(), &hostnames, lifetime)?;
    let certificate = ServerCertificate {
        dir: dir.tls(),
        hostnames: hostnames.clone(),
        lifetime,
        expires: tls.server_expires,
    };
    let spaces = Spaces::to_serve(opts, &keys)?;
    tracing::info!(spaces = spaces.all.len(), "phase: provisioned keys and TLS");
    let store_limit = store_limit(dir)?;
    if let Some(c) = &cluster {
        tracing::info!(
            cluster = c.name,
            routes = ?c.routes,
            replicas = c.replicas(),
            "clustered: routes to the other nodes"
        );
    }
    let server_name = cluster::server_name(dir, &keys);
    let conf = ServerConf {
        server_name: server_name.clone(),
        host: listen.ip(),
        port: (listen.port() != 0).then_some(listen.port()),
        monitor: opts.profile.broker.monitor,
        ports_file_dir: dir.run(),
        operator_jwt: keys.operator_jwt()?,
        system_account: keys.system_account(),
        system_account_jwt: keys.system_account_jwt()?,
        resolver_dir: dir.resolver(),
        store_dir: dir.jetstream(),
        max_file_store: store_limit,
        sync_interval: opts.profile.broker.sync_interval.clone(),
        tls_cert: tls.server_cert.clone(),
        tls_key: tls.server_key.clone(),
        tls_ca: tls.ca_cert.clone(),
        cluster: cluster.as_ref().map(cluster_conf),
        leaf_remotes: leaf_remotes(&opts.profile, &keys)?,
    };
    let spec = BrokerSpec {
        executable,
        conf,
        conf_path: dir.broker_conf(),
        log_path: dir.broker_log(),
        ready_timeout: READY_TIMEOUT,
        stop_deadline: STOP_DEADLINE,
        access: supervisor::BrokerAccess {
            creds: keys.system_user_creds()?,
            ca: tls.ca_cert.clone(),
        },
    };
    let prepared = Prepared {
        dir: dir.clone(),
        spaces: spaces.all,
        profile_spaces: spaces.profile,
        store_limit,
        unserved: spaces.unserved,
        hostnames,
        ca_cert: tls.ca_cert,
        keys,
        broker_version,
        replicas: cluster.as_ref().map(ClusterConfig::replicas),
        node: server_name,
        profile_text: opts.profile.text.clone(),
        certificate,
    };
    Ok((prepared, spec))
}

/// The client listener (its port kept from the last start when it was picked), and the
/// cluster's table when this node is one of a cluster: both claimed from whatever holds them
/// (a broker left behind by a crash of this data dir's appliance).
async fn claim_listeners(
    opts: &Options,
    executable: &std::path::Path,
) -> Result<(SocketAddr, Option<ClusterConfig>), DaemonError> {
    let dir = &opts.data_dir;
    let broker = &opts.profile.broker;
    let listen = keep_picked_port(opts.listen.unwrap_or(broker.listen), dir);
    let cluster = match &opts.profile.cluster {
        Some(c) => Some(c.clone()),
        None => cluster::read_joined(dir)?,
    };
    let mut listeners = vec![listen];
    listeners.extend(broker.monitor);
    listeners.extend(cluster.as_ref().map(|c| c.listen));
    supervisor::claim(&dir.run(), executable, &dir.broker_conf(), &listeners).await?;
    Ok((listen, cluster))
}

/// The spaces to serve: those added while running (remembered in the data dir) and the
/// profile's, which win; each with its account keys.
struct Spaces {
    all: std::collections::BTreeMap<String, crate::profile::SpaceConfig>,
    /// The profile's: served first, so they get their storage first.
    profile: std::collections::BTreeSet<String>,
    /// Known already not to be servable (an unreadable record).
    unserved: Vec<crate::datadir::UnservedSpace>,
}

impl Spaces {
    fn to_serve(opts: &Options, keys: &KeyStore) -> Result<Spaces, DaemonError> {
        let (mut all, mut unserved) = store::runtime_spaces(&opts.data_dir);
        for (name, config) in &opts.profile.spaces {
            all.insert(name.clone(), config.clone());
            unserved.retain(|u| &u.name != name);
        }
        for name in all.keys() {
            keys.ensure_space(name)?;
        }
        Ok(Spaces {
            all,
            profile: opts.profile.spaces.keys().cloned().collect(),
            unserved,
        })
    }
}

/// The JetStream storage budget of the data dir's disk ([`budget`]).
fn store_limit(dir: &DataDir) -> Result<i64, DaemonError> {
    let limit = budget::store_limit(dir.root(), &dir.jetstream()).map_err(|source| {
        DaemonError::FreeSpace {
            path: dir.root().to_owned(),
            source,
        }
    })?;
    tracing::info!(
        limit = crate::profile::human_size(limit.max(0) as u64),
        "JetStream storage budget: three quarters of the free disk space plus what it stores"
    );
    Ok(limit)
}

fn cluster_conf(c: &ClusterConfig) -> supervisor::ClusterConf {
    supervisor::ClusterConf {
        name: c.name.clone(),
        host: c.listen.ip(),
        port: c.listen.port(),
        routes: c.routes.clone(),
    }
}

/// The names the server certificate covers and links name: the profile's and `--hostname`'s,
/// the listener's address when it is a specific one, else the machine's outward address.
fn hostnames(opts: &Options, listen: SocketAddr) -> Vec<String> {
    let mut hostnames = opts.profile.broker.hostnames.clone();
    hostnames.extend(opts.hostnames.iter().cloned());
    if !listen.ip().is_unspecified() && !listen.ip().is_loopback() {
        hostnames.push(listen.ip().to_string());
    }
    if listen.ip().is_unspecified()
        && hostnames.is_empty()
        && let Some(outward) = outward_address(listen.ip())
    {
        // Links must name a host remote peers can dial and the certificate covers.
        hostnames.push(outward.to_string());
    }
    hostnames
}

/// The leaf remotes of the profile's `[leaf]`: one per bridged space, bound to its account.
fn leaf_remotes(
    profile: &Profile,
    keys: &KeyStore,
) -> Result<Vec<supervisor::LeafRemote>, ProvisionError> {
    let Some(leaf) = &profile.leaf else {
        return Ok(Vec::new());
    };
    leaf.spaces(profile)
        .iter()
        .map(|space| {
            Ok(supervisor::LeafRemote {
                url: leaf.remote.clone(),
                account: keys.ensure_space(space)?.account_public(),
                credentials: leaf.credentials.clone(),
                ca: leaf.ca.clone(),
            })
        })
        .collect()
}

/// `listen` as given, except that a port 0 becomes the port this data dir's appliance picked
/// last time on the same address, when that port is free: the join links handed out then
/// stay valid. When it is taken, a new port is picked and the warning says the links change.
fn keep_picked_port(listen: SocketAddr, dir: &DataDir) -> SocketAddr {
    let last = dir.read_last_served().map(|l| l.listen);
    keep_picked(
        listen,
        last,
        "join links handed out before name the old one",
    )
}

/// `listen` as given, except that a port 0 on the address of `last` becomes `last`'s port when
/// it is free; when it is taken, a new port is picked, and the warning says so and what that
/// changes (`changes`).
pub(super) fn keep_picked(
    listen: SocketAddr,
    last: Option<SocketAddr>,
    changes: &str,
) -> SocketAddr {
    let Some(last) = last else {
        return listen;
    };
    if listen.port() != 0 || last.ip() != listen.ip() {
        return listen;
    }
    match std::net::TcpListener::bind(last) {
        Ok(_) => last,
        Err(e) => {
            tracing::warn!(
                port = last.port(),
                error = %e,
                "the port picked last time is taken; a new one is picked, and {changes}"
            );
            listen
        }
    }
}

/// The address of this machine that others on its network most likely dial: the source
/// address of its default route, found by connecting a UDP socket (which sends nothing).
/// `None` when there is no route (an offline machine): links then name loopback.
fn outward_address(family: IpAddr) -> Option<IpAddr> {
    let (bind, probe): (SocketAddr, SocketAddr) = match family {
        IpAddr::V4(_) => (
            (Ipv4Addr::UNSPECIFIED, 0).into(),
            (Ipv4Addr::new(192, 0, 2, 1), 9).into(),
        ),
        IpAddr::V6(_) => (
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
            ("2001:db8::1".parse::<std::net::Ipv6Addr>().ok()?, 9).into(),
        ),
    };
    let socket = std::net::UdpSocket::bind(bind).ok()?;
    socket.connect(probe).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified() && !ip.is_loopback()).then_some(ip)
}
