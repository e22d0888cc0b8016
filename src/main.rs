//! The `cotald` executable: parses the command line and hands over to the library. The only
//! place that embeds the bundled nats-server (test binaries never carry its 18 MB).

use std::process::ExitCode;

use cotald::cli::{Cli, run};
use cotald::supervisor::{BUNDLED_SHA256, BUNDLED_VERSION, BrokerBinary};

/// mimalloc rather than the system's allocator: every message a client or the appliance
/// handles allocates and frees many small buffers beside a few large ones, which glibc's malloc
/// does more slowly (`docs/design-notes.md`, *Layout*). The library leaves the choice to the
/// program that embeds it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

static NATS_SERVER: &[u8] = include_bytes!(env!("COTALD_NATS_SERVER_PATH"));

fn main() -> ExitCode {
    let embedded = BrokerBinary::Embedded {
        bytes: NATS_SERVER,
        sha256: BUNDLED_SHA256,
        version: BUNDLED_VERSION,
    };
    run(Cli::parse_args(), embedded)
}
