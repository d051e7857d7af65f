//! Exit codes, one set for every command, so scripts can branch on them (the table is in
//! docs/cli.md). None is 2: that was clap's code for a usage error, which metash reports as
//! [`Exit::Usage`] (64, `EX_USAGE`) instead, so 2 can only ever come from a program `metash sandbox`
//! ran (whose own status it passes through).

use std::process::ExitCode;

/// What a metash command's exit status means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// A command failed or its request was refused (bad input, unknown agent, I/O error, ...).
    Failure = 1,
    /// The agent ran and failed (`AgentResponse.status = "error"`).
    AgentError = 3,
    /// A checkpoint waits for a person: `metash run --answer VALUE` or `metash resume --answer VALUE`.
    Checkpoint = 4,
    /// `metash run`: the session halted (gap limit, rejected plans, a task that keeps failing).
    Halted = 5,
    /// The agent was stopped at its deadline (`status = "timeout"`).
    Timeout = 6,
    /// Refused before anything ran: `consent check` (the capability), `harness` (a provider,
    /// model or continuation that cannot work; JSON `{"error":{"code","message"}}` on stdout).
    Refused = 7,
    /// The command line itself was wrong (unknown flag, missing argument): nothing ran.
    Usage = 64,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}
