//! The host (seed 000): what an orchestrator calls to spawn sub-agents under limits, change state
//! atomically, report progress and pause for people.

pub mod asks;
pub mod budget;
mod bus;
pub mod checkpoint;
pub mod config;
pub mod control;
mod error;
pub mod gitdirs;
mod host;
pub mod interactive;
mod journal;
pub mod oauth;
mod preflight;
pub mod pricing;
pub mod progress;
#[cfg(unix)]
mod race;
pub mod redaction;
pub mod sandbox;
pub mod serve;
pub mod session_liveness;
mod spawn;
mod spawner;

pub use error::{HostError, Result};
pub use host::{ConsentMode, Host, HostOptions};
pub use journal::JOURNAL_DOC;
pub use progress::Terminal;
pub use spawn::tape::cassette as tape_cassette;
pub use spawn::tape::{cassette_with as tape_cassette_with, Pins as ReplayPins};
pub use spawn::DEFAULT_TIMEOUT;
pub use spawner::{SpawnRequest, Spawner, WorkspaceAccess};
