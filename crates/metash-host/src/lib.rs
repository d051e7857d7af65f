//! The host (seed 000): what an orchestrator calls to spawn sub-agents under limits, change state
//! atomically, report progress and pause for people.

mod error;
mod spawner;

pub use error::{HostError, Result};
pub use spawner::{SpawnRequest, Spawner};
