//! The `cotald` executable: parses the command line and hands over to the library. The only
//! place that embeds the bundled nats-server (test binaries never carry its 18 MB).

use std::process::ExitCode;

use cotald::cli::{Cli, run};
use cotald::supervisor::{BUNDLED_SHA256, BUNDLED_VERSION, BrokerBinary};

static NATS_SERVER: &[u8] = include_bytes!(env!("COTALD_NATS_SERVER_PATH"));

fn main() -> ExitCode {
    let embedded = BrokerBinary::Embedded {
        bytes: NATS_SERVER,
        sha256: BUNDLED_SHA256,
        version: BUNDLED_VERSION,
    };
    run(Cli::parse_args(), embedded)
}
