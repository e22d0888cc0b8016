//! Content handed over to a follower as copies: what it asked for (`backstop-want`), what its
//! offers could not carry (an entry without an id), and offers unconfirmed past the handoff
//! timeout. Each entry is fetched by sequence and checked as a delivery (§5) first, for the
//! channel's feed reads no content.

use crate::binding::frame::accept_delivery;
use crate::ops::CopyBatch;
use crate::protocol::DeliveryKind;
use async_nats::jetstream::stream::DirectGetErrorKind;

use super::Feeds;

/// Entries to hand over to one member as copies: (member, its inbox, (sequence, subject)s).
pub(super) type Carry = (String, String, Vec<(u64, String)>);

impl Feeds {
    /// Hands entries over to a member as copies: each fetched by sequence and checked as a
    /// delivery (§5) first; one that fails the checks, or is too large to hand over, is handled
    /// for the member (as its own consumer acknowledges an anomaly away).
    pub(super) async fn hand_over(&self, (member, inbox, items): Carry) {
        if items.is_empty() {
            return;
        }
        let Ok(stream) = self
            .space
            .jetstream()
            .get_stream_no_info(self.space.names().chat_stream())
            .await
        else {
            return;
        };
        let max_payload = self.space.nats().server_info().max_payload;
        let mut handled = Vec::new();
        let mut batches = Vec::new();
        let mut batch = CopyBatch::default();
        for (seq, subject) in items {
            let stored = match stream.direct_get(seq).await {
                Ok(stored) => stored,
                // Evicted by the channel's retention: nothing is left to hand over (§4
                // "within retention").
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => {
                    handled.push(seq);
                    continue;
                }
                // Handed over again after the handoff timeout.
                Err(_) => continue,
            };
            let token = format!("f{seq}");
            let framed = CopyBatch::framed_len(&subject, &token, &stored.payload);
            let checked = accept_delivery(
                &subject,
                Some(&stored.headers),
                None,
                &stored.payload,
                max_payload,
            );
            let valid = match checked {
                Ok(a) => a.kind == DeliveryKind::Channel,
                Err(rejection) => {
                    self.space
                        .refusals()
                        .refuse("backstop", &subject, &rejection);
                    false
                }
            };
            if !valid || framed > max_payload {
                handled.push(seq);
                continue;
            }
            if !batch.is_empty() && batch.len() + framed > max_payload {
                batches.push(std::mem::take(&mut batch));
            }
            batch.push(&subject, &token, &stored.payload);
        }
        if !handled.is_empty() {
            tracing::debug!(
                member,
                ?handled,
                "entries not handed over: anomalies (§5) or too large"
            );
            self.confirm(&member, &handled);
        }
        batches.push(batch);
        for batch in batches.into_iter().filter(|b| !b.is_empty()) {
            if let Err(e) = self
                .space
                .nats()
                .publish(inbox.clone(), batch.into_body().into())
                .await
            {
                // Handed over again after the handoff timeout.
                tracing::debug!(member, error = %e, "copies not sent");
            }
        }
    }
}
