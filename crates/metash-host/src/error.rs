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
    /// A spawn that needs a consent nobody gave (refused non-interactively, denied by a person,
    /// revoked): nothing changes by trying again, so a caller stops instead of retrying. The
    /// message names the agent, the capability and the commands that grant it.
    #[error("{message}")]
    ConsentRefused {
        agent: String,
        capability: String,
        /// The command that grants it for a while (`metash consent grant …`).
        grant_command: String,
        message: String,
    },
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

impl HostError {
    /// The refusal of `capability` to `agent`: `what` is refused (`native execution of ...`)
    /// because `why` (the policy's words).
    pub(crate) fn consent_refused(agent: &str, capability: &str, what: &str, why: &str) -> Self {
        let grant_command =
            format!("metash consent grant {agent} {capability} --sensitive --duration-s 86400");
        Self::ConsentRefused {
            message: format!(
                "{what} is not allowed: {why}. Nothing changes by trying again: allow it for this \
                 run with `metash run --yes-to {capability}` (every command that runs agents takes \
                 `--yes-to`), or for a day with `{grant_command}`"
            ),
            agent: agent.to_string(),
            capability: capability.to_string(),
            grant_command,
        }
    }
}
