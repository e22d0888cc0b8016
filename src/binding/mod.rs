//! The NATS + JetStream binding (§8, §9, Appendix B) as pure functions: the names of a space's
//! streams, buckets and durables, their exact configurations, and the permission sets of each
//! credential profile. Nothing here talks to a server; `space` applies these to one.

pub mod acl;
mod names;
pub mod streams;

pub use names::{MANAGER_SERVICE, SpaceNames, chat_history_consumer, dm_durable, svc_durable};
