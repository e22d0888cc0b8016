//! A received NATS frame judged as a whole (§4, §5): its header block first, then its body.
//!
//! The broker passes a publisher's header block through to every reader untouched: it checks
//! its length, not its grammar. cotald reads frames with async-nats patched so that a block it
//! cannot read costs its own message, never the connection (`vendor/async-nats/PATCHES.md`):
//! the library marks such a block ([`HeaderMap::malformed`]) and drops a status line found on a
//! message read from a stream. What is left to judge here:
//!
//! - a block the library marked: the message is refused, `malformed-header`;
//! - a status line on a delivery subject: the server writes statuses only on inboxes (request
//!   replies, pull responses), so on `chat`, `inst` or `svc` it is the publisher's; refused too.
//!
//! Nothing else of the block is read: the envelope is the body (§5), so a message with a
//! well-formed block is judged by [`accept_delivery`] alone.

use async_nats::{HeaderMap, StatusCode};

use crate::protocol::{AcceptedControlRequest, AcceptedDelivery, Rejection};

/// Why a received frame's header block makes its message unreadable, if it does.
pub fn header_rejection(
    headers: Option<&HeaderMap>,
    status: Option<StatusCode>,
) -> Option<Rejection> {
    if let Some(why) = headers.and_then(HeaderMap::malformed) {
        return Some(Rejection::MalformedHeader(why.to_string()));
    }
    status.map(|s| Rejection::MalformedHeader(format!("a status line ({s}) on a delivery")))
}

/// [`crate::protocol::accept_delivery`] of a received frame: its header block, then its subject
/// and body.
pub fn accept_delivery(
    subject: &str,
    headers: Option<&HeaderMap>,
    status: Option<StatusCode>,
    payload: &[u8],
    max_payload: usize,
) -> Result<AcceptedDelivery, Rejection> {
    match header_rejection(headers, status) {
        Some(rejection) => Err(rejection),
        None => crate::protocol::accept_delivery(subject, payload, max_payload),
    }
}

/// [`crate::protocol::accept_control_request`] of a received frame: its header block, then its
/// subject and body.
pub fn accept_control_request(
    subject: &str,
    headers: Option<&HeaderMap>,
    status: Option<StatusCode>,
    payload: &[u8],
    max_payload: usize,
) -> Result<AcceptedControlRequest, Rejection> {
    match header_rejection(headers, status) {
        Some(rejection) => Err(rejection),
        None => crate::protocol::accept_control_request(subject, payload, max_payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::RejectReason;

    const ALICE: &str = "UAQGWOEVJKMIO4WXSYOTLARXYOZTCXFK67JASEH6AFFFYK6FOPSKQCAD";

    fn body() -> Vec<u8> {
        serde_json::json!({
            "id": "m1", "ts": 1, "space": "main",
            "from": {"id": ALICE, "name": "alice"},
            "channel": "general",
            "parts": [{"kind": "text", "text": "hi"}],
        })
        .to_string()
        .into_bytes()
    }

    fn subject() -> String {
        format!("cotal.main.chat.{ALICE}.general")
    }

    #[test]
    fn a_well_formed_block_is_judged_by_the_body_alone() {
        let block = async_nats::header::parse_block(b"NATS/1.0\r\nNats-Msg-Id: m1\r\n\r\n");
        let accepted = accept_delivery(
            &subject(),
            Some(&block.headers),
            block.status,
            &body(),
            1 << 20,
        )
        .unwrap();
        assert_eq!(accepted.sender(), ALICE);
        assert!(accept_delivery(&subject(), None, None, &body(), 1 << 20).is_ok());
    }

    #[test]
    fn a_malformed_block_or_a_status_refuses_the_message() {
        for block in [
            &b"NATS/1.0\r\nX: \xff\r\n\r\n"[..],
            b"NATS/1.0\r\nX\r\n\r\n",
            b"NATS/1.0\r\nX: a\rb\r\n\r\n",
            b"NATS/1.0 abc\r\n\r\n",
            b"NATS/1.0 409 Consumer Deleted\r\n\r\n",
            b"",
        ] {
            let read = async_nats::header::parse_block(block);
            let refused = accept_delivery(
                &subject(),
                Some(&read.headers),
                read.status,
                &body(),
                1 << 20,
            )
            .expect_err(&String::from_utf8_lossy(block));
            assert_eq!(refused.reason(), RejectReason::MalformedHeader, "{refused}");
        }
    }
}
