//! One soak from start to verdict: the appliance, the team, the traffic, the watchers, the
//! faults in their turn, then the settling of what is owed and the report.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio_util::sync::CancellationToken;

use super::SoakArgs;
use super::agents::{Agent, CHATTER, LibraryAgent, McpAgent, Minted, TEAM};
use super::faults::{self, Fault};
use super::ledger::{Ledger, Unconfirmed};
use super::report::Report;
use super::traffic::{Canary, traffic};
use super::watch::{HealthJudge, Resources, progress, watch_health, watch_resources};
use crate::bench::appliance::Appliance;
use crate::datadir::DataDir;
use crate::provision::KeyStore;
use crate::supervisor::monitor::Monitor;

/// One agent in this many runs through a `cotald mcp` session.
const MCP_SHARE: u32 = 3;
/// The roles tasks go to.
pub(super) const ROLES: [&str; 3] = ["review", "build", "triage"];
/// How long what is owed may take to arrive once traffic stops.
const SETTLE: Duration = Duration::from_secs(120);
/// How long a leave lasts before the agent comes back.
const AWAY: Duration = Duration::from_secs(5);
/// How long the broker is stopped for a stall.
const STALL: Duration = Duration::from_secs(20);
/// How long a leave or a join is tried again.
const RETRY_FOR: Duration = Duration::from_secs(30);

/// What the watchers find, shared with them.
#[derive(Default)]
struct Watched {
    judge: Arc<Mutex<HealthJudge>>,
    samples: Arc<Mutex<Vec<Resources>>>,
    /// Server certificates seen after the first.
    renewals: Arc<AtomicU64>,
}

/// One agent of the team.
pub(super) struct Member {
    pub(super) name: String,
    pub(super) id: String,
    pub(super) role: &'static str,
    minted: Minted,
    pub(super) agent: Agent,
}

pub(super) type Team = Arc<RwLock<Vec<Option<Arc<Member>>>>>;

/// The members whose session runs, with their index.
pub(super) fn live_members(team: &Team) -> Vec<(usize, Arc<Member>)> {
    let team = team.read().unwrap_or_else(|e| e.into_inner());
    team.iter()
        .enumerate()
        .filter_map(|(i, m)| Some((i, m.clone()?)))
        .collect()
}

/// A soak in progress.
pub(super) struct Soak {
    exe: PathBuf,
    root: PathBuf,
    data: DataDir,
    profile: PathBuf,
    appliance: Option<Appliance>,
    /// The space the team works in: `main` of a fresh appliance, one of the soak's own on a
    /// linked one.
    pub(super) space: String,
    monitor: Monitor,
    ledger: Arc<Mutex<Ledger>>,
    team: Team,
    rng: fastrand::Rng,
    minted: u32,
    faults: BTreeMap<&'static str, u32>,
    fault_errors: Vec<String>,
}

impl Soak {
    /// The whole soak; its report. When `stop` resolves first (a signal), the traffic ends
    /// there and the soak finishes as it would at its end (sessions closed, the appliance
    /// stopped, its data dir removed unless kept), with no report.
    pub(super) async fn run(
        args: &SoakArgs,
        stop: impl Future<Output = ()>,
    ) -> anyhow::Result<Report> {
        let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
        eprintln!(
            "soak: {} agents, {:?}, {:.0} msg/h, seed {seed}",
            args.agents,
            args.duration,
            args.rate * 3600.0
        );
        let mut soak = Soak::start(args, seed).await?;
        let outcome = tokio::select! {
            outcome = soak.drive(args, seed) => outcome,
            () = stop => Err(anyhow::anyhow!("stopped by a signal before its end: no verdict")),
        };
        soak.finish(args).await;
        outcome
    }

    /// The appliance up (or the linked one found), the team minted and connected.
    async fn start(args: &SoakArgs, seed: u64) -> anyhow::Result<Soak> {
        let exe = std::env::current_exe().context("the cotald executable")?;
        let root = match &args.keep {
            Some(dir) => dir.clone(),
            None => std::env::temp_dir().join(format!("cotald-soak-{}-{seed}", std::process::id())),
        };
        if root.exists() {
            bail!(
                "{} exists: a soak starts from a new data dir",
                root.display()
            );
        }
        std::fs::create_dir_all(&root)?;
        let profile = root.join("profile.toml");
        let (data, appliance, listen) = match &args.link {
            Some(dir) => {
                let data = DataDir::new(dir.clone());
                let state = data.read_state()?.with_context(|| {
                    format!(
                        "no appliance runs from {} (start it with `cotald up`)",
                        dir.display()
                    )
                })?;
                (data, None, state.listen)
            }
            None => {
                let data = DataDir::new(root.join("data"));
                let appliance = fresh(&exe, &data, &profile, &root, args.duration).await?;
                let listen = appliance.listen;
                (data, Some(appliance), listen)
            }
        };
        let keys = KeyStore::open(&data.keys())?;
        let monitor = Monitor::connect(&keys.system_user_creds()?, &data.ca_cert(), listen)
            .await
            .context("the soak's system connection")?;
        let linked = appliance.is_none();
        let mut soak = Soak {
            exe,
            root,
            data,
            profile,
            appliance,
            space: match linked {
                true => format!("soak-{seed}"),
                false => "main".to_owned(),
            },
            monitor,
            ledger: Arc::default(),
            team: Arc::default(),
            rng: fastrand::Rng::with_seed(seed),
            minted: 0,
            faults: BTreeMap::new(),
            fault_errors: Vec::new(),
        };
        if linked {
            soak.cli(&["space", "add", &soak.space])
                .await
                .context("the soak works in a space of its own, named by its seed")?;
        }
        soak.cli(&[
            "channels",
            "set",
            CHATTER,
            "--class",
            "live",
            "--space",
            &soak.space,
        ])
        .await?;
        for _ in 0..args.agents {
            soak.add_agent().await?;
        }
        Ok(soak)
    }

    /// Traffic, watchers and faults for the run's duration, then the settling; the report.
    async fn drive(&mut self, args: &SoakArgs, seed: u64) -> anyhow::Result<Report> {
        let started = Instant::now();
        let stop = CancellationToken::new();
        let canary = Canary::start(self).await?;
        let watched = Watched::default();
        let mut tasks = self.spawn_tasks(args, seed, started, &canary, &watched, &stop);
        self.run_faults(args, started).await;
        tokio::time::sleep_until((started + args.duration).into()).await;
        stop.cancel();
        while tasks.join_next().await.is_some() {}
        let settled = self.settle().await;
        canary.close().await;
        let (tally, missing) = {
            let ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
            let mut said = ledger.missing(started, 20);
            said.extend(ledger.offences().iter().cloned());
            (ledger.tally(Instant::now()), said)
        };
        Ok(Report::new(
            args,
            seed,
            started.elapsed(),
            settled,
            tally,
            missing,
            watched
                .judge
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .tally
                .clone(),
            watched
                .samples
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            watched.renewals.load(Ordering::Relaxed),
            std::mem::take(&mut self.faults),
            std::mem::take(&mut self.fault_errors),
        ))
    }

    /// The traffic and the watchers, until `stop`.
    fn spawn_tasks(
        &self,
        args: &SoakArgs,
        seed: u64,
        started: Instant,
        canary: &Canary,
        watched: &Watched,
        stop: &CancellationToken,
    ) -> tokio::task::JoinSet<()> {
        let mut tasks = tokio::task::JoinSet::new();
        let rng = fastrand::Rng::with_seed(seed ^ 0x7261_6666);
        let (team, ledger) = (self.team.clone(), self.ledger.clone());
        tasks.spawn(traffic(team, ledger, rng, args.rate, stop.clone()));
        tasks.spawn(watch_health(
            self.exe.clone(),
            self.data.clone(),
            canary.last.clone(),
            watched.judge.clone(),
            stop.clone(),
        ));
        tasks.spawn(watch_resources(
            self.data.clone(),
            self.monitor.clone(),
            (args.duration / 60).max(Duration::from_secs(5)),
            watched.samples.clone(),
            watched.renewals.clone(),
            started,
            stop.clone(),
        ));
        let (ledger, samples) = (self.ledger.clone(), watched.samples.clone());
        tasks.spawn(progress(
            ledger,
            samples,
            started,
            args.duration,
            stop.clone(),
        ));
        tasks
    }

    /// Each fault of the schedule at its time; one that cannot be carried out is recorded.
    async fn run_faults(&mut self, args: &SoakArgs, started: Instant) {
        let kinds = Fault::kinds(args.link.is_some());
        let every = faults::pace(args.duration, 1, kinds.len());
        for (at, fault) in faults::schedule(&mut self.rng, args.duration, every, &kinds) {
            tokio::time::sleep_until((started + at).into()).await;
            let at = started.elapsed().as_secs_f64();
            eprintln!("soak: {at:>5.0}s  {}", fault.name());
            match self.fault(fault).await {
                Ok(()) => *self.faults.entry(fault.name()).or_default() += 1,
                Err(e) => self.fault_errors.push(format!(
                    "{} at {at:.0}s: {}",
                    fault.name(),
                    crate::ops::error_text(&*e)
                )),
            }
        }
    }

    /// Waits until nothing owed is missing, or [`SETTLE`]; how long it took.
    async fn settle(&self) -> Duration {
        let from = Instant::now();
        while from.elapsed() < SETTLE {
            let lost = self
                .ledger
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .tally(Instant::now())
                .lost;
            if lost == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        from.elapsed()
    }

    /// Every agent's session ended, the appliance stopped, the data dir removed unless kept.
    async fn finish(&mut self, args: &SoakArgs) {
        let members: Vec<Arc<Member>> = self
            .team
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .flatten()
            .collect();
        for member in members {
            member.agent.close().await;
        }
        match self.appliance.take() {
            Some(appliance) => appliance.stop().await,
            None => self.revoke_all().await,
        }
        if args.keep.is_none() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    /// On a linked appliance, every identity the soak minted is revoked: its space stays (the
    /// appliance has no op to remove one), with no credential left that reaches it.
    async fn revoke_all(&self) {
        let names = (0..self.minted)
            .map(|n| format!("agent-{n}"))
            .chain(["canary-a".to_owned(), "canary-b".to_owned()]);
        for name in names {
            // One revoked by a fault already says so; that is not a failure of the cleanup.
            let _ = self.cli(&["revoke", &name, "--space", &self.space]).await;
        }
        eprintln!(
            "soak: space {} left on the appliance, its identities revoked",
            self.space
        );
    }

    /// Mints an agent and starts it: one in [`MCP_SHARE`] on `cotald mcp`.
    async fn add_agent(&mut self) -> anyhow::Result<()> {
        let number = self.minted;
        self.minted += 1;
        let name = format!("agent-{number}");
        let role = ROLES[number as usize % ROLES.len()];
        let mcp = number.is_multiple_of(MCP_SHARE);
        let minted = self.mint(&name, role, mcp, false).await?;
        let index = {
            let mut team = self.team.write().unwrap_or_else(|e| e.into_inner());
            let index = team.len();
            team.push(None);
            index
        };
        let ledger_index =
            self.ledger
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .agent(role, !mcp, Instant::now());
        debug_assert_eq!(index, ledger_index);
        let agent = self.start_agent(index, &minted, role, mcp).await?;
        self.team.write().unwrap_or_else(|e| e.into_inner())[index] = Some(Arc::new(Member {
            name,
            id: minted.id.clone(),
            role,
            minted,
            agent,
        }));
        Ok(())
    }

    async fn start_agent(
        &self,
        index: usize,
        minted: &Minted,
        role: &str,
        mcp: bool,
    ) -> anyhow::Result<Agent> {
        Ok(match mcp {
            true => Agent::Mcp(Box::new(
                McpAgent::start(&self.exe, index, minted, self.ledger.clone()).await?,
            )),
            false => {
                Agent::Library(LibraryAgent::start(index, minted, role, self.ledger.clone()).await?)
            }
        })
    }

    /// `cotald mint` of an agent: library agents join the team channel at boot; every agent
    /// may post on both channels and serves its role.
    async fn mint(
        &self,
        name: &str,
        role: &str,
        mcp: bool,
        replace: bool,
    ) -> anyhow::Result<Minted> {
        let subscribe = if mcp {
            CHATTER.to_owned()
        } else {
            format!("{TEAM},{CHATTER}")
        };
        let channels = format!("{TEAM},{CHATTER}");
        let mut args = vec![
            "mint",
            name,
            "--space",
            &self.space,
            "--json",
            "--role",
            role,
            "--subscribe",
            &subscribe,
            "--allow-subscribe",
            &channels,
            "--allow-publish",
            &channels,
        ];
        if replace {
            args.push("--replace");
        }
        let out = self.cli(&args).await?;
        serde_json::from_slice(&out).context("cotald mint --json")
    }

    /// Runs `cotald ARGS --data-dir DIR`; its stdout, or its stderr as the error.
    pub(super) async fn cli(&self, args: &[&str]) -> anyhow::Result<Vec<u8>> {
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new(&self.exe)
                .args(args)
                .arg("--data-dir")
                .arg(self.data.root())
                .output(),
        )
        .await
        .with_context(|| format!("cotald {} did not finish within 60 s", args[0]))??;
        if !out.status.success() {
            bail!(
                "cotald {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out.stdout)
    }

    /// A random member that is running, of the kind asked (`Some(true)`: library).
    fn pick(&mut self, library: Option<bool>) -> Option<(usize, Arc<Member>)> {
        let live: Vec<(usize, Arc<Member>)> = live_members(&self.team)
            .into_iter()
            .filter(|(_, m)| library.is_none_or(|l| l == matches!(m.agent, Agent::Library(_))))
            .collect();
        (!live.is_empty()).then(|| live[self.rng.usize(..live.len())].clone())
    }

    /// Carries out one fault.
    async fn fault(&mut self, fault: Fault) -> anyhow::Result<()> {
        match fault {
            Fault::LeaveAndReturn => self.leave_and_return().await,
            Fault::HostRestart => {
                let (index, member) = self
                    .pick(Some(false))
                    .or_else(|| self.pick(None))
                    .context("no agent")?;
                self.restart(index, &member, member.minted.clone(), None)
                    .await
            }
            Fault::Mint => self.add_agent().await,
            Fault::Reissue => {
                let (index, member) = self.pick(None).context("no agent")?;
                let mcp = matches!(member.agent, Agent::Mcp(_));
                // The re-issue revokes the running session's credential: the broker cuts it,
                // and what it acknowledged from then on may not have reached the appliance.
                let cut = Instant::now();
                let minted = self.mint(&member.name, member.role, mcp, true).await?;
                self.restart(index, &member, minted, Some(cut)).await
            }
            Fault::Revoke => {
                let (index, member) = self.pick(None).context("no agent")?;
                self.ledger
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .revoked(index, Instant::now());
                self.cli(&["revoke", &member.name, "--space", &self.space])
                    .await?;
                self.team.write().unwrap_or_else(|e| e.into_inner())[index] = None;
                member.agent.close().await;
                Ok(())
            }
            Fault::ChannelConfig => {
                let description = format!("soak at {}", crate::provision::now_secs());
                self.cli(&[
                    "channels",
                    "set",
                    CHATTER,
                    "--description",
                    &description,
                    "--space",
                    &self.space,
                ])
                .await
                .map(|_| ())
            }
            Fault::ServicesCut => faults::cut_services(&self.monitor, &self.space).await,
            Fault::BrokerKill => faults::kill_broker(&self.data),
            Fault::BrokerStall => faults::stall_broker(&self.data, STALL).await,
            Fault::ApplianceRestart => {
                if let Some(appliance) = self.appliance.take() {
                    appliance.stop().await;
                }
                let started =
                    Appliance::start(&self.exe, self.data.root(), Some(&self.profile), &self.root)
                        .await?;
                self.appliance = Some(started);
                Ok(())
            }
        }
    }

    /// A library agent leaves the team channel and joins it again [`AWAY`] later.
    async fn leave_and_return(&mut self) -> anyhow::Result<()> {
        let (index, member) = self.pick(Some(true)).context("no library agent")?;
        let Agent::Library(agent) = &member.agent else {
            bail!("not a library agent");
        };
        let asked = Instant::now();
        retrying(|| agent.leave()).await?;
        self.ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .left(index, asked, Instant::now());
        tokio::time::sleep(AWAY).await;
        let asked = Instant::now();
        retrying(|| agent.rejoin()).await?;
        self.ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .joined(index, asked, Instant::now());
        Ok(())
    }

    /// Ends a member's session and starts a new one of the same identity with `minted`. `cut`
    /// is when the session's credential was revoked under it, if it was: its acknowledgements
    /// from then on are not known to have arrived, nor are those its client says it could not
    /// confirm as it closed.
    async fn restart(
        &mut self,
        index: usize,
        member: &Arc<Member>,
        minted: Minted,
        cut: Option<Instant>,
    ) -> anyhow::Result<()> {
        self.team.write().unwrap_or_else(|e| e.into_inner())[index] = None;
        let closing = Instant::now();
        let settled = member.agent.close().await;
        let unconfirmed = Unconfirmed {
            since: cut.or(settled.filter(|s| !s.acks_confirmed).map(|_| closing)),
            // An agent that cannot tell (an MCP session logs it, to its host) may be handed
            // again any post or mention it handled before that copy came.
            posts: settled.map_or(usize::MAX, |s| s.unsettled),
        };
        self.ledger
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .resumed(index, unconfirmed);
        let mcp = matches!(member.agent, Agent::Mcp(_));
        let agent = match self.start_agent(index, &minted, member.role, mcp).await {
            Ok(agent) => agent,
            Err(e) => {
                // Its backlog waits for a session the soak cannot give it: not counted lost.
                self.ledger
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .abandoned(index);
                return Err(e);
            }
        };
        self.team.write().unwrap_or_else(|e| e.into_inner())[index] = Some(Arc::new(Member {
            name: member.name.clone(),
            id: minted.id.clone(),
            role: member.role,
            minted,
            agent,
        }));
        Ok(())
    }
}

/// A fresh appliance in `data`, on the embedded local profile written to `profile` with a
/// certificate that lives a fifth of the run (at least 30 s): renewed while it runs.
async fn fresh(
    exe: &std::path::Path,
    data: &DataDir,
    profile: &std::path::Path,
    logs: &std::path::Path,
    run: Duration,
) -> anyhow::Result<Appliance> {
    let lifetime = (run / 5).max(Duration::from_secs(30)).as_secs();
    let text = crate::profile::EMBEDDED_LOCAL.replacen(
        "[broker]\n",
        &format!("[broker]\ncertificate_lifetime = \"{lifetime}s\"\n"),
        1,
    );
    std::fs::write(profile, text)?;
    Appliance::start(exe, data.root(), Some(profile), logs).await
}

/// Runs `op` again for up to [`RETRY_FOR`] while it fails: a leave or a join asks the space's
/// manager, which a fault just before may have left restarting (it says so, and an agent tries
/// again, as a person would). The last failure is returned.
async fn retrying<T, F: std::future::Future<Output = anyhow::Result<T>>>(
    mut op: impl FnMut() -> F,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + RETRY_FOR;
    let mut backoff = crate::backoff::Backoff::default();
    loop {
        match op().await {
            Ok(done) => return Ok(done),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "retrying");
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(e) => return Err(e),
        }
    }
}
