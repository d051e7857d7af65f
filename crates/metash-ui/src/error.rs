//! The UI's errors: what stops it from serving (the address is taken, the project cannot be read),
//! and what a request could not do, shown to the user as a page.

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UiError {
    #[error(transparent)]
    Store(#[from] metash_store::StoreError),
    #[error(transparent)]
    Host(#[from] metash_host::HostError),
    #[error(transparent)]
    Policy(#[from] metash_policy::PolicyError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Refused(String),
}

pub type Result<T, E = UiError> = std::result::Result<T, E>;

impl UiError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}
