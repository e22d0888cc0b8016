//! `cotald context`: saved ways to reach a remote appliance (a link, a `.creds` file and the
//! CA), so that every endpoint command works there without connection flags, like the
//! `nats context` pattern.
//!
//! Contexts live in the config dir (`$XDG_CONFIG_HOME/cotald`, else `~/.config/cotald`):
//!
//! ```text
//! contexts/<name>.json   {"link", "creds", "ca"} (absolute paths; owner-only)
//! current                the name `cotald context use` selected
//! ```
//!
//! Which one applies: `--context NAME`, else `COTALD_CONTEXT`, else the current one. A context
//! stores paths, never the secrets themselves: a credential re-minted in place is picked up.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};

use crate::files;
use crate::protocol::JoinLink;

/// Options of `cotald context`.
#[derive(Debug, Args)]
pub struct ContextArgs {
    #[command(subcommand)]
    command: ContextCommand,
}

#[derive(Debug, Subcommand)]
enum ContextCommand {
    /// Save a context (refused if the name exists, unless --replace).
    Add(AddArgs),
    /// Make a context the one used when no connection flag is given.
    Use {
        /// The context.
        name: String,
    },
    /// List the contexts; the current one is marked `*`.
    #[command(alias = "list")]
    Ls {
        /// One JSON array of {"name","link","creds","ca","current"}.
        #[arg(long)]
        json: bool,
    },
    /// Remove a context (and stop using it, if it was current).
    Rm {
        /// The context.
        name: String,
    },
}

#[derive(Debug, Args)]
struct AddArgs {
    /// The context's name: 1 to 64 characters from [A-Za-z0-9_.-].
    name: String,
    /// The join link, e.g. cotals://host:4222/main?channel=general
    #[arg(long, value_name = "LINK")]
    link: String,
    /// The `.creds` file.
    #[arg(long, value_name = "FILE")]
    creds: PathBuf,
    /// The CA certificate of the appliance (its tls/ca.pem).
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// Overwrite a context of that name.
    #[arg(long)]
    replace: bool,
    /// Also make it the current context.
    #[arg(long = "use")]
    make_current: bool,
}

/// A saved context.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SavedContext {
    /// The join link.
    pub link: String,
    /// The `.creds` file.
    pub creds: PathBuf,
    /// The CA certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
}

/// The config dir: `$XDG_CONFIG_HOME/cotald`, else `$HOME/.config/cotald`.
fn config_dir() -> anyhow::Result<PathBuf> {
    if let Some(xdg) = std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(xdg).join("cotald"));
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".config/cotald")),
        None => bail!("cannot find the config dir for contexts: set XDG_CONFIG_HOME or HOME"),
    }
}

fn context_path(dir: &Path, name: &str) -> PathBuf {
    dir.join("contexts").join(format!("{name}.json"))
}

fn current_path(dir: &Path) -> PathBuf {
    dir.join("current")
}

fn validate(name: &str) -> anyhow::Result<()> {
    crate::space::identity::validate_name(name).map_err(|e| anyhow::anyhow!("context {e}"))
}

/// There is no context `name`: say which there are, and how to make one.
fn no_such(dir: &Path, name: &str) -> anyhow::Error {
    let known = names(dir);
    anyhow::anyhow!(
        "no context named `{name}`{}; save one with `cotald context add {name} --link LINK \
         --creds FILE --ca CA`",
        if known.is_empty() {
            String::new()
        } else {
            format!(" (known: {})", known.join(", "))
        }
    )
}

/// Reads the context named `name`.
fn load(dir: &Path, name: &str) -> anyhow::Result<SavedContext> {
    validate(name)?;
    let path = context_path(dir, name);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(no_such(dir, name)),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    serde_json::from_str(&text).with_context(|| {
        format!(
            "context `{name}` ({}) is malformed; remove it with `cotald context rm {name}` and \
             add it again",
            path.display()
        )
    })
}

/// The names of the saved contexts, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir.join("contexts"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".json")
                .map(str::to_owned)
        })
        .collect();
    out.sort();
    out
}

fn current(dir: &Path) -> Option<String> {
    std::fs::read_to_string(current_path(dir))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The context that applies: the one named (`--context` or `COTALD_CONTEXT`), else the current
/// one, else none. Its name comes with it.
pub(super) fn selected(named: Option<&str>) -> anyhow::Result<Option<(String, SavedContext)>> {
    let dir = config_dir();
    match named {
        Some(name) => Ok(Some((name.to_owned(), load(&dir?, name)?))),
        None => {
            let Ok(dir) = dir else { return Ok(None) };
            match current(&dir) {
                Some(name) => {
                    let saved = load(&dir, &name).with_context(|| {
                        format!(
                            "the current context `{name}` cannot be used (change it with \
                             `cotald context use NAME`)"
                        )
                    })?;
                    Ok(Some((name, saved)))
                }
                None => Ok(None),
            }
        }
    }
}

pub(super) async fn run(args: ContextArgs) -> anyhow::Result<ExitCode> {
    let dir = config_dir()?;
    match args.command {
        ContextCommand::Add(add) => {
            validate(&add.name)?;
            JoinLink::parse(&add.link).with_context(|| format!("invalid --link {}", add.link))?;
            let creds = absolute(&add.creds)?;
            let text = std::fs::read_to_string(&creds)
                .with_context(|| format!("cannot read --creds {}", creds.display()))?;
            crate::binding::Creds::parse(&text)
                .with_context(|| format!("--creds {} is not a .creds file", creds.display()))?;
            let ca = match &add.ca {
                Some(ca) => {
                    let ca = absolute(ca)?;
                    super::endpoint::check_ca(&ca)?;
                    Some(ca)
                }
                None => None,
            };
            let path = context_path(&dir, &add.name);
            if path.exists() && !add.replace {
                bail!(
                    "context `{}` exists; pass --replace to overwrite it",
                    add.name
                );
            }
            files::private_dir(&dir.join("contexts"))?;
            let saved = SavedContext {
                link: add.link,
                creds,
                ca,
            };
            files::write_atomic(&path, &serde_json::to_vec_pretty(&saved)?, 0o600)?;
            if add.make_current {
                files::write_atomic(&current_path(&dir), add.name.as_bytes(), 0o600)?;
            }
            super::stdout(|out| {
                writeln!(
                    out,
                    "saved context {}{}",
                    add.name,
                    if add.make_current { " (current)" } else { "" }
                )
            })?;
        }
        ContextCommand::Use { name } => {
            load(&dir, &name)?;
            files::write_atomic(&current_path(&dir), name.as_bytes(), 0o600)?;
            super::stdout(|out| writeln!(out, "using context {name}"))?;
        }
        ContextCommand::Ls { json } => list(&dir, json)?,
        ContextCommand::Rm { name } => {
            // Removed whatever it holds: a malformed context is what one most wants gone.
            validate(&name)?;
            let path = context_path(&dir, &name);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(no_such(&dir, &name));
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot remove {}", path.display()));
                }
            }
            if current(&dir).as_deref() == Some(name.as_str()) {
                let _ = std::fs::remove_file(current_path(&dir));
            }
            super::stdout(|out| writeln!(out, "removed context {name}"))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))
}

/// `context ls`: every saved context, a broken one marked with why.
fn list(dir: &Path, json: bool) -> anyhow::Result<()> {
    let current = current(dir);
    // A context that cannot be read is listed as broken, with why, not a failure of
    // the whole listing (`context rm` removes it).
    let mut rows = Vec::new();
    for name in names(dir) {
        let saved = load(dir, &name).map_err(|e| format!("{e:#}"));
        rows.push((current.as_deref() == Some(name.as_str()), name, saved));
    }
    super::stdout(|out| {
        if json {
            let doc: Vec<serde_json::Value> = rows
                .iter()
                .map(|(current, name, c)| match c {
                    Ok(c) => serde_json::json!({
                        "name": name, "link": c.link, "creds": c.creds,
                        "ca": c.ca, "current": current,
                    }),
                    Err(broken) => serde_json::json!({
                        "name": name, "broken": broken, "current": current,
                    }),
                })
                .collect();
            writeln!(out, "{}", serde_json::Value::from(doc))
        } else {
            if rows.is_empty() {
                writeln!(
                    out,
                    "no contexts; save one with `cotald context add NAME --link LINK \
                     --creds FILE --ca CA`"
                )?;
            }
            for (current, name, c) in &rows {
                let mark = if *current { "*" } else { " " };
                match c {
                    Ok(c) => writeln!(out, "{mark} {name}  {}  {}", c.link, c.creds.display())?,
                    Err(broken) => writeln!(
                        out,
                        "{mark} {name}  BROKEN: {broken} (remove it with `cotald context \
                         rm {name}`)"
                    )?,
                }
            }
            Ok(())
        }
    })?;
    Ok(())
}
