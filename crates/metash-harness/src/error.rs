//! The crate's error type. Every variant maps to one stable wire code
//! ([`HarnessErrorCode`]) so a control plane can branch on strings that never change.

use metash_protocol::{HarnessErrorCode, HarnessFrontend, ProviderDomain, RunError};

pub type Result<T, E = HarnessError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    #[error("provider_mismatch: a continuation of provider {continuation} cannot be used with {frontend} (provider {expected})", continuation = .continuation.as_str(), frontend = .frontend.as_str(), expected = .frontend.provider().as_str())]
    ProviderMismatch {
        continuation: ProviderDomain,
        frontend: HarnessFrontend,
    },
    #[error("continuation_not_found: {0}")]
    ContinuationNotFound(String),
    #[error("model_not_supported: {0}")]
    ModelNotSupported(String),
    #[error("unsupported_frontend: {0}")]
    UnsupportedFrontend(String),
    #[error("program_not_found: {0}")]
    ProgramNotFound(String),
    #[error("invalid_request: {0}")]
    InvalidRequest(String),
    #[error("api_error: {message}")]
    Api {
        status: Option<u16>,
        message: String,
    },
    #[error("harness_failed: {0}")]
    HarnessFailed(String),
    #[error("timeout: {0}")]
    Timeout(String),
    #[error("cancelled")]
    Cancelled,
    #[error("io: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl HarnessError {
    /// This error as a turn's `RunError` (a failure of the turn itself, reported in its result).
    pub fn run_error(&self) -> RunError {
        RunError {
            code: self.code(),
            message: self.to_string(),
            status: match self {
                Self::Api { status, .. } => *status,
                _ => None,
            },
        }
    }

    /// The stable wire code of this error.
    pub fn code(&self) -> HarnessErrorCode {
        match self {
            Self::ProviderMismatch { .. } => HarnessErrorCode::ProviderMismatch,
            Self::ContinuationNotFound(_) => HarnessErrorCode::ContinuationNotFound,
            Self::ModelNotSupported(_) => HarnessErrorCode::ModelNotSupported,
            Self::UnsupportedFrontend(_) => HarnessErrorCode::UnsupportedFrontend,
            Self::ProgramNotFound(_) => HarnessErrorCode::ProgramNotFound,
            Self::InvalidRequest(_) => HarnessErrorCode::InvalidRequest,
            Self::Api { .. } => HarnessErrorCode::ApiError,
            Self::HarnessFailed(_) => HarnessErrorCode::HarnessFailed,
            Self::Timeout(_) => HarnessErrorCode::Timeout,
            Self::Cancelled => HarnessErrorCode::Cancelled,
            Self::Io { .. } => HarnessErrorCode::Io,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}
