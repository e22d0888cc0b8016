//! `cotald cluster init|join`: one trust chain for a cluster of appliances (see
//! [`crate::daemon::cluster`] and [`crate::provision::JoinBundle`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use super::DataDirArg;
use crate::daemon::cluster::{self, NodeOptions};

/// Options of `cotald cluster`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
    #[command(flatten)]
    pub(super) data_dir: DataDirArg,
}

/// Where this node's routes listen and which nodes it dials.
#[derive(Debug, Args)]
struct NodeArgs {
    /// This node's route listener.
    #[arg(long)]
    listen: SocketAddr,
    /// Another node's route listener, host:port (repeat).
    #[arg(long = "route")]
    routes: Vec<String>,
    /// Stream replicas [default: 3 with at least 3 nodes, else 1].
    #[arg(long)]
    replicas: Option<usize>,
}

impl NodeArgs {
    fn options(self) -> NodeOptions {
        NodeOptions {
            listen: self.listen,
            routes: self.routes,
            replicas: self.replicas,
        }
    }
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// On the first node: make this data dir's trust chain the cluster's and write the join
    /// bundle (operator, system account, space accounts and the CA; owner-only: copy it to
    /// the other nodes over a channel you trust, then delete it).
    Init {
        /// The cluster's name.
        #[arg(long)]
        name: String,
        #[command(flatten)]
        node: NodeArgs,
        /// Where to write the bundle (must not exist).
        #[arg(long)]
        out: PathBuf,
        /// This data dir served alone and holds streams, which JetStream cannot adopt into a
        /// new cluster: move its store aside (nothing is deleted) and go on. Credentials,
        /// identities and the trust chain are kept; the stored messages are not served.
        #[arg(long)]
        discard_history: bool,
    },
    /// On every other node, with a fresh data dir: take the cluster's trust chain from the
    /// bundle and remember this node's routes; then `cotald up`.
    Join {
        /// The bundle `cluster init` wrote.
        bundle: PathBuf,
        #[command(flatten)]
        node: NodeArgs,
    },
}

pub(super) async fn run(args: ClusterArgs) -> anyhow::Result<ExitCode> {
    let dir = args.data_dir.resolve()?;
    if dir.is_locked().unwrap_or(false) {
        bail!(
            "cotald is running on data dir {}: stop it first (`cotald down`)",
            dir.root().display()
        );
    }
    match args.command {
        ClusterCommand::Init {
            name,
            node,
            out,
            discard_history,
        } => {
            let node = node.options();
            let listen = node.listen;
            let bundle = cluster::init(&dir, &name, &node, &out, discard_history)
                .with_context(|| format!("cluster init in {}", dir.root().display()))?;
            println!(
                "cluster {name}: join bundle written to {} ({} space(s)); on each other node:",
                out.display(),
                bundle.spaces.len()
            );
            println!("  cotald cluster join BUNDLE --listen HOST:PORT --route {listen} ...");
            println!("then `cotald up` on every node.");
        }
        ClusterCommand::Join { bundle, node } => {
            let node = node.options();
            let imported = cluster::join(&dir, &bundle, &node)
                .with_context(|| format!("cluster join in {}", dir.root().display()))?;
            if imported.trust_chain {
                println!("joined: the cluster's trust chain is this data dir's");
            }
            if !imported.spaces.is_empty() {
                println!("spaces added: {}", imported.spaces.join(", "));
            }
            println!("start the node with `cotald up`");
        }
    }
    Ok(ExitCode::SUCCESS)
}
