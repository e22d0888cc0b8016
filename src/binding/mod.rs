//! The NATS + JetStream binding (§8, §9, Appendix B) as pure functions: the names of a space's
//! streams, buckets and durables, their exact configurations, and the permission sets of each
//! credential profile, a minted credential read back as data, and a received frame judged
//! whole (its header block, then its body). Nothing here talks to a server; `space` applies
//! these to one.

pub mod acl;
pub mod backlog;
pub mod credential;
pub mod frame;
mod names;
pub mod streams;
pub mod system;

pub use credential::{Creds, CredsError, Permission, UserClaims, UserPermissions};
pub use names::{
    API_AUDIT_ADVISORIES, HELD, MANAGER_SERVICE, SpaceNames, backstop_inbox, chat_history_consumer,
    consumer_deleted_advisories, dm_durable, guard_notice, inbox_of, interval_consumer,
    mention_consumer, svc_durable,
};
