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
    // One absolute workspace path, made here once: every layer below gets the same path whether
    // the user ran from inside the project (`-C .`, the default) or named it.
    let workspace = std::path::absolute(&cli.workspace).unwrap_or(cli.workspace);
    let ctx = cmd::Ctx {
        workspace,
        json: cli.json,
    };
    match cmd::run(cli.command, &ctx) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("metash: {}", redacted(&ctx, &format!("{err:#}")));
            Exit::of_error(&err).into()
        }
    }
}

/// An error message as it may be shown: an error can quote a config line, a header or a
/// provider's reply, so it goes through the same redaction as every other output. Outside a
/// project (or before `init`) the token shapes still apply, under a throwaway salt.
fn redacted(ctx: &cmd::Ctx, message: &str) -> String {
    let redactor = match metash_store::Store::open(&ctx.workspace) {
        Ok(store) => {
            let config = metash_host::config::HostConfig::load(&ctx.workspace).unwrap_or_default();
            metash_host::redaction::output_redactor(&store, &config, &|k| std::env::var(k).ok(), [])
        }
        Err(_) => metash_host::redaction::throwaway(),
    };
    // An error can quote an agent's words too (a checkpoint id, an answer): shown, not obeyed.
    metash_protocol::sanitize_for_terminal(&redactor.redact_str(message)).into_owned()
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
