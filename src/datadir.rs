//! The data dir: where the appliance keeps everything, and the lock that makes one `cotald`
//! its only owner.
//!
//! ```text
//! <data-dir>/
//!   cotald.lock          held (flock) by the running appliance; holds its pid
//!   bin/                 the bundled nats-server, written once and verified (0755)
//!   keys/                operator, SYS and space keys (0600; see provision::KeyStore)
//!   tls/                 ca.pem (what clients trust), ca.key, server.pem, server.key
//!   spaces/<space>/      one served space:
//!     local-operator.creds   the machine operator's own user (unrestricted in the space)
//!     space.toml             present when the space was added with `cotald space add`
//!     identities/<id>.json   every identity minted for the space (never its seed)
//!     creds/                 `.creds` files `cotald mint` wrote
//!   jwt/                 the broker's account resolver store
//!   jetstream/           JetStream storage
//!   served.json          where the appliance last listened and what it served (kept)
//!   cluster/             cluster.toml (this node's [cluster] table) and node (its server
//!                        name), written by `cotald cluster init` / `join`
//!   run/                 nats-server.conf, ports file, admin.sock and state.json (while running)
//!   log/nats-server.log  the broker's log (rotated by the broker)
//!   log/cotald.log       the appliance's own log, when its stderr cannot take it (a background
//!                        job of a terminal, or a terminal gone)
//! ```
//!
//! Only this module names the parts of the layout; everything else asks [`DataDir`].

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::files::{self, FileError};

/// The data dir layout.
#[derive(Debug, Clone)]
pub struct DataDir {
    root: PathBuf,
}

/// Why the data dir cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// Another process holds the lock.
    #[error(
        "another cotald{} is already running on data dir {dir}; stop it first, or pass a \
         different --data-dir",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Locked { dir: PathBuf, pid: Option<u32> },
    /// A file could not be read or written.
    #[error(transparent)]
    File(#[from] FileError),
    /// The state file is not valid JSON of the expected shape.
    #[error("cannot parse {path}: {source}")]
    BadState {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// Other users may write into the data dir.
    #[error(
        "data dir {dir} has mode {mode:o}: other users could replace what cotald runs. Fix it \
         with `chmod go-w {dir}` (or `chmod 700`)"
    )]
    Writable { dir: PathBuf, mode: u32 },
    /// No data dir was given and none can be derived.
    #[error(
        "cannot determine the data dir: set --data-dir, COTALD_DATA_DIR, XDG_DATA_HOME or HOME"
    )]
    NoDefault,
}

/// The exclusive lock on a data dir; released when dropped.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

/// What a running appliance records for `cotald status` (`run/state.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RuntimeState {
    /// The cotald process.
    pub pid: u32,
    /// The nats-server child (changes when the supervisor restarts it).
    pub broker_pid: u32,
    /// The bundled nats-server version.
    pub broker_version: String,
    /// Client listener (TLS).
    pub listen: SocketAddr,
    /// The broker's HTTP monitoring listener (loopback), when the profile turns it on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitor: Option<SocketAddr>,
    /// The served spaces.
    pub spaces: Vec<String>,
    /// How many times the broker was restarted after dying or failing its health probes.
    pub broker_restarts: u32,
    /// Why and when the broker was last restarted, if it was.
    #[serde(default)]
    pub broker_last_restart: Option<crate::ops::status::BrokerRestart>,
    /// The health of every service of every space.
    #[serde(default)]
    pub services: Vec<crate::ops::status::ServiceStatus>,
    /// The spaces that could not be served at start, and why (the others are served).
    #[serde(default)]
    pub unserved: Vec<UnservedSpace>,
    /// The dashboard's URL with its access token, when it is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dashboard: Option<String>,
    /// In a cluster: who holds each space's lease (runs its services).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub leases: BTreeMap<String, crate::ops::status::LeaseView>,
    /// In a cluster: its nodes and the leader of each stream, as this node saw them last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterState>,
}

/// A cluster as one of its nodes sees it (`cotald status`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterState {
    /// This node's server name.
    pub node: String,
    /// The JetStream meta leader.
    pub meta_leader: String,
    /// Every node of the JetStream meta group.
    pub nodes: Vec<ClusterNode>,
    /// Each stream of the served spaces and its leader.
    pub streams: Vec<StreamLeader>,
}

/// One node of a cluster.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterNode {
    /// Its server name.
    pub name: String,
    /// Whether it is up to date with the meta group (this node: always).
    pub current: bool,
}

/// A stream and where it is led.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct StreamLeader {
    /// The stream.
    pub stream: String,
    /// Its leader's server name (empty: none elected).
    pub leader: String,
    /// Its replicas (the leader's followers) and whether each is current.
    pub followers: Vec<ClusterNode>,
}

/// What the appliance of this data dir last served, kept across runs (`served.json`): a port
/// picked with `--listen HOST:0` is picked again at the next start, so the join links handed
/// out stay valid; with no appliance running, `mint` prints a link that works and `space
/// list` answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LastServed {
    /// The client listener as bound.
    pub listen: SocketAddr,
    /// The `host:port` join links name.
    pub link_host: String,
    /// The spaces served.
    pub spaces: Vec<crate::ops::SpaceInfo>,
    /// The dashboard's listener as bound, when it was served: a port picked with `HOST:0` is
    /// picked again, so that its bookmarked URL stays valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dashboard: Option<SocketAddr>,
}

/// A space the appliance knows but could not serve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnservedSpace {
    /// The space.
    pub name: String,
    /// Why, with every cause (the broker's own words where it refused).
    pub reason: String,
}

impl DataDir {
    /// A data dir rooted at `root` (created on demand, mode 0700).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DataDir { root: root.into() }
    }

    /// The default: `$COTALD_DATA_DIR` is handled by the CLI; this is
    /// `$XDG_DATA_HOME/cotald`, else `$HOME/.local/share/cotald`.
    pub fn default_root() -> Result<PathBuf, DataDirError> {
        if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
            return Ok(PathBuf::from(xdg).join("cotald"));
        }
        std::env::var_os("HOME")
            .filter(|v| !v.is_empty())
            .map(|home| PathBuf::from(home).join(".local/share/cotald"))
            .ok_or(DataDirError::NoDefault)
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// `bin/`
    pub fn bin(&self) -> PathBuf {
        self.root.join("bin")
    }
    /// `bin.verified`: what the installed broker's file was when last compared with the
    /// embedded build.
    pub fn broker_verified(&self) -> PathBuf {
        self.root.join("bin.verified")
    }
    /// `keys/`
    pub fn keys(&self) -> PathBuf {
        self.root.join("keys")
    }
    /// `tls/`
    pub fn tls(&self) -> PathBuf {
        self.root.join("tls")
    }
    /// `tls/ca.pem`
    pub fn ca_cert(&self) -> PathBuf {
        self.tls().join("ca.pem")
    }
    /// `spaces/`: one directory per space.
    pub fn spaces(&self) -> PathBuf {
        self.root.join("spaces")
    }
    /// `spaces/<space>/`
    pub fn space(&self, space: &str) -> PathBuf {
        self.spaces().join(space)
    }
    /// `spaces/<space>/local-operator.creds`: the machine operator's own credentials.
    pub fn operator_creds(&self, space: &str) -> PathBuf {
        self.space(space)
            .join(format!("{}.creds", crate::ops::OPERATOR))
    }
    /// `spaces/<space>/space.toml`: the record of a space added at runtime.
    pub fn runtime_space(&self, space: &str) -> PathBuf {
        self.space(space).join("space.toml")
    }
    /// `spaces/<space>/identities/`: the identities minted for a space.
    pub fn identities(&self, space: &str) -> PathBuf {
        self.space(space).join("identities")
    }
    /// `spaces/<space>/creds/`: where `cotald mint` writes `.creds` files by default.
    pub fn creds(&self, space: &str) -> PathBuf {
        self.space(space).join("creds")
    }
    /// A clustered node's `[cluster]` table (`cluster/cluster.toml`).
    pub fn cluster_table(&self) -> PathBuf {
        self.root.join("cluster/cluster.toml")
    }

    /// A joined node's server name (`cluster/node`).
    pub fn node_name(&self) -> PathBuf {
        self.root.join("cluster/node")
    }

    /// `jwt/`
    pub fn resolver(&self) -> PathBuf {
        self.root.join("jwt")
    }
    /// `jetstream/`
    pub fn jetstream(&self) -> PathBuf {
        self.root.join("jetstream")
    }
    /// `run/`
    pub fn run(&self) -> PathBuf {
        self.root.join("run")
    }
    /// `run/nats-server.conf`: the broker config rendered at each start.
    pub fn broker_conf(&self) -> PathBuf {
        self.run().join("nats-server.conf")
    }
    /// `run/admin.sock`: the owner-only socket local commands use.
    pub fn admin_socket(&self) -> PathBuf {
        self.run().join("admin.sock")
    }
    /// `dashboard.token`: the dashboard's access token, kept across runs (owner-only).
    pub fn dashboard_token(&self) -> PathBuf {
        self.root.join("dashboard.token")
    }
    /// `restore/`: what `cotald restore` left for the next start to put back into the broker.
    pub fn restore(&self) -> PathBuf {
        self.root.join("restore")
    }
    /// `log/`
    pub fn log(&self) -> PathBuf {
        self.root.join("log")
    }
    /// `log/cotald.log`: the appliance's log when stderr cannot take it (`cli::log`).
    pub fn appliance_log(&self) -> PathBuf {
        self.log().join("cotald.log")
    }
    /// `log/nats-server.log`: the broker's log, which the broker writes and rotates.
    pub fn broker_log(&self) -> PathBuf {
        self.log().join("nats-server.log")
    }
    fn lock_path(&self) -> PathBuf {
        self.root.join("cotald.lock")
    }
    fn state_path(&self) -> PathBuf {
        self.run().join("state.json")
    }

    /// Creates the root and takes the exclusive lock, recording our pid in it. A root that
    /// other users may write to is refused: they could replace the broker binary or the socket.
    pub fn lock(&self) -> Result<DataDirLock, DataDirError> {
        for dir in [self.root.clone(), self.run(), self.log(), self.bin()] {
            files::private_dir(&dir)?;
        }
        {
            use std::os::unix::fs::PermissionsExt;
            let meta = fs::metadata(&self.root)
                .map_err(FileError::at(&self.root, "reading metadata of"))?;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o022 != 0 {
                return Err(DataDirError::Writable {
                    dir: self.root.clone(),
                    mode,
                });
            }
        }
        let path = self.lock_path();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(FileError::at(&path, "opening"))?;
        // `cotald status` probes with a shared lock held for an instant: retry briefly
        // before concluding that another appliance owns the data dir.
        let mut attempt = 0;
        let locked = loop {
            match file.try_lock() {
                Err(TryLockError::WouldBlock) if attempt < 10 => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => break other,
            }
        };
        match locked {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(DataDirError::Locked {
                    dir: self.root.clone(),
                    pid: text.trim().parse().ok(),
                });
            }
            Err(TryLockError::Error(source)) => {
                return Err(FileError::new(&path, "locking", source).into());
            }
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .map_err(FileError::at(&path, "writing the pid into"))?;
        Ok(DataDirLock { _file: file })
    }

    /// Blocks until no appliance holds this data dir: its lock is released when its process
    /// exits, however it exits.
    pub fn wait_unlocked(&self) -> Result<(), DataDirError> {
        let path = self.lock_path();
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(FileError::new(&path, "opening", source).into()),
        };
        file.lock_shared()
            .map_err(|source| FileError::new(&path, "waiting for", source).into())
    }

    /// Whether some process holds the lock right now (without taking it for long).
    pub fn is_locked(&self) -> Result<bool, DataDirError> {
        let path = self.lock_path();
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(source) => return Err(FileError::new(&path, "opening", source).into()),
        };
        match file.try_lock_shared() {
            Ok(()) => Ok(false),
            Err(TryLockError::WouldBlock) => Ok(true),
            Err(TryLockError::Error(source)) => {
                Err(FileError::new(&path, "probing", source).into())
            }
        }
    }

    /// Records the runtime state (atomically).
    pub fn write_state(&self, state: &RuntimeState) -> Result<(), DataDirError> {
        let path = self.state_path();
        let json = serde_json::to_vec_pretty(state).map_err(|source| DataDirError::BadState {
            path: path.clone(),
            source,
        })?;
        // Runtime state: replaced whole, never synced (it says nothing after a crash).
        Ok(files::write_replacing(&path, &json, 0o600)?)
    }

    /// Reads the runtime state, if a running appliance wrote one.
    pub fn read_state(&self) -> Result<Option<RuntimeState>, DataDirError> {
        let path = self.state_path();
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| DataDirError::BadState { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(FileError::new(&path, "reading", source).into()),
        }
    }

    /// Records what the appliance serves (atomically); kept after it stops. A record that
    /// says the same already is left as it is: a start that serves what the last one did
    /// writes (and syncs) nothing.
    pub fn write_last_served(&self, served: &LastServed) -> Result<(), DataDirError> {
        let path = self.root.join("served.json");
        let json = serde_json::to_vec_pretty(served).map_err(|source| DataDirError::BadState {
            path: path.clone(),
            source,
        })?;
        if fs::read(&path).is_ok_and(|recorded| recorded == json) {
            return Ok(());
        }
        Ok(files::write_atomic(&path, &json, 0o600)?)
    }

    /// What the appliance last served, if it ever served and the record is readable (an
    /// unreadable record is as good as none: the next start writes it again).
    pub fn read_last_served(&self) -> Option<LastServed> {
        let bytes = fs::read(self.root.join("served.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Removes the runtime state (clean shutdown).
    pub fn clear_state(&self) {
        let _ = fs::remove_file(self.state_path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused_with_the_holder_pid() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(tmp.path().join("d"));
        assert!(!dir.is_locked().unwrap());
        let held = dir.lock().unwrap();
        assert!(dir.is_locked().unwrap());
        match dir.lock() {
            Err(DataDirError::Locked { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("expected Locked, got {other:?}"),
        }
        drop(held);
        assert!(!dir.is_locked().unwrap());
        dir.lock().unwrap();
    }

    #[test]
    fn the_served_record_is_written_only_when_it_changes() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(tmp.path().join("d"));
        fs::create_dir(dir.root()).unwrap();
        let mut served = LastServed {
            listen: "127.0.0.1:4222".parse().unwrap(),
            link_host: "127.0.0.1:4222".into(),
            spaces: Vec::new(),
            dashboard: None,
        };
        let inode = || fs::metadata(dir.root().join("served.json")).unwrap().ino();
        dir.write_last_served(&served).unwrap();
        let first = inode();
        // The same record again: the file is left as it is (a write renames a new file in).
        dir.write_last_served(&served).unwrap();
        assert_eq!(inode(), first);
        served.dashboard = Some("127.0.0.1:8080".parse().unwrap());
        dir.write_last_served(&served).unwrap();
        assert_ne!(inode(), first);
        let read = dir.read_last_served().unwrap();
        assert_eq!(read.dashboard, served.dashboard);
    }

    #[test]
    fn a_data_dir_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("d");
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o777)).unwrap();
        let err = DataDir::new(&root).lock().unwrap_err();
        assert!(err.to_string().contains("chmod go-w"), "{err}");
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        DataDir::new(&root).lock().unwrap();
    }

    #[test]
    fn state_round_trips() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(tmp.path());
        let _lock = dir.lock().unwrap();
        assert_eq!(dir.read_state().unwrap(), None);
        let state = RuntimeState {
            pid: 1,
            broker_pid: 2,
            broker_version: "2.15.1".into(),
            listen: "127.0.0.1:4222".parse().unwrap(),
            monitor: None,
            spaces: vec!["main".into()],
            broker_restarts: 1,
            broker_last_restart: Some(crate::ops::status::BrokerRestart {
                reason: "unresponsive: no answer to HEALTHZ within 1s".into(),
                at: "2026-12-03T09:00:00Z".into(),
            }),
            services: Vec::new(),
            unserved: vec![UnservedSpace {
                name: "lab".into(),
                reason: "space `lab` refused".into(),
            }],
            dashboard: Some("http://127.0.0.1:4280/?token=x".into()),
            leases: BTreeMap::new(),
            cluster: None,
        };
        dir.write_state(&state).unwrap();
        assert_eq!(dir.read_state().unwrap(), Some(state));
        dir.clear_state();
        assert_eq!(dir.read_state().unwrap(), None);
    }
}
