//! The DM and anycast durables (§8): bound, never created (Appendix B), and pulled into the
//! sink a few copies ahead of the application.

use std::time::Duration;

use async_nats::jetstream;
use futures_util::StreamExt;

use super::super::{Client, ClientError};
use super::Notice;

/// How many DM or anycast copies are pulled ahead of the application.
const PULL_BATCH: usize = 64;

/// Binds a pre-created pull durable (`CONSUMER.INFO` only, never create: Appendix B) and
/// pumps it into the sink until the client closes, rebinding after failures. What it held
/// when bound (`what`, in words) is on its way until it has been surfaced.
pub(crate) async fn bind(
    client: &Client,
    stream: &str,
    durable: &str,
    what: &'static str,
) -> Result<(), ClientError> {
    let js = &client.inner.js;
    let consumer = super::super::transient::retried(durable, &client.inner.state, || {
        js.get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(durable, stream)
    })
    .await
    .map_err(|e| ClientError::Bind {
        durable: durable.to_owned(),
        stream: stream.to_owned(),
        source: e.into(),
    })?;
    let backlog = crate::binding::backlog::Backlog::at(consumer.cached_info());
    if !backlog.is_done() {
        client.inner.catch_up.register(durable, what);
    }
    let (stream, durable) = (stream.to_owned(), durable.to_owned());
    client.inner.background.spawn(pull(
        client.inner.clone(),
        consumer,
        backlog,
        stream,
        durable,
    ));
    Ok(())
}

/// Pulls `durable`'s copies into the client's deliveries, counting down the `backlog` found
/// at bind; rebinds when the consumer goes away or the stream ends (a broker restart).
async fn pull(
    inner: std::sync::Arc<super::super::Inner>,
    mut consumer: jetstream::consumer::PullConsumer,
    mut backlog: crate::binding::backlog::Backlog,
    stream: String,
    durable: String,
) {
    loop {
        // A small prefetch: every pulled copy's `ack_wait` runs while it waits for the
        // application, so pulling far ahead of it would only provoke redeliveries.
        match consumer
            .stream()
            .max_messages_per_batch(PULL_BATCH)
            .messages()
            .await
        {
            Ok(mut messages) => {
                while let Some(next) = messages.next().await {
                    match next {
                        Ok(msg) => {
                            let last = backlog.took_one();
                            inner.out.stream_copy(msg).await;
                            if last {
                                inner.catch_up.done(&durable);
                            }
                        }
                        Err(e) => {
                            tracing::debug!(durable, error = %e, "pull stream error");
                            if matches!(
                                e.kind(),
                                jetstream::consumer::pull::MessagesErrorKind::ConsumerDeleted
                            ) {
                                break;
                            }
                        }
                    }
                }
            }
            Err(e) => inner.out.notice(Notice::ConsumerLost {
                durable: durable.clone(),
                reason: e.to_string(),
            }),
        }
        // The consumer went away or the stream ended (e.g. a broker restart): rebind.
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Ok(c) = inner
            .js
            .get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(&durable, &stream)
            .await
        {
            consumer = c;
        }
    }
}
