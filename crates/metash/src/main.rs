//! `metash`: the command line. Thin on purpose: every command parses its arguments, calls one layer
//! crate and prints the result for people, or as JSON with `--json`.

mod cmd;
mod exit;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

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

    #[command(subcommand)]
    command: cmd::Command,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ctx = cmd::Ctx {
        workspace: cli.workspace,
    };
    match cmd::run(cli.command, &ctx) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("metash: {err:#}");
            ExitCode::from(exit::FAILURE)
        }
    }
}
