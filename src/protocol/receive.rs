//! Receive-side validation of delivery messages and control requests (§4, §5).
//!
//! One function per inbound path turns `(subject, payload bytes, max payload)` into either a
//! validated message or a [`Rejection`]. Rejections are permanent anomalies: the caller
//! terminates them and never redelivers (§4); [`Rejection::reason`] gives the advisory reason
//! token for logs and `ControlReply.error` (§5).
//!
//! The delivery kind comes from the subject kind only (`chat` → channel, `inst` → dm,
//! `svc` → anycast), never from the payload's routing fields, which are advisory (§4): a
//! peer can put your id in `to`, but cannot publish on your unicast subject.
//!
//! Checks run cheapest and most security-relevant first: size, subject, UTF-8, JSON syntax,
//! then the sender (`from` present and `from.id` equal to the subject sender), then the full
//! shape. A message that is both spoofed and misshapen is therefore reported as a sender
//! mismatch.

use std::fmt;

use serde_json::Value;

use super::control::ControlRequest;
use super::envelope::{CotalMessage, EnvelopeError, RawEnvelope};
use super::subject::{SubjectKind, SubjectParseError, parse_subject};

/// How a delivery was addressed to the receiver, derived from the subject (§4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeliveryKind {
    /// Received on a `chat` subject (multicast).
    Channel,
    /// Received on an `inst` subject (unicast).
    Dm,
    /// Received on a `svc` subject (anycast).
    Anycast,
}

impl DeliveryKind {
    /// The delivery kind of a subject kind; `ctl` carries control requests, not deliveries.
    pub fn of(kind: SubjectKind) -> Option<Self> {
        match kind {
            SubjectKind::Chat => Some(Self::Channel),
            SubjectKind::Inst => Some(Self::Dm),
            SubjectKind::Svc => Some(Self::Anycast),
            SubjectKind::Ctl => None,
        }
    }

    /// `channel`, `dm` or `anycast` (the reference's `MessageMeta.kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Channel => "channel",
            Self::Dm => "dm",
            Self::Anycast => "anycast",
        }
    }
}

impl fmt::Display for DeliveryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Advisory reason tokens (§5). The first three are the spec's; `payload-too-large` (payloads
/// over the configured maximum, §5 "Messages MUST fit") and `malformed-header` (a transport
/// header block that breaks its grammar) are ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// `malformed-subject`.
    MalformedSubject,
    /// `sender-mismatch`.
    SenderMismatch,
    /// `malformed-json`.
    MalformedJson,
    /// `payload-too-large`.
    PayloadTooLarge,
    /// `malformed-header`.
    MalformedHeader,
}

impl RejectReason {
    /// The reason token.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MalformedSubject => "malformed-subject",
            Self::SenderMismatch => "sender-mismatch",
            Self::MalformedJson => "malformed-json",
            Self::PayloadTooLarge => "payload-too-large",
            Self::MalformedHeader => "malformed-header",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an inbound message was refused. Every variant is permanent: terminate, never retry.
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    /// The payload exceeds the maximum payload.
    #[error("payload of {size} bytes exceeds the maximum of {max}")]
    PayloadTooLarge {
        /// Payload size in bytes.
        size: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The subject has no sender (§3).
    #[error("malformed subject: {0}")]
    MalformedSubject(#[from] SubjectParseError),
    /// The subject parses but is of the wrong kind for this path (e.g. `ctl` on the delivery
    /// path).
    #[error("a {found} subject is not valid here")]
    WrongSubjectKind {
        /// The kind found.
        found: SubjectKind,
    },
    /// The payload is not UTF-8.
    #[error("payload is not UTF-8 (valid up to byte {valid_up_to})")]
    InvalidUtf8 {
        /// Length of the valid prefix.
        valid_up_to: usize,
    },
    /// The payload is not JSON.
    #[error("payload is not JSON: {0}")]
    MalformedJson(serde_json::Error),
    /// `from` is absent, or has no string `id`.
    #[error("payload has no from.id")]
    MissingSender,
    /// `from.id` is not the subject sender (§5).
    #[error("from.id {from_id:?} does not match subject sender {subject_sender:?}")]
    SenderMismatch {
        /// The sender token of the subject.
        subject_sender: String,
        /// The payload's `from.id`.
        from_id: String,
    },
    /// Valid JSON, wrong shape.
    #[error("invalid envelope: {0}")]
    InvalidEnvelope(EnvelopeError),
    /// The transport's header block, which the broker passes through from the publisher,
    /// breaks its grammar or carries what only the broker writes (in the NATS binding:
    /// `binding::frame`).
    #[error("malformed header: {0}")]
    MalformedHeader(String),
}

impl Rejection {
    /// The advisory reason token (§5).
    pub fn reason(&self) -> RejectReason {
        match self {
            Self::PayloadTooLarge { .. } => RejectReason::PayloadTooLarge,
            Self::MalformedSubject(_) | Self::WrongSubjectKind { .. } => {
                RejectReason::MalformedSubject
            }
            Self::MissingSender | Self::SenderMismatch { .. } => RejectReason::SenderMismatch,
            Self::InvalidUtf8 { .. } | Self::MalformedJson(_) | Self::InvalidEnvelope(_) => {
                RejectReason::MalformedJson
            }
            Self::MalformedHeader(_) => RejectReason::MalformedHeader,
        }
    }
}

/// A delivery message that passed every receive check.
#[derive(Clone, Debug, PartialEq)]
pub struct AcceptedDelivery {
    /// How it was addressed, from the subject (§4).
    pub kind: DeliveryKind,
    /// The subject's route: the channel for `chat`, the target for `inst`, the role for `svc`.
    pub route: String,
    /// The parsed message.
    pub message: CotalMessage,
}

impl AcceptedDelivery {
    /// The subject's sender token: the checks found it equal to `message.from.id` (§5), which
    /// holds it.
    pub fn sender(&self) -> &str {
        &self.message.from.id
    }
}

/// A control request that passed every receive check.
#[derive(Clone, Debug, PartialEq)]
pub struct AcceptedControlRequest {
    /// The control service named by the subject (token 3).
    pub service: String,
    /// The subject's sender token (equal to `request.from.id`).
    pub sender: String,
    /// The parsed request.
    pub request: ControlRequest,
}

fn check_size(payload: &[u8], max_payload: usize) -> Result<(), Rejection> {
    if payload.len() > max_payload {
        return Err(Rejection::PayloadTooLarge {
            size: payload.len(),
            max: max_payload,
        });
    }
    Ok(())
}

/// The payload as text, or why it is not UTF-8.
fn utf8(payload: &[u8]) -> Result<&str, Rejection> {
    std::str::from_utf8(payload).map_err(|e| Rejection::InvalidUtf8 {
        valid_up_to: e.valid_up_to(),
    })
}

/// The sender check (§5): the document's `from.id` is the subject's sender.
fn check_sender(sender: &str, from_id: Option<&str>) -> Result<(), Rejection> {
    let from_id = from_id.ok_or(Rejection::MissingSender)?;
    if from_id != sender {
        return Err(Rejection::SenderMismatch {
            subject_sender: sender.to_owned(),
            from_id: from_id.to_owned(),
        });
    }
    Ok(())
}

/// UTF-8 and JSON checks, then the sender check; returns the decoded document (a control
/// request, which is read from it by its derived shape).
fn decode_and_check_sender(sender: &str, payload: &[u8]) -> Result<Value, Rejection> {
    let value: Value = serde_json::from_str(utf8(payload)?).map_err(Rejection::MalformedJson)?;
    let from_id = value
        .get("from")
        .and_then(|from| from.get("id"))
        .and_then(Value::as_str);
    check_sender(sender, from_id)?;
    Ok(value)
}

/// Validates an inbound delivery (`chat`, `inst`, `svc`) against its subject (§4, §5).
pub fn accept_delivery(
    subject: &str,
    payload: &[u8],
    max_payload: usize,
) -> Result<AcceptedDelivery, Rejection> {
    check_size(payload, max_payload)?;
    let parsed = parse_subject(subject)?;
    let kind =
        DeliveryKind::of(parsed.kind).ok_or(Rejection::WrongSubjectKind { found: parsed.kind })?;
    let text = utf8(payload)?;
    let document = RawEnvelope::read(text).map_err(Rejection::MalformedJson)?;
    check_sender(parsed.sender, document.sender())?;
    let message = document
        .into_message()
        .map_err(Rejection::InvalidEnvelope)?;
    Ok(AcceptedDelivery {
        kind,
        route: parsed.rest.to_owned(),
        message,
    })
}

/// Validates an inbound control request against its `ctl` subject (§5).
pub fn accept_control_request(
    subject: &str,
    payload: &[u8],
    max_payload: usize,
) -> Result<AcceptedControlRequest, Rejection> {
    check_size(payload, max_payload)?;
    let parsed = parse_subject(subject)?;
    if parsed.kind != SubjectKind::Ctl {
        return Err(Rejection::WrongSubjectKind { found: parsed.kind });
    }
    let value = decode_and_check_sender(parsed.sender, payload)?;
    let request: ControlRequest = serde_json::from_value(value)
        .map_err(|e| Rejection::InvalidEnvelope(EnvelopeError::Json(e)))?;
    Ok(AcceptedControlRequest {
        service: parsed.rest.to_owned(),
        sender: parsed.sender.to_owned(),
        request,
    })
}
