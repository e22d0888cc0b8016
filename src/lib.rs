//! cotald: a Cotal Wire Specification v0.3 appliance.

pub mod protocol;
