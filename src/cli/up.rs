//! `cotald up`: start the appliance in the foreground.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use futures_util::StreamExt;
use signal_hook::consts::{SIGINT, SIGQUIT, SIGTERM};

use super::DataDirArg;
use crate::daemon::notify::Notifier;
use crate::daemon::{Appliance, Options, ReadyInfo};
use crate::dashboard::Availability;
use crate::profile::Profile;
use crate::supervisor::BrokerBinary;

/// Options of `cotald up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    #[command(flatten)]
    pub(super) data_dir: DataDirArg,
    /// Profile to serve (TOML; see config/local.toml) [default: the embedded local profile:
    /// space `main`, channels durable by default]
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Client listener, overriding the profile (TLS always on). Port 0 picks a free port.
    #[arg(long, env = "COTALD_LISTEN", value_name = "HOST:PORT")]
    listen: Option<SocketAddr>,
    /// A DNS name or IP address clients dial, added to the server certificate (repeatable;
    /// in the environment, comma-separated).
    #[arg(
        long = "hostname",
        env = "COTALD_HOSTNAME",
        value_name = "NAME",
        value_delimiter = ',',
        value_parser = hostname
    )]
    hostnames: Vec<String>,
    /// The web dashboard's listener, overriding the profile's `[dashboard] listen` (port 0 picks
    /// a free port).
    #[arg(long, value_name = "HOST:PORT")]
    dashboard: Option<SocketAddr>,
    /// Run this nats-server executable instead of the bundled one.
    #[arg(long, value_name = "PATH")]
    nats_server: Option<PathBuf>,
}

pub(super) async fn run(args: UpArgs, embedded: BrokerBinary) -> anyhow::Result<ExitCode> {
    let profile = match &args.config {
        Some(path) => Profile::read(path)?,
        None => Profile::embedded()?,
    };
    let mut signals = signal_hook_tokio::Signals::new([SIGTERM, SIGINT, SIGQUIT])
        .context("cannot install signal handlers")?;
    let handle = signals.handle();
    let data_dir = args.data_dir.resolve()?;
    let log_file = data_dir.appliance_log();
    match super::log::background_job() {
        true => {
            super::log::to_file(&log_file)
                .with_context(|| format!("cannot write the log to {}", log_file.display()))?;
            let _ = super::stdout(|out| {
                writeln!(
                    out,
                    "cotald runs as a background job; its log goes to {}",
                    log_file.display()
                )
            });
        }
        false => super::log::fall_back_to(&log_file),
    }
    let opts = Options {
        data_dir,
        profile,
        listen: args.listen,
        hostnames: args.hostnames,
        broker: args.nats_server.map_or(embedded, BrokerBinary::External),
        dashboard: args.dashboard,
    };
    let notifier = Notifier::from_env();
    notifier.status("starting: provisioning, then the broker and the spaces");
    let appliance = tokio::select! {
        started = Appliance::start(opts) => started?,
        signal = signals.next() => {
            tracing::info!(?signal, "interrupted during startup");
            return Ok(ExitCode::FAILURE);
        }
    };
    print_ready(appliance.info());
    // After the banner: whoever waits for READY=1 finds the links printed.
    notifier.ready(&ready_status(appliance.info()));
    appliance
        .run_until(
            async move {
                if let Some(signal) = signals.next().await {
                    tracing::info!(signal, "shutdown requested");
                }
            },
            &notifier,
        )
        .await;
    handle.close();
    Ok(ExitCode::SUCCESS)
}

/// `--hostname` is checked as it is parsed, before the data dir is touched.
fn hostname(value: &str) -> Result<String, crate::provision::ProvisionError> {
    crate::provision::validate_hostname(value).map(|()| value.to_owned())
}

/// The one line `systemctl status` shows while the appliance serves.
fn ready_status(info: &ReadyInfo) -> String {
    let spaces: Vec<&str> = info.spaces.iter().map(|s| s.name.as_str()).collect();
    let mut status = format!(
        "serving {} on {} (nats-server {}, pid {})",
        match spaces.as_slice() {
            [one] => format!("space {one}"),
            many => format!("spaces {}", many.join(", ")),
        },
        info.listen,
        info.broker_version,
        info.broker_pid
    );
    if !info.unserved.is_empty() {
        let unserved: Vec<&str> = info.unserved.iter().map(|s| s.name.as_str()).collect();
        status.push_str(&format!("; NOT SERVED: {}", unserved.join(", ")));
    }
    status
}

/// The ready banner, on stdout; a stdout that cannot take it (a closed terminal) costs the
/// banner, never the appliance.
fn print_ready(info: &ReadyInfo) {
    let _ = super::stdout(|out| ready_banner(out, info));
}

fn ready_banner(out: &mut dyn std::io::Write, info: &ReadyInfo) -> std::io::Result<()> {
    writeln!(
        out,
        "cotald is ready: nats-server {} (pid {}) on {}, TLS on",
        info.broker_version, info.broker_pid, info.listen
    )?;
    served(out, info)?;
    remote_peers(out, info)?;
    match &info.dashboard {
        Availability::Serving(url) => writeln!(out, "  dashboard                 {url}")?,
        Availability::NotServed(reason) => {
            writeln!(out, "  dashboard                 NOT SERVED: {reason}")?
        }
        Availability::Disabled => {}
    }
    writeln!(
        out,
        "  CA certificate            {}",
        info.ca_cert.display()
    )?;
    writeln!(
        out,
        "  data dir                  {}",
        info.data_dir.display()
    )?;
    writeln!(out)?;
    next_steps(out, info)
}

/// Each space: its join link and the operator's credential, or why it is not served.
fn served(out: &mut dyn std::io::Write, info: &ReadyInfo) -> std::io::Result<()> {
    for space in &info.spaces {
        writeln!(out, "  space {:<12} join link   {}", space.name, space.link)?;
        writeln!(
            out,
            "  {:<18} your creds  {}",
            "",
            space.operator_creds.display()
        )?;
    }
    for space in &info.unserved {
        writeln!(
            out,
            "  space {:<12} NOT SERVED: {}",
            space.name, space.reason
        )?;
    }
    Ok(())
}

/// On a listener of every address: how remote peers reach it, or that the links cannot serve
/// them (they name loopback).
fn remote_peers(out: &mut dyn std::io::Write, info: &ReadyInfo) -> std::io::Result<()> {
    if info.listen.ip().is_unspecified() {
        let host = info.link_host.rsplit_once(':').map_or("", |(h, _)| h);
        if host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
        {
            writeln!(
                out,
                "  remote peers              cannot use these links (they name loopback): \
                 restart with --hostname NAME, a name or address they dial"
            )?;
        } else {
            writeln!(
                out,
                "  remote peers              dial {} (in the certificate); add other names \
                 with --hostname NAME",
                info.link_host
            )?;
        }
    }
    Ok(())
}

/// The commands to try next, with the options that reach this appliance.
fn next_steps(out: &mut dyn std::io::Write, info: &ReadyInfo) -> std::io::Result<()> {
    let dir = info.data_dir.display();
    writeln!(out, "Next:")?;
    // The data dir option, only when it is not the one every command finds by itself.
    let data_dir = match crate::datadir::DataDir::default_root() {
        Ok(default) if default == info.data_dir => String::new(),
        _ => format!(" --data-dir {dir}"),
    };
    if let Some(space) = info.spaces.first() {
        let space_arg = match space.name.as_str() {
            "main" => String::new(),
            other => format!(" --space {other}"),
        };
        writeln!(
            out,
            "  cotald tail{space_arg}{data_dir}                  # what arrives, as the operator"
        )?;
        writeln!(
            out,
            "  cotald send{space_arg}{data_dir} \"hello\"          # post on general"
        )?;
        writeln!(
            out,
            "  cotald mint alice --allow-publish general{space_arg}{data_dir}   # an agent's credential"
        )?;
        writeln!(out, "  cotald roster{space_arg}{data_dir}")?;
    }
    writeln!(out, "  cotald status{data_dir}")?;
    writeln!(out, "  cotald down{data_dir}")?;
    writeln!(out, "Stop with Ctrl-C, SIGTERM or `cotald down`.")
}
