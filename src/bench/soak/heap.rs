//! What the broker's memory holds, from its own heap profile (`PROFILEZ` over the system
//! account, the text form): its message-block cache apart from the rest.
//!
//! The broker's RSS follows its file store's block cache: each stream's block being written is
//! held whole in memory, and so is each older block a reader loaded lately, in buffers of up
//! to the block size (16 MiB for a large stream); the Go runtime keeps up to twice the live
//! heap before it collects. So the RSS climbs while blocks fill and falls when they roll over
//! or expire: bounded by the blocks in use, not by time or by what is stored. A leak is
//! everything else growing, and that is what the soak judges flat.

use std::time::Duration;

use base64::Engine;

use crate::supervisor::monitor::Monitor;

/// The broker function that hands out block buffers, in the stacks of what it allocated.
const BLOCK_BUFFER: &str = "getMsgBlockBuf";

/// The live heap of the broker, split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct BrokerHeap {
    /// Bytes in message-block buffers (written and loaded blocks).
    pub(super) blocks: u64,
    /// Every other live byte.
    pub(super) rest: u64,
}

/// Asks the broker for its heap profile; `None` when it does not answer or the answer cannot be
/// read (a broker between a stop and a start, or one that does not profile).
pub(super) async fn broker_heap(monitor: &Monitor) -> Option<BrokerHeap> {
    let options = serde_json::json!({ "name": "heap", "debug": 1 });
    let data = monitor
        .ask("PROFILEZ", options, Duration::from_secs(5))
        .await
        .ok()?;
    let encoded = data["profile"].as_str()?;
    let text = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    split(&String::from_utf8_lossy(&text))
}

/// Splits a Go heap profile in its legacy text form: each record's in-use bytes, scaled up from
/// the sample as the Go runtime does (an allocation of `s` bytes is sampled with probability
/// `1 - e^(-s/rate)`), counted as block buffers when its stack holds [`BLOCK_BUFFER`].
fn split(profile: &str) -> Option<BrokerHeap> {
    let header = profile.lines().next()?;
    // `heap profile: N: B [N: B] @ heap/<2 × the sampling rate>`
    let rate = header.rsplit_once("heap/")?.1.trim().parse::<f64>().ok()? / 2.0;
    let mut heap = BrokerHeap::default();
    let mut record: Option<(f64, bool)> = None;
    for line in profile.lines().skip(1) {
        if let Some(frame) = line.strip_prefix("#\t") {
            if let Some((_, block)) = record.as_mut() {
                *block |= frame.contains(BLOCK_BUFFER);
            }
            continue;
        }
        close(record.take(), &mut heap);
        record = in_use(line, rate);
    }
    close(record, &mut heap);
    Some(heap)
}

/// Adds a finished record to the heap.
fn close(record: Option<(f64, bool)>, heap: &mut BrokerHeap) {
    if let Some((bytes, block)) = record {
        match block {
            true => heap.blocks += bytes as u64,
            false => heap.rest += bytes as u64,
        }
    }
}

/// `objects: bytes [allocated objects: bytes] @ stack`: the in-use bytes, scaled.
fn in_use(line: &str, rate: f64) -> Option<(f64, bool)> {
    let (counts, _) = line.split_once(" [")?;
    let (objects, bytes) = counts.split_once(": ")?;
    let (objects, bytes) = (objects.parse::<f64>().ok()?, bytes.parse::<f64>().ok()?);
    if objects == 0.0 || bytes == 0.0 {
        return Some((0.0, false));
    }
    let scale = match rate > 1.0 {
        true => 1.0 / (1.0 - (-(bytes / objects) / rate).exp()),
        false => 1.0,
    };
    Some((bytes * scale, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_buffers_are_told_from_the_rest_and_small_samples_are_scaled() {
        let profile = "heap profile: 3: 16777316 [9: 99] @ heap/1048576\n\
            1: 16777216 [1: 16777216] @ 0x1 0x2\n\
            #\t0x1\tgithub.com/nats-io/nats-server/v2/server.getMsgBlockBuf+0x9d\tfilestore.go:1\n\
            #\t0x2\tgithub.com/nats-io/nats-server/v2/server.(*msgBlock).loadBlock+0x156\tfilestore.go:2\n\
            \n\
            1: 100 [5: 500] @ 0x3\n\
            #\t0x3\tgithub.com/nats-io/nats-server/v2/server.(*client).processConnect+0x192\tclient.go:3\n\
            \n\
            0: 0 [3: 300] @ 0x4\n\
            #\t0x4\truntime.malg+0x1\tproc.go:4\n\
            \n\
            # runtime.MemStats\n\
            # HeapAlloc = 123\n";
        let heap = split(profile).unwrap();
        // 16 MiB at a rate of 512 KiB: sampled with near certainty, scaled by about 1.
        assert!((16_777_216..16_777_300).contains(&heap.blocks), "{heap:?}");
        // 100 bytes in one object: one sample stands for about 5,243 such bytes' worth.
        assert!((524_000..525_000).contains(&heap.rest), "{heap:?}");
        assert!(split("not a profile").is_none());
    }
}
