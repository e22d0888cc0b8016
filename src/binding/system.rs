//! The broker's own subjects, as the appliance and its clients use them: the system account's
//! requests and events (`$SYS`), the JetStream API (`$JS.API`) as grants and audit advisories
//! name it, and the namespaces a leaf node must not bridge. With [`super::SpaceNames`] (the
//! space's `cotal.` tree), every subject the crate speaks is built here; a test holds it so.

/// A request to one server's monitoring endpoint `what` (`VARZ`, `JSZ`, ...) over the system
/// account: `$SYS.REQ.SERVER.<id>.<what>`.
pub fn server_request(server_id: &str, what: &str) -> String {
    format!("$SYS.REQ.SERVER.{server_id}.{what}")
}

/// The connections of `account` (`CONNZ`, every server answers): `$SYS.REQ.ACCOUNT.<a>.CONNZ`.
pub fn account_connz(account: &str) -> String {
    format!("$SYS.REQ.ACCOUNT.{account}.CONNZ")
}

/// A client of `account` connected: `$SYS.ACCOUNT.<a>.CONNECT`.
pub fn account_connects(account: &str) -> String {
    format!("$SYS.ACCOUNT.{account}.CONNECT")
}

/// A client of `account` disconnected: `$SYS.ACCOUNT.<a>.DISCONNECT`.
pub fn account_disconnects(account: &str) -> String {
    format!("$SYS.ACCOUNT.{account}.DISCONNECT")
}

/// Where an account JWT is pushed to the running servers (the operator's resolver).
pub const CLAIMS_UPDATE: &str = "$SYS.REQ.CLAIMS.UPDATE";

/// The pull of `durable` on `stream`: `$JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>` (what a
/// credential must be granted to read that durable, Appendix B).
pub fn consumer_next(stream: &str, durable: &str) -> String {
    format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}")
}

/// A direct read of one stored message of `stream` by sequence: `$JS.API.STREAM.MSG.GET.<s>`.
pub fn stream_msg_get(stream: &str) -> String {
    format!("$JS.API.STREAM.MSG.GET.{stream}")
}

/// A snapshot of `stream` (backup): `$JS.API.STREAM.SNAPSHOT.<stream>`.
pub fn stream_snapshot(stream: &str) -> String {
    format!("$JS.API.STREAM.SNAPSHOT.{stream}")
}

/// A restore of `stream` (restore): `$JS.API.STREAM.RESTORE.<stream>`.
pub fn stream_restore(stream: &str) -> String {
    format!("$JS.API.STREAM.RESTORE.{stream}")
}

/// What follows the consumer-create API prefix in `subject` (`<stream>[.<consumer>[.<filter>]]`),
/// when it is a consumer create, ephemeral or durable, as an API audit names it.
pub fn consumer_create(subject: &str) -> Option<&str> {
    subject
        .strip_prefix("$JS.API.CONSUMER.CREATE.")
        .or_else(|| subject.strip_prefix("$JS.API.CONSUMER.DURABLE.CREATE."))
}

/// The subject namespaces a leaf node never imports or exports: the JetStream API and its
/// clustering, KV and object stores, the system account, and Raft.
pub const LEAF_DENIED: [&str; 6] = ["$JS.>", "$JSC.>", "$KV.>", "$O.>", "$SYS.>", "$NRG.>"];

/// `_INBOX_<id>`: where replies to `id` (an identity or a service's connection) arrive
/// (Appendix B `inbox`).
pub fn inbox_prefix(id: &str) -> String {
    format!("_INBOX_{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_subjects_read_as_the_server_names_them() {
        assert_eq!(server_request("NABC", "VARZ"), "$SYS.REQ.SERVER.NABC.VARZ");
        assert_eq!(account_connz("AACC"), "$SYS.REQ.ACCOUNT.AACC.CONNZ");
        assert_eq!(
            consumer_next("DM_main", "dm_U1"),
            "$JS.API.CONSUMER.MSG.NEXT.DM_main.dm_U1"
        );
        assert_eq!(
            consumer_create("$JS.API.CONSUMER.DURABLE.CREATE.KV_b.d"),
            Some("KV_b.d")
        );
        assert_eq!(consumer_create("$JS.API.CONSUMER.INFO.KV_b.d"), None);
    }
}
