//! `cotald completions SHELL` and `cotald man`: shell integration generated from the same clap
//! model as `--help`, so neither can drift from the binary.

use std::process::ExitCode;

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use super::Cli;

/// Options of `cotald completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

pub(super) fn completions(args: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "cotald", &mut script);
    super::stdout(|out| out.write_all(&script))?;
    Ok(ExitCode::SUCCESS)
}

pub(super) fn man() -> anyhow::Result<ExitCode> {
    let mut page = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut page)?;
    super::stdout(|out| out.write_all(&page))?;
    Ok(ExitCode::SUCCESS)
}
