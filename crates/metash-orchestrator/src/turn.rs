//! A task given rather than planned: how an editor's prompt becomes one task (`metash acp`'s
//! `turn` mode, docs/acp.md). [`add_turn`] puts a task into the session's current phase, so the
//! next `metash run --max-phases 1` executes, verifies and merges it through the loop's own path
//! (the planner is asked only for a phase without tasks: this one has one). [`withdraw_turn`]
//! takes such a task out again when its turn did not land (the verifier rejected it past the
//! retries, or the editor cancelled it), so the next prompt does not inherit a failed task.
//!
//! Both hold the run lock, as a run does: they never change the session under a running loop.

use metash_protocol::{LogKind, SessionState, SessionStatus, TaskStatus};
use metash_store::Store;
use serde_json::{json, Value};

use crate::book::{self, Book, Entry, HaltReason};
use crate::engine::{branch_of, worktree_of, Orchestrator, ORCHESTRATOR_AGENT};
use crate::error::{OrchestratorError, Result};
use crate::git::Git;
use crate::plan::{self, PlannedTask};

/// The prefix of a turn's task id (`turn-1`, `turn-2`, …).
pub const TURN_PREFIX: &str = "turn-";

/// The task a turn added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnTask {
    pub id: String,
    pub phase: u32,
}

/// Adds a task titled `title` (the editor's prompt) to the session's current phase, pending, and
/// moves the session to executing. A session halted because the project was complete takes the
/// task as more work; one halted for another reason stays halted (`metash run --retry` takes both
/// up). Unfinished tasks already in the phase stay: the same run lands them too.
///
/// # Errors
/// A checkpoint is pending (its answer belongs to the agent that asked, not to this task); an
/// empty title; another run holds the run lock; store errors.
pub fn add_turn(store: &Store, title: &str) -> Result<TurnTask> {
    let _run = crate::run_lock(store)?;
    let state = store.state()?;
    if let Some(p) = &state.pending_checkpoint {
        return Err(OrchestratorError::Refused(format!(
            "checkpoint `{}` from {} waits for an answer ({}): answer it first (run mode, or \
             `metash run --answer VALUE`)",
            p.id, p.agent, p.signal.message
        )));
    }
    let id = next_id(&state);
    let phase = state.current_phase;
    let nodes = Orchestrator::nodes(&state);
    let new = PlannedTask {
        id: id.clone(),
        title: title.to_string(),
        dependencies: vec![],
        phase: Some(phase),
        expects_change: Some(true),
        labels: vec![],
        paths: vec![],
    };
    let all = plan::validate(&nodes, std::slice::from_ref(&new), phase)
        .map_err(OrchestratorError::InvalidPlan)?;
    let node = &all[nodes.len()];
    let mut tasks: Vec<Value> = state.tasks().iter().map(|t| json!(t)).collect();
    tasks.push(
        json!({"id": node.id, "title": node.title, "status": "pending",
                      "dependencies": [], "commits": []}),
    );
    let idx = state.plan.as_ref().map_or(0, |p| p.current_task_idx);
    let mut updates = vec![
        (
            "plan".to_string(),
            json!({"tasks": tasks, "currentTaskIdx": idx}),
        ),
        book::set_for(Entry::Phases, &id, json!(phase)),
        book::set(Entry::PlanAttempts, json!(0)),
        book::set(Entry::LastRejection, book::null()),
    ];
    let halt = Book::of(&state).halt;
    let complete = halt
        .as_ref()
        .is_some_and(|h| h.reason == HaltReason::Complete);
    if state.status != SessionStatus::Halted || complete {
        updates.push(("status".into(), json!(SessionStatus::Executing)));
        updates.push(book::set(Entry::Halt, book::null()));
    }
    store.update_many(Some(ORCHESTRATOR_AGENT), updates, None)?;
    progress(
        store,
        &format!("phase {phase}: task {id} given by the editor"),
    );
    Ok(TurnTask { id, phase })
}

/// `turn-N` for the first N above every turn task's number so far.
fn next_id(state: &SessionState) -> String {
    let last = state
        .tasks()
        .iter()
        .filter_map(|t| t.id.strip_prefix(TURN_PREFIX)?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    format!("{TURN_PREFIX}{}", last + 1)
}

/// Takes the turn's task `id` out of the session when it did not land: its worktree and branch
/// are removed, it leaves the plan and the book, and a halt that named only this task is lifted
/// (the session goes back to planning its phase, which finds what is left). Returns `false`, and
/// changes nothing, when the task is gone already, has landed or entered the merge queue (the next
/// run finishes landing it), has dependents, or a checkpoint waits for its answer.
///
/// # Errors
/// Another run holds the run lock; git or store errors.
pub fn withdraw_turn(store: &Store, id: &str) -> Result<bool> {
    let run = crate::run_lock(store)?;
    let state = store.state()?;
    let book = Book::of(&state);
    let Some(task) = state.task(id) else {
        return Ok(false);
    };
    let depended = state
        .tasks()
        .iter()
        .any(|t| t.dependencies.iter().any(|d| d == id));
    let asking = state.pending_checkpoint.is_some()
        && book.resume_for.as_ref().and_then(|r| r.task.as_deref()) == Some(id);
    let landed = book.merged_at(id).is_some()
        || book.queued(id).is_some()
        || (task.status == TaskStatus::Complete && book.is_verified(id));
    if depended || asking || landed {
        return Ok(false);
    }
    let git = Git::new(store.workspace());
    let _handed = git.handing_down(&run);
    git.check_trust()?;
    git.remove_worktree(&worktree_of(store.workspace(), id), Some(&branch_of(id)))?;
    let tasks: Vec<Value> = state
        .tasks()
        .iter()
        .filter(|t| t.id != id)
        .map(|t| json!(t))
        .collect();
    // The current task's index in the plan without this task (never past its end).
    let at = state.tasks().iter().position(|t| t.id == id).unwrap_or(0);
    let idx = state
        .plan
        .as_ref()
        .map_or(0, |p| p.current_task_idx as usize);
    let idx = if at < idx { idx - 1 } else { idx }.min(tasks.len());
    let mut updates = vec![(
        "plan".to_string(),
        json!({"tasks": tasks, "currentTaskIdx": idx}),
    )];
    for (entry, empty) in per_task() {
        updates.push(book::set_for(entry, id, empty));
    }
    let only_this = book
        .halt
        .as_ref()
        .is_some_and(|h| !h.failed.is_empty() && h.failed.iter().all(|f| f.id == id));
    if state.status != SessionStatus::Halted || only_this {
        updates.push(("status".into(), json!(SessionStatus::Planning)));
        updates.push(("gapCount".into(), json!(0)));
        updates.push(book::set(Entry::Halt, book::null()));
    }
    if book.resume_for.as_ref().and_then(|r| r.task.as_deref()) == Some(id) {
        updates.push(book::set(Entry::ResumeFor, book::null()));
    }
    store.update_many(Some(ORCHESTRATOR_AGENT), updates, None)?;
    progress(
        store,
        &format!("task {id} did not land: withdrawn (its worktree and branch removed)"),
    );
    Ok(true)
}

/// The book's entries kept per task, each with its "absent" value: `null` where the book reads
/// an option, else the value a new task starts with (a later turn may get the same id).
fn per_task() -> [(Entry, Value); 13] {
    let null = book::null;
    [
        (Entry::Phases, json!(0)),
        (Entry::Running, null()),
        (Entry::Findings, null()),
        (Entry::Errors, null()),
        (Entry::Summaries, null()),
        (Entry::Merged, null()),
        (Entry::Branches, null()),
        (Entry::Queue, null()),
        (Entry::NoChange, json!(false)),
        (Entry::Attempts, json!(0)),
        (Entry::Verified, json!(false)),
        (Entry::Labels, json!([])),
        (Entry::Paths, json!([])),
    ]
}

/// A progress line in the log (what `metash ui` and the editor show).
fn progress(store: &Store, message: &str) {
    let _ = store.append(
        LogKind::Progress,
        Some(ORCHESTRATOR_AGENT),
        json!({"message": message, "level": "info"}),
    );
}
