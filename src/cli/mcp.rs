//! `cotald mcp`: the MCP server on stdio (the library's `mcp` module), and the config block a
//! host needs to launch it.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};

use super::endpoint::EndpointArgs;

/// Options of `cotald mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub(super) endpoint: EndpointArgs,
    /// Print the JSON a host needs to launch this server with these options (absolute paths),
    /// then exit: `claude` for Claude Code's `.mcp.json`, `json` for the common `mcpServers`
    /// block (Claude Desktop, Cursor, ...).
    #[arg(long, value_enum, value_name = "FORMAT", num_args = 0..=1, default_missing_value = "json")]
    print_config: Option<ConfigFormat>,
    /// The server's name in the printed config.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "cotal",
        requires = "print_config"
    )]
    server_name: String,
}

/// The shapes of `--print-config`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum ConfigFormat {
    /// Claude Code (`.mcp.json`, or `claude mcp add-json NAME '<the inner object>'`).
    Claude,
    /// The `mcpServers` block most hosts read.
    Json,
}

pub(super) async fn run(args: McpArgs) -> anyhow::Result<ExitCode> {
    if let Some(format) = args.print_config {
        return print_config(&args, format);
    }
    let endpoint = args.endpoint.resolve()?;
    let mut opts = endpoint.options.clone();
    // Peers that are away are still addressed by name (cotal_dm), as `cotald send --to`.
    opts.known = endpoint.directory();
    // SIGINT or SIGTERM (a host ending its server): the endpoint says `offline` before it exits.
    crate::mcp::serve_stdio(opts, super::stop_signal()?)
        .await
        .context("cotald mcp")?;
    Ok(ExitCode::SUCCESS)
}

fn print_config(args: &McpArgs, format: ConfigFormat) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot tell where this cotald is")?;
    let mut launch = vec!["mcp".to_owned()];
    launch.extend(args.endpoint.launch_args()?);
    let mut server = serde_json::json!({
        "command": exe.display().to_string(),
        "args": launch,
    });
    if let ConfigFormat::Claude = format {
        server["type"] = "stdio".into();
    }
    let doc = serde_json::json!({ "mcpServers": { args.server_name.as_str(): server } });
    super::stdout(|out| writeln!(out, "{}", serde_json::to_string_pretty(&doc)?))?;
    Ok(ExitCode::SUCCESS)
}
