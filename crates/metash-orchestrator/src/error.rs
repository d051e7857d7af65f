//! The orchestrator's errors. An agent that fails, times out or asks a question is not an error:
//! the loop handles those as task outcomes. Errors are what stops the loop from doing its job at
//! all (a broken store, a git command that cannot run, a config that does not parse).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OrchestratorError {
    #[error(transparent)]
    Store(#[from] metash_store::StoreError),
    #[error(transparent)]
    Host(#[from] metash_host::HostError),
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    /// A git command failed; `args` are its arguments so the message can be re-run by hand.
    #[error("git {args} (in {dir}) failed: {message}")]
    Git {
        dir: PathBuf,
        args: String,
        message: String,
    },
    #[error("the plan is invalid: {0}")]
    InvalidPlan(String),
    #[error("unknown task `{0}`")]
    UnknownTask(String),
    #[error("another `metash run` holds the run lock ({0}); wait for it or stop it first")]
    Busy(String),
    #[error("{0}")]
    Refused(String),
    /// The repository's executable git configuration (filters, drivers, fsmonitor, hooks...)
    /// differs from what a person accepted (`.meta/git-trust.json`): no git command runs until
    /// a person accepts it (`metash git trust`).
    #[error("{}", crate::git::trust::change::refusal(.changes))]
    GitConfigChanged {
        changes: Vec<crate::git::trust::change::Change>,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = OrchestratorError> = std::result::Result<T, E>;

impl OrchestratorError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}
