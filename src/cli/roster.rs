//! `cotald roster`: who is in the space (§6), as the presence directory says, with the status
//! the liveness rule gives (a record older than the liveness window is `offline`, whatever it
//! declares). The command watches the roster without announcing itself.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::endpoint::EndpointArgs;
use crate::client::{Client, Peer};

/// How long the roster may take to load.
const LOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Options of `cotald roster`.
#[derive(Debug, Args)]
pub struct RosterArgs {
    #[command(flatten)]
    pub(super) endpoint: EndpointArgs,
    /// Keep printing the roster whenever it changes (Ctrl-C ends).
    #[arg(long)]
    watch: bool,
    /// One JSON array per roster: {"name","id","status","activity","attention","role",
    /// "lastSeen"}.
    #[arg(long)]
    json: bool,
}

pub(super) async fn run(args: RosterArgs) -> anyhow::Result<ExitCode> {
    let mut opts = args.endpoint.options()?;
    opts.receive_dms = false;
    opts.receive_backstop = false;
    opts.presence = true;
    opts.announce = false;
    let conn = Client::connect(opts).await?;
    let client = conn.client;
    let result = async {
        tokio::time::timeout(LOAD_TIMEOUT, client.roster().loaded())
            .await
            .map_err(|_| {
                anyhow::anyhow!("the presence directory was not read within {LOAD_TIMEOUT:?}")
            })?;
        print(&client, args.json)?;
        if !args.watch {
            return Ok(());
        }
        let interrupted = tokio::signal::ctrl_c();
        tokio::pin!(interrupted);
        // Statuses also change with time alone (a silent peer turns offline): re-read each
        // heartbeat interval, print when what is shown changed.
        let mut shown = without_last_seen(rows(&client));
        let mut tick = tokio::time::interval(crate::protocol::HEARTBEAT_INTERVAL);
        loop {
            tokio::select! {
                () = client.roster().changed() => {}
                _ = tick.tick() => {}
                _ = &mut interrupted => return Ok(()),
            }
            // A heartbeat moves `lastSeen` only: not a change worth a new roster.
            let now = without_last_seen(rows(&client));
            if now != shown {
                shown = now;
                if !args.json {
                    super::stdout(|out| writeln!(out))?;
                }
                print(&client, args.json)?;
            }
        }
    }
    .await;
    client.close().await;
    result.map(|()| ExitCode::SUCCESS)
}

/// One line per peer, as shown (used to tell whether anything changed).
fn rows(client: &Client) -> Vec<serde_json::Value> {
    let mut peers: Vec<(String, Peer)> = client.roster().peers().into_iter().collect();
    peers.sort_by(|a, b| (&a.1.presence.card.name, &a.0).cmp(&(&b.1.presence.card.name, &b.0)));
    peers
        .into_iter()
        .map(|(id, peer)| {
            let p = &peer.presence;
            let last_seen =
                p.ts.as_u64()
                    .map(|ms| crate::provision::rfc3339((ms / 1000) as i64));
            serde_json::json!({
                "name": p.card.name,
                "id": id,
                "status": client.roster().status(&id).map(|s| s.as_str()),
                "activity": p.activity,
                "attention": p.attention,
                "role": p.card.role,
                "lastSeen": last_seen,
            })
        })
        .collect()
}

fn without_last_seen(mut rows: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    for row in &mut rows {
        if let Some(row) = row.as_object_mut() {
            row.remove("lastSeen");
        }
    }
    rows
}

fn print(client: &Client, json: bool) -> anyhow::Result<()> {
    let rows = rows(client);
    super::stdout(|out| {
        if json {
            return writeln!(out, "{}", serde_json::Value::from(rows));
        }
        if rows.is_empty() {
            return writeln!(out, "nobody is in space {}", client.space());
        }
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => super::terminal::terminal_safe(s, false),
            serde_json::Value::Null => "-".to_owned(),
            other => other.to_string(),
        };
        let width = rows
            .iter()
            .map(|r| text(&r["name"]).chars().count())
            .max()
            .unwrap_or(4)
            .max(4);
        writeln!(
            out,
            "{:width$}  {:56}  {:7}  {:9}  {:10}  {:20}  ACTIVITY",
            "NAME", "ID", "STATUS", "ATTENTION", "ROLE", "LAST SEEN"
        )?;
        for r in &rows {
            writeln!(
                out,
                "{:width$}  {:56}  {:7}  {:9}  {:10}  {:20}  {}",
                text(&r["name"]),
                text(&r["id"]),
                text(&r["status"]),
                text(&r["attention"]),
                text(&r["role"]),
                text(&r["lastSeen"]),
                text(&r["activity"]),
            )?;
        }
        Ok(())
    })
}
