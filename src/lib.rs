//! cotald: a Cotal Wire Specification v0.3 appliance.
pub mod cli;
pub mod daemon;
pub mod datadir;
pub mod profile;
pub mod provision;
pub mod supervisor;
