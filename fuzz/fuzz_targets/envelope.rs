//! Envelope parsing (§5) and receive validation (§4). Input: `subject \0 payload`. Oracles: the
//! one-pass read judges a document as its decoded value does (the same message, or the same
//! refusal); a parsed message serializes and re-parses to an equal message; an accepted
//! delivery's `from.id` is its subject's sender (§5).
#![no_main]

use cotald::protocol::{
    CotalMessage, EnvelopeError, accept_control_request, accept_delivery, parse_subject,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (subject, payload) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&[][..], data),
    };
    let read = CotalMessage::from_json(payload).map_err(|e| e.to_string());
    let decoded = serde_json::from_slice::<serde_json::Value>(payload)
        .map_err(|e| EnvelopeError::from(e).to_string())
        .and_then(|value| CotalMessage::from_value(value).map_err(|e| e.to_string()));
    assert_eq!(read, decoded, "one pass and decoded disagree");
    if let Ok(message) = CotalMessage::from_json(payload) {
        let bytes = message.to_json().expect("a parsed message serializes");
        let again = CotalMessage::from_json(&bytes).expect("serialized message re-parses");
        assert_eq!(again, message);
    }
    if let Ok(subject) = std::str::from_utf8(subject) {
        if let Ok(delivery) = accept_delivery(subject, payload, 1 << 20) {
            let parsed = parse_subject(subject).expect("an accepted delivery's subject parses");
            assert_eq!(delivery.message.from.id, parsed.sender);
        }
        if let Ok(request) = accept_control_request(subject, payload, 1 << 20) {
            assert_eq!(request.request.from.id, request.sender);
        }
    }
});
