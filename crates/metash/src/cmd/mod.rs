//! One module per command group; each owns its clap types and its printing.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

mod acp;
mod artifacts;
mod asks;
mod auth;
mod capability;
mod context;
mod control;
mod fork;
mod git;
mod harness;
pub(crate) mod host;
mod ledger;
mod migrate;
pub(crate) mod onboard;
mod orchestrator;
mod policy;
mod replay;
mod revoked;
mod serve;
#[cfg(unix)]
mod session;
#[cfg(unix)]
mod session_env;
#[cfg(unix)]
mod session_run;
mod store;
mod tape;
#[cfg(target_os = "linux")]
mod worker;

/// What every command gets besides its own arguments.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub workspace: PathBuf,
    /// `--json`: print the same data as JSON.
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    #[command(flatten)]
    Store(store::StoreCommand),
    #[command(flatten)]
    Acp(acp::AcpCommand),
    #[command(flatten)]
    Context(context::ContextCommand),
    #[command(flatten)]
    Harness(harness::HarnessCommand),
    #[command(flatten)]
    Policy(policy::PolicyCommand),
    #[command(flatten)]
    Orchestrator(orchestrator::OrchestratorCommand),
    #[command(flatten)]
    Git(git::GitCommand),
    #[command(flatten)]
    Serve(serve::ServeCommand),
    #[command(flatten)]
    Host(host::HostCommand),
    #[command(flatten)]
    Onboard(onboard::OnboardCommand),
    #[command(flatten)]
    Auth(auth::AuthCommand),
    #[cfg(unix)]
    #[command(flatten)]
    Session(session::SessionCommand),
    #[command(flatten)]
    Tape(tape::TapeCommand),
    #[command(flatten)]
    Replay(replay::ReplayCommand),
    #[command(flatten)]
    Fork(fork::ForkCommand),
    #[cfg(target_os = "linux")]
    #[command(flatten)]
    Worker(worker::WorkerCommand),
}

pub fn run(command: Command, ctx: &Ctx) -> anyhow::Result<ExitCode> {
    match command {
        Command::Store(c) => store::run(c, ctx),
        Command::Acp(c) => acp::run(c, ctx),
        Command::Context(c) => context::run(c, ctx),
        Command::Harness(c) => harness::run(c, ctx),
        Command::Policy(c) => policy::run(c, ctx),
        Command::Orchestrator(c) => orchestrator::run(c, ctx),
        Command::Git(c) => git::run(c, ctx),
        Command::Serve(c) => serve::run(c, ctx),
        Command::Host(c) => host::run(c, ctx),
        Command::Onboard(c) => onboard::run(c, ctx),
        Command::Auth(c) => auth::run(c, ctx),
        #[cfg(unix)]
        Command::Session(c) => session::run(c, ctx),
        Command::Tape(c) => tape::run(c, ctx),
        Command::Replay(c) => replay::run(c, ctx),
        Command::Fork(c) => fork::run(c, ctx),
        #[cfg(target_os = "linux")]
        Command::Worker(c) => worker::run(c, ctx),
    }
}
