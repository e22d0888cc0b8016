//! The `cotald` command line: thin over the library. Errors become `anyhow` here, at the edge.

mod backup;
mod channels;
mod cluster;
mod context;
mod down;
mod endpoint;
mod identities;
mod log;
mod mcp;
mod membership;
mod mint;
mod revoke;
mod roster;
mod send;
mod shell;
mod space;
mod status;
mod tail;
mod terminal;
mod up;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::datadir::DataDir;
use crate::supervisor::BrokerBinary;

/// cotald: a secure, real-time coordination space for AI agents (Cotal v0.3 over NATS).
///
/// `cotald up` starts the appliance: a bundled nats-server with JetStream, its own trust
/// chain (operator, one account per space) and TLS. Agents join with a link such as
/// `cotals://127.0.0.1:4222/main`, a `.creds` file and the CA certificate.
///
/// On the appliance's machine, `send`, `tail`, `join`, `leave`, `roster` and `channels` need
/// no connection flag: they act as the machine operator of space `main` (`--space` picks
/// another, `--as NAME` a minted identity). For a remote appliance, save a context
/// (`cotald context add`) or set COTALD_LINK, COTALD_CREDS and COTALD_CA.
#[derive(Debug, Parser)]
#[command(
    name = "cotald",
    version,
    long_version = LONG_VERSION,
    about,
    long_about = None,
    propagate_version = true
)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug, -vvv trace; RUST_LOG overrides).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// How log lines on stderr look: `text` (coloured only on a terminal, never with NO_COLOR
    /// set) or `json` (one object per line, for log collectors).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub leading: Leading,
    #[command(subcommand)]
    pub command: Command,
    /// The options given on the command line after the command (by argument id): those win
    /// over the same given before it; a value from the environment does not.
    #[arg(skip)]
    pub given_after: Vec<String>,
}

impl Cli {
    /// Parses the process's command line (`--help` and errors exit, as clap does).
    pub fn parse_args() -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Cli::command().get_matches();
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        if let Some((_, after)) = matches.subcommand() {
            cli.given_after = after
                .ids()
                .filter(|id| {
                    after.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine)
                })
                .map(|id| id.as_str().to_owned())
                .collect();
        }
        cli
    }
}

/// The space an endpoint command, `mint`, `revoke` and `identities` act in when none is named.
const DEFAULT_SPACE: &str = "main";

/// Where and as whom to act, given before the command (`cotald --context prod send hi`) as
/// well as after it; after it wins. Each applies to the commands that take it after them.
#[derive(Debug, Default, clap::Args)]
#[command(next_help_heading = "Options for the command (also accepted after it)")]
pub struct Leading {
    /// The data dir [default: $COTALD_DATA_DIR, else $XDG_DATA_HOME/cotald or
    /// ~/.local/share/cotald]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<std::path::PathBuf>,
    /// Use this saved context (`cotald context ls`).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// The join link.
    #[arg(long, value_name = "LINK")]
    pub link: Option<String>,
    /// The `.creds` file.
    #[arg(long, value_name = "FILE")]
    pub creds: Option<std::path::PathBuf>,
    /// The CA certificate to trust.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<std::path::PathBuf>,
    /// The space to act in.
    #[arg(long, value_name = "SPACE")]
    pub space: Option<String>,
    /// Act as this identity minted on the local appliance.
    #[arg(long = "as", value_name = "NAME")]
    pub as_name: Option<String>,
}

impl Leading {
    /// The options given, by flag, for a refusal.
    fn given(&self) -> Vec<&'static str> {
        [
            ("--data-dir", self.data_dir.is_some()),
            ("--context", self.context.is_some()),
            ("--link", self.link.is_some()),
            ("--creds", self.creds.is_some()),
            ("--ca", self.ca.is_some()),
            ("--space", self.space.is_some()),
            ("--as", self.as_name.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }
}

/// The options given before the command, and which were given after it too.
pub(crate) struct Before<'a> {
    pub(crate) leading: &'a Leading,
    pub(crate) given_after: &'a [String],
}

impl Before<'_> {
    /// `slot` as given after the command, else as given before it, else as it was (its
    /// environment variable, if any).
    pub(crate) fn fill<T: Clone>(&self, slot: &mut Option<T>, id: &str, before: &Option<T>) {
        if before.is_some() && !self.given_after.iter().any(|given| given == id) {
            slot.clone_from(before);
        }
    }
}

impl Command {
    /// Hands the options given before the command to it; one it does not take is refused, as
    /// it would be after it.
    fn inherit(&mut self, before: &Before<'_>) -> anyhow::Result<()> {
        let leading = before.leading;
        let endpoint = match self {
            Command::Send(a) => Some(&mut a.endpoint),
            Command::Tail(a) => Some(&mut a.endpoint),
            Command::Join(a) => Some(&mut a.endpoint),
            Command::Leave(a) => Some(&mut a.endpoint),
            Command::Roster(a) => Some(&mut a.endpoint),
            Command::Channels(a) => Some(&mut a.endpoint),
            Command::Mcp(a) => Some(&mut a.endpoint),
            _ => None,
        };
        if let Some(endpoint) = endpoint {
            endpoint.inherit(before);
            return Ok(());
        }
        let (data_dir, space) = match self {
            Command::Up(a) => (Some(&mut a.data_dir), None),
            Command::Status(a) => (Some(&mut a.data_dir), None),
            Command::Down(a) => (Some(&mut a.data_dir), None),
            Command::Backup(a) => (Some(&mut a.data_dir), None),
            Command::Restore(a) => (Some(&mut a.data_dir), None),
            Command::Space(a) => (Some(&mut a.data_dir), None),
            Command::Cluster(a) => (Some(&mut a.data_dir), None),
            Command::Mint(a) => (Some(&mut a.data_dir), Some(&mut a.space)),
            Command::Revoke(a) => (Some(&mut a.data_dir), Some(&mut a.space)),
            Command::Identities(a) => (Some(&mut a.data_dir), Some(&mut a.space)),
            _ => (None, None),
        };
        let taken: &[&str] = match (&data_dir, &space) {
            (Some(_), Some(_)) => &["--data-dir", "--space"],
            (Some(_), None) => &["--data-dir"],
            _ => &[],
        };
        let refused: Vec<&str> = leading
            .given()
            .into_iter()
            .filter(|flag| !taken.contains(flag))
            .collect();
        if !refused.is_empty() {
            anyhow::bail!(
                "{} does not apply to this command (see its --help)",
                refused.join(", ")
            );
        }
        if let Some(d) = data_dir {
            d.inherit(before);
        }
        if let Some(s) = space {
            before.fill(s, "space", &leading.space);
        }
        Ok(())
    }
}

/// What `cotald --version` prints: the build, the broker it bundles and the spec it speaks.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("COTALD_GIT_REVISION"),
    ")\nnats-server ",
    env!("COTALD_NATS_SERVER_VERSION"),
    " (bundled)\nCotal Wire Specification v0.3",
);

/// The format of log lines on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
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
    /// Report whether the appliance of a data dir is running and healthy.
    ///
    /// Exit 0 when it is running and delivery progresses: its broker healthy, every service
    /// running, no online durable member stalled; 1 when it is not running, still starting,
    /// or degraded (the text says which, and why).
    Status(status::StatusArgs),
    /// Mint a credential (`.creds`) for an agent, observer or admin of a space.
    ///
    /// With the appliance running, its durables (`dm_<id>`, `svc_<role>`) are created at once,
    /// so a client built from the credential alone receives DMs and anycast; without it, they
    /// are created at the next `cotald up`. Channel lists are strict: `foo/bar`, `a.>.b` or an
    /// empty segment are refused, never rewritten.
    Mint(mint::MintArgs),
    /// List the identities minted for a space (works with the appliance stopped).
    Identities(identities::IdentitiesArgs),
    /// Revoke an identity: the broker refuses its credentials from now on and closes its
    /// connections; its durables, durable memberships and backlog are deleted.
    Revoke(revoke::RevokeArgs),
    /// Add or list the spaces of a running appliance.
    Space(space::SpaceArgs),
    /// Form a cluster of appliances: `init` on the first node writes the join bundle, `join`
    /// on the others takes it (then `cotald up` on each).
    Cluster(cluster::ClusterArgs),
    /// Send one message as the credential's identity (multicast, unicast or anycast).
    Send(send::SendArgs),
    /// Join channels (and optionally DMs and a role's anycast) and print what arrives.
    ///
    /// History is replayed per the channel's config unless --no-history; a message is acked
    /// only after it was printed. Exiting is not leaving: no durable membership is dropped.
    Tail(tail::TailArgs),
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
    /// Stop the appliance of a data dir gracefully and wait until it has exited.
    ///
    /// The same as Ctrl-C on `cotald up`: services stop, clients are told, the broker flushes
    /// JetStream and exits. Exit 0 once stopped, or when nothing was running.
    Down(down::DownArgs),
    /// Write an archive of the running appliance's spaces: their streams and buckets (every
    /// message, every durable position), keys, identities and profile.
    ///
    /// Taken while the appliance serves; the archive is owner-only, since it holds every key.
    /// `cotald restore` makes a new data dir of it, here or on another machine.
    Backup(backup::BackupArgs),
    /// Make a new data dir from an archive of `cotald backup` (--data-dir names it; it must be
    /// new or empty).
    ///
    /// The keys, identities and profile are written at once; the streams go back into the
    /// broker at the first `cotald up` of the new data dir, before anything is served. The
    /// same credentials connect, and each durable member is handed what it had not
    /// acknowledged.
    Restore(backup::RestoreArgs),
    /// Measure cotald against raw NATS on an appliance of its own, and print the figures.
    ///
    /// Starts `cotald up` on a fresh temporary data dir, runs each case through cotald's
    /// client and through a raw async-nats baseline on the same broker, interleaved, and
    /// prints min/median/max and the ratio cotald/baseline. Takes several minutes (`--quick`:
    /// about two).
    #[cfg(feature = "bench")]
    Bench(crate::bench::BenchArgs),
    /// Run a team's week on an appliance, with churn and faults, and judge what it reports:
    /// nothing lost, nothing flat-lined, no false green.
    ///
    /// Starts `cotald up` on a fresh data dir (or, with --link, uses the one running from a
    /// data dir, in a space of its own) and a team of agents on it (a third through `cotald
    /// mcp` sessions) sending durable and live posts, DMs, mentions, tasks and replies; on a
    /// schedule drawn from --seed, agents leave and return, hosts restart, identities are
    /// minted, re-issued and revoked, a channel's config changes, the services' connection is
    /// cut, the broker is killed and stalled, the appliance restarts (not a linked one), and
    /// the server certificate is renewed. Prints progress on stderr, a table (or --json) at the
    /// end; exits 1 on any loss, read-again, duplicates past 1 %, delivery across a leave or a
    /// revocation, false green, fault not carried out, or growth without bound (judged from 10
    /// minutes).
    #[cfg(feature = "bench")]
    Soak(crate::bench::soak::SoakArgs),
    /// Print a shell completion script: `cotald completions bash > ~/.local/share/bash-completion/completions/cotald`.
    Completions(shell::CompletionsArgs),
    /// Print a manual page (roff): `cotald man | man -l -`, and each command's own with
    /// `cotald man COMMAND` (the pages the first one names, cotald-COMMAND(1)).
    Man(shell::ManArgs),
    /// Who is in the space: name, id, status (by the liveness rule), attention, role, last seen.
    Roster(roster::RosterArgs),
    /// The channels of the space: effective config, message count, last activity; `set`
    /// writes one channel's config (admin only).
    Channels(channels::ChannelsArgs),
    /// Save, select, list and remove ways to reach remote appliances.
    Context(context::ContextArgs),
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
    /// Takes `--data-dir` given before the command when it is not given after it.
    fn inherit(&mut self, before: &Before<'_>) {
        before.fill(&mut self.data_dir, "data_dir", &before.leading.data_dir);
    }

    fn resolve(&self) -> anyhow::Result<DataDir> {
        Ok(DataDir::new(match &self.data_dir {
            Some(dir) => dir.clone(),
            None => DataDir::default_root()?,
        }))
    }
}

/// Runs the parsed command. `embedded` is the broker compiled into the executable.
pub fn run(cli: Cli, embedded: BrokerBinary) -> ExitCode {
    install_tracing(
        cli.verbose,
        cli.log_format,
        matches!(cli.command, Command::Up(_)),
    );
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
    let Cli {
        leading,
        mut command,
        given_after,
        ..
    } = cli;
    let result = runtime.block_on(async {
        command.inherit(&Before {
            leading: &leading,
            given_after: &given_after,
        })?;
        match command {
            Command::Up(args) => up::run(args, embedded).await,
            Command::Status(args) => status::run(args).await,
            Command::Mint(args) => mint::run(args).await,
            Command::Revoke(args) => revoke::run(args).await,
            Command::Space(args) => space::run(args).await,
            Command::Cluster(args) => cluster::run(args).await,
            Command::Send(args) => send::send(args).await,
            Command::Tail(args) => tail::tail(args).await,
            Command::Join(args) => membership::join(args).await,
            Command::Leave(args) => membership::leave(args).await,
            Command::Down(args) => down::run(args).await,
            Command::Backup(args) => backup::backup(args).await,
            Command::Restore(args) => backup::restore(args).await,
            #[cfg(feature = "bench")]
            Command::Bench(args) => {
                let stop = stop_signal()?;
                let report = tokio::select! {
                    report = crate::bench::run(&args) => report?,
                    () = stop => anyhow::bail!(STOPPED),
                };
                stdout(|out| crate::bench::write(out, &report, args.json))?;
                Ok(ExitCode::SUCCESS)
            }
            #[cfg(feature = "bench")]
            Command::Soak(args) => crate::bench::soak::run(args, stop_signal()?).await,
            Command::Completions(args) => shell::completions(args),
            Command::Man(args) => shell::man(args),
            Command::Identities(args) => identities::run(args).await,
            Command::Roster(args) => roster::run(args).await,
            Command::Channels(args) => channels::run(args).await,
            Command::Context(args) => context::run(args).await,
            Command::Mcp(args) => mcp::run(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) if stdout_closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // Each cause once: an error that already says its source's words is not followed
            // by them again.
            eprintln!("error: {}", crate::ops::error_text(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// What `bench` says when a signal stops it: the appliances it started are killed and their
/// temporary data dirs removed as the run is dropped, not left running.
#[cfg(feature = "bench")]
const STOPPED: &str =
    "stopped by a signal: the appliances it started are stopped and their data removed";

/// Resolves on SIGINT or SIGTERM.
fn stop_signal() -> anyhow::Result<impl Future<Output = ()>> {
    use anyhow::Context;
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
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

/// Logs go to stderr ([`log`]: never at the cost of the command): coloured only when it is a
/// terminal and `NO_COLOR` is unset (<https://no-color.org>), so files and journals get plain
/// text.
fn install_tracing(verbose: u8, format: LogFormat, serving: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let level = match (verbose, serving) {
        (0, true) => "info",
        (0, false) => "warn",
        (1, _) => "info",
        (2, _) => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        // A client command reports what the connection refused as its own error, in words
        // that say what to do; the NATS library's log of the same refusal would only repeat
        // it in other words.
        let nats = if serving { "warn" } else { "off" };
        // The broker's own lines (its start-up banner among them; all of them are in
        // log/nats-server.log) only when they warn, unless -v asks for more.
        let broker = if verbose == 0 { "warn" } else { level };
        EnvFilter::new(format!("{level},async_nats={nats},nats_server={broker}"))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| log::LogWriter);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => {
            let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
            // An appliance in the background logs to a file (`up`): no colour codes there.
            let colour =
                std::io::stderr().is_terminal() && !no_color && !(serving && log::background_job());
            builder.with_ansi(colour).try_init()
        }
    };
}

/// How long a command waits for an appliance that is starting (its data dir locked, not ready
/// yet) before it says none is running.
const STARTING_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long it waits for an appliance to take its data dir at all: `cotald up &` followed at
/// once by another command starts both processes together.
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// The running appliance's state on `dir`, waiting (with a note on stderr) while one is
/// starting; `None` when none is running. Called before anything is connected, so it may block.
pub(crate) fn started_state(dir: &DataDir) -> anyhow::Result<Option<crate::datadir::RuntimeState>> {
    let started = std::time::Instant::now();
    let mut noted = false;
    loop {
        if let Some(state) = dir.read_state()? {
            return Ok(Some(state));
        }
        let locked = dir.is_locked()?;
        let waited = started.elapsed();
        if (!locked && waited >= LOCK_GRACE) || waited >= STARTING_WAIT {
            return Ok(None);
        }
        if locked && !noted {
            eprintln!(
                "cotald is starting on data dir {}; waiting for it to be ready (at most {} s)",
                dir.root().display(),
                STARTING_WAIT.as_secs()
            );
            noted = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// [`crate::daemon::admin::call`], waiting first for an appliance that is starting (its data dir
/// locked, its admin socket not open yet); `None` when none is running.
pub(crate) async fn admin_call(
    dir: &DataDir,
    req: &crate::ops::Request,
) -> anyhow::Result<Option<serde_json::Value>> {
    use crate::daemon::admin;
    if let Some(reply) = admin::call(dir, req).await? {
        return Ok(Some(reply));
    }
    if dir.is_locked()? && started_state(dir)?.is_some() {
        return Ok(admin::call(dir, req).await?);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_long_version_names_the_spec_this_build_implements() {
        let spec = format!(
            "Cotal Wire Specification v{}",
            crate::protocol::SPEC_VERSION
        );
        assert!(LONG_VERSION.contains(&spec), "{LONG_VERSION}");
        assert!(LONG_VERSION.contains(crate::supervisor::BUNDLED_VERSION));
    }

    #[test]
    fn the_command_line_model_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
