//! One stream copied out of JetStream and back in, over the JetStream API
//! (`$JS.API.STREAM.SNAPSHOT.<stream>`, `$JS.API.STREAM.RESTORE.<stream>`): what `cotald
//! backup` takes of each stream and bucket of a space, and what the first start after `cotald
//! restore` puts back. The archive bytes are the broker's own (its messages and its consumers
//! with their positions); cotald stores them as they come and feeds them back unchanged.
//!
//! **Snapshot.** The broker sends the archive in chunks to an inbox; each full chunk carries a
//! reply subject that must be answered before the broker sends more than its window (flow
//! control), and an empty message ends it (a status other than 204 is the broker's failure).
//! The request answered first holds the stream's config and state, which a restore sends back.
//!
//! **Restore.** The broker names a subject to send the archive to; each chunk is a request
//! answered once the broker has taken it (backpressure), and an empty request ends it,
//! answered with the restored stream's info once the broker has rebuilt it. A stream that
//! exists already is refused by the broker.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::files::FileError;

/// Bytes per snapshot chunk asked of the broker.
const SNAPSHOT_CHUNK: usize = 128 * 1024;
/// Bytes per restore chunk sent to the broker.
const RESTORE_CHUNK: usize = 64 * 1024;
/// How long a snapshot may go without a chunk, or a restore chunk without its answer.
const STALL: Duration = Duration::from_secs(30);
/// How long the broker may take to rebuild a restored stream from its archive.
const REBUILD: Duration = Duration::from_secs(600);

/// What a snapshot copied.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The restore request (`{config, state}`) the broker answered the snapshot with.
    pub request: Value,
    /// The stream's messages when the snapshot began.
    pub messages: u64,
    /// The archive's size.
    pub bytes: u64,
}

/// Why a stream could not be copied out or back.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The broker refused, or failed, and said why.
    #[error("{stream}: the broker could not {action} it: {said}")]
    Refused {
        /// The stream.
        stream: String,
        /// `snapshot` or `restore`.
        action: &'static str,
        /// The broker's words.
        said: String,
    },
    /// The broker stopped answering, or the connection failed.
    #[error("{stream}: {action} failed")]
    Broker {
        /// The stream.
        stream: String,
        /// What was being done.
        action: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The archive file could not be written or read.
    #[error(transparent)]
    File(#[from] FileError),
}

/// Copies `stream` (with its consumers and their positions when `consumers`) into `out`.
pub async fn snapshot(
    nats: &async_nats::Client,
    stream: &str,
    consumers: bool,
    out: &Path,
) -> Result<Snapshot, SnapshotError> {
    let broker = |action| failed(stream, action);
    let inbox = nats.new_inbox();
    let mut chunks = nats
        .subscribe(inbox.clone())
        .await
        .map_err(|e| broker("subscribing for the snapshot")(e.into()))?;
    let request = json!({
        "deliver_subject": inbox,
        "no_consumers": !consumers,
        "chunk_size": SNAPSHOT_CHUNK,
    });
    let answer = nats
        .request(
            crate::binding::system::stream_snapshot(stream),
            request.to_string().into(),
        )
        .await
        .map_err(|e| broker("asking for a snapshot")(e.into()))?;
    let answer = api_answer(stream, "snapshot", &answer.payload)?;
    let mut file = private_file(out).await?;
    let write = |e| FileError::at(out, "writing")(e);
    let mut bytes = 0u64;
    loop {
        let chunk = tokio::time::timeout(STALL, chunks.next())
            .await
            .map_err(|e| broker("waiting for the next chunk")(e.into()))?
            .ok_or_else(|| broker("receiving chunks")("the subscription ended".into()))?;
        if chunk.payload.is_empty() {
            match chunk.status {
                Some(status) if status.as_u16() != 204 => {
                    return Err(SnapshotError::Refused {
                        stream: stream.to_owned(),
                        action: "snapshot",
                        said: format!(
                            "{} {}",
                            status.as_u16(),
                            chunk.description.unwrap_or_default()
                        ),
                    });
                }
                _ => break,
            }
        }
        // Answered first: the broker sends the next chunks while this one is written.
        if let Some(reply) = chunk.reply {
            nats.publish(reply, Bytes::new())
                .await
                .map_err(|e| broker("acknowledging a chunk")(e.into()))?;
        }
        file.write_all(&chunk.payload).await.map_err(write)?;
        bytes += chunk.payload.len() as u64;
    }
    file.sync_all().await.map_err(write)?;
    Ok(Snapshot {
        messages: answer["state"]["messages"].as_u64().unwrap_or(0),
        request: json!({ "config": answer["config"], "state": answer["state"] }),
        bytes,
    })
}

/// Creates `stream` from `request` (its `{config, state}`) and the archive in `input`; the
/// restored stream's message count.
pub async fn restore(
    nats: &async_nats::Client,
    stream: &str,
    request: &Value,
    input: &Path,
) -> Result<u64, SnapshotError> {
    let broker = |action| failed(stream, action);
    let answer = nats
        .request(
            crate::binding::system::stream_restore(stream),
            request.to_string().into(),
        )
        .await
        .map_err(|e| broker("asking for a restore")(e.into()))?;
    let answer = api_answer(stream, "restore", &answer.payload)?;
    let Some(deliver) = answer["deliver_subject"].as_str().map(str::to_owned) else {
        return Err(SnapshotError::Refused {
            stream: stream.to_owned(),
            action: "restore",
            said: format!("an answer without a subject to send to: {answer}"),
        });
    };
    let mut file = tokio::fs::File::open(input)
        .await
        .map_err(FileError::at(input, "opening"))?;
    let mut chunk = vec![0; RESTORE_CHUNK];
    loop {
        let n = read_full(&mut file, &mut chunk)
            .await
            .map_err(FileError::at(input, "reading"))?;
        if n == 0 {
            break;
        }
        let request = async_nats::Request::new()
            .payload(Bytes::copy_from_slice(&chunk[..n]))
            .timeout(Some(STALL));
        let taken = nats
            .send_request(deliver.clone(), request)
            .await
            .map_err(|e| broker("sending a chunk")(e.into()))?;
        chunk_answer(stream, &taken.payload)?;
    }
    let end = async_nats::Request::new()
        .payload(Bytes::new())
        .timeout(Some(REBUILD));
    let done = nats
        .send_request(deliver, end)
        .await
        .map_err(|e| broker("finishing the restore")(e.into()))?;
    let info = api_answer(stream, "restore", &done.payload)?;
    Ok(info["state"]["messages"].as_u64().unwrap_or(0))
}

/// What turns a failure of `action` on `stream` into a [`SnapshotError::Broker`].
fn failed(
    stream: &str,
    action: &'static str,
) -> impl FnOnce(Box<dyn std::error::Error + Send + Sync>) -> SnapshotError {
    let stream = stream.to_owned();
    move |source| SnapshotError::Broker {
        stream,
        action,
        source,
    }
}

/// A JetStream API answer as JSON, or the broker's refusal.
fn api_answer(stream: &str, action: &'static str, payload: &[u8]) -> Result<Value, SnapshotError> {
    let refused = |said: String| SnapshotError::Refused {
        stream: stream.to_owned(),
        action,
        said,
    };
    let answer: Value = serde_json::from_slice(payload)
        .map_err(|_| refused(String::from_utf8_lossy(payload).into_owned()))?;
    match answer.get("error") {
        Some(error) => Err(refused(
            error["description"]
                .as_str()
                .map_or_else(|| error.to_string(), str::to_owned),
        )),
        None => Ok(answer),
    }
}

/// The answer to one restore chunk: empty when taken; an error in JSON or as `-ERR` text.
fn chunk_answer(stream: &str, payload: &[u8]) -> Result<(), SnapshotError> {
    if payload.is_empty() {
        return Ok(());
    }
    if payload.starts_with(b"-ERR") {
        return Err(SnapshotError::Refused {
            stream: stream.to_owned(),
            action: "restore",
            said: String::from_utf8_lossy(payload).into_owned(),
        });
    }
    api_answer(stream, "restore", payload).map(|_| ())
}

/// Reads until `buf` is full or the file ends; how much was read.
async fn read_full(file: &mut tokio::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]).await? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// A new owner-only file: an archive holds every message of the stream.
async fn private_file(path: &Path) -> Result<tokio::fs::File, FileError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(FileError::at(path, "creating"))?;
    Ok(tokio::fs::File::from_std(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_brokers_refusals_are_read_in_both_of_its_forms() {
        let json = br#"{"type":"x","error":{"code":400,"err_code":10130,"description":"stream name already in use, cannot restore"}}"#;
        let err = api_answer("CHAT_main", "restore", json)
            .unwrap_err()
            .to_string();
        assert!(err.contains("already in use"), "{err}");
        assert!(chunk_answer("CHAT_main", b"").is_ok());
        let err = chunk_answer("CHAT_main", b"-ERR 'storage failure during restore'")
            .unwrap_err()
            .to_string();
        assert!(err.contains("storage failure"), "{err}");
        let ok = api_answer(
            "CHAT_main",
            "restore",
            br#"{"deliver_subject":"$JS.SNAPSHOT.RESTORE.x"}"#,
        );
        assert_eq!(ok.unwrap()["deliver_subject"], "$JS.SNAPSHOT.RESTORE.x");
    }
}
