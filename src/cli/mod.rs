//! The `cotald` command line: thin over the library. Errors become `anyhow` here, at the edge.

mod endpoint;
mod mcp;
mod membership;
mod mint;
mod revoke;
mod space;
mod status;
mod up;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::datadir::DataDir;
use crate::supervisor::BrokerBinary;

/// cotald: a secure, real-time coordination space for AI agents (Cotal v0.3 over NATS).
///
/// `cotald up` starts the appliance: a bundled nats-server with JetStream, its own trust
/// chain (operator, one account per space) and TLS. Agents join with a link such as
/// `cotals://127.0.0.1:4222/main`, a `.creds` file and the CA certificate.
#[derive(Debug, Parser)]
#[command(name = "cotald", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug, -vvv trace; RUST_LOG overrides).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the appliance in the foreground; Ctrl-C or SIGTERM stops it cleanly.
    ///
    /// Prints the join link of each space, where the CA certificate and your own credentials
    /// were written, and what to try next. Keys and certificates are created on the first run
    /// and reused afterwards, so credentials handed out stay valid across restarts.
    Up(up::UpArgs),
    /// Report whether the appliance of a data dir is running and healthy (exit 0 only then).
    Status(status::StatusArgs),
    /// Mint a credential (`.creds`) for an agent, observer or admin of a space.
    ///
    /// With the appliance running, its durables (`dm_<id>`, `svc_<role>`) are created at once,
    /// so a client built from the credential alone receives DMs and anycast; without it, they
    /// are created at the next `cotald up`. Channel lists are strict: `foo/bar`, `a.>.b` or an
    /// empty segment are refused, never rewritten.
    Mint(mint::MintArgs),
    /// Revoke an identity: the broker refuses its credentials from now on and closes its
    /// connections; its durables, durable memberships and backlog are deleted.
    Revoke(revoke::RevokeArgs),
    /// Add or list the spaces of a running appliance.
    Space(space::SpaceArgs),
    /// Send one message as the credential's identity (multicast, unicast or anycast).
    Send(endpoint::SendArgs),
    /// Join channels (and optionally DMs and a role's anycast) and print what arrives.
    ///
    /// History is replayed per the channel's config unless --no-history; a message is acked
    /// only after it was printed. Exiting is not leaving: no durable membership is dropped.
    Tail(endpoint::TailArgs),
    /// Join a channel; on a durable channel, become a durable member from now on.
    ///
    /// A durable member's backlog is kept from the moment of the join, and delivered (at least
    /// once, acked only when handled) whenever it is connected, e.g. by `cotald tail`. Exits 1
    /// when the channel is durable but the membership could not be established.
    Join(membership::JoinArgs),
    /// End a durable membership: nothing published from now on is kept for you.
    ///
    /// Works after your credential's read ACL narrowed; messages published before the leave
    /// are still delivered.
    Leave(membership::LeaveArgs),
    /// Serve MCP on stdio: an AI agent host (Claude Code, Codex, ...) launches this to join the
    /// space as one endpoint for as long as it runs.
    ///
    /// Presence, the joins of the link's channels, DMs and the credential's anycast role are
    /// held for the whole session; messages wait in an inbox the agent reads with the
    /// `cotal_inbox` tool, and are acknowledged only once returned to it. Logs go to stderr.
    /// `--print-config` prints what to put in the host's config.
    Mcp(mcp::McpArgs),
}

/// The data dir option every local command takes.
#[derive(Debug, Clone, Args)]
pub struct DataDirArg {
    /// Where the appliance keeps its keys, certificates, streams and logs
    /// [default: $XDG_DATA_HOME/cotald or ~/.local/share/cotald]
    #[arg(long, env = "COTALD_DATA_DIR", value_name = "DIR", global = true)]
    pub data_dir: Option<PathBuf>,
}

impl DataDirArg {
    fn resolve(&self) -> anyhow::Result<DataDir> {
        Ok(DataDir::new(match &self.data_dir {
            Some(dir) => dir.clone(),
            None => DataDir::default_root()?,
        }))
    }
}

/// Runs the parsed command. `embedded` is the broker compiled into the executable.
pub fn run(cli: Cli, embedded: BrokerBinary) -> ExitCode {
    install_tracing(cli.verbose, matches!(cli.command, Command::Up(_)));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Up(args) => up::run(args, embedded).await,
            Command::Status(args) => status::run(args).await,
            Command::Mint(args) => mint::run(args).await,
            Command::Revoke(args) => revoke::run(args).await,
            Command::Space(args) => space::run(args).await,
            Command::Send(args) => endpoint::send(args).await,
            Command::Tail(args) => endpoint::tail(args).await,
            Command::Join(args) => membership::join(args).await,
            Command::Leave(args) => membership::leave(args).await,
            Command::Mcp(args) => mcp::run(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) if stdout_closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Stdout was closed under a write: its reader (`cotald status | head -1`) has what it wanted,
/// so the command ends quietly, with success.
#[derive(Debug, thiserror::Error)]
#[error("stdout is closed")]
struct StdoutClosed;

/// Whether `e` is, or was caused by, [`StdoutClosed`].
fn stdout_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| cause.is::<StdoutClosed>())
}

/// Runs `write` on the locked stdout and flushes it. A closed pipe becomes [`StdoutClosed`]:
/// Rust ignores SIGPIPE, so a write there fails with `BrokenPipe` (and `println!` panics).
fn stdout(
    write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match write(&mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        result => Ok(result?),
    }
}

fn install_tracing(verbose: u8, serving: bool) {
    use tracing_subscriber::EnvFilter;
    let level = match (verbose, serving) {
        (0, true) => "info",
        (0, false) => "warn",
        (1, _) => "info",
        (2, _) => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{level},async_nats=warn")));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
