//! Idempotent bootstrap of one space (§8): create what is missing, never touch what exists.
//! An existing stream whose pinned fields differ is reported as drift (someone changed it,
//! or an older cotald made it); an existing registry value that differs from the profile is
//! reported too. Nothing is overwritten, so re-running bootstrap never loses data.

use async_nats::jetstream::context::{GetStreamError, GetStreamErrorKind};
use async_nats::jetstream::kv::CreateErrorKind;
use async_nats::jetstream::{self, ErrorCode};

use crate::binding::SpaceNames;
use crate::binding::streams::{self, Drift, Retention};
use crate::client::BoxError;

/// What one bootstrap run did and found.
#[derive(Debug, Default, Clone)]
pub struct BootstrapReport {
    /// Streams and buckets created by this run.
    pub created: Vec<String>,
    /// Pinned fields that differ on existing streams.
    pub drift: Vec<Drift>,
    /// Channel registry keys written by this run.
    pub registry_written: Vec<String>,
    /// Channel registry keys whose stored value differs from the profile (kept as stored).
    pub registry_drift: Vec<String>,
}

/// Why bootstrap failed.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// A JetStream request failed.
    #[error("space `{space}`: {action} {object}")]
    JetStream {
        space: String,
        action: &'static str,
        object: String,
        #[source]
        source: BoxError,
    },
    /// An existing stream differs in a way that breaks confidentiality; refused, not served.
    #[error(
        "space `{space}` refused: {drift}. Fix the stream (or delete it to let cotald recreate \
         it) before serving this space"
    )]
    Unsafe { space: String, drift: String },
}

/// Ensures every stream and bucket of the space exists, and that the channel registry holds
/// `registry` entries (key → JSON value) that are absent.
pub async fn bootstrap(
    js: &jetstream::Context,
    names: &SpaceNames,
    retention: &Retention,
    registry: &[(String, serde_json::Value)],
) -> Result<BootstrapReport, BootstrapError> {
    let mut report = BootstrapReport::default();
    // One round trip per stream, all in flight at once (startup time), and the channel
    // registry's bucket opened meanwhile: at a first start it is not made yet, and is opened
    // again once it is.
    let checks = streams::all(names, retention)
        .into_iter()
        .map(|expected| ensure_stream(js, names, expected));
    let bucket = names.channels_bucket();
    let (checked, opened) = tokio::join!(
        futures_util::future::try_join_all(checks),
        js.get_key_value(&bucket)
    );
    for (created, drift) in checked? {
        report.created.extend(created);
        report.drift.extend(drift);
    }
    let kv = match opened {
        Ok(kv) => kv,
        Err(_) => js
            .get_key_value(&bucket)
            .await
            .map_err(|e| failed(names, "opening", &bucket, e))?,
    };
    seed_registry(&kv, names, registry, &mut report).await?;
    for d in &report.drift {
        tracing::warn!(space = names.space(), drift = %d, "stream config drift (not changed)");
    }
    let unsafe_drift: Vec<String> = report
        .drift
        .iter()
        .filter(|d| d.is_unsafe())
        .map(ToString::to_string)
        .collect();
    if !unsafe_drift.is_empty() {
        return Err(BootstrapError::Unsafe {
            space: names.space().to_owned(),
            drift: unsafe_drift.join("; "),
        });
    }
    for key in &report.registry_drift {
        tracing::warn!(
            space = names.space(),
            key,
            "channel registry value differs from the profile (kept as stored)"
        );
    }
    Ok(report)
}

/// A JetStream request of the bootstrap of `names`' space that failed.
fn failed(
    names: &SpaceNames,
    action: &'static str,
    object: &str,
    e: impl Into<BoxError>,
) -> BootstrapError {
    BootstrapError::JetStream {
        space: names.space().to_owned(),
        action,
        object: object.to_owned(),
        source: e.into(),
    }
}

/// Creates the stream when it is missing; else scales it to the cluster's replicas, applies
/// the bounds it lacks, and reports how else it differs. Returns its name when created.
async fn ensure_stream(
    js: &jetstream::Context,
    names: &SpaceNames,
    expected: jetstream::stream::Config,
) -> Result<(Option<String>, Vec<Drift>), BootstrapError> {
    let err = |action, e: BoxError| failed(names, action, &expected.name, e);
    // The stream's info comes with it: one round trip per stream.
    let existing = match js.get_stream(&expected.name).await {
        Ok(existing) => existing,
        Err(e) if is_not_found(&e) => {
            js.create_stream(expected.clone())
                .await
                .map_err(|e| err("creating", e.into()))?;
            return Ok((Some(expected.name.clone()), Vec::new()));
        }
        Err(e) => return Err(err("reading", e.into())),
    };
    // What the stream is now, as this run leaves it.
    let mut current = existing.cached_info().config.clone();
    if current.num_replicas != expected.num_replicas {
        // A cluster's replicas changed: JetStream moves the stream in place. Its byte limit
        // changes with it: the account's quota counts every replica, so each one's share is
        // divided by their number.
        let mut scaled = current.clone();
        scaled.num_replicas = expected.num_replicas;
        scaled.max_bytes = expected.max_bytes;
        js.update_stream(scaled.clone())
            .await
            .map_err(|e| err("scaling", e.into()))?;
        tracing::info!(
            stream = expected.name,
            from = current.num_replicas,
            to = expected.num_replicas,
            "stream replicas changed"
        );
        current = scaled;
    }
    let mut drift = streams::drift(&expected, &current);
    // Streams made before a bound get it (the per-sender bounds of DM and TASK, CHAT's
    // largest message): they only narrow what is stored.
    if let Some((bounded, fields)) = streams::narrowed(&current, &expected) {
        js.update_stream(bounded)
            .await
            .map_err(|e| err("bounding", e.into()))?;
        tracing::info!(
            stream = expected.name,
            ?fields,
            "bounds applied to an existing stream"
        );
        drift.retain(|d| !fields.contains(&d.field));
    }
    Ok((None, drift))
}

/// Writes the registry entries that are absent; one that differs from `registry` is kept as
/// stored and reported.
async fn seed_registry(
    kv: &jetstream::kv::Store,
    names: &SpaceNames,
    registry: &[(String, serde_json::Value)],
    report: &mut BootstrapReport,
) -> Result<(), BootstrapError> {
    let bucket = &kv.name;
    // Every entry is read at once (startup time); each is then written or compared.
    let reads = registry.iter().map(|(key, _)| async move {
        let object = format!("{bucket}/{key}");
        kv.get(key)
            .await
            .map_err(|e| failed(names, "reading", &object, e))
    });
    let stored = futures_util::future::try_join_all(reads).await?;
    for ((key, value), stored) in registry.iter().zip(stored) {
        let object = format!("{bucket}/{key}");
        match stored {
            None => {
                let bytes = serde_json::to_vec(value).unwrap_or_default();
                match kv.create(key, bytes.into()).await {
                    Ok(_) => report.registry_written.push(key.clone()),
                    // The key appeared meanwhile: that value wins, as stored.
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {}
                    Err(e) => return Err(failed(names, "writing", &object, e)),
                }
            }
            Some(bytes) => {
                let same = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .is_ok_and(|stored| &stored == value);
                if !same {
                    report.registry_drift.push(key.clone());
                }
            }
        }
    }
    Ok(())
}

fn is_not_found(e: &GetStreamError) -> bool {
    matches!(e.kind(), GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND)
}
