//! The runtime's error type. Every variant names what was refused and why, because the host shows
//! these messages to people deciding whether to grant more.

use crate::lifecycle::IllegalTransition;

/// Everything the runtime can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    IllegalTransition(#[from] IllegalTransition),
    #[error("unsupported schema_version {found:?} (this runtime speaks {supported})")]
    UnsupportedVersion { found: String, supported: String },
    #[error("malformed protocol message: {0}")]
    Protocol(String),
    #[error("native execution is not allowed for agent {0}: the user has not consented to running it outside the WASM sandbox")]
    NativeNotAllowed(String),
    #[error("sandbox could not be applied, agent not started (fail-closed): {0}")]
    SandboxSetup(String),
    /// A grant could not be taken back from an agent that runs (it may still use it).
    #[error("withdrawing the grant from the running agent failed (it may still use it): {0}")]
    Withdrawal(String),
    #[error("invalid resource quantity {value:?} for {field}: {reason}")]
    BadQuantity {
        field: &'static str,
        value: String,
        reason: String,
    },
    #[error("wasm error: {0}")]
    Wasm(String),
    #[error("agent {0} is not running")]
    NotRunning(String),
    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

/// The runtime's `Result`.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

impl RuntimeError {
    /// A stable snake_case code for the wire (`error.code`) and the log.
    pub fn code(&self) -> &'static str {
        match self {
            Self::IllegalTransition { .. } => "illegal_transition",
            Self::UnsupportedVersion { .. } => "unsupported_version",
            Self::Protocol(_) => "protocol_error",
            Self::NativeNotAllowed(_) => "native_not_allowed",
            Self::SandboxSetup(_) => "sandbox_setup_failed",
            Self::Withdrawal(_) => "withdrawal_failed",
            Self::BadQuantity { .. } => "bad_quantity",
            Self::Wasm(_) => "wasm_error",
            Self::NotRunning(_) => "not_running",
            Self::Io { .. } => "io_error",
        }
    }
}

/// Wrap an `io::Error` with what we were doing.
pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let context = context.into();
    move |source| RuntimeError::Io { context, source }
}
