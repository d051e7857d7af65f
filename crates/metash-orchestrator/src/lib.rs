//! `metash run`: the plan -> execute -> verify loop of seed 001, on top of the host (seed 000).
//!
//! The session's `status` moves `planning` -> `executing` -> `verifying` -> the next phase's
//! `planning`, or `halted`. The roles (planner, executor, verifier) are agents like any other,
//! named in `.meta/config.toml` `[orchestrator]` and spawned through the host. Tasks run in
//! dependency order, in parallel up to `jobs`, each in its own git worktree and branch; verified
//! branches are merged back in dependency order. Every transition is an `update_state`, so the
//! event log tells the story and a killed run continues where the state says. `docs/orchestrator.md`
//! has the whole design.

pub mod book;
pub mod config;
mod context_note;
pub mod cost;
mod engine;
mod error;
mod execute;
pub mod git;
mod merge;
pub mod plan;
mod planning;
pub mod prompts;
mod queue;
mod recorded;
mod remote;
pub mod reply;
mod resolve;
pub mod review;
mod rollback;
pub mod schedule;
pub mod settle;
pub mod status;
mod trust_gate;
pub mod turn;
mod verify;
/// Linux: a task's processes die with their worker (`PR_SET_PDEATHSIG`).
#[cfg(target_os = "linux")]
pub mod worker;

pub use book::{Book, Halt};
pub use config::OrchestratorConfig;
pub use engine::{
    branch_of, worktree_of, Orchestrator, RunOptions, RunOutcome, ORCHESTRATOR_AGENT,
};
pub use error::{OrchestratorError, Result};
pub use rollback::{RollbackPlan, RolledBack};
pub use status::{report, StatusReport, TaskRow};
pub use verify::{parse_verdict, Verdict};

/// Held by `metash run` and `metash rollback` for their whole duration, so two of them never work
/// on one project at once. A flock: a killed run never leaves it stale.
pub(crate) fn run_lock(store: &metash_store::Store) -> Result<metash_store::lock::LockGuard> {
    let path = store.meta_dir().join("run.lock");
    metash_store::lock::acquire(&path, engine_wait()).map_err(|e| match e {
        metash_store::StoreError::LockTimeout { .. } => {
            OrchestratorError::Busy(path.display().to_string())
        }
        other => OrchestratorError::Store(other),
    })
}

/// Long enough for a killed run's last git command (which holds the lock too) to finish.
fn engine_wait() -> std::time::Duration {
    std::time::Duration::from_secs(5)
}
