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

/// Options of `cotald man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// The command whose page to print (cotald-COMMAND(1)), e.g. `send`; `channels set` for
    /// one of a command's own [default: cotald(1)]
    #[arg(value_name = "COMMAND")]
    command: Vec<String>,
}

pub(super) fn man(args: ManArgs) -> anyhow::Result<ExitCode> {
    let mut command = Cli::command();
    let (mut name, mut invoked) = ("cotald".to_owned(), "cotald".to_owned());
    for word in &args.command {
        let Some(sub) = command.find_subcommand(word).cloned() else {
            let known: Vec<&str> = command.get_subcommands().map(|c| c.get_name()).collect();
            anyhow::bail!(
                "`{name}` has no command `{word}`; it has: {}",
                known.join(", ")
            );
        };
        name = format!("{name}-{}", sub.get_name());
        invoked = format!("{invoked} {}", sub.get_name());
        command = sub;
    }
    // The page's title is cotald-COMMAND, as the parent page names it; its synopsis shows
    // the command as typed.
    let command = command.display_name(name).bin_name(invoked);
    let mut page = Vec::new();
    clap_mangen::Man::new(command).render(&mut page)?;
    super::stdout(|out| out.write_all(&page))?;
    Ok(ExitCode::SUCCESS)
}
