//! The merge queue (issue 33): a phase's verified tasks land in the project's checkout one at a
//! time, in dependency order, and the checkout only ever moves from one clean state to the next.
//!
//! For each task:
//! 1. **up to date?** When the project's `HEAD` is already in the task's recorded tip, it lands.
//! 2. **updating**, the clean path (`through_queue`, `git/land.rs`): the commit that lands the
//!    task is made on `HEAD`, away from the task's worktree: a merge of its recorded tip made in
//!    memory (`[orchestrator] update = "merge"`), or its commits replayed on `HEAD` and that
//!    merge made of them (`"rebase"`; the replayed commits become the task's, recorded before
//!    they land). Neither the task's branch nor its worktree is written (bringing the worktree up
//!    to date wrote there every file that landed since the task branched: most of the queue's
//!    cost per task).
//! 3. **resolving** (resolve.rs): only an update that conflicts is made in the task's worktree
//!    (`bring_up_to_date`): left in progress there, and the executor gets a resolution turn;
//!    its result is committed by metash as the merge commit and re-verified. A failed resolution
//!    (markers left, an error, a failed verification) resets the worktree and tries again, up to
//!    `max_resolve_attempts`; then a person is asked, in the worktree.
//! 4. **re-verifying**: when the commit of step 2 has another tree than the task's tip (and
//!    `reverify_after_update` holds), the verifier checks it in the queue's worktree
//!    (`queue_worktree`, metash's own, showing exactly that commit). A failure is a gap like any
//!    other: the task's branch is then brought up to date in its worktree, and it goes back to
//!    the executor with the findings.
//! 5. **landing**: the checkout is fast-forwarded to the commit of step 2, or a tip that holds
//!    `HEAD` is merged into it: neither can conflict. The recorded-branch and tree checks
//!    (`recorded_tip`, `git::guard`) apply to it as to any merge (merge.rs).
//!
//! Crash safety: nothing reaches the checkout before it lands; the commit of step 2 is made again
//! by the next run (the queue's worktree holds nothing that cannot be remade); what a conflict
//! touches is the task's worktree, reset to the recorded `head` when a run died in `updating` or
//! `resolving`.

use std::path::{Path, PathBuf};

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
    /// Land the task's recorded tip, which holds `HEAD` (or is in it).
    Land,
    /// It landed (the queue's clean path: `through_queue`).
    Landed,
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
                    self.through_queue(node, &state, &book, entry)?
                }
                _ => self.through_queue(node, &state, &book, entry)?,
            };
            match next {
                Next::Land => match self.land(root, node)? {
                    Landing::Landed => return Ok(Queued::Landed),
                    Landing::Again => {}
                    Landing::Stop(step) => return Ok(Queued::Stop(step)),
                },
                Next::Landed => return Ok(Queued::Landed),
                Next::Again => {}
                Next::Stop(step) => return Ok(Queued::Stop(step)),
            }
        }
        Err(OrchestratorError::Refused(format!(
            "task {id}: the merge queue made no progress in {bound} steps"
        )))
    }

    /// Steps 2 to 5 away from the task's worktree: the commit that lands task `node` is made on
    /// `HEAD` (a merge of its recorded tip, or its commits replayed there), checked by the
    /// verifier in the queue's worktree when it differs from the task's own tree, and the
    /// checkout is fast-forwarded to it. A conflict goes to `bring_up_to_date` (the task's
    /// worktree, its executor); a tip that already holds `HEAD` lands as it is.
    fn through_queue(
        &self,
        node: &TaskNode,
        state: &SessionState,
        book: &Book,
        entry: QueueEntry,
    ) -> Result<Next> {
        let id = node.id.as_str();
        let root = self.workspace();
        let (rev, main) = match self.tip_to_update(id, state, book)? {
            Ok(both) => both,
            Err(next) => return Ok(next),
        };
        // Nothing of a refused task is merged, shown to a verifier or landed.
        if let Some(step) = self.refused_tree(&root, id, state, &rev)? {
            return Ok(Next::Stop(step));
        }
        self.show(id, QueueState::Updating);
        let queue = queue_worktree(&root);
        let at = (queue.as_path(), QUEUE_BRANCH);
        let msg = landing_message(node);
        let (landing, replayed) = match self.config.update {
            UpdateMode::Merge => (self.git.merge_onto(at, &main, &rev, &msg)?, None),
            UpdateMode::Rebase => match self.git.replay_onto(at, &main, &rev)? {
                // Every change of the task is in `HEAD` already: its branch is put there, and
                // it is recorded as landed.
                Some(r) if r == main => {
                    self.adopt_replayed(id, book, &entry, (&rev, &main), &r)?;
                    return Ok(Next::Land);
                }
                Some(r) => (Some(self.git.landing_commit(&main, &r, &msg)?), Some(r)),
                None => (None, None),
            },
        };
        let Some(landing) = landing else {
            return self.bring_up_to_date(node, state, book, entry);
        };
        let changed = self.git.tree_of(&root, &landing)? != self.git.tree_of(&root, &rev)?;
        if changed && self.config.reverify_after_update {
            let onto = Onto {
                rev: &rev,
                main: &main,
                landing: &landing,
            };
            if let Some(next) = self.reverify_in_queue(node, state, book, &entry, &onto)? {
                return Ok(next);
            }
        }
        if let Some(r) = replayed {
            self.adopt_replayed(id, book, &entry, (&rev, &main), &r)?;
        }
        Ok(match self.land_onto(&root, node, &main, &landing)? {
            Landing::Landed => Next::Landed,
            Landing::Again => Next::Again,
            Landing::Stop(step) => Next::Stop(step),
        })
    }

    /// The verifier checks the commit about to land, in the queue's worktree. `None`: it passed.
    /// A failure is a gap as after an update in the task's worktree: the task's branch is
    /// brought up to date there, and it goes back to its executor with the findings. A
    /// checkpoint stops the run; the next one makes the commit again and asks again.
    fn reverify_in_queue(
        &self,
        node: &TaskNode,
        state: &SessionState,
        book: &Book,
        entry: &QueueEntry,
        onto: &Onto<'_>,
    ) -> Result<Option<Next>> {
        let id = node.id.as_str();
        let queue = queue_worktree(&self.workspace());
        self.git.show_in_queue(&queue, QUEUE_BRANCH, onto.landing)?;
        self.show(id, QueueState::Reverifying);
        let (verdict, review) = match self.verdict_of(id, state, book, Some(&queue))? {
            Ok(v) => v,
            Err(Checked::Checkpoint(p)) => {
                return Ok(Some(Next::Stop(Step::Stop(RunOutcome::Checkpoint(p)))))
            }
            Err(_) => return Ok(Some(Next::Again)),
        };
        if verdict.pass {
            return Ok(None);
        }
        let mut updates = self.update_for_gap(id, book, entry, onto)?;
        updates.push(book::set_for(Entry::Queue, id, book::null()));
        self.update(updates)?;
        self.record_gap(id, state, verdict, &review)?;
        Ok(Some(Next::Stop(self.after_failure(state.current_phase)?)))
    }

    /// Before a gap after a clean update: task `id`'s branch brought up to date in its worktree
    /// (as the executor then works on it), and the records that moves. An update that conflicts
    /// there after all is undone (the executor works on its tip).
    fn update_for_gap(
        &self,
        id: &str,
        book: &Book,
        entry: &QueueEntry,
        onto: &Onto<'_>,
    ) -> Result<Vec<(String, serde_json::Value)>> {
        let wt = worktree_of(&self.workspace(), id);
        self.git.ensure_worktree(&wt, &branch_of(id), onto.rev)?;
        if self.git.dirty(&wt)? {
            self.git.reset_to(&wt, onto.rev)?;
        }
        if self.config.update == UpdateMode::Rebase {
            let updating = updating_entry(entry, onto.rev, onto.main);
            self.update(vec![book::set_for(Entry::Queue, id, json!(updating))])?;
        }
        match self.update_worktree(id, &wt, onto.main)? {
            (Merge::Clean, rebased) => {
                let new = self.git.head(&wt)?;
                let mut updates = self.tip_updates(id, book, &new);
                if rebased {
                    updates.extend(self.replayed(id, &wt, onto.main, &new)?);
                }
                Ok(updates)
            }
            (Merge::Conflict { .. }, _) => {
                self.git.reset_to(&wt, onto.rev)?;
                Ok(vec![])
            }
        }
    }

    /// With `update = "rebase"`, the replayed commits `replayed` become task `id`'s (what a
    /// rollback reverts) and its branch's tip before they land: recorded `updating` first (a
    /// run killed before the record puts the branch back), the branch moved, then recorded.
    fn adopt_replayed(
        &self,
        id: &str,
        book: &Book,
        entry: &QueueEntry,
        (rev, main): (&str, &str),
        replayed: &str,
    ) -> Result<()> {
        let updating = updating_entry(entry, rev, main);
        self.update(vec![book::set_for(Entry::Queue, id, json!(updating))])?;
        let msg = format!("metash: task {id} replayed on {}", short(main));
        self.git.set_branch(&branch_of(id), replayed, &msg)?;
        let mut updates = self.tip_updates(id, book, replayed);
        updates.extend(self.replayed(id, &self.workspace(), main, replayed)?);
        let waiting = QueueEntry {
            state: QueueState::Waiting,
            ..updating
        };
        updates.push(book::set_for(Entry::Queue, id, json!(waiting)));
        self.update(updates)?;
        Ok(())
    }

    /// Step 5 on the clean path: the checkout is fast-forwarded from `main` to `landing` (whose
    /// first parent it is), once what a landing cut short left is undone; `merged.<id>` and the
    /// state are recorded in one update. `HEAD` moved meanwhile (a person's commit): again.
    fn land_onto(
        &self,
        root: &Path,
        node: &TaskNode,
        main: &str,
        landing: &str,
    ) -> Result<Landing> {
        let id = node.id.as_str();
        if let Some(step) = self.blocked(root, node, landing)? {
            return Ok(Landing::Stop(step));
        }
        if !self
            .git
            .fast_forward(main, landing, &landing_message(node))?
        {
            let waiting = entry(QueueState::Waiting);
            self.update(vec![book::set_for(Entry::Queue, id, json!(waiting))])?;
            return Ok(Landing::Again);
        }
        self.record_landed(id, landing)?;
        Ok(Landing::Landed)
    }

    /// Task `id` landed: `HEAD` is now `head`.
    fn record_landed(&self, id: &str, head: &str) -> Result<()> {
        self.update(vec![
            book::set_for(Entry::Merged, id, json!(head)),
            book::set_for(Entry::Queue, id, json!(entry(QueueState::Landed))),
            book::set(Entry::ResumeFor, book::null()),
        ])?;
        self.show(id, QueueState::Landed);
        self.progress(&format!("task {id}: landed"), LogLevel::Info);
        Ok(())
    }

    /// Task `id`'s recorded tip and the project's `HEAD`, when the tip still needs an update;
    /// otherwise what the queue does instead: no branch or a tip holding `HEAD` already, or in it
    /// (a run killed after landing it), lands or is recorded as landed; a tip that fails the
    /// trust check halts the run.
    fn tip_to_update(
        &self,
        id: &str,
        state: &SessionState,
        book: &Book,
    ) -> Result<std::result::Result<(String, String), Next>> {
        let rev = match self.recorded_tip(id, book)? {
            Ok(Some(rev)) => rev,
            Ok(None) => return Ok(Err(Next::Land)),
            Err(Untrusted(why)) => {
                return Ok(Err(Next::Stop(self.halt(self.refusal(state, id, why))?)));
            }
        };
        let (main, holds, landed) = self.git.head_against(&self.workspace(), &rev)?;
        if holds || landed {
            return Ok(Err(Next::Land));
        }
        Ok(Ok((rev, main)))
    }

    /// Step 2 when the update conflicts: brings the project's `HEAD` into task `node`'s branch
    /// in its worktree, where the executor resolves the conflict.
    fn bring_up_to_date(
        &self,
        node: &TaskNode,
        state: &SessionState,
        book: &Book,
        entry: QueueEntry,
    ) -> Result<Next> {
        let id = node.id.as_str();
        let root = self.workspace();
        let (rev, main) = match self.tip_to_update(id, state, book)? {
            Ok(both) => both,
            Err(next) => return Ok(next),
        };
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
        let (verdict, review) = match self.verdict_of(id, state, book, None)? {
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
        let (verdict, review) = match self.verdict_of(id, state, &book, None)? {
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
        self.record_landed(id, &head)?;
        Ok(Landing::Landed)
    }
}

/// The commit `landing` that lands task tip `rev` on `HEAD`'s `main`.
struct Onto<'a> {
    rev: &'a str,
    main: &'a str,
    landing: &'a str,
}

/// The queue's worktree is made on this branch (its `HEAD` is then detached wherever the queue
/// needs it); a task's branch is `metash/task/<id>`, so the two never meet.
pub(crate) const QUEUE_BRANCH: &str = "metash/queue";

/// The message of the commit that lands task `node` in the checkout.
pub(crate) fn landing_message(node: &TaskNode) -> String {
    format!("metash: merge task {}: {}", node.id, node.title)
}

/// `entry` as `updating` task tip `rev` with `main`.
fn updating_entry(entry: &QueueEntry, rev: &str, main: &str) -> QueueEntry {
    QueueEntry {
        state: QueueState::Updating,
        head: rev.to_string(),
        main: main.to_string(),
        files: vec![],
        with: vec![],
        ..entry.clone()
    }
}

/// How landing a task ended.
enum Landing {
    Landed,
    /// `HEAD` moved since the update (a person's commit): the task is brought up to date again.
    Again,
    Stop(Step),
}

/// The queue's worktree, where a clean update is shown to the verifier: metash's own, never an
/// executor's (its name holds a `.`, which no task id does).
pub(crate) fn queue_worktree(workspace: &Path) -> PathBuf {
    workspace
        .join(".meta")
        .join("worktrees")
        .join("metash.queue")
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
