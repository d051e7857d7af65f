//! What the pages show, read from the project at request time: the session (status, phase,
//! gapCount, plan), the pending checkpoint, the budget, the grants and the ledger. Reading only:
//! every change the UI makes goes through the same functions the CLI calls (`actions`).

use std::path::{Path, PathBuf};

use metash_host::budget::BudgetUsed;
use metash_host::config::{Budget, HostConfig};
use metash_policy::consent::{self, Grant};
use metash_protocol::{PendingCheckpoint, SessionState, Task};
use metash_store::Store;

use crate::error::Result;

/// One task of the plan, with where its work is.
#[derive(Debug, Clone)]
pub struct TaskRow {
    pub task: Task,
    /// `.meta/worktrees/<id>` when it exists.
    pub worktree: Option<PathBuf>,
    /// Review comments not yet handed to its agent.
    pub comments_waiting: usize,
    /// Who works on it now: the executor's name and the attempt, while an attempt runs.
    pub agent: Option<String>,
}

/// What an agent's manifest says about how to show it (`ui.hints`: `streaming`, `diff`,
/// `preview`, …).
#[derive(Debug, Clone)]
pub struct AgentHints {
    pub agent: String,
    pub hints: Vec<String>,
}

/// The run view's data.
#[derive(Debug, Clone)]
pub struct Run {
    pub root: PathBuf,
    pub state: SessionState,
    pub tasks: Vec<TaskRow>,
    pub checkpoint: Option<PendingCheckpoint>,
    pub used: BudgetUsed,
    pub budget: Budget,
    /// Agents' questions waiting for any client (`[host] consent_wait_seconds`).
    pub asks: Vec<metash_host::asks::Ask>,
    pub hints: Vec<AgentHints>,
}

/// A grant as the ledger view shows it.
#[derive(Debug, Clone)]
pub struct GrantRow {
    pub grant: Grant,
    pub live: bool,
}

impl Run {
    /// Reads the project at `root`.
    ///
    /// # Errors
    /// The store cannot be read (the error names the file).
    pub fn read(store: &Store, root: &Path) -> Result<Self> {
        let state = store.state()?;
        let book = metash_orchestrator::Book::of(&state);
        // A config that does not parse names no agent: `metash run` reports it where it matters.
        let roles = metash_orchestrator::OrchestratorConfig::load(root).ok();
        // One read of the review document for the whole plan.
        let waiting = metash_orchestrator::review::waiting_by_task(store).unwrap_or_default();
        let tasks = state
            .tasks()
            .iter()
            .map(|t| {
                let wt = root.join(".meta").join("worktrees").join(&t.id);
                TaskRow {
                    task: t.clone(),
                    worktree: wt.is_dir().then_some(wt),
                    comments_waiting: waiting.get(&t.id).copied().unwrap_or(0),
                    agent: book.running.get(&t.id).and_then(|r| r.as_ref()).map(|r| {
                        let who = roles.as_ref().map_or("executor", |c| c.executor.as_str());
                        format!("{who} (attempt {})", r.attempt)
                    }),
                }
            })
            .collect();
        let registry =
            metash_policy::Registry::discover(&metash_policy::AgentDirs::new(root, None));
        let hints = registry
            .agents()
            .map(|a| AgentHints {
                agent: a.id.clone(),
                hints: a.manifest.ui.hints.clone(),
            })
            .collect();
        // A config that does not parse shows no budget rather than no page: `metash run` reports
        // it where it matters.
        let budget = HostConfig::load(root).map(|c| c.budget).unwrap_or_default();
        Ok(Self {
            root: root.to_path_buf(),
            checkpoint: state.pending_checkpoint.clone(),
            tasks,
            state,
            used: metash_host::budget::used(store)?,
            budget,
            asks: metash_host::asks::pending(store)?,
            hints,
        })
    }

    /// Whether the run waits on a person (the page title and the notification say so).
    pub fn needs_you(&self) -> bool {
        self.checkpoint.is_some() || !self.asks.is_empty()
    }
}

/// Every grant, live ones first.
///
/// # Errors
/// `consent.json` cannot be read.
pub fn grants(store: &Store) -> Result<Vec<GrantRow>> {
    let now = store.now();
    let mut rows: Vec<GrantRow> = consent::load(store)?
        .grants
        .into_iter()
        .map(|g| GrantRow {
            live: g.active_at(now),
            grant: g,
        })
        .collect();
    rows.sort_by_key(|r| !r.live);
    Ok(rows)
}
