//! The merge queue (issue 33): a phase's verified tasks land in the project's checkout one at a
//! time, in dependency order, and the checkout only ever moves from one clean state to the next.
//!
//! For each task:
//! 1. **up to date?** When the project's `HEAD` is already in the task's recorded tip, it lands.
//! 2. **updating**: `queue.<id> = {state: updating, head, main}` is recorded, then `HEAD` is
//!    brought into the task's branch *in the task's worktree* (`[orchestrator] update`: a merge
//!    commit, or a rebase). The new tip is recorded as the branch's (recorded.rs), with
//!    `verified = false` and `re-verifying` when the update changed the tree (and
//!    `reverify_after_update` holds), in one update.
//! 3. **resolving** (resolve.rs): an update that conflicts is left in progress in the worktree
//!    and the executor gets a resolution turn there; its result is committed by metash as the
//!    merge commit and re-verified. A failed resolution (markers left, an error, a failed
//!    verification) resets the worktree and tries again, up to `max_resolve_attempts`; then a
//!    person is asked, in the worktree.
//! 4. **re-verifying**: the verifier checks the updated tree; a failure after a clean update is a
//!    gap like any other (back to the executor with the findings).
//! 5. **landing**: the task's recorded tip, which now holds `HEAD`, is merged into the checkout:
//!    a merge that cannot conflict (its tree is the task's). The recorded-branch and tree checks
//!    (`recorded_tip`, `git::guard`) apply to it as to any merge (merge.rs).
//!
//! Crash safety: every step is recorded before it touches git, and what it touches is the task's
//! worktree, reset to the recorded `head` when a run died in `updating` or `resolving`.

use std::path::Path;

use metash_protocol::{LogLevel, SessionState};
use serde_json::json;

use crate::book::{self, Book, Entry, QueueEntry, QueueState};
use crate::config::UpdateMode;
use crate::engine::{branch_of, worktree_of, Orchestrator, RunOutcome, Step};
use crate::error::{OrchestratorError, Result};
use crate::git::Merge;
use crate::plan::TaskNode;
use crate::recorded::Untrusted;
use crate::verify::Checked;

/// How one task's turn in the queue ended.
pub(crate) enum Queued {
    Landed,
    Stop(Step),
}

/// What the queue does next with a task.
pub(crate) enum Next {
    Land,
    /// Look at the task's queue entry again (it changed).
    Again,
    Stop(Step),
}

impl Orchestrator<'_> {
    /// Every queued task of the phase without an entry is `waiting` (one update).
    pub(crate) fn enqueue(&self, ids: &[&str], book: &Book) -> Result<()> {
        let updates: Vec<(String, serde_json::Value)> = ids
            .iter()
            .filter(|id| {
                book.queued(id)
                    .is_none_or(|q| q.state == QueueState::Landed)
            })
            .map(|id| book::set_for(Entry::Queue, id, json!(entry(QueueState::Waiting))))
            .collect();
        if !updates.is_empty() {
            self.update(updates)?;
        }
        Ok(())
    }

    /// Takes task `node` through the queue until it lands or the run must stop.
    pub(crate) fn queue_task(&self, root: &Path, node: &TaskNode) -> Result<Queued> {
        let id = node.id.as_str();
        let bound = 16 + 4 * self.config.max_resolve_attempts;
        for _ in 0..bound {
            let state = self.store().state()?;
            let book = Book::of(&state);
            let entry = book
                .queued(id)
                .cloned()
                .unwrap_or_else(|| entry(QueueState::Waiting));
            if matches!(entry.state, QueueState::Waiting | QueueState::Unknown)
                && self.settle_update(id, &book, &entry)?
            {
                continue;
            }
            let next = match entry.state {
                QueueState::Reverifying => self.reverify(node, &state, entry)?,
                QueueState::WaitingOnPerson => self.after_person(node, &state, &book, entry)?,
                QueueState::Updating | QueueState::Resolving => {
                    // A run died mid-update or mid-resolution: back to where the task was.
                    let wt = worktree_of(root, id);
                    self.git.ensure_worktree(&wt, &branch_of(id), &entry.head)?;
                    self.git.reset_to(&wt, &entry.head)?;
                    self.bring_up_to_date(node, &state, &book, entry)?
                }
                _ => self.bring_up_to_date(node, &state, &book, entry)?,
            };
            match next {
                Next::Land => match self.land(root, node)? {
                    Landing::Landed => return Ok(Queued::Landed),
                    Landing::Again => {}
                    Landing::Stop(step) => return Ok(Queued::Stop(step)),
                },
                Next::Again => {}
                Next::Stop(step) => return Ok(Queued::Stop(step)),
            }
        }
        Err(OrchestratorError::Refused(format!(
            "task {id}: the merge queue made no progress in {bound} steps"
        )))
    }

    /// Step 2: brings the project's `HEAD` into task `node`'s branch in its worktree.
    fn bring_up_to_date(
        &self,
        node: &TaskNode,
        state: &SessionState,
        book: &Book,
        entry: QueueEntry,
    ) -> Result<Next> {
        let id = node.id.as_str();
        let root = self.workspace();
        let rev = match self.recorded_tip(id, book)? {
            Ok(Some(rev)) => rev,
            Ok(None) => return Ok(Next::Land),
            Err(Untrusted(why)) => {
                return Ok(Next::Stop(self.halt(self.refusal(state, id, why))?));
            }
        };
        // Holding `HEAD` already, or in it (a run killed after landing it): it lands, or is
        // recorded as landed.
        let (main, holds, landed) = self.git.head_against(&root, &rev)?;
        if holds || landed {
            return Ok(Next::Land);
        }
        let wt = worktree_of(&root, id);
        self.git.ensure_worktree(&wt, &branch_of(id), &rev)?;
        // What a verifier (or a killed update) left in the worktree is never part of the update.
        if self.git.dirty(&wt)? {
            self.git.reset_to(&wt, &rev)?;
        }
        let entry = QueueEntry {
            state: QueueState::Updating,
            head: rev.clone(),
            main: main.clone(),
            files: vec![],
            with: vec![],
            ..entry
        };
        self.show(id, QueueState::Updating);
        // A merge update killed before its record is recognised by its shape (`settle_update`); replayed
        // commits are not, so a rebase is recorded first.
        if self.config.update == UpdateMode::Rebase {
            self.update(vec![book::set_for(Entry::Queue, id, json!(entry))])?;
        }
        match self.update_worktree(id, &wt, &main)? {
            (Merge::Clean, rebased) => self.updated(node, state, book, &wt, entry, rebased),
            (Merge::Conflict { files }, _) => self.resolve_conflict(node, &wt, entry, files),
        }
    }

    /// Merges (or rebases onto) `main` in the worktree `wt` of task `id`; `true` when it rebased.
    /// A rebase that conflicts is aborted and the update made as a merge, which the executor
    /// resolves.
    fn update_worktree(&self, id: &str, wt: &Path, main: &str) -> Result<(Merge, bool)> {
        if self.config.update == UpdateMode::Rebase {
            if let Merge::Clean = self.git.rebase(wt, main)? {
                return Ok((Merge::Clean, true));
            }
        }
        let msg = format!("metash: update task {id} with {}", short(main));
        Ok((self.git.merge(wt, main, &msg)?, false))
    }

    /// A clean update: re-verified when it changed the tree, before anything is recorded (a run
    /// killed meanwhile leaves an update commit the next one recognises: `settle_update`); then
    /// its tip is recorded as the branch's (and, for a rebase, the replayed commits as the
    /// task's) with the verdict, in one update.
    fn updated(
        &self,
        node: &TaskNode,
        state: &SessionState,
        book: &Book,
        wt: &Path,
        entry: QueueEntry,
        rebased: bool,
    ) -> Result<Next> {
        let id = node.id.as_str();
        let root = self.workspace();
        let new = self.git.head(wt)?;
        let changed = self.git.tree_of(&root, &new)? != self.git.tree_of(&root, &entry.head)?;
        let mut updates = self.tip_updates(id, book, &new);
        if rebased {
            updates.extend(self.replayed(id, wt, &entry.main, &new)?);
        }
        let waiting = |state| QueueEntry {
            state,
            ..entry.clone()
        };
        if !(changed && self.config.reverify_after_update) {
            updates.push(book::set_for(
                Entry::Queue,
                id,
                json!(waiting(QueueState::Waiting)),
            ));
            self.update(updates)?;
            return Ok(Next::Land);
        }
        self.show(id, QueueState::Reverifying);
        let (verdict, review) = match self.verdict_of(id, state, book)? {
            Ok(v) => v,
            Err(checked) => {
                // A checkpoint: the next run asks the verifier again.
                updates.push(book::set_for(Entry::Verified, id, json!(false)));
                updates.push(book::set_for(
                    Entry::Queue,
                    id,
                    json!(waiting(QueueState::Reverifying)),
                ));
                self.update(updates)?;
                return Ok(match checked {
                    Checked::Checkpoint(p) => Next::Stop(Step::Stop(RunOutcome::Checkpoint(p))),
                    _ => Next::Again,
                });
            }
        };
        if !verdict.pass {
            // A gap: back to the executor, on the updated branch.
            updates.push(book::set_for(Entry::Queue, id, book::null()));
            self.update(updates)?;
            self.record_gap(id, state, verdict, &review)?;
            return Ok(Next::Stop(self.after_failure(state.current_phase)?));
        }
        updates.extend([
            book::set_for(Entry::Verified, id, json!(true)),
            book::set_for(Entry::Findings, id, book::null()),
            book::set_for(Entry::Queue, id, json!(waiting(QueueState::Waiting))),
        ]);
        self.update(updates)?;
        Ok(Next::Land)
    }

    /// The branch record of task `id` moved to `new`.
    pub(crate) fn tip_updates(
        &self,
        id: &str,
        book: &Book,
        new: &str,
    ) -> Vec<(String, serde_json::Value)> {
        book.branch(id)
            .map(|r| book::set_for(Entry::Branches, id, json!(r.moved_to(new))))
            .into_iter()
            .collect()
    }

    /// After a rebase: the task's commits are the replayed ones (what a rollback reverts).
    fn replayed(
        &self,
        id: &str,
        wt: &Path,
        main: &str,
        new: &str,
    ) -> Result<Vec<(String, serde_json::Value)>> {
        let subject = format!("metash: task {id}:");
        let listed = self.git.run(
            wt,
            &[
                "log",
                "--reverse",
                "--no-merges",
                "--format=%H %s",
                &format!("{main}..{new}"),
            ],
        )?;
        let commits: Vec<&str> = listed
            .lines()
            .filter(|l| {
                l.split_once(' ')
                    .is_some_and(|(_, s)| s.starts_with(&subject))
            })
            .filter_map(|l| l.split(' ').next())
            .collect();
        if commits.is_empty() {
            return Ok(vec![]);
        }
        Ok(vec![book::task_set(id, "commits", json!(commits))])
    }

    /// Step 4: the verifier checks task `node` again. After a resolution a failure is a failed
    /// resolution; after a clean update, a gap.
    fn reverify(&self, node: &TaskNode, state: &SessionState, entry: QueueEntry) -> Result<Next> {
        let id = node.id.as_str();
        let book = Book::of(state);
        if book.is_verified(id) {
            return Ok(Next::Land);
        }
        self.show(id, QueueState::Reverifying);
        self.progress(
            &format!("task {id}: re-verifying after the update"),
            LogLevel::Info,
        );
        let (verdict, review) = match self.verdict_of(id, state, &book)? {
            Ok(v) => v,
            Err(Checked::Checkpoint(p)) => {
                return Ok(Next::Stop(Step::Stop(RunOutcome::Checkpoint(p))))
            }
            Err(_) => return Ok(Next::Again),
        };
        if verdict.pass {
            self.record_pass(id)?;
            return Ok(Next::Land);
        }
        if entry.files.is_empty() {
            self.update(vec![book::set_for(Entry::Queue, id, book::null())])?;
            self.record_gap(id, state, verdict, &review)?;
            return Ok(Next::Stop(self.after_failure(state.current_phase)?));
        }
        let wt = worktree_of(&self.workspace(), id);
        self.resolution_failed(id, &wt, entry, verdict.findings)
    }

    /// Step 5: merges the task's recorded tip into the checkout, which it holds (else it is
    /// brought up to date again). The run stops on a refusal or a person's local changes.
    fn land(&self, root: &Path, node: &TaskNode) -> Result<Landing> {
        let id = node.id.as_str();
        let state = self.store().state()?;
        let book = Book::of(&state);
        if let Ok(Some(rev)) = self.recorded_tip(id, &book)? {
            let (_, holds, landed) = self.git.head_against(root, &rev)?;
            if !holds && !landed {
                // `HEAD` moved since the update (a person's commit): update again.
                let waiting = entry(QueueState::Waiting);
                self.update(vec![book::set_for(Entry::Queue, id, json!(waiting))])?;
                return Ok(Landing::Again);
            }
        }
        if let Some(step) = self.merge_task(root, node, &state, &book)? {
            return Ok(Landing::Stop(step));
        }
        let head = self.git.head(root)?;
        self.update(vec![
            book::set_for(Entry::Merged, id, json!(head)),
            book::set_for(Entry::Queue, id, json!(entry(QueueState::Landed))),
            book::set(Entry::ResumeFor, book::null()),
        ])?;
        self.show(id, QueueState::Landed);
        self.progress(&format!("task {id}: landed"), LogLevel::Info);
        Ok(Landing::Landed)
    }
}

/// How landing a task ended.
enum Landing {
    Landed,
    /// `HEAD` moved since the update (a person's commit): the task is brought up to date again.
    Again,
    Stop(Step),
}

/// A fresh queue entry in `state`.
pub(crate) fn entry(state: QueueState) -> QueueEntry {
    QueueEntry {
        state,
        head: String::new(),
        main: String::new(),
        attempts: 0,
        files: vec![],
        with: vec![],
        why: vec![],
    }
}

/// A commit id shortened for a progress line.
pub(crate) fn short(sha: &str) -> &str {
    &sha[..sha.len().min(10)]
}
