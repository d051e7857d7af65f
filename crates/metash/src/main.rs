//! `metash`: the command line. Thin on purpose: every command parses its arguments, calls one layer
//! crate and prints the result for people, or as JSON with `--json`.

mod cmd;
mod exit;
#[cfg(test)]
mod grammar_tests;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::exit::Exit;

#[derive(Debug, Parser)]
#[command(
    name = "metash",
    version,
    about = "An agent host shell: several agents, one project, under your control."
)]
struct Cli {
    /// The project directory (the one holding `.meta/`).
    #[arg(short = 'C', long = "workspace", global = true, default_value = ".")]
    workspace: PathBuf,

    /// Print JSON instead of text: the same data, for scripts (every command).
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: cmd::Command,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage(&e),
    };
    let ctx = cmd::Ctx {
        workspace: cli.workspace,
        json: cli.json,
    };
    match cmd::run(cli.command, &ctx) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("metash: {err:#}");
            Exit::Failure.into()
        }
    }
}

/// `--help` and `--version` print and succeed; a wrong command line prints clap's message and
/// exits [`Exit::Usage`], never clap's 2 (see `exit.rs`).
fn usage(e: &clap::Error) -> ExitCode {
    let _ = e.print();
    if e.use_stderr() {
        Exit::Usage.into()
    } else {
        ExitCode::SUCCESS
    }
}
