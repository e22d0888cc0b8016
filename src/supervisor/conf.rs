//! Renders the nats-server configuration: operator mode with a `full` account resolver, the
//! SYS account preloaded, JetStream in the data dir, TLS on the client listener, monitoring on
//! loopback only. The file holds no secret (JWTs are public, the TLS key is referenced by path)
//! and is passed with `-c`, so nothing sensitive reaches the child's argv.
//!
//! Two optional blocks grow the appliance beyond one machine: `cluster {}` (routes to the other
//! appliances of a cluster, TLS both ways with the shared CA, every node presenting its server
//! certificate) and `leafnodes { remotes = [...] }` (each bound space's account joined to a hub
//! of an existing NATS system, with JetStream, KV and system subjects denied both ways so that
//! the leaf's store stays its own; see [`LEAF_DENIED`]).
//!
//! The broker writes its own log and rotates it by size ([`LOG_SIZE_LIMIT`], [`LOG_MAX_FILES`]):
//! every refused publish is logged with its full subject, so any credential could otherwise
//! fill the disk at the speed of its connection.

use std::fmt::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// Everything the rendered configuration depends on.
#[derive(Debug, Clone)]
pub struct ServerConf {
    /// Stable server name (kept from the first run so that clustering later is a config change).
    pub server_name: String,
    /// Client listener host.
    pub host: IpAddr,
    /// Client port; `None` lets the server pick one.
    pub port: Option<u16>,
    /// Monitoring host (loopback).
    pub monitor_host: IpAddr,
    /// Monitoring port; `None` lets the server pick one.
    pub monitor_port: Option<u16>,
    /// Where the server writes `<argv0>_<pid>.ports`.
    pub ports_file_dir: PathBuf,
    /// The operator JWT.
    pub operator_jwt: String,
    /// The SYS account public key.
    pub system_account: String,
    /// The SYS account JWT (preloaded).
    pub system_account_jwt: String,
    /// The account resolver directory.
    pub resolver_dir: PathBuf,
    /// The JetStream store directory.
    pub store_dir: PathBuf,
    /// The most JetStream may store on disk (`max_file_store`), bytes.
    pub max_file_store: i64,
    /// JetStream fsync interval (`always` or a duration).
    pub sync_interval: String,
    /// TLS server certificate.
    pub tls_cert: PathBuf,
    /// TLS server key.
    pub tls_key: PathBuf,
    /// The CA every node of a cluster trusts (routes verify each other with it).
    pub tls_ca: PathBuf,
    /// Routes to the other nodes of a cluster.
    pub cluster: Option<ClusterConf>,
    /// Leaf connections to a hub.
    pub leaf_remotes: Vec<LeafRemote>,
}

/// The `cluster {}` block.
#[derive(Debug, Clone)]
pub struct ClusterConf {
    /// The cluster's name.
    pub name: String,
    /// This node's route listener host.
    pub host: IpAddr,
    /// Its port.
    pub port: u16,
    /// The other nodes' route listeners, `host:port`.
    pub routes: Vec<String>,
}

/// One leaf connection: a local account bound to a hub.
#[derive(Debug, Clone)]
pub struct LeafRemote {
    /// The hub's leaf listener URL.
    pub url: String,
    /// The local account (public key) the connection binds.
    pub account: String,
    /// The hub-side `.creds`.
    pub credentials: Option<PathBuf>,
    /// The CA of the hub's certificate.
    pub ca: Option<PathBuf>,
}

/// Subjects that never cross a leaf connection, in either direction: the JetStream API and its
/// acks and flow control (the leaf's store is reached only by local clients, in its own domain),
/// KV operations (presence, registries: a hub user could otherwise write the leaf's buckets), the
/// system account's requests. What crosses is everything else of the bound account, i.e. the
/// space's `cotal.<space>.>` traffic and the replies to it.
pub const LEAF_DENIED: [&str; 6] = ["$JS.>", "$JSC.>", "$KV.>", "$O.>", "$SYS.>", "$NRG.>"];

/// Permissions ride the CONNECT line inside the user JWT: the 4 KiB default would drop the
/// connection of an agent with a few dozen channel grants, and the number of grants is not
/// capped. The same limit bounds a PUB's subject, hence the longest line the broker logs for a
/// refused publish (the subject quoted: at most 4 bytes per byte); [`LOG_MAX_LINE`] allows
/// for it.
pub const MAX_CONTROL_LINE: u64 = 256 * 1024;

/// The broker's log is rotated once it exceeds this many bytes (`logfile_size_limit`): room for
/// thousands of starts of an ordinary broker's log (a start logs a few KiB).
pub const LOG_SIZE_LIMIT: u64 = 10 * 1024 * 1024;

/// How many log files the broker keeps, the active one included (`logfile_max_num`); the
/// oldest backup is deleted at each rotation beyond it.
pub const LOG_MAX_FILES: u64 = 5;

/// The longest line the broker can log: a refused subject of [`MAX_CONTROL_LINE`] bytes,
/// quoted, and its prefix. A rotated file holds at most [`LOG_SIZE_LIMIT`] plus one such line,
/// so the log directory stays under `LOG_MAX_FILES * (LOG_SIZE_LIMIT + LOG_MAX_LINE)`, about
/// 55 MiB.
pub const LOG_MAX_LINE: u64 = 4 * MAX_CONTROL_LINE + 1024;

impl ServerConf {
    /// The configuration text; the broker logs to `log_file` (the supervisor reads the same
    /// path for the broker's last words, so it is given once, by the caller).
    pub fn render(&self, log_file: &Path) -> String {
        let mut out =
            String::from("# Generated by cotald at every start; edits are overwritten.\n");
        let port = |p: Option<u16>| p.map_or(-1, i32::from);
        let _ = writeln!(out, "server_name: {}", quote(&self.server_name));
        let _ = writeln!(out, "host: {}", quote(&self.host.to_string()));
        let _ = writeln!(out, "port: {}", port(self.port));
        let monitor = std::net::SocketAddr::new(self.monitor_host, 0).to_string();
        let monitor_host = monitor.rsplit_once(':').map_or("", |(h, _)| h);
        let _ = writeln!(
            out,
            "http: {}",
            quote(&format!("{monitor_host}:{}", port(self.monitor_port)))
        );
        let _ = writeln!(out, "max_control_line: {MAX_CONTROL_LINE}");
        let _ = writeln!(out, "log_file: {}", quote_path(log_file));
        let _ = writeln!(out, "logfile_size_limit: {LOG_SIZE_LIMIT}");
        let _ = writeln!(out, "logfile_max_num: {LOG_MAX_FILES}");
        let _ = writeln!(out, "ports_file_dir: {}", quote_path(&self.ports_file_dir));
        let _ = writeln!(out, "operator: {}", quote(&self.operator_jwt));
        let _ = writeln!(out, "system_account: {}", quote(&self.system_account));
        let _ = writeln!(
            out,
            "resolver: {{\n  type: full\n  dir: {}\n  allow_delete: false\n  interval: \"2m\"\n  timeout: \"1s\"\n}}",
            quote_path(&self.resolver_dir)
        );
        let _ = writeln!(
            out,
            "resolver_preload: {{\n  {}: {}\n}}",
            self.system_account,
            quote(&self.system_account_jwt)
        );
        let _ = writeln!(
            out,
            "jetstream: {{\n  store_dir: {}\n  max_file_store: {}\n  domain: \"cotald\"\n  sync_interval: {}\n}}",
            quote_path(&self.store_dir),
            self.max_file_store,
            quote(&self.sync_interval)
        );
        let _ = writeln!(
            out,
            "tls: {{\n  cert_file: {}\n  key_file: {}\n  timeout: 5\n}}",
            quote_path(&self.tls_cert),
            quote_path(&self.tls_key)
        );
        if let Some(cluster) = &self.cluster {
            let routes: Vec<String> = cluster
                .routes
                .iter()
                .map(|r| quote(&format!("nats-route://{r}")))
                .collect();
            let _ = writeln!(
                out,
                "cluster: {{\n  name: {}\n  host: {}\n  port: {}\n  routes: [{}]\n  tls: {{\n    cert_file: {}\n    key_file: {}\n    ca_file: {}\n    verify: true\n    timeout: 5\n  }}\n}}",
                quote(&cluster.name),
                quote(&cluster.host.to_string()),
                cluster.port,
                routes.join(", "),
                quote_path(&self.tls_cert),
                quote_path(&self.tls_key),
                quote_path(&self.tls_ca),
            );
        }
        if !self.leaf_remotes.is_empty() {
            let denied: Vec<String> = LEAF_DENIED.iter().map(|s| quote(s)).collect();
            let denied = denied.join(", ");
            let _ = writeln!(out, "leafnodes: {{\n  remotes: [");
            for remote in &self.leaf_remotes {
                let _ = writeln!(out, "    {{");
                let _ = writeln!(out, "      url: {}", quote(&remote.url));
                let _ = writeln!(out, "      account: {}", quote(&remote.account));
                if let Some(creds) = &remote.credentials {
                    let _ = writeln!(out, "      credentials: {}", quote_path(creds));
                }
                if let Some(ca) = &remote.ca {
                    let _ = writeln!(out, "      tls: {{ ca_file: {} }}", quote_path(ca));
                }
                let _ = writeln!(out, "      deny_imports: [{denied}]");
                let _ = writeln!(out, "      deny_exports: [{denied}]");
                let _ = writeln!(out, "    }}");
            }
            let _ = writeln!(out, "  ]\n}}");
        }
        out
    }
}

/// A double-quoted conf string. JSON escaping is a subset of what the conf parser accepts.
fn quote(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

fn quote_path(p: &Path) -> String {
    quote(&p.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf() -> ServerConf {
        ServerConf {
            server_name: "cotald_ABC".into(),
            host: "127.0.0.1".parse().unwrap(),
            port: None,
            monitor_host: "127.0.0.1".parse().unwrap(),
            monitor_port: Some(8222),
            ports_file_dir: "/d/run".into(),
            operator_jwt: "op.jwt".into(),
            system_account: "ASYS".into(),
            system_account_jwt: "sys.jwt".into(),
            resolver_dir: "/d/jwt".into(),
            store_dir: "/d/my \"js\"".into(),
            max_file_store: 186_000_000,
            sync_interval: "1s".into(),
            tls_cert: "/d/tls/server.pem".into(),
            tls_key: "/d/tls/server.key".into(),
            tls_ca: "/d/tls/ca.pem".into(),
            cluster: None,
            leaf_remotes: Vec::new(),
        }
    }

    #[test]
    fn renders_routes_with_mutual_tls_and_leaf_remotes_with_denies() {
        let mut c = conf();
        let alone = c.render(Path::new("/l"));
        assert!(!alone.contains("cluster"), "{alone}");
        assert!(!alone.contains("leafnodes"), "{alone}");
        c.cluster = Some(ClusterConf {
            name: "team".into(),
            host: "127.0.0.1".parse().unwrap(),
            port: 6222,
            routes: vec!["10.0.0.2:6222".into(), "b.example:6222".into()],
        });
        c.leaf_remotes = vec![LeafRemote {
            url: "tls://hub:7422".into(),
            account: "AMAIN".into(),
            credentials: Some("/hub.creds".into()),
            ca: Some("/hub-ca.pem".into()),
        }];
        let text = c.render(Path::new("/l"));
        for expected in [
            "name: \"team\"",
            "port: 6222\n",
            "routes: [\"nats-route://10.0.0.2:6222\", \"nats-route://b.example:6222\"]",
            "ca_file: \"/d/tls/ca.pem\"\n    verify: true",
            "url: \"tls://hub:7422\"",
            "account: \"AMAIN\"",
            "credentials: \"/hub.creds\"",
            "tls: { ca_file: \"/hub-ca.pem\" }",
            "deny_imports: [\"$JS.>\", \"$JSC.>\", \"$KV.>\"",
            "deny_exports: [\"$JS.>\"",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }

    #[test]
    fn renders_operator_mode_with_tls_and_loopback_monitoring() {
        let text = conf().render(Path::new("/d/log/nats-server.log"));
        for expected in [
            "port: -1\n",
            "http: \"127.0.0.1:8222\"\n",
            "system_account: \"ASYS\"\n",
            "type: full",
            "ASYS: \"sys.jwt\"",
            "store_dir: \"/d/my \\\"js\\\"\"",
            "sync_interval: \"1s\"",
            "max_file_store: 186000000\n",
            "key_file: \"/d/tls/server.key\"",
            "max_control_line: 262144",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        assert!(!text.contains("seed"), "no secret in the config");
    }

    #[test]
    fn the_broker_log_is_rotated_and_bounded() {
        let text = conf().render(Path::new("/d/log/nats-server.log"));
        for expected in [
            "log_file: \"/d/log/nats-server.log\"\n",
            "logfile_size_limit: 10485760\n",
            "logfile_max_num: 5\n",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }
}
