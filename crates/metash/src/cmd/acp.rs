//! `metash acp`: metash as an ACP agent over stdio, for editors (Zed, JetBrains, Neovim...,
//! issue 34 item 2, docs/acp.md "metash as an editor's agent"). An editor session is a metash
//! session in its `cwd`. A prompt in `turn` mode (the default) is one task: the executor role's
//! turn in a fresh task worktree, verified and merged as any task; in `run` mode it runs
//! `metash run` there (plan → execute → verify). Either way the plan, progress, spawns, merges
//! and the verifier's findings stream as `session/update`s; checkpoints and consent questions
//! become `session/request_permission`s.
//!
//! - [`server`]: the JSON-RPC connection (stdin/stdout), sessions and dispatch;
//! - [`conn`]: what those share: the editor's end of the connection, a session, its mode, its
//!   cancel;
//! - [`prompt`]: a `run`-mode prompt, and what both modes drive: the run as a child process, its
//!   checkpoints, cancel;
//! - [`turn`]: a `turn`-mode prompt: the prompt as one task, landed or withdrawn;
//! - [`follow`]: the project's store followed while the run goes, as `session/update`s.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;

use super::Ctx;

mod conn;
mod follow;
mod prompt;
mod server;
mod turn;

#[derive(Debug, Subcommand)]
pub enum AcpCommand {
    /// Serve the Agent Client Protocol on stdin/stdout for an editor: each session is a metash
    /// project (its `cwd`); each prompt is one task (`turn` mode, the default) or a whole
    /// `metash run` (`run` mode), whose plan, progress, spawns and merges stream to the editor,
    /// whose checkpoints and consent questions the editor answers.
    Acp {
        /// Allow this capability without asking, in every run (repeatable), e.g. `--yes-to
        /// files.write`; other questions go to the editor when the project waits for answers
        /// (`[host] consent_wait_seconds`), else they are denied.
        #[arg(long = "yes-to", value_name = "CAPABILITY")]
        yes_to: Vec<String>,
        /// A consent policy file for every run (see docs/policy.md); default: each project's
        /// `.meta/policy.toml` when present.
        #[arg(long)]
        policy: Option<PathBuf>,
    },
}

pub fn run(cmd: AcpCommand, _ctx: &Ctx) -> Result<ExitCode> {
    let AcpCommand::Acp { yes_to, policy } = cmd;
    let exe = std::env::current_exe()?;
    let mut run_args = Vec::new();
    for c in yes_to {
        run_args.extend(["--yes-to".to_string(), c]);
    }
    if let Some(p) = policy {
        // Each run works in its own project: the path must not depend on where that is.
        let p = std::path::absolute(&p)?;
        run_args.extend(["--policy".to_string(), p.display().to_string()]);
    }
    server::serve(conn::Config { exe, run_args })?;
    Ok(ExitCode::SUCCESS)
}
