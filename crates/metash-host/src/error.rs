/// Errors of the host itself. An agent that fails, times out or asks for a checkpoint is not an
/// error: that is an `AgentResponse` with the matching status.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    #[error(
        "unknown agent `{name}`: not a registered agent nor a role in .meta/config.toml{hint}"
    )]
    UnknownAgent { name: String, hint: String },
    #[error("checkpoint `{id}` is waiting for an answer ({message}); answer it first: metash resume --answer VALUE --checkpoint {id}")]
    CheckpointPending { id: String, message: String },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Store(#[from] metash_store::StoreError),
    #[error(transparent)]
    Policy(#[from] metash_policy::PolicyError),
    #[error(transparent)]
    Runtime(#[from] metash_runtime::RuntimeError),
    #[error(transparent)]
    Harness(#[from] metash_harness::HarnessError),
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = HostError> = std::result::Result<T, E>;
