use std::path::PathBuf;

/// Everything the store can refuse or fail at. Each variant says which file and what to do, because
/// these messages reach people unchanged through the CLI.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no metash project at {0} (run `metash init` there first)")]
    NotInitialized(PathBuf),
    #[error("{0} already holds a metash project")]
    AlreadyInitialized(PathBuf),
    #[error("{path} changed behind metash's back (expected sha256 {expected}, found {found}); agents and runs read it as recorded: restore it, and make changes with `metash context edit` or `metash context set FILE` (recorded in the log); nothing was changed")]
    ContextChanged {
        path: PathBuf,
        expected: String,
        found: String,
    },
    #[error("{path}:{line}:{column}: {message}; the file was left untouched (run `metash state rebuild` to recreate it from the event log)")]
    BadSessionFile {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}:{line}: {message}")]
    BadFile {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("timed out after {waited_ms} ms waiting for the store lock {path}{holder}")]
    LockTimeout {
        path: PathBuf,
        waited_ms: u64,
        /// ` (held by pid N)` when the holder wrote its pid.
        holder: String,
    },
    #[error("stale write refused: it was computed from revision {expected} but the state is at revision {found} (another writer got there first)")]
    Fenced { expected: u64, found: u64 },
    #[error("unknown key path `{key}`: {reason}")]
    UnknownKey { key: String, reason: String },
    #[error("invalid value for `{key}`: {reason}")]
    InvalidValue { key: String, reason: String },
    #[error("invalid name `{name}`: {reason}")]
    InvalidName { name: String, reason: String },
    #[error(
        "{path}: {what} has schema_version {found}, newer than this build reads ({supported}); \
         upgrade metash to read it (nothing was changed)"
    )]
    NewerVersion {
        path: PathBuf,
        what: String,
        found: String,
        supported: String,
    },
    #[error("event log {path} is broken at seq {seq}: {reason}")]
    BrokenLog {
        path: PathBuf,
        seq: u64,
        reason: String,
    },
    #[error("disk full while writing {path}; nothing was changed")]
    DiskFull { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Rejected(String),
    /// Something else holds what this needs (a run, for a context change).
    #[error("busy: {0}")]
    Busy(String),
    /// The PostgreSQL backend's server refused or failed (its message and SQLSTATE).
    #[error("PostgreSQL: {0}")]
    Database(String),
    /// The store's configuration (`[store]`) is not usable as written.
    #[error("{0}")]
    Config(String),
    /// A task's lease is no longer the caller's: its completion or heartbeat was refused.
    #[error("lease lost: {0}")]
    LeaseLost(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// Wraps an I/O error with the path it concerns, singling out a full disk.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::StorageFull {
            return Self::DiskFull { path };
        }
        Self::Io { path, source }
    }
}

/// Adds the path to an `io::Result`.
pub(crate) trait IoContext<T> {
    fn at(self, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| StoreError::io(path, e))
    }
}
