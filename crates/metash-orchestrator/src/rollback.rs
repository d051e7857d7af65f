//! `metash rollback TASK`: undo a task's recorded commits. Merged work is reverted on the project's
//! branch with one `git revert` per commit, newest first (history is kept, nothing is rewritten);
//! work not merged yet is dropped with its worktree and branch. The tasks become `pending` again
//! and the session goes back to planning the earliest phase concerned, where the loop finds the
//! pending tasks and executes them again (a rollback is also how you ask for a redo).
//!
//! Tasks that depend on a rolled-back task are built on its work: they are rolled back with it
//! (dependents first), which the CLI confirms with the user first.

use std::path::Path;

use metash_protocol::{SessionStatus, TaskStatus};
use serde_json::json;

use crate::book::{self, Book, Entry};
use crate::engine::{branch_of, worktree_of, Orchestrator};
use crate::error::{OrchestratorError, Result};
use crate::git::Merge;
use crate::plan;

/// What rolling back a task involves.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RollbackPlan {
    pub task: String,
    /// Tasks depending on `task`, directly or not, that have work to undo.
    pub dependents: Vec<String>,
}

/// What a rollback did, per task.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RolledBack {
    pub task: String,
    /// Commits undone.
    pub commits: Vec<String>,
    /// The revert commits made on the project branch (empty for unmerged work).
    pub reverts: Vec<String>,
}

impl Orchestrator<'_> {
    /// The task and the dependents a rollback of it would undo too.
    ///
    /// # Errors
    /// Unknown task; store errors.
    pub fn rollback_plan(&self, task: &str) -> Result<RollbackPlan> {
        let state = self.store().state()?;
        let nodes = Self::nodes(&state);
        if !nodes.iter().any(|n| n.id == task) {
            return Err(OrchestratorError::UnknownTask(task.to_string()));
        }
        let tasks = state.tasks();
        let dependents = plan::dependents_of(&nodes, task)
            .into_iter()
            .filter(|d| {
                tasks.iter().any(|t| {
                    &t.id == d
                        && (t.status != TaskStatus::Pending
                            || t.commits.as_ref().is_some_and(|c| !c.is_empty()))
                })
            })
            .collect();
        Ok(RollbackPlan {
            task: task.to_string(),
            dependents,
        })
    }

    /// Reverts a merged task's work still in HEAD; the revert commits made. A task that landed
    /// through the merge queue with merges of its own (see [`Orchestrator::landing_to_revert`])
    /// has its landing merge reverted; any other, its recorded commits, newest first. A conflict
    /// aborts the revert and refuses, saying how many tasks were already rolled back.
    fn revert_commits(
        &self,
        root: &Path,
        id: &str,
        book: &Book,
        commits: &[String],
        done: usize,
    ) -> Result<Vec<String>> {
        let in_head = self.recorded_to_revert(root, id, commits)?;
        let landing = match self.landing_to_revert(root, id, book, &in_head)? {
            Some(landing) => {
                self.check_revert_of(root, id, &landing)?;
                Some(landing)
            }
            None => None,
        };
        let mut reverts = Vec::new();
        let undo: Vec<(&String, bool)> = match &landing {
            Some(landing) => vec![(landing, true)],
            None => in_head.iter().rev().map(|c| (c, false)).collect(),
        };
        for (sha, merge) in undo {
            let reverted = if merge {
                self.git.revert_merge(root, sha)?
            } else {
                self.git.revert(root, sha)?
            };
            match reverted {
                Merge::Clean => reverts.push(self.git.head(root)?),
                Merge::Conflict { files } => {
                    let _ = self.git.run(root, &["revert", "--abort"]);
                    return Err(OrchestratorError::Refused(format!(
                        "reverting {sha} of task {id} conflicts in {} (later work changed the same lines); \
                         the revert was aborted; {done} task(s) were rolled back before this one",
                        files.join(", ")
                    )));
                }
            }
        }
        Ok(reverts)
    }

    /// The merge that landed task `id` (`merged.<id>`), when its work is undone by reverting it
    /// against the checkout's side (`git revert -m 1`): a landing through the merge queue (the
    /// task's tip holds the `HEAD` it landed on, and is the branch's recorded tip) whose tip has
    /// merges of its own since that `HEAD`: the queue's update (with a resolution, perhaps) or a
    /// dependency's merge. Reverting the task's commits one by one would fight those merges (a
    /// resolution rewrote the lines the commits changed); the landing merge brought exactly the
    /// task's work, the resolution included, and nothing else. `None`: revert the commits.
    fn landing_to_revert(
        &self,
        root: &Path,
        id: &str,
        book: &Book,
        in_head: &[String],
    ) -> Result<Option<String>> {
        let Some(landed) = book.merged_at(id) else {
            return Ok(None);
        };
        if in_head.is_empty()
            || !crate::recorded::is_commit_id(landed)
            || self.git.resolve(root, landed)?.as_deref() != Some(landed)
            || !self.git.is_ancestor(root, landed, "HEAD")?
        {
            return Ok(None);
        }
        let parents = self.git.parents(root, landed)?;
        let [before, tip] = parents.as_slice() else {
            return Ok(None);
        };
        if book.branch(id).is_some_and(|r| r.last() != tip.as_str())
            || !self.git.is_ancestor(root, before, tip)?
        {
            return Ok(None);
        }
        for sha in in_head {
            if !self.git.is_ancestor(root, sha, tip)? {
                return Ok(None);
            }
        }
        let range = format!("{before}..{tip}");
        let merges = self
            .git
            .run(root, &["rev-list", "--merges", "-n", "1", &range])?;
        Ok((!merges.is_empty()).then(|| landed.to_string()))
    }

    /// What reverting `sha` of task `id` writes must pass the merge guard.
    fn check_revert_of(&self, root: &Path, id: &str, sha: &str) -> Result<()> {
        let refused = self.git.check_revert(root, sha)?;
        if !refused.is_empty() {
            return Err(crate::git::guard::refused(
                &format!("reverting {sha} of task {id} would write what metash never merges"),
                &refused,
            ));
        }
        Ok(())
    }

    /// Which of a task's recorded `commits` are in HEAD, checked before any is reverted: each must
    /// be a full commit id naming itself (never a ref, which something else could move), and
    /// what reverting it writes into the checkout must pass the merge guard (`git::guard`).
    fn recorded_to_revert(&self, root: &Path, id: &str, commits: &[String]) -> Result<Vec<String>> {
        let mut in_head = Vec::new();
        for sha in commits {
            if !crate::recorded::is_commit_id(sha)
                || self.git.resolve(root, sha)?.as_deref() != Some(sha.as_str())
            {
                return Err(OrchestratorError::Refused(format!(
                    "task {id}'s recorded commit {sha:?} is not a commit of this repository; \
                     nothing of the task was reverted"
                )));
            }
            if !self.git.is_ancestor(root, sha, "HEAD")? {
                continue;
            }
            self.check_revert_of(root, id, sha)?;
            in_head.push(sha.clone());
        }
        Ok(in_head)
    }

    /// Rolls back `plan.task` and, with `with_dependents`, its dependents.
    ///
    /// # Errors
    /// Dependents with work exist but `with_dependents` is false; a revert conflicts (it is
    /// aborted, nothing of that task is changed); another run holds the run lock; the
    /// repository's executable git configuration changed (nothing is changed; logged).
    pub fn rollback(&self, plan: &RollbackPlan, with_dependents: bool) -> Result<Vec<RolledBack>> {
        let done = self.rollback_trusted(plan, with_dependents);
        self.trust_logged(done)
    }

    fn rollback_trusted(
        &self,
        plan: &RollbackPlan,
        with_dependents: bool,
    ) -> Result<Vec<RolledBack>> {
        let run = crate::run_lock(self.store())?;
        let _handed = self.git.handing_down(&run);
        // Before any git command (a revert runs the repository's filters and merge drivers).
        self.check_git_trust()?;
        if !plan.dependents.is_empty() && !with_dependents {
            return Err(OrchestratorError::Refused(format!(
                "tasks {} depend on {}; roll them back too (--yes) or not at all",
                plan.dependents.join(", "),
                plan.task
            )));
        }
        let root = self.workspace();
        let state = self.store().state()?;
        let nodes = Self::nodes(&state);
        let mut ids: Vec<String> = vec![plan.task.clone()];
        ids.extend(plan.dependents.iter().cloned());
        // Dependents first: undo in reverse dependency order.
        let order: Vec<String> = plan::topo_order(&nodes)
            .into_iter()
            .rev()
            .filter(|id| ids.contains(id))
            .collect();
        let mut done = Vec::new();
        let mut min_phase = state.current_phase;
        for id in order {
            let state = self.store().state()?;
            let book = Book::of(&state);
            let commits: Vec<String> = state
                .task(&id)
                .and_then(|t| t.commits.clone())
                .unwrap_or_default();
            min_phase = min_phase.min(book.phase_of(&id, state.current_phase));
            let reverts = if book.merged_at(&id).is_some() {
                self.revert_commits(&root, &id, &book, &commits, done.len())?
            } else {
                Vec::new()
            };
            self.git
                .remove_worktree(&worktree_of(&root, &id), Some(&branch_of(&id)))?;
            self.update(vec![
                book::task_set(&id, "status", json!(TaskStatus::Pending)),
                book::task_set(&id, "commits", json!([])),
                book::set_for(Entry::Verified, &id, json!(false)),
                book::set_for(Entry::Merged, &id, book::null()),
                book::set_for(Entry::Findings, &id, book::null()),
                book::set_for(Entry::Errors, &id, book::null()),
                book::set_for(Entry::Attempts, &id, json!(0)),
                book::set_for(Entry::Running, &id, book::null()),
                // The branch is gone: a new one starts from a new recorded base.
                book::set_for(Entry::Branches, &id, book::null()),
                book::set_for(
                    Entry::RolledBack,
                    &id,
                    json!({"commits": commits, "reverts": reverts, "at": metash_store::log::now()}),
                ),
            ])?;
            done.push(RolledBack {
                task: id,
                commits,
                reverts,
            });
        }
        self.update(vec![
            ("status".into(), json!(SessionStatus::Planning)),
            ("currentPhase".into(), json!(min_phase)),
            ("gapCount".into(), json!(0)),
            book::set(Entry::Halt, book::null()),
        ])?;
        Ok(done)
    }
}
