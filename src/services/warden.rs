//! The warden: what keeps one agent's DMs and tasks from taking the space from the others
//! (§4: an acknowledged DM or task is delivered at least once within retention, to everyone).
//!
//! The broker bounds each pair: DM keeps at most [`DM_MAX_MSGS_PER_PAIR`] per (target, sender)
//! and TASK [`TASK_MAX_MSGS_PER_PAIR`] per (role, sender), refusing one more to its sender and
//! never evicting anything older (`binding/streams.rs`). What the broker cannot bound is how
//! many pairs a sender opens: Appendix B lets an agent publish `inst.<anything>.<id>` and
//! `svc.<anything>.<id>`, and a target that does not exist never reads. The warden closes that:
//! - a DM to a target that is no minted, unrevoked agent (only agents have a `dm_<id>` to read
//!   it with) is purged as soon as it is seen (a flood to one such target, once per
//!   [`PURGE_BATCH`]), and so is a task to a role no such agent holds;
//! - a pair that fills up is trimmed of the DMs its target has already read (below the ack
//!   floor of `dm_<target>`; DM keeps read messages for history), so the pair bound counts what
//!   waits unread, not what was said in the retention window; and when DM as a whole is nearly
//!   full, every agent's read DMs are trimmed, so reading frees room without an operator.
//!
//! It sees each publish on a core subscription (refused ones too, which is how a full pair is
//! noticed), and sweeps the streams' subjects when it starts and every [`SWEEP_INTERVAL`], which
//! catches what was stored while it was not running and identities revoked since.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use async_nats::jetstream::consumer::{Consumer, pull};
use futures_util::StreamExt;

use super::{Context, Health, Service, ServiceError};
use crate::binding::dm_durable;
use crate::binding::streams::DM_MAX_MSGS_PER_PAIR;
use crate::ops::CredentialProfile;
use crate::space::{Identities, Space};

/// How often every DM and TASK subject is checked (and full pairs trimmed) besides the live
/// checks.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// A target's first unreadable message is purged at once; more to the same target within this
/// window are purged together at its end (a flood to one target is one purge per window).
const PURGE_BATCH: Duration = Duration::from_millis(50);
/// A pair is trimmed of read DMs once it holds this many.
const TRIM_AT: i64 = DM_MAX_MSGS_PER_PAIR / 2;
/// When DM holds this share (percent) of its byte limit, every agent's read DMs are trimmed:
/// a full store drops what has been read before it refuses what has not.
const FULL_PERCENT: u64 = 90;
/// A pair that stays full after a trim (its target reads nothing) is trimmed again at most this
/// often, and DM is checked for being nearly full at most this often.
const TRIM_EVERY: Duration = Duration::from_secs(1);

/// The warden of one space.
pub struct Warden {
    space: Arc<Space>,
    identities: Arc<Identities>,
}

impl Warden {
    /// A warden of `space`, judging targets and roles by `identities`.
    pub fn new(space: Arc<Space>, identities: Arc<Identities>) -> Self {
        Warden { space, identities }
    }
}

/// Who may be addressed: the agents minted and not revoked, and their roles.
#[derive(Default)]
struct Addressable {
    version: Option<u64>,
    agents: HashSet<String>,
    roles: HashSet<String>,
}

impl Addressable {
    fn refresh(&mut self, identities: &Identities) {
        let version = identities.version();
        if self.version == Some(version) {
            return;
        }
        self.agents.clear();
        self.roles.clear();
        for record in identities.active() {
            if record.profile == CredentialProfile::Agent {
                self.roles.extend(record.role.clone());
                self.agents.insert(record.id);
            }
        }
        self.version = Some(version);
    }
}

/// A routing token that can be used inside a purge filter as itself.
fn literal(token: &str) -> bool {
    !token.is_empty() && !token.contains(['*', '>'])
}

/// What the warden does about one DM or task subject it saw.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Nobody can read it: purge everything to this target (the filter).
    Purge(String),
    /// A real DM pair (target, subject).
    Pair(String, String),
    /// Nothing to do.
    Keep,
}

fn judge(prefix: &str, subject: &str, addressable: &Addressable) -> Verdict {
    let Some(rest) = subject
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('.'))
    else {
        return Verdict::Keep;
    };
    let tokens: Vec<&str> = rest.split('.').collect();
    match tokens.as_slice() {
        ["inst", target, sender] if literal(target) && literal(sender) => {
            if addressable.agents.contains(*target) {
                Verdict::Pair((*target).to_owned(), subject.to_owned())
            } else {
                Verdict::Purge(format!("{prefix}.inst.{target}.*"))
            }
        }
        ["svc", role, sender] if literal(role) && literal(sender) => {
            if addressable.roles.contains(*role) {
                Verdict::Keep
            } else {
                Verdict::Purge(format!("{prefix}.svc.{role}.*"))
            }
        }
        _ => Verdict::Keep,
    }
}

impl Warden {
    fn stream_of(&self, filter: &str) -> String {
        let svc = format!("{}.svc.", self.space.names().prefix());
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
                .get_stream(&stream)
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
                "purged messages addressed to no agent or role of this space"
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
                .get_stream(self.space.names().dm_stream())
                .await?;
            let mut consumer: Consumer<pull::Config> =
                stream.get_consumer(&dm_durable(target)).await?;
            let floor = consumer.info().await?.ack_floor.stream_sequence;
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

    /// Whether DM holds [`FULL_PERCENT`] of its byte limit or more.
    async fn dm_nearly_full(&self) -> bool {
        let info = async {
            let mut stream = self
                .space
                .jetstream()
                .get_stream(self.space.names().dm_stream())
                .await?;
            let info = stream.info().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((
                info.state.bytes,
                info.config.max_bytes,
            ))
        };
        match info.await {
            Ok((bytes, max)) => max > 0 && bytes * 100 >= max as u64 * FULL_PERCENT,
            Err(e) => {
                tracing::warn!(space = self.space.name(), error = %e, "DM not read");
                false
            }
        }
    }

    /// Checks every stored DM and task subject: purges the unaddressable, trims full pairs.
    async fn sweep(&self, addressable: &mut Addressable) -> Result<(), ServiceError> {
        addressable.refresh(&self.identities);
        let prefix = self.space.names().prefix();
        let mut purges = BTreeSet::new();
        for (stream, filter) in [
            (self.space.names().dm_stream(), format!("{prefix}.inst.>")),
            (self.space.names().task_stream(), format!("{prefix}.svc.>")),
        ] {
            let stream = self
                .space
                .jetstream()
                .get_stream(&stream)
                .await
                .map_err(ServiceError::at("reading a stream the warden sweeps"))?;
            let mut subjects = stream
                .info_with_subjects(&filter)
                .await
                .map_err(ServiceError::at("listing subjects"))?;
            while let Some(entry) = subjects.next().await {
                let (subject, count) = entry.map_err(ServiceError::at("listing subjects"))?;
                match judge(&prefix, &subject, addressable) {
                    Verdict::Purge(filter) => {
                        purges.insert(filter);
                    }
                    Verdict::Pair(target, subject) if count as i64 >= TRIM_AT => {
                        self.trim(&target, &subject).await;
                    }
                    _ => {}
                }
            }
        }
        for filter in purges {
            self.purge(&filter).await;
        }
        Ok(())
    }
}

impl Service for Warden {
    fn name(&self) -> &'static str {
        "warden"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let nats = self.space.nats();
        let prefix = self.space.names().prefix();
        let mut dms = nats
            .subscribe(format!("{prefix}.inst.*.*"))
            .await
            .map_err(ServiceError::at("subscribing to DMs"))?;
        let mut tasks = nats
            .subscribe(format!("{prefix}.svc.*.*"))
            .await
            .map_err(ServiceError::at("subscribing to tasks"))?;
        nats.flush()
            .await
            .map_err(ServiceError::at("subscribing to DMs and tasks"))?;
        let mut addressable = Addressable::default();
        self.sweep(&mut addressable).await?;
        ctx.report(Health::Running);

        // When DM was last checked for being nearly full.
        let mut fullness_checked: Option<Instant> = None;
        // Per DM pair: how many it may hold (publishes seen since it was last counted), and
        // when it was last trimmed.
        let mut pairs: HashMap<String, (i64, Option<Instant>)> = HashMap::new();
        // Purged within the current window, and waiting for its end.
        let mut recent: BTreeSet<String> = BTreeSet::new();
        let mut purges: BTreeSet<String> = BTreeSet::new();
        let mut batch = tokio::time::interval(PURGE_BATCH);
        let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
        sweep.reset();
        loop {
            let subject = tokio::select! {
                () = ctx.cancelled() => return Ok(()),
                msg = dms.next() => msg.ok_or_else(|| ServiceError::msg("the DM subscription ended"))?.subject,
                msg = tasks.next() => msg.ok_or_else(|| ServiceError::msg("the task subscription ended"))?.subject,
                _ = batch.tick() => {
                    recent = std::mem::take(&mut purges);
                    for filter in &recent {
                        self.purge(filter).await;
                    }
                    continue;
                }
                _ = sweep.tick() => {
                    pairs.clear();
                    self.sweep(&mut addressable).await?;
                    continue;
                }
            };
            addressable.refresh(&self.identities);
            match judge(&prefix, subject.as_str(), &addressable) {
                Verdict::Purge(filter) if recent.contains(&filter) => {
                    purges.insert(filter);
                }
                Verdict::Purge(filter) => {
                    self.purge(&filter).await;
                    recent.insert(filter);
                }
                Verdict::Pair(target, subject) => {
                    if fullness_checked.is_none_or(|t| t.elapsed() >= TRIM_EVERY) {
                        fullness_checked = Some(Instant::now());
                        if self.dm_nearly_full().await {
                            for agent in &addressable.agents {
                                self.trim(agent, &format!("{prefix}.inst.{agent}.*")).await;
                            }
                        }
                    }
                    let (held, trimmed) = pairs.entry(subject.clone()).or_default();
                    *held += 1;
                    if *held >= TRIM_AT && trimmed.is_none_or(|t| t.elapsed() >= TRIM_EVERY) {
                        // A target that keeps reading is trimmed at every publish past the
                        // mark, so that a busy pair is not refused for what was read; one that
                        // read nothing since is looked at again only after TRIM_EVERY.
                        match self.trim(&target, &subject).await {
                            Some((purged, now)) => {
                                *held = now;
                                *trimmed = (purged == 0).then(Instant::now);
                            }
                            None => *trimmed = Some(Instant::now()),
                        }
                    }
                }
                Verdict::Keep => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addressable() -> Addressable {
        Addressable {
            version: Some(0),
            agents: ["UBOB".to_owned()].into(),
            roles: ["reviewer".to_owned()].into(),
        }
    }

    #[test]
    fn dms_and_tasks_nobody_can_read_are_purged_by_target() {
        let a = addressable();
        let p = "cotal.main";
        assert_eq!(
            judge(p, "cotal.main.inst.UBOB.UMAL", &a),
            Verdict::Pair("UBOB".into(), "cotal.main.inst.UBOB.UMAL".into())
        );
        assert_eq!(
            judge(p, "cotal.main.inst.UNOBODY.UMAL", &a),
            Verdict::Purge("cotal.main.inst.UNOBODY.*".into())
        );
        assert_eq!(judge(p, "cotal.main.svc.reviewer.UMAL", &a), Verdict::Keep);
        assert_eq!(
            judge(p, "cotal.main.svc.ghost.UMAL", &a),
            Verdict::Purge("cotal.main.svc.ghost.*".into())
        );
    }

    #[test]
    fn a_wildcard_token_never_becomes_a_purge_filter() {
        let a = addressable();
        for subject in [
            "cotal.main.inst.*.UMAL",
            "cotal.main.inst.>",
            "cotal.main.svc.*.UMAL",
            "cotal.main.inst.UX.UMAL.extra",
            "cotal.other.inst.UX.UMAL",
        ] {
            assert_eq!(judge("cotal.main", subject, &a), Verdict::Keep, "{subject}");
        }
    }
}
