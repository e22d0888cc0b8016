//! cotald: a single-binary appliance that implements the Cotal Wire Specification v0.3 over
//! an embedded NATS + JetStream broker.
//!
//! # Layout
//!
//! Dependencies point one way, down this table: a module uses only the modules above it
//! (`tests/it/layering.rs` reads every `crate::` path of `src/` and fails on one that points
//! down). `protocol` is pure; `binding` applies it to NATS as data; everything that talks to a
//! broker sits below `client`, the one conformant endpoint; the appliance (`daemon`) composes
//! the rest, and `cli` is a thin shell over it.
//!
//! | module | what it is | spec |
//! | --- | --- | --- |
//! | [`protocol`] | the transport-agnostic contract: subjects, envelopes, presence, channels, links | §2–§7, §10, §11 |
//! | [`binding`] | the NATS binding as data: subject, stream, bucket and durable names and configs, profile ACLs, refusal kinds | §8, §9, App. B |
//! | [`profile`] | the operator's TOML profile: broker settings, spaces | §7 (deployment profile) |
//! | [`files`] | atomic, owner-only file writes | |
//! | [`backoff`] | capped exponential backoff between restarts | |
//! | [`ops`] | every operation the appliance serves, the two transports that carry them, and what `status` reports | §5, §7 |
//! | [`provision`] | keys and trust chain (operator, SYS, account per space, users), `.creds`, TLS | §2, §9 |
//! | [`dial`] | the one connect sequence: credential, TLS verified against the appliance's CA, bounded timeout | §2, §9 |
//! | [`supervisor`] | the child nats-server: install, config, spawn, readiness, restart, stop | §8 |
//! | [`datadir`] | the data dir layout, its lock, the runtime state file | |
//! | [`client`] | the conformant endpoint: connect, presence, join/replay/dedup, DM, anycast, control | §2, §4–§8, §10, §12 |
//! | [`space`] | a served space: provisioner connection, bootstrap, minted identities, the durable members registry, the channel registry's view, the warden's holds | §7, §8, App. B |
//! | [`services`] | the in-process services and the one way they run: manager, trusted backstop reader, mention router, membership feed, presence view, channel registry view, the warden of DM and TASK, the consumer guard; in a cluster, the per-space lease and the shared identities | §4–§9 |
//! | [`dashboard`] | the live web dashboard `cotald up` serves: roster, channels, feed, health, read as an observer | §6, §7, App. B |
//! | [`mcp`] | `cotald mcp`: an MCP server on stdio that makes an AI agent host one long-lived endpoint | §4–§8, §12 |
//! | [`daemon`] | the appliance: startup phases, the storage budget, account push, the admin socket, readiness to a service manager, teardown; `cluster init`/`join` | §9 |
//! | [`bench`](mod@bench) | `cotald bench`: the figures against raw NATS measured in the same run (cargo feature `bench`, on by default) | |
//! | [`cli`] | the `cotald` subcommands; how an endpoint command finds its space (local data dir, context, environment) | |
//!
//! The `cotald` executable (`src/main.rs`) is the only artefact that embeds the bundled
//! nats-server; the library refers to it by [`supervisor::BrokerBinary`].

#![deny(unreachable_pub)]

pub mod backoff;
#[cfg(feature = "bench")]
pub mod bench;
pub mod binding;
pub mod cli;
pub mod client;
pub mod daemon;
pub mod dashboard;
pub mod datadir;
pub mod dial;
pub mod files;
pub mod mcp;
pub mod ops;
pub mod profile;
pub mod protocol;
pub mod provision;
pub mod services;
pub mod space;
pub mod supervisor;
