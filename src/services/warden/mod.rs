//! The warden: what keeps one agent's DMs and tasks from taking the space from the others
//! (§4: an acknowledged DM or task is delivered at least once within retention, to everyone).
//! Why each mechanism, and what was rejected: `docs/design-notes.md`, *Fairness*.
//!
//! The broker bounds each pair: DM keeps at most [`DM_MAX_MSGS_PER_PAIR`](crate::binding::streams::DM_MAX_MSGS_PER_PAIR) per (target, sender)
//! and TASK [`TASK_MAX_MSGS_PER_PAIR`](crate::binding::streams::TASK_MAX_MSGS_PER_PAIR) per (role, sender), refusing one more to its sender and
//! never evicting anything older (`binding/streams.rs`). What the broker cannot bound is how
//! many pairs a sender opens: Appendix B lets an agent publish `inst.<anything>.<id>` and
//! `svc.<anything>.<id>`, and a target that does not exist never reads. The warden closes that:
//! - a DM to a target that is no minted, unrevoked agent or person (only they have a `dm_<id>`
//!   to read it with; an observer has none) is purged as soon as it is seen (a flood to one such target, once per
//!   `PURGE_BATCH`; one stored only after that purge, once more as it is seen stored), and so
//!   is a task to a role no such agent holds;
//! - a pair that fills up is trimmed of the DMs its target has already read (below the ack
//!   floor of `dm_<target>`; DM keeps read messages for history), so the pair bound counts what
//!   waits unread, not what was said in the retention window; and when DM as a whole is nearly
//!   full, every agent's read DMs are trimmed, so reading frees room without an operator;
//! - a sender whose DMs wait unread across all its targets, or whose tasks wait untaken across
//!   all roles, beyond its share of the store ([`SHARE_DIVISOR`]: an eighth of its byte limit)
//!   is held: those publishes of it are refused, to it alone and with the reason, until it is
//!   back under half its share (`space/holds.rs` says how the broker carries that out). The
//!   pair bound cannot do this, since the pairs a sender opens to real targets are as many as
//!   there are agents: one agent sending 1 MiB DMs to a few that never read filled all of DM.
//!
//! It sees each publish on a core subscription (refused ones too, which is how a full pair is
//! noticed), every DM that DM stores on a headers-only ordered consumer (sequence and size: the
//! `ledger` of unread bytes per sender; TASK, a work queue, admits no such consumer, so a
//! sender's tasks are measured from the stream's per-subject counts), and sweeps the streams'
//! subjects when it starts and every [`SWEEP_INTERVAL`], which catches what was stored while it
//! was not running and identities revoked since. The core subscriptions carry every payload,
//! so they have a connection of their own: a flood queued there delays neither DM's stored
//! feed nor the warden's questions to the broker, and while tasks are being published TASK's
//! size is asked every 25 ms (`PULSE`), so a task flood is judged by what the stream holds,
//! not by how much of it the appliance has read.

mod ledger;
mod shares;
mod verdict;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use async_nats::jetstream::consumer::pull;
use futures_util::StreamExt;

use std::future::Future;
use std::pin::Pin;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::stream;

use super::{Context, Health, Service, ServiceError};
use crate::binding::{SpaceNames, dm_durable};
use crate::space::{Held, Identities, Space};
use ledger::Ledger;
use shares::Shares;
use verdict::{Addressable, Verdict, judge};

/// How often every DM and TASK subject is checked (and full pairs trimmed) besides the live
/// checks.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// A target's first unreadable message is purged at once; more to the same target within this
/// window are purged together at its end (a flood to one target is one purge per window).
const PURGE_BATCH: Duration = Duration::from_millis(50);
/// A pair is trimmed of read DMs once it holds this many: a pair read as fast as it is written
/// is trimmed once per few hundred DMs, not per DM, and stays far below its bound
/// ([`DM_MAX_MSGS_PER_PAIR`](crate::binding::streams::DM_MAX_MSGS_PER_PAIR)), which then
/// counts what waits unread.
const TRIM_AT: i64 = 500;
/// When DM holds this share (percent) of its byte limit, every agent's read DMs are trimmed:
/// a full store drops what has been read before it refuses what has not.
const FULL_PERCENT: u64 = 90;
/// A pair that stays full after trims (its target reads nothing) is trimmed again at most this
/// often, and DM is checked for being nearly full at most this often.
const TRIM_EVERY: Duration = Duration::from_secs(1);
/// A trim that removed nothing (the target had read nothing since the last) is tried again,
/// at a publish to the pair, after this at the earliest, then after twice as long each time
/// it removes nothing, up to [`TRIM_EVERY`]: a target that keeps reading frees its waiting
/// sender within milliseconds, one that reads nothing costs a trim a second.
const TRIM_RETRY_FIRST: Duration = Duration::from_millis(10);
/// A sender estimated past its share but measured under it is measured again after this: a
/// flood goes on meanwhile, and a second of it can fill the store.
const REMEASURE_AFTER: Duration = Duration::from_millis(100);
/// While tasks are being published, TASK's size is asked this often: the tasks seen on the
/// core subscription trail a flood by as much as the appliance has yet to read of it, the
/// stream's own count does not.
const PULSE: Duration = Duration::from_millis(25);
/// Tasks count as being published for this long after the last one seen.
const PULSE_FOR: Duration = Duration::from_secs(1);

/// One sender may have this part of DM's (TASK's) byte limit stored unread (untaken): an
/// eighth, so that a sender past it is held while seven others at their share still fit.
pub const SHARE_DIVISOR: u64 = 8;

/// Why the account could not be pushed again, as the appliance says it.
pub type PushFailed = Box<dyn std::error::Error + Send + Sync>;

/// Signs and pushes the space's account JWT again, with the current holds: the appliance's
/// job, since it holds the operator key.
pub trait AccountPush: Send + Sync {
    /// Pushes the account as it is now.
    fn push_again(&self) -> Pin<Box<dyn Future<Output = Result<(), PushFailed>> + Send + '_>>;
}

/// The warden of one space.
pub struct Warden {
    space: Arc<Space>,
    identities: Arc<Identities>,
    account: Arc<dyn AccountPush>,
    /// Its own connection, dialed while the broker got ready; taken by the first run.
    dialed: std::sync::Mutex<Option<async_nats::Client>>,
}

/// What the warden's own connection is dialed for (`Space::dial_another`).
pub const OWN_CONNECTION: &str = "warden";

impl Warden {
    /// A warden of `space`, judging targets and roles by `identities`, pushing holds with
    /// `account`; its own connection is `dialed` when it was made already.
    pub fn new(
        space: Arc<Space>,
        identities: Arc<Identities>,
        account: Arc<dyn AccountPush>,
        dialed: Option<async_nats::Client>,
    ) -> Self {
        Warden {
            space,
            identities,
            account,
            dialed: std::sync::Mutex::new(dialed),
        }
    }
}

/// A stream's byte limit (0: none).
fn byte_limit(info: &stream::Info) -> u64 {
    info.config.max_bytes.max(0) as u64
}

/// The stream sequence and payload size of a DM delivered headers-only, and how many more
/// the feed has yet to deliver.
fn stored_entry(msg: &async_nats::jetstream::Message) -> Option<(u64, u64, u64)> {
    let info = msg.info().ok()?;
    let size = msg
        .headers
        .as_ref()?
        .get("Nats-Msg-Size")?
        .as_str()
        .parse()
        .ok()?;
    Some((info.stream_sequence, size, info.pending))
}

impl Warden {
    fn stream_of(&self, filter: &str) -> String {
        let svc = self.space.names().task_prefix();
        if filter.starts_with(&svc) {
            self.space.names().task_stream()
        } else {
            self.space.names().dm_stream()
        }
    }

    async fn purge(&self, filter: &str) {
        let stream = self.stream_of(filter);
        let purged = async {
            self.space
                .jetstream()
                .get_stream_no_info(&stream)
                .await?
                .purge()
                .filter(filter)
                .await
                .map_err(Into::<Box<dyn std::error::Error + Send + Sync>>::into)
        };
        match purged.await {
            Ok(r) if r.purged > 0 => tracing::warn!(
                space = self.space.name(),
                stream,
                filter,
                purged = r.purged,
                "purged messages addressed to no identity (agent or person) or role of this space"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(space = self.space.name(), stream, filter, error = %e, "purge failed")
            }
        }
    }

    /// Removes the DMs of `subject` that `target` has already read; returns how many were
    /// removed and how many the pair still holds (None when that could not be read).
    async fn trim(&self, target: &str, subject: &str) -> Option<(u64, i64)> {
        let trimmed = async {
            let stream = self
                .space
                .jetstream()
                .get_stream_no_info(self.space.names().dm_stream())
                .await?;
            let floor = self.floor(target).await?;
            let purged = match floor {
                0 => 0,
                floor => {
                    stream
                        .purge()
                        .filter(subject)
                        .sequence(floor + 1)
                        .await?
                        .purged
                }
            };
            let mut held = 0;
            let mut subjects = stream.info_with_subjects(subject).await?;
            while let Some(entry) = subjects.next().await {
                held += entry?.1 as i64;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((purged, held))
        };
        match trimmed.await {
            Ok((purged, held)) => {
                if purged > 0 {
                    tracing::debug!(
                        space = self.space.name(),
                        subject,
                        purged,
                        held,
                        "read DMs trimmed from a full pair"
                    );
                }
                Some((purged, held))
            }
            Err(e) => {
                tracing::warn!(space = self.space.name(), subject, error = %e, "trim failed");
                None
            }
        }
    }

    /// How far `target` has read its DMs: the ack floor of `dm_<target>`.
    async fn floor(&self, target: &str) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
        let dm = self
            .space
            .jetstream()
            .get_stream_no_info(self.space.names().dm_stream())
            .await?;
        Ok(dm
            .consumer_info(dm_durable(target))
            .await?
            .ack_floor
            .stream_sequence)
    }

    /// Tells `ledger` how far each of `targets` has read (asked all at once: a sender past its
    /// share is judged on them while it may still be flooding).
    async fn read_floors(&self, ledger: &mut Ledger, targets: Vec<String>) {
        let floors: Vec<_> = futures_util::stream::iter(targets)
            .map(|target| async move {
                let floor = self.floor(&target).await;
                (target, floor)
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for (target, floor) in floors {
            match floor {
                Ok(floor) => ledger.read(&target, floor),
                Err(e) => tracing::debug!(space = self.space.name(), target, error = %e,
                    "a DM reader's floor not read"),
            }
        }
    }

    /// A stream's configuration and state, as they are now.
    async fn stream_info(&self, stream: &str) -> Result<stream::Info, ServiceError> {
        let stream = self
            .space
            .jetstream()
            .get_stream(stream)
            .await
            .map_err(ServiceError::at("reading a stream the warden keeps"))?;
        Ok(stream.cached_info().clone())
    }

    /// Whether DM holds [`FULL_PERCENT`] of its byte limit or more.
    async fn dm_nearly_full(&self) -> bool {
        match self.stream_info(&self.space.names().dm_stream()).await {
            Ok(dm) => {
                let max = byte_limit(&dm);
                max > 0 && dm.state.bytes * 100 >= max * FULL_PERCENT
            }
            Err(e) => {
                tracing::warn!(space = self.space.name(), error = %e, "DM not read");
                false
            }
        }
    }

    /// Checks every stored DM and task subject: purges the unaddressable, trims full pairs.
    /// Returns the task pairs TASK holds.
    async fn sweep(&self, addressable: &mut Addressable) -> Result<HashSet<String>, ServiceError> {
        addressable.refresh(&self.identities);
        let mut purges = BTreeSet::new();
        let mut task_pairs = HashSet::new();
        for (stream, filter) in [
            (self.space.names().dm_stream(), self.space.names().dms()),
            (self.space.names().task_stream(), self.space.names().tasks()),
        ] {
            let stream = self
                .space
                .jetstream()
                .get_stream_no_info(&stream)
                .await
                .map_err(ServiceError::at("reading a stream the warden sweeps"))?;
            let mut subjects = stream
                .info_with_subjects(&filter)
                .await
                .map_err(ServiceError::at("listing subjects"))?;
            while let Some(entry) = subjects.next().await {
                let (subject, count) = entry.map_err(ServiceError::at("listing subjects"))?;
                match judge(self.space.names(), &subject, addressable) {
                    Verdict::Purge(filter) => {
                        purges.insert(filter);
                    }
                    Verdict::Pair(target, subject) if count as i64 >= TRIM_AT => {
                        self.trim(&target, &subject).await;
                    }
                    Verdict::Task(subject) => {
                        task_pairs.insert(subject);
                    }
                    _ => {}
                }
            }
        }
        for filter in purges {
            self.purge(&filter).await;
        }
        Ok(task_pairs)
    }
}

/// What the warden's loop keeps between two events.
struct Watch {
    names: SpaceNames,
    addressable: Addressable,
    dm_shares: Shares,
    task_shares: Shares,
    /// Until the feed has caught up with what DM held, holds kept from an earlier run of the
    /// warden are not reviewed (they would look read).
    replayed: bool,
    /// DM's last sequence when the warden started: what DM stores after it was published
    /// once the core subscriptions began (they are made alongside), so its publish is seen
    /// there too.
    dm_seen_after: u64,
    /// Whether the broker has yet to be told of a change of the holds.
    unpushed: bool,
    /// When DM was last checked for being nearly full.
    fullness_checked: Option<Instant>,
    /// Per DM pair subject.
    pairs: HashMap<String, Pair>,
    /// Purged within the current window, and waiting for its end.
    recent: BTreeSet<String>,
    purges: BTreeSet<String>,
    /// When a task was last seen published (TASK's size is asked while it is recent).
    task_seen: Option<Instant>,
    /// TASK's size when its pairs were last listed, or its lowest since.
    task_listed: u64,
}

/// A DM pair as the warden counts it.
#[derive(Default)]
struct Pair {
    /// How many it may hold: publishes seen since it was last counted.
    held: i64,
    /// After a trim that removed nothing: when it was, and how long until the next may run.
    idle: Option<(Instant, Duration)>,
}

impl Pair {
    fn due(&self) -> bool {
        self.held >= TRIM_AT && self.idle.is_none_or(|(at, wait)| at.elapsed() >= wait)
    }

    /// Records a trim's outcome, (purged, held now); `None` when it failed.
    fn trimmed(&mut self, outcome: Option<(u64, i64)>) {
        let wait = match outcome {
            None => Some(TRIM_EVERY),
            Some((purged, held)) => {
                self.held = held;
                let longer = |(_, wait): (Instant, Duration)| (wait * 2).min(TRIM_EVERY);
                (purged == 0).then(|| self.idle.map_or(TRIM_RETRY_FIRST, longer))
            }
        };
        self.idle = wait.map(|wait| (Instant::now(), wait));
    }
}

impl Warden {
    /// Every DM and task published, on a connection of the warden's own (the connection is
    /// kept as long as the subscriptions).
    async fn tap(
        &self,
    ) -> Result<
        (
            async_nats::Client,
            async_nats::Subscriber,
            async_nats::Subscriber,
        ),
        ServiceError,
    > {
        let names = self.space.names();
        let dialed = self.dialed.lock().ok().and_then(|mut d| d.take());
        let tap = match dialed {
            Some(tap) => tap,
            None => self
                .space
                .dial_another(OWN_CONNECTION)
                .await
                .map_err(ServiceError::at(
                    "connecting for the DMs and tasks published",
                ))?,
        };
        let dms = tap
            .subscribe(names.dms())
            .await
            .map_err(ServiceError::at("subscribing to DMs"))?;
        let tasks = tap
            .subscribe(names.tasks())
            .await
            .map_err(ServiceError::at("subscribing to tasks"))?;
        tap.flush()
            .await
            .map_err(ServiceError::at("subscribing to DMs and tasks"))?;
        Ok((tap, dms, tasks))
    }

    /// Every DM that DM stores, from the first it holds: sequence, pair and size, no payload.
    async fn follow_dm(&self) -> Result<pull::Ordered, ServiceError> {
        self.space
            .jetstream()
            .get_stream_no_info(self.space.names().dm_stream())
            .await
            .map_err(ServiceError::at("reading DM"))?
            .create_consumer(pull::OrderedConfig {
                filter_subject: self.space.names().dms(),
                headers_only: true,
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(ServiceError::at("following DM"))?
            .messages()
            .await
            .map_err(ServiceError::at("following DM"))
    }

    /// The loop's state at start: what is addressable, the shares of DM and TASK, the read
    /// floors first (the feed then counts only what is unread).
    async fn watch(&self) -> Result<Watch, ServiceError> {
        let mut addressable = Addressable::default();
        self.sweep(&mut addressable).await?;
        let names = self.space.names();
        let mut dm_shares = Shares::default();
        let agents = addressable.inboxes.iter().cloned().collect();
        let (dm_stream, task_stream) = (names.dm_stream(), names.task_stream());
        let infos = async {
            tokio::try_join!(self.stream_info(&dm_stream), self.stream_info(&task_stream))
        };
        let (infos, ()) = tokio::join!(infos, self.read_floors(&mut dm_shares.ledger, agents));
        let (dm, task) = infos?;
        dm_shares.store = byte_limit(&dm);
        let task_shares = Shares {
            store: byte_limit(&task),
            ..Shares::default()
        };
        Ok(Watch {
            names: names.clone(),
            addressable,
            dm_shares,
            task_shares,
            replayed: dm.state.messages == 0,
            dm_seen_after: dm.state.last_sequence,
            unpushed: !self.space.holds().is_empty(),
            fullness_checked: None,
            pairs: HashMap::new(),
            recent: BTreeSet::new(),
            purges: BTreeSet::new(),
            task_seen: None,
            // The first pulse lists TASK's pairs if it holds more than a share already (tasks
            // stored while the warden was not running).
            task_listed: 0,
        })
    }

    /// A DM that DM stored: counted against its sender's share.
    async fn on_stored(&self, w: &mut Watch, msg: &async_nats::jetstream::Message) {
        w.addressable.refresh(&self.identities);
        let Some((seq, size, pending)) = stored_entry(msg) else {
            return;
        };
        w.replayed |= pending == 0;
        let target = match judge(&w.names, msg.subject.as_str(), &w.addressable) {
            Verdict::Pair(target, _) => target,
            // Stored after the purge its publish caused (the broker stores a message after it
            // hands it to core subscribers, and may answer a purge in between): purged again at
            // the end of the batch window, not left for the next sweep.
            Verdict::Purge(filter) => {
                w.purges.insert(filter);
                return;
            }
            Verdict::Task(_) | Verdict::Keep => return,
        };
        let sender = msg.subject.as_str().rsplit('.').next().unwrap_or_default();
        w.dm_shares
            .stored(&target, sender, seq, size, seq > w.dm_seen_after);
        if self.judge_share(Held::Dms, &mut w.dm_shares, sender).await {
            w.unpushed = !self.push_holds().await;
        }
    }

    /// Every [`TRIM_EVERY`]: the holds reviewed, and pushed if they changed.
    async fn on_review(&self, w: &mut Watch) {
        w.dm_shares.in_flight.clear();
        if w.replayed && self.review_holds(Held::Dms, &mut w.dm_shares).await {
            w.unpushed = true;
        }
        if self.review_holds(Held::Tasks, &mut w.task_shares).await {
            w.unpushed = true;
        }
        if w.unpushed {
            w.unpushed = !self.push_holds().await;
        }
    }

    /// Every [`PULSE`] while tasks are being published: TASK's size; once it grew by half a
    /// share since its pairs were last listed, every sender past its share by the stream's
    /// counts is judged.
    async fn on_pulse(&self, w: &mut Watch) {
        if w.task_seen.is_none_or(|seen| seen.elapsed() > PULSE_FOR) {
            return;
        }
        let state = match self.stream_info(&self.space.names().task_stream()).await {
            Ok(task) => task.state,
            Err(e) => {
                tracing::debug!(space = self.space.name(), error = %e, "TASK not read");
                return;
            }
        };
        let (bytes, share) = (state.bytes, w.task_shares.share());
        w.task_listed = w.task_listed.min(bytes);
        if bytes <= share || bytes < w.task_listed.saturating_add(share / 2) {
            return;
        }
        w.task_listed = bytes;
        w.addressable.refresh(&self.identities);
        let (names, addressable) = (&w.names, &w.addressable);
        // Tasks to a role nobody holds are purged, not counted.
        let counted = |pair: &str| matches!(judge(names, pair, addressable), Verdict::Task(_));
        let past = self
            .task_senders_past_share(&state, &mut w.task_shares, counted)
            .await;
        for sender in past {
            // The stream's own count: judged now, whenever it was last.
            w.task_shares.judged.remove(&sender);
            if self
                .judge_share(Held::Tasks, &mut w.task_shares, &sender)
                .await
            {
                w.unpushed = !self.push_holds().await;
            }
        }
    }

    /// Every [`SWEEP_INTERVAL`]: what is addressable and what the stores hold, read again.
    async fn on_sweep(&self, w: &mut Watch) -> Result<(), ServiceError> {
        // Caught up by now, or with nothing of the filter's to deliver.
        w.replayed = true;
        w.pairs.clear();
        w.dm_shares.judged.clear();
        w.task_shares.judged.clear();
        let names = self.space.names();
        let task_pairs = self.sweep(&mut w.addressable).await?;
        w.task_shares.tasks.retain(|pair| task_pairs.contains(pair));
        w.task_shares.store = byte_limit(&self.stream_info(&names.task_stream()).await?);
        // What DM no longer holds, or holds for no agent, or was read.
        let dm = self.stream_info(&names.dm_stream()).await?;
        w.dm_shares.store = byte_limit(&dm);
        w.dm_shares.ledger.below(dm.state.first_sequence);
        for target in w.dm_shares.ledger.targets() {
            if !w.addressable.inboxes.contains(&target) {
                w.dm_shares.ledger.forget_target(&target);
            }
        }
        let targets = w.dm_shares.ledger.targets();
        self.read_floors(&mut w.dm_shares.ledger, targets).await;
        // The holds again: another node of a cluster may have pushed the account without them.
        if !self.space.holds().is_empty() {
            w.unpushed = !self.push_holds().await;
        }
        Ok(())
    }

    /// A DM or a task as published.
    async fn on_published(&self, w: &mut Watch, subject: &str, size: u64) {
        w.addressable.refresh(&self.identities);
        match judge(&w.names, subject, &w.addressable) {
            Verdict::Purge(filter) if w.recent.contains(&filter) => {
                w.purges.insert(filter);
            }
            Verdict::Purge(filter) => {
                self.purge(&filter).await;
                w.recent.insert(filter);
            }
            Verdict::Pair(target, subject) => self.on_dm(w, &target, subject, size).await,
            Verdict::Task(subject) => {
                w.task_seen = Some(Instant::now());
                let sender = subject.rsplit('.').next().unwrap_or_default();
                w.task_shares.tasks.published(&subject, size);
                w.task_shares.published(sender, size);
                if self
                    .judge_share(Held::Tasks, &mut w.task_shares, sender)
                    .await
                {
                    w.unpushed = !self.push_holds().await;
                }
            }
            Verdict::Keep => {}
        }
    }

    /// A DM to an agent as published: its sender's share, DM's fullness, its pair's bound.
    async fn on_dm(&self, w: &mut Watch, target: &str, subject: String, size: u64) {
        let sender = subject.rsplit('.').next().unwrap_or_default();
        w.dm_shares.published(sender, size);
        if self.judge_share(Held::Dms, &mut w.dm_shares, sender).await {
            w.unpushed = !self.push_holds().await;
        }
        if w.fullness_checked.is_none_or(|t| t.elapsed() >= TRIM_EVERY) {
            w.fullness_checked = Some(Instant::now());
            if self.dm_nearly_full().await {
                for agent in &w.addressable.inboxes {
                    self.trim(agent, &self.space.names().dms_to(agent)).await;
                }
            }
        }
        let pair = w.pairs.entry(subject.clone()).or_default();
        pair.held += 1;
        // A target that keeps reading is trimmed at every publish past the mark, so that a
        // busy pair is not refused for what was read; one that read nothing since is looked
        // at again after a wait that grows to TRIM_EVERY.
        if pair.due() {
            pair.trimmed(self.trim(target, &subject).await);
        }
    }
}

impl Service for Warden {
    fn name(&self) -> &'static str {
        "warden"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        // None needs another: their round trips at once (startup time). A DM stored before
        // the core subscriptions began is one whose publish the warden does not see; its
        // stored entry, counted all the same, leaves in flight below zero until the next
        // review clears it.
        let ((_tap, mut dms, mut tasks), mut stored, mut w) =
            tokio::try_join!(self.tap(), self.follow_dm(), self.watch())?;
        let mut review = tokio::time::interval(TRIM_EVERY);
        let mut batch = tokio::time::interval(PURGE_BATCH);
        let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
        sweep.reset();
        let mut pulse = tokio::time::interval(PULSE);
        pulse.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ctx.report(Health::Running);
        loop {
            let (subject, size) = tokio::select! {
                () = ctx.cancelled() => return Ok(()),
                entry = stored.next() => {
                    let msg = entry
                        .ok_or_else(|| ServiceError::msg("following DM ended"))?
                        .map_err(ServiceError::at("following DM"))?;
                    self.on_stored(&mut w, &msg).await;
                    continue;
                }
                _ = review.tick() => {
                    self.on_review(&mut w).await;
                    continue;
                }
                msg = dms.next() => {
                    let msg = msg.ok_or_else(|| ServiceError::msg("the DM subscription ended"))?;
                    (msg.subject, msg.payload.len() as u64)
                }
                msg = tasks.next() => {
                    let msg = msg.ok_or_else(|| ServiceError::msg("the task subscription ended"))?;
                    (msg.subject, msg.payload.len() as u64)
                }
                _ = batch.tick() => {
                    w.recent = std::mem::take(&mut w.purges);
                    for filter in &w.recent {
                        self.purge(filter).await;
                    }
                    continue;
                }
                _ = sweep.tick() => {
                    self.on_sweep(&mut w).await?;
                    continue;
                }
                _ = pulse.tick() => {
                    self.on_pulse(&mut w).await;
                    continue;
                }
            };
            self.on_published(&mut w, subject.as_str(), size).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_that_removes_nothing_waits_longer_each_time_and_one_that_removes_resets() {
        let mut pair = Pair {
            held: TRIM_AT,
            idle: None,
        };
        assert!(pair.due());
        let waits = |pair: &mut Pair, outcome| {
            pair.trimmed(outcome);
            pair.idle.map(|(_, wait)| wait)
        };
        let ms = Duration::from_millis;
        assert_eq!(waits(&mut pair, Some((0, 1_000))), Some(ms(10)));
        assert!(!pair.due(), "not at once after a trim that removed nothing");
        assert_eq!(waits(&mut pair, Some((0, 1_000))), Some(ms(20)));
        for _ in 0..10 {
            pair.trimmed(Some((0, 1_000)));
        }
        assert_eq!(pair.idle.map(|(_, wait)| wait), Some(TRIM_EVERY));
        // The target read: what it read is gone, and the next trim is due at the mark.
        assert_eq!(waits(&mut pair, Some((600, 400))), None);
        assert_eq!(pair.held, 400);
        assert!(!pair.due());
        pair.held = TRIM_AT;
        assert!(pair.due());
        assert_eq!(waits(&mut pair, None), Some(TRIM_EVERY));
    }
}
