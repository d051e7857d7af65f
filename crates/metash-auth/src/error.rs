//! What can go wrong in the broker and the vault. Messages name the file, the provider or the
//! step, and never carry a secret.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// A configuration file or section that cannot be used: where, and why.
    #[error("{0}")]
    Config(String),
    #[error("no OAuth provider `{0}` (configure [oauth.providers.{0}] in .meta/config.toml, or use a preset: {1})")]
    UnknownProvider(String, String),
    /// No key for the vault: no OS keychain here and no passphrase given.
    #[error("{0}")]
    NoKey(String),
    /// The vault cannot be opened with the key given (wrong passphrase, another machine's key).
    #[error("the vault {path} cannot be opened with this key: {why}")]
    WrongKey { path: PathBuf, why: String },
    #[error("the vault {path} is damaged: {why} (it was not changed)")]
    Damaged { path: PathBuf, why: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The provider refused or failed a step of a flow.
    #[error("{provider}: {step}: {why}")]
    Flow {
        provider: String,
        step: &'static str,
        why: String,
    },
    /// Not logged in to the provider (or logged out since).
    #[error("not logged in to {0}: run `metash auth login {0}`")]
    NotLoggedIn(String),
    /// The refresh token no longer works: a person must log in again.
    #[error("the login to {0} has expired and could not be renewed: run `metash auth login {0}`")]
    LoginExpired(String),
    #[error(transparent)]
    Store(#[from] metash_store::StoreError),
}

pub type Result<T, E = AuthError> = std::result::Result<T, E>;

impl AuthError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn flow(provider: &str, step: &'static str, why: impl std::fmt::Display) -> Self {
        Self::Flow {
            provider: provider.to_string(),
            step,
            why: why.to_string(),
        }
    }
}
