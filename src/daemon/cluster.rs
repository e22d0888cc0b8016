//! A cluster of appliances: `cotald cluster init` on the first node, `cotald cluster join` on
//! the others (see [`crate::provision::JoinBundle`] for what travels between them).
//!
//! Both write the node's `[cluster]` table into the data dir (`cluster/cluster.toml`), so that
//! a plain `cotald up` on that data dir starts the node with its routes; a `[cluster]` table in
//! the profile takes precedence. A joined node also gets a server name of its own
//! (`cluster/node`): the first node keeps the name its data dir always had
//! (`cotald_<operator prefix>`), which every joined node would otherwise share, since they share
//! the operator. JetStream needs each server of a cluster to have a distinct, stable name.
//!
//! All nodes run one JetStream domain (`cotald`): a cluster is one JetStream system whose
//! streams are replicated across it, not three appliances that copy to each other.

use std::net::SocketAddr;

use crate::datadir::DataDir;
use crate::profile::ClusterConfig;
use crate::provision::{Imported, JoinBundle, KeyStore, TlsFiles};

use super::DaemonError;

/// Why a node cannot be made one of a cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The data dir's `[cluster]` table does not parse.
    #[error("{path}: not a [cluster] table")]
    Table {
        /// The table.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: toml::de::Error,
    },
    /// The cluster options break a rule of the profile's `[cluster]` table, in its words.
    #[error("{0}")]
    Options(String),
    /// The bundle would be written over a file.
    #[error("{0} exists: the bundle is written to a new file")]
    BundleExists(std::path::PathBuf),
    /// The data dir served alone and holds streams a cluster would not adopt.
    #[error(
        "{0} holds the streams of an appliance that served alone, and JetStream does not adopt \
         a standalone server's streams into a new cluster: its stored messages would not be \
         served. Add --discard-history to move the store aside (to \
         jetstream.standalone-<time>; credentials, identities and the trust chain are kept), or \
         start the cluster from fresh data dirs"
    )]
    Standalone(std::path::PathBuf),
}

fn table_path(dir: &DataDir) -> std::path::PathBuf {
    dir.cluster_table()
}

fn node_path(dir: &DataDir) -> std::path::PathBuf {
    dir.node_name()
}

/// The broker's `server_name`: `cotald_<first 12 characters of the operator>`, or the name a
/// joined node was given.
pub fn server_name(dir: &DataDir, keys: &KeyStore) -> String {
    std::fs::read_to_string(node_path(dir))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("cotald_{}", &keys.operator_public()[..12]))
}

/// The `[cluster]` table `cluster init` or `join` wrote, if any.
pub fn read_joined(dir: &DataDir) -> Result<Option<ClusterConfig>, DaemonError> {
    let path = table_path(dir);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    #[derive(serde::Deserialize)]
    struct Table {
        cluster: ClusterConfig,
    }
    let table: Table =
        toml::from_str(&text).map_err(|source| ClusterError::Table { path, source })?;
    Ok(Some(table.cluster))
}

fn write_table(dir: &DataDir, c: &ClusterConfig) -> Result<(), DaemonError> {
    if let Some(parent) = table_path(dir).parent() {
        crate::files::private_dir(parent)?;
    }
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let routes: Vec<String> = c.routes.iter().map(|r| quote(r)).collect();
    let mut text = format!(
        "# Written by `cotald cluster init` / `join`; a [cluster] table in the profile \
         takes precedence.\n[cluster]\nname = {}\nlisten = {}\nroutes = [{}]\n",
        quote(&c.name),
        quote(&c.listen.to_string()),
        routes.join(", ")
    );
    if let Some(r) = c.replicas {
        text.push_str(&format!("replicas = {r}\n"));
    }
    crate::files::write_atomic(&table_path(dir), text.as_bytes(), 0o600)?;
    Ok(())
}

/// What `cluster init` and `join` take.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// This node's route listener.
    pub listen: SocketAddr,
    /// The other nodes' route listeners (`host:port`).
    pub routes: Vec<String>,
    /// Replicas, when not the default.
    pub replicas: Option<usize>,
}

fn validated(name: &str, node: &NodeOptions) -> Result<ClusterConfig, DaemonError> {
    let config = ClusterConfig {
        name: name.to_owned(),
        listen: node.listen,
        routes: node.routes.clone(),
        replicas: node.replicas,
    };
    // The profile's own checks, on a profile made of this table alone.
    let mut profile = crate::profile::Profile::embedded().map_err(DaemonError::EmbeddedProfile)?;
    profile.cluster = Some(config.clone());
    profile.validate().map_err(ClusterError::Options)?;
    Ok(config)
}

/// Whether the data dir's JetStream store holds streams (of any account).
fn holds_streams(dir: &DataDir) -> bool {
    let accounts = dir.jetstream().join("jetstream");
    std::fs::read_dir(accounts)
        .into_iter()
        .flatten()
        .flatten()
        .any(|account| {
            std::fs::read_dir(account.path().join("streams"))
                .into_iter()
                .flatten()
                .flatten()
                .next()
                .is_some()
        })
}

/// `cotald cluster init`: makes this data dir's trust chain the cluster's (created if it has
/// none yet), writes its `[cluster]` table and the join bundle at `bundle`.
///
/// A data dir that served alone and holds streams is refused unless `discard_history`:
/// JetStream does not adopt a standalone server's streams into a new cluster (the server
/// recovers them, but the meta group formed with the new nodes does not know them, and the
/// space's bootstrap then creates empty replicated streams of the same names). With
/// `discard_history` the store is moved aside (`jetstream.standalone-<unix time>`), never
/// deleted; the trust chain, the server name, the client port and the identities are kept,
/// so every credential handed out keeps working. Run again on a node already clustered (to
/// hand a new space to the others), it refuses nothing.
pub fn init(
    dir: &DataDir,
    name: &str,
    node: &NodeOptions,
    bundle: &std::path::Path,
    discard_history: bool,
) -> Result<JoinBundle, DaemonError> {
    let config = validated(name, node)?;
    if bundle.exists() {
        return Err(ClusterError::BundleExists(bundle.to_owned()).into());
    }
    let clustered = read_joined(dir).ok().flatten().is_some();
    if !clustered && holds_streams(dir) {
        if !discard_history {
            return Err(ClusterError::Standalone(dir.root().to_owned()).into());
        }
        let aside = dir.root().join(format!(
            "jetstream.standalone-{}",
            crate::provision::now_secs()
        ));
        std::fs::rename(dir.jetstream(), &aside).map_err(|e| {
            DaemonError::File(crate::files::FileError::new(
                &dir.jetstream(),
                "moving aside",
                e,
            ))
        })?;
        tracing::warn!(to = %aside.display(), "the standalone JetStream store was moved aside");
    }
    let keys = KeyStore::load_or_create(&dir.keys())?;
    keys.ensure_space("main")?;
    // The server certificate is issued again at the node's start, for its own names.
    let lifetime = crate::profile::BrokerConfig::default_certificate_lifetime().duration();
    TlsFiles::ensure(&dir.tls(), &[], lifetime)?;
    let exported = JoinBundle::export(&dir.keys(), &dir.tls(), name)?;
    exported.write(bundle)?;
    write_table(dir, &config)?;
    Ok(exported)
}

/// `cotald cluster join`: imports the bundle's trust chain into this data dir, names the node,
/// writes its `[cluster]` table.
pub fn join(
    dir: &DataDir,
    bundle: &std::path::Path,
    node: &NodeOptions,
) -> Result<Imported, DaemonError> {
    let bundle = JoinBundle::read(bundle)?;
    let config = validated(&bundle.cluster, node)?;
    crate::files::private_dir(dir.root())?;
    let imported = bundle.import(&dir.keys(), &dir.tls())?;
    if imported.trust_chain {
        let suffix = uuid::Uuid::now_v7().simple().to_string();
        let name = format!(
            "cotald_{}_{}",
            &bundle.operator_public()[..12],
            &suffix[suffix.len() - 8..]
        );
        if let Some(parent) = node_path(dir).parent() {
            crate::files::private_dir(parent)?;
        }
        crate::files::write_atomic(&node_path(dir), format!("{name}\n").as_bytes(), 0o600)?;
    }
    write_table(dir, &config)?;
    Ok(imported)
}
