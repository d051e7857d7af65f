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
    /// Refused consent: the run (or spawn) needs a grant nobody gave (native execution without
    /// `--yes-to native` or a stored grant); the message names the command that grants it.
    /// Nothing was retried: trying again without the grant would be refused the same way.
    ConsentRefused = 8,
    /// The command line itself was wrong (unknown flag, missing argument): nothing ran.
    Usage = 64,
}

impl Exit {
    /// The code for a command that failed with `err`: [`Exit::ConsentRefused`] when a refused
    /// consent stopped it, else [`Exit::Failure`].
    pub fn of_error(err: &anyhow::Error) -> Self {
        let refused = err.chain().any(|e| {
            matches!(
                e.downcast_ref::<metash_host::HostError>(),
                Some(metash_host::HostError::ConsentRefused { .. })
            ) || matches!(
                e.downcast_ref::<metash_orchestrator::OrchestratorError>(),
                Some(metash_orchestrator::OrchestratorError::Host(
                    metash_host::HostError::ConsentRefused { .. }
                ))
            )
        });
        if refused {
            Self::ConsentRefused
        } else {
            Self::Failure
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}
