//! The consumer guard: no identity can take the presence and channel-registry buckets'
//! consumers from the others (§6: every client reads presence; §7: every client reads the
//! channel registry).
//!
//! Appendix B grants every agent `$JS.API.CONSUMER.CREATE.<KV|CHKV>.>`, the creates a KV watch
//! is made of, and that subject takes any consumer name: nothing in the grant bounds how many
//! consumers one agent creates, while a stream admits a bounded number
//! ([`MAX_CONSUMERS`](crate::binding::streams::MAX_CONSUMERS)). The grant stays, since clients written to the appendix watch with it;
//! what the broker cannot bound per identity the guard bounds by attribution. JetStream audits
//! every API request with the client that made it ([`API_AUDIT_ADVISORIES`]), so every
//! consumer created on a bucket has an owner:
//! - a durable consumer on a bucket (a `durable_name`, no inactivity threshold, or one longer
//!   than [`LONGEST_INACTIVITY`]) is deleted at once: no watch needs one, and it would outlive
//!   its client;
//! - so is a push consumer whose deliver subject is not under its creator's own inbox
//!   (`_INBOX_<id>.`): nats-server does not check a deliver subject against its creator's
//!   permissions, and a bucket the creator writes to (its presence key) delivered onto another
//!   agent's chat subject would be a message in that agent's name (§3, §9). nats-server 2.15.1
//!   was seen to deliver nothing to such a subject (the consumer stays pending), which the guard
//!   does not rely on;
//! - an identity keeps at most [`PER_IDENTITY`] consumers on each bucket (its watches, and those
//!   a reconnecting client leaves behind until they lapse). One more is deleted at once and the
//!   identity is held: every consumer it creates on the buckets is deleted as soon as it is
//!   seen, until it has created none for [`HOLD_QUIET`]. Those it kept are left alone, so its
//!   watches go on;
//! - the identity is told why on its inbox ([`guard_notice`]), with the figures, at most once
//!   per `NOTICE_EVERY`, and the log says it once per hold;
//! - only minted identities are bounded; the appliance's own users (its provisioner, the
//!   machine operator, the dashboard) are not.
//!
//! What it does not do is refuse the create itself: a create subject carries no identity (a
//! DM's does, which is how a DM hold refuses at publish, `space/holds.rs`), and a user's
//! permissions change only with a new credential. So the broker creates the consumer and the
//! guard deletes it a moment later; the streams' limit is far above what a flood creates in
//! that moment (`it::fairness::a_consumer_flood_on_the_buckets_stops_no_watch`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, Select};
use futures_util::{StreamExt, TryStreamExt};
use serde::Deserialize;
use tokio::time::Instant;

use super::{Context, Health, Service, ServiceError};
use async_nats::Subscriber;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::stream::ConsumerErrorKind;

use crate::binding::HELD;
use crate::binding::{API_AUDIT_ADVISORIES, SpaceNames, consumer_deleted_advisories, guard_notice};
use crate::space::{Identities, Space};

/// Consumers one identity may keep on each bucket.
pub const PER_IDENTITY: usize = 8;
/// A held identity is released once it has created no consumer on the buckets for this long.
pub const HOLD_QUIET: Duration = Duration::from_secs(10);
/// A consumer whose inactivity threshold is longer than this is treated as durable.
pub const LONGEST_INACTIVITY: Duration = Duration::from_secs(60 * 60);
/// A held identity is told at most this often.
const NOTICE_EVERY: Duration = Duration::from_secs(1);

/// The guard of one space.
pub struct ConsumerGuard {
    space: Arc<Space>,
    identities: Arc<Identities>,
}

impl ConsumerGuard {
    /// A guard of `space`'s buckets, bounding the identities minted for it.
    pub fn new(space: Arc<Space>, identities: Arc<Identities>) -> Self {
        ConsumerGuard { space, identities }
    }
}

/// What becomes of a consumer just created on a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// It stays, counted against its owner.
    Keep,
    /// Deleted: it is durable, or delivers outside its owner's inbox.
    Forbidden,
    /// Deleted: its owner is past its bound, or held.
    Held {
        /// Whether this create began the hold.
        began: bool,
    },
}

/// Who owns which consumer on the buckets, and who is held: the guard's decisions, with no I/O.
#[derive(Default)]
struct Tally {
    /// (stream, consumer) → its owner, for the consumers kept.
    owners: HashMap<(String, String), String>,
    /// (owner, stream) → how many of the consumers kept it owns there.
    kept: HashMap<(String, String), usize>,
    /// Held identities, until when (extended by each create while held).
    held: HashMap<String, Instant>,
}

impl Tally {
    fn created(
        &mut self,
        owner: &str,
        stream: &str,
        name: &str,
        forbidden: bool,
        now: Instant,
    ) -> Verdict {
        if forbidden {
            return Verdict::Forbidden;
        }
        let key = (stream.to_owned(), name.to_owned());
        if self.owners.contains_key(&key) {
            // The same consumer again: an update, or a create repeated.
            return Verdict::Keep;
        }
        if let Some(until) = self.held.get_mut(owner) {
            *until = now + HOLD_QUIET;
            return Verdict::Held { began: false };
        }
        let kept = self
            .kept
            .entry((owner.to_owned(), stream.to_owned()))
            .or_default();
        if *kept >= PER_IDENTITY {
            self.held.insert(owner.to_owned(), now + HOLD_QUIET);
            return Verdict::Held { began: true };
        }
        *kept += 1;
        self.owners.insert(key, owner.to_owned());
        Verdict::Keep
    }

    fn deleted(&mut self, stream: &str, name: &str) {
        let Some(owner) = self.owners.remove(&(stream.to_owned(), name.to_owned())) else {
            return;
        };
        let key = (owner, stream.to_owned());
        if let Some(kept) = self.kept.get_mut(&key) {
            *kept = kept.saturating_sub(1);
            if *kept == 0 {
                self.kept.remove(&key);
            }
        }
    }

    fn kept(&self, owner: &str, stream: &str) -> usize {
        self.kept
            .get(&(owner.to_owned(), stream.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// Ends the holds that have been quiet for [`HOLD_QUIET`]; returns whose.
    fn release(&mut self, now: Instant) -> Vec<String> {
        let ended: Vec<String> = self
            .held
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ended {
            self.held.remove(id);
        }
        ended
    }
}

/// The subject of an API audit advisory: read first, since every JetStream request of the
/// account is audited and only the bucket creates need the rest.
#[derive(Deserialize)]
struct AuditSubject<'a> {
    #[serde(borrow)]
    subject: Cow<'a, str>,
}

/// The part of a bucket create's audit advisory the guard reads.
#[derive(Deserialize)]
struct Audit {
    client: Option<AuditClient>,
    response: Option<String>,
}

#[derive(Deserialize)]
struct AuditClient {
    user: Option<String>,
}

/// A consumer create's answer.
#[derive(Deserialize)]
struct CreateResponse {
    stream_name: Option<String>,
    name: Option<String>,
    config: Option<CreatedConfig>,
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct CreatedConfig {
    durable_name: Option<String>,
    deliver_subject: Option<String>,
    /// Nanoseconds.
    inactive_threshold: Option<u64>,
}

impl CreatedConfig {
    fn is_durable(&self) -> bool {
        is_durable(
            self.durable_name.is_some(),
            self.inactive_threshold.map(Duration::from_nanos),
        )
    }
}

/// Durable as the guard counts it: named durable, without an inactivity threshold, or with one
/// longer than [`LONGEST_INACTIVITY`].
fn is_durable(named: bool, inactive_threshold: Option<Duration>) -> bool {
    named || inactive_threshold.is_none_or(|idle| idle.is_zero() || idle > LONGEST_INACTIVITY)
}

/// Why a consumer may not stay on a bucket, whoever made it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Forbidden {
    /// It is durable.
    Durable,
    /// It delivers to this subject, outside its creator's inbox.
    Delivery(String),
}

/// A consumer created on one of `buckets`, as the audit of its create tells it.
#[derive(Debug, PartialEq, Eq)]
struct Created {
    owner: String,
    stream: String,
    name: String,
    forbidden: Option<Forbidden>,
}

/// Reads an API audit advisory: a successful consumer create on one of `buckets`, or nothing.
fn created_on(payload: &[u8], buckets: &[String; 2]) -> Option<Created> {
    let AuditSubject { subject } = serde_json::from_slice(payload).ok()?;
    let rest = crate::binding::system::consumer_create(&subject)?;
    let stream = rest.split('.').next()?;
    if !buckets.iter().any(|b| b == stream) {
        return None;
    }
    let audit: Audit = serde_json::from_slice(payload).ok()?;
    let response: CreateResponse = serde_json::from_str(audit.response.as_deref()?).ok()?;
    if response.error.is_some() {
        return None;
    }
    let config = response.config?;
    let owner = audit.client?.user?;
    let forbidden = if config.is_durable() {
        Some(Forbidden::Durable)
    } else {
        config
            .deliver_subject
            .filter(|to| !to.starts_with(&crate::binding::inbox_of(&owner)))
            .map(Forbidden::Delivery)
    };
    Some(Created {
        owner,
        stream: response.stream_name.unwrap_or_else(|| stream.to_owned()),
        name: response.name?,
        forbidden,
    })
}

/// What a held identity (or the owner of a durable) is told, in the words of a JetStream API
/// error, as a DM hold's refusal is.
fn notice(verdict: Verdict, created: &Created, kept: usize) -> serde_json::Value {
    let description = match (&created.forbidden, verdict) {
        (Some(Forbidden::Durable), _) => format!(
            "{HELD}consumer `{}` on `{}` was deleted: a durable consumer (or one kept for more \
             than {} idle) on the presence or channel-registry bucket is not allowed; watch \
             with an ephemeral or ordered consumer",
            created.name,
            created.stream,
            humantime(LONGEST_INACTIVITY)
        ),
        (Some(Forbidden::Delivery(to)), _) => format!(
            "{HELD}consumer `{}` on `{}` was deleted: it delivered to `{to}`, outside your inbox \
             `_INBOX_{}.>`",
            created.name, created.stream, created.owner
        ),
        _ => format!(
            "{HELD}consumer `{}` on `{}` was deleted: you keep {kept} consumers there, the most \
             one identity may ({PER_IDENTITY}); every consumer you create on the presence and \
             channel-registry buckets is deleted until you have created none for {}",
            created.name,
            created.stream,
            humantime(HOLD_QUIET)
        ),
    };
    serde_json::json!({"error": {"code": 429, "description": description}})
}

fn humantime(d: Duration) -> String {
    match d.as_secs() {
        s if s >= 3600 && s % 3600 == 0 => format!("{} h", s / 3600),
        s => format!("{s} s"),
    }
}

type Deletion = futures_util::future::BoxFuture<'static, (String, String, Option<String>)>;

impl Service for ConsumerGuard {
    fn name(&self) -> &'static str {
        "consumer-guard"
    }

    async fn run(&self, ctx: Context) -> Result<(), ServiceError> {
        let names = self.space.names();
        let buckets = [
            SpaceNames::kv_stream(&names.presence_bucket()),
            SpaceNames::kv_stream(&names.channels_bucket()),
        ];
        let (mut audits, mut deleted) = self.subscribe(&buckets).await?;
        // Both buckets at once (startup time).
        tokio::try_join!(
            self.delete_durables(&buckets[0]),
            self.delete_durables(&buckets[1])
        )?;
        ctx.report(Health::Running);

        let mut tally = Tally::default();
        let mut told: HashMap<String, Instant> = HashMap::new();
        let mut deletions: FuturesUnordered<Deletion> = FuturesUnordered::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                () = ctx.cancelled() => return Ok(()),
                audit = audits.next() => {
                    let Some(audit) = audit else {
                        return Err(ServiceError::msg("the API audit subscription ended"));
                    };
                    let Some(created) = created_on(&audit.payload, &buckets) else { continue };
                    if !self.identities.is_minted(&created.owner) {
                        continue;
                    }
                    self.judge(created, &mut tally, &mut told, &mut deletions).await;
                }
                Some(advisory) = deleted.next() => {
                    // `$JS.EVENT.ADVISORY.CONSUMER.DELETED.<stream>.<consumer>`
                    let mut tokens = advisory.subject.rsplitn(3, '.');
                    if let (Some(name), Some(stream)) = (tokens.next(), tokens.next()) {
                        tally.deleted(stream, name);
                    }
                }
                Some((stream, name, failed)) = deletions.next(), if !deletions.is_empty() => {
                    if let Some(error) = failed {
                        tracing::warn!(space = self.space.name(), stream, consumer = name, error, "consumer not deleted");
                    }
                }
                _ = tick.tick() => {
                    for id in tally.release(Instant::now()) {
                        told.remove(&id);
                        tracing::info!(space = self.space.name(), identity = id, "consumer hold ended");
                    }
                }
            }
        }
    }
}

impl ConsumerGuard {
    /// The API audit, and the deletions of consumers on the `buckets`' streams; subscribed
    /// (and flushed) before the durables already there are deleted, so that none created
    /// meanwhile goes unseen.
    async fn subscribe(
        &self,
        buckets: &[String; 2],
    ) -> Result<(Subscriber, Select<Subscriber, Subscriber>), ServiceError> {
        let client = self.space.nats();
        let audits = client
            .subscribe(API_AUDIT_ADVISORIES)
            .await
            .map_err(ServiceError::at("subscribing to the API audit"))?;
        let deleted = futures_util::stream::select(
            client
                .subscribe(consumer_deleted_advisories(&buckets[0]))
                .await
                .map_err(ServiceError::at("subscribing to consumer deletions"))?,
            client
                .subscribe(consumer_deleted_advisories(&buckets[1]))
                .await
                .map_err(ServiceError::at("subscribing to consumer deletions"))?,
        );
        client
            .flush()
            .await
            .map_err(ServiceError::at("subscribing to the API audit"))?;
        Ok((audits, deleted))
    }

    /// A consumer a minted identity created on a bucket: kept and counted, or deleted (and
    /// logged, once per hold), its owner told why at most every [`NOTICE_EVERY`].
    async fn judge(
        &self,
        created: Created,
        tally: &mut Tally,
        told: &mut HashMap<String, Instant>,
        deletions: &mut FuturesUnordered<Deletion>,
    ) {
        let now = Instant::now();
        let verdict = tally.created(
            &created.owner,
            &created.stream,
            &created.name,
            created.forbidden.is_some(),
            now,
        );
        if verdict == Verdict::Keep {
            return;
        }
        deletions.push(self.delete(created.stream.clone(), created.name.clone()));
        let kept = tally.kept(&created.owner, &created.stream);
        match verdict {
            Verdict::Forbidden => tracing::warn!(
                space = self.space.name(),
                identity = created.owner,
                stream = created.stream,
                consumer = created.name,
                forbidden = ?created.forbidden,
                "consumer on a bucket deleted"
            ),
            Verdict::Held { began: true } => tracing::warn!(
                space = self.space.name(),
                identity = created.owner,
                stream = created.stream,
                kept,
                bound = PER_IDENTITY,
                "identity past its consumers on a bucket: held, its creates deleted"
            ),
            _ => {}
        }
        let due = told
            .get(&created.owner)
            .is_none_or(|at| at.elapsed() >= NOTICE_EVERY);
        if due {
            told.insert(created.owner.clone(), now);
            let body = notice(verdict, &created, kept).to_string();
            let sent = self
                .space
                .nats()
                .publish(guard_notice(&created.owner), body.into())
                .await;
            if let Err(e) = sent {
                tracing::debug!(identity = created.owner, error = %e, "guard notice not sent");
            }
        }
    }

    /// Deletes `stream`'s consumer `name`; a consumer already gone is no failure.
    fn delete(&self, stream: String, name: String) -> Deletion {
        let js = self.space.jetstream().clone();
        Box::pin(async move {
            let failed = match js.delete_consumer_from_stream(&name, &stream).await {
                Ok(_) => None,
                Err(e)
                    if matches!(e.kind(), ConsumerErrorKind::JetStream(js)
                    if js.error_code() == ErrorCode::CONSUMER_NOT_FOUND) =>
                {
                    None
                }
                Err(e) => Some(e.to_string()),
            };
            (stream, name, failed)
        })
    }

    /// The durable consumers a bucket holds from before the guard ran (no audit names their
    /// owner), deleted: no watch needs one. The appliance makes none on the buckets.
    async fn delete_durables(&self, bucket: &str) -> Result<(), ServiceError> {
        let stream = self
            .space
            .jetstream()
            .get_stream_no_info(bucket)
            .await
            .map_err(ServiceError::at("opening a bucket's stream"))?;
        let infos: Vec<_> = stream
            .consumers()
            .try_collect()
            .await
            .map_err(ServiceError::at("listing a bucket's consumers"))?;
        for info in infos {
            if is_durable(
                info.config.durable_name.is_some(),
                Some(info.config.inactive_threshold),
            ) {
                tracing::warn!(
                    space = self.space.name(),
                    stream = bucket,
                    consumer = info.name,
                    "durable consumer on a bucket deleted"
                );
                let (_, _, failed) = self.delete(bucket.to_owned(), info.name).await;
                if let Some(error) = failed {
                    return Err(ServiceError::msg(format!(
                        "deleting a durable consumer of {bucket}: {error}"
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: &str = "UAQGWOEVJKMIO4WXSYOTLARXYOZTCXFK67JASEH6AFFFYK6FOPSKQCAD";
    const KV: &str = "KV_cotal_presence_main";

    #[test]
    fn an_identity_keeps_its_bound_and_is_held_past_it() {
        let mut t = Tally::default();
        let now = Instant::now();
        for i in 0..PER_IDENTITY {
            assert_eq!(
                t.created(ALICE, KV, &format!("w{i}"), false, now),
                Verdict::Keep
            );
        }
        // The same consumer again is not another.
        assert_eq!(t.created(ALICE, KV, "w0", false, now), Verdict::Keep);
        assert_eq!(
            t.created(ALICE, KV, "one-more", false, now),
            Verdict::Held { began: true }
        );
        // Held: even with room again, creates are deleted until it has been quiet.
        t.deleted(KV, "w0");
        assert_eq!(t.kept(ALICE, KV), PER_IDENTITY - 1);
        let later = now + HOLD_QUIET / 2;
        assert_eq!(
            t.created(ALICE, KV, "again", false, later),
            Verdict::Held { began: false }
        );
        assert!(
            t.release(later + HOLD_QUIET / 2).is_empty(),
            "extended by the create"
        );
        assert_eq!(t.release(later + HOLD_QUIET), [ALICE.to_owned()]);
        assert_eq!(
            t.created(ALICE, KV, "back", false, later + HOLD_QUIET),
            Verdict::Keep
        );
        // Another identity and another bucket are counted apart.
        assert_eq!(t.created("UOTHER", KV, "w0", false, now), Verdict::Keep);
        assert_eq!(
            t.created(ALICE, "KV_cotal_channels_main", "w0", false, now),
            Verdict::Keep
        );
    }

    #[test]
    fn a_durable_is_never_kept() {
        let mut t = Tally::default();
        assert_eq!(
            t.created(ALICE, KV, "d", true, Instant::now()),
            Verdict::Forbidden
        );
        assert_eq!(t.kept(ALICE, KV), 0);
        let durable = |durable_name: Option<&str>, threshold| CreatedConfig {
            durable_name: durable_name.map(str::to_owned),
            deliver_subject: None,
            inactive_threshold: threshold,
        };
        assert!(durable(Some("d"), Some(5_000_000_000)).is_durable());
        assert!(durable(None, None).is_durable());
        assert!(durable(None, Some(0)).is_durable());
        assert!(durable(None, Some(2 * LONGEST_INACTIVITY.as_nanos() as u64)).is_durable());
        assert!(!durable(None, Some(300_000_000_000)).is_durable());
    }

    #[test]
    fn the_audit_of_a_create_names_its_owner() {
        let buckets = [KV.to_owned(), "KV_cotal_channels_main".to_owned()];
        // As nats-server 2.15 writes it (`>` escaped, the response a JSON string).
        let audit = |subject: &str, response: serde_json::Value| {
            serde_json::to_vec(&serde_json::json!({
                "type": "io.nats.jetstream.advisory.v1.api_audit",
                "client": {"acc": "A", "user": ALICE, "kind": "Client"},
                "subject": subject,
                "request": "{}",
                "response": response.to_string(),
            }))
            .unwrap()
        };
        let ok = serde_json::json!({"type": "io.nats.jetstream.api.v1.consumer_create_response",
            "stream_name": KV, "name": "oc_1",
            "config": {"deliver_policy": "last_per_subject", "inactive_threshold": 5_000_000_000u64}});
        let created = created_on(
            &audit(
                "$JS.API.CONSUMER.CREATE.KV_cotal_presence_main.oc_1.$KV.cotal_presence_main.\u{3e}",
                ok.clone(),
            ),
            &buckets,
        );
        assert_eq!(
            created,
            Some(Created {
                owner: ALICE.to_owned(),
                stream: KV.to_owned(),
                name: "oc_1".to_owned(),
                forbidden: None,
            })
        );
        let raw = String::from_utf8(audit(
            "$JS.API.CONSUMER.CREATE.KV_cotal_presence_main.oc_1.$KV.x.>",
            ok.clone(),
        ))
        .unwrap();
        let escaped = raw.replace('>', "\\u003e");
        assert!(created_on(escaped.as_bytes(), &buckets).is_some());
        // A push watch delivers to its owner's inbox; anywhere else is forbidden.
        let push = |to: &str| {
            serde_json::json!({"stream_name": KV, "name": "p",
            "config": {"deliver_subject": to, "inactive_threshold": 5_000_000_000u64}})
        };
        let subject = "$JS.API.CONSUMER.CREATE.KV_cotal_presence_main.p";
        let own = format!("_INBOX_{ALICE}.x1");
        assert_eq!(
            created_on(&audit(subject, push(&own)), &buckets)
                .unwrap()
                .forbidden,
            None
        );
        for to in [
            "cotal.main.chat.UBOB.general",
            "_INBOX.x",
            &format!("_INBOX_{ALICE}X.y"),
        ] {
            assert_eq!(
                created_on(&audit(subject, push(to)), &buckets)
                    .unwrap()
                    .forbidden,
                Some(Forbidden::Delivery(to.to_owned()))
            );
        }
        // Not a bucket, not a create, refused: nothing.
        assert!(
            created_on(
                &audit("$JS.API.CONSUMER.CREATE.CHAT_main.x", ok.clone()),
                &buckets
            )
            .is_none()
        );
        assert!(
            created_on(
                &audit("$JS.API.CONSUMER.INFO.KV_cotal_presence_main.oc_1", ok),
                &buckets
            )
            .is_none()
        );
        let refused = serde_json::json!({"error": {"code": 400, "err_code": 10026, "description": "maximum consumers limit reached"}});
        assert!(
            created_on(
                &audit("$JS.API.CONSUMER.CREATE.KV_cotal_presence_main", refused),
                &buckets
            )
            .is_none()
        );
        let durable = serde_json::json!({"stream_name": KV, "name": "d",
            "config": {"durable_name": "d"}});
        let subject = "$JS.API.CONSUMER.DURABLE.CREATE.KV_cotal_presence_main.d";
        let created = created_on(&audit(subject, durable), &buckets).unwrap();
        assert_eq!(created.forbidden, Some(Forbidden::Durable));
    }
}
