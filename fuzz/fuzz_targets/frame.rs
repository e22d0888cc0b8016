//! The received-frame path (§4, §5, `binding::frame`): a header block as a publisher may
//! write it, read by the patched NATS library, then judged with the body it came with.
//! Input: `header block \0 subject \0 payload`. Oracles beyond "does not panic": a block the
//! reader did not mark starts with `NATS/1.0`, is UTF-8 with every CR ending a line, and
//! carries no broken line; a frame accepted as a delivery has an unmarked block, no status
//! and a `from.id` equal to its subject sender.
#![no_main]

use async_nats::header::parse_block;
use cotald::binding::frame::accept_delivery;
use cotald::protocol::parse_subject;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |b| *b == 0);
    let block = parts.next().unwrap_or_default();
    let subject = parts.next().unwrap_or_default();
    let payload = parts.next().unwrap_or_default();
    let read = parse_block(block);
    if read.headers.malformed().is_none() {
        let text = std::str::from_utf8(block).expect("an unmarked block is UTF-8");
        assert!(
            text.starts_with("NATS/1.0"),
            "an unmarked block has its version line"
        );
        assert!(
            !text.replace("\r\n", "").contains(['\r', '\n']),
            "an unmarked block has no stray line break"
        );
        for line in text.lines().skip(1).filter(|l| !l.is_empty()) {
            assert!(
                line.contains(':') || line.starts_with(char::is_whitespace),
                "an unmarked block has no line without a colon: {line:?}"
            );
        }
    }
    let Ok(subject) = std::str::from_utf8(subject) else {
        return;
    };
    if let Ok(delivery) =
        accept_delivery(subject, Some(&read.headers), read.status, payload, 1 << 20)
    {
        assert!(read.headers.malformed().is_none() && read.status.is_none());
        let parsed = parse_subject(subject).expect("an accepted frame's subject parses");
        assert_eq!(delivery.message.from.id, parsed.sender);
    }
});
