//! The policy layer's errors. Messages reach people unchanged through the CLI, so each one says
//! which file or agent it concerns and what to do.

use std::path::PathBuf;

use crate::manifest::Diagnostics;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A manifest that does not parse or validate; every diagnostic has file, line, column and field.
    #[error("{0}")]
    Manifest(#[from] Diagnostics),
    #[error("invalid capability `{capability}`: {reason}")]
    InvalidCapability { capability: String, reason: String },
    #[error("no agent `{0}` is registered (see `metash agents list`)")]
    UnknownAgent(String),
    /// `declared_in`: the manifest's `capabilities`, or the config role.
    #[error(
        "agent `{agent}` does not declare capability `{capability}`; add it to {declared_in} first"
    )]
    Undeclared {
        agent: String,
        capability: String,
        declared_in: String,
    },
    #[error("{path}: {message}")]
    PolicyFile { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] metash_store::StoreError),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = PolicyError> = std::result::Result<T, E>;

impl PolicyError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
