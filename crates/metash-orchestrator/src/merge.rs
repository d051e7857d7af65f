//! Landing a phase's verified task branches in the project's checked-out branch, through the merge
//! queue (queue.rs), in dependency order, each as a `--no-ff` merge commit. Idempotent: a branch
//! already contained in `HEAD` (merged by a run that died before recording it) is recorded, not
//! merged again. The queue lands only a tip that holds `HEAD`, so landing never conflicts; local
//! changes of a person's in the way are a `human_action` checkpoint.
//!
//! What is merged is the task's last recorded commit, by its id, and only while the task's branch
//! points there (`recorded.rs`); its tree is checked first (`git::guard`): nothing under `.meta/`
//! or `.git/` in any spelling, no new submodule, no link out of the checkout. A refusal halts the
//! session (`refused`) naming the task, the path and the rule; nothing of the task is merged.

use std::path::Path;

use metash_protocol::SessionState;

use crate::book::{self, Book, Entry, Halt, HaltReason, ResumeFor};
use crate::engine::{branch_of, worktree_of, Orchestrator, Step};
use crate::error::Result;
use crate::git::{guard, Merge};
use crate::plan::{self, TaskNode};
use crate::queue::{landing_message, queue_worktree, Queued, QUEUE_BRANCH};
use crate::recorded::Untrusted;

impl Orchestrator<'_> {
    /// The phase's verified tasks go through the merge queue (queue.rs) in dependency order;
    /// when all have landed, the phase completes.
    pub(crate) fn merge_phase(&self, phase: u32) -> Result<Step> {
        let root = self.workspace();
        let state = self.store().state()?;
        let book = Book::of(&state);
        if let Some(step) = self.merge_in_progress(&root, &state, &book, phase)? {
            return Ok(step);
        }
        let nodes = Self::nodes(&state);
        let queue: Vec<&TaskNode> = plan::topo_order(&nodes)
            .into_iter()
            .filter_map(|id| nodes.iter().find(|n| n.id == id))
            .filter(|n| n.phase <= phase && book.merged_at(&n.id).is_none())
            .collect();
        let ids: Vec<&str> = queue.iter().map(|n| n.id.as_str()).collect();
        self.enqueue(&ids, &book)?;
        for node in queue {
            if let Queued::Stop(step) = self.queue_task(&root, node)? {
                return Ok(step);
            }
        }
        self.remove_merged(&root, phase)?;
        self.complete_phase(phase)
    }

    /// A merge into the checkout a person was asked to finish (by a version of metash before the
    /// merge queue, which left conflicts there): still in progress (ask again, or abort it on
    /// `abort`), or abandoned with `abort`. `None`: go on merging.
    fn merge_in_progress(
        &self,
        root: &Path,
        state: &SessionState,
        book: &Book,
        phase: u32,
    ) -> Result<Option<Step>> {
        let waiting_on_person = book.resume_for.as_ref().is_some_and(|r| r.role == "merge");
        let abort = waiting_on_person && book_answer(state) == Some("abort");
        let aborted = |message: String| {
            self.halt(Halt {
                reason: HaltReason::MergeAborted,
                phase,
                failed: vec![],
                message,
            })
        };
        if self.git.merge_in_progress(root)? {
            if abort {
                self.git.run(root, &["merge", "--abort"])?;
                return aborted(format!(
                    "phase {phase} halted: the conflicting merge was aborted"
                ))
                .map(Some);
            }
            let task = book.resume_for.as_ref().and_then(|r| r.task.clone());
            return self
                .raise_own(
                    format!(
                        "A merge is still in progress in {}: resolve the conflicts, commit, then \
                         run `metash run --answer done` (or `--answer abort`).",
                        root.display()
                    ),
                    vec!["done".into(), "abort".into()],
                    ResumeFor {
                        role: "merge".into(),
                        task,
                        asked: None,
                    },
                )
                .map(Some);
        }
        if abort {
            return aborted(format!("phase {phase} halted: merging was abandoned")).map(Some);
        }
        Ok(None)
    }

    /// Merges one task's last recorded commit into the project. No branch left and that commit
    /// in HEAD: nothing of it is outside HEAD. A commit already contained in HEAD merges as
    /// "Already up to date", making no commit: merging is idempotent. `Some`: a person must act
    /// first (local changes, a conflict), or the session halts (a refused branch or tree).
    pub(crate) fn merge_task(
        &self,
        root: &Path,
        node: &TaskNode,
        state: &SessionState,
        book: &Book,
    ) -> Result<Option<Step>> {
        let id = &node.id;
        let rev = match self.recorded_tip(id, book)? {
            Ok(Some(rev)) => rev,
            Ok(None) => return Ok(None),
            Err(Untrusted(why)) => return self.halt(self.refusal(state, id, why)).map(Some),
        };
        if let Some(step) = self.refused_tree(root, id, state, &rev)? {
            return Ok(Some(step));
        }
        if let Some(step) = self.blocked(root, node, &rev)? {
            return Ok(Some(step));
        }
        let msg = landing_message(node);
        if let Merge::Conflict { files } = self.git.merge(root, &rev, &msg)? {
            // The queue lands only tips that hold `HEAD`, so this cannot conflict; if it does
            // anyway, the checkout is put back at once: it is never left mid-merge.
            self.git.run(root, &["merge", "--abort"])?;
            return self
                .halt(Halt {
                    reason: HaltReason::MergeAborted,
                    phase: state.current_phase,
                    failed: vec![],
                    message: format!(
                        "landing task {id} in {} conflicted in {} although it holds HEAD; the \
                         merge was aborted",
                        root.display(),
                        files.join(", ")
                    ),
                })
                .map(Some);
        }
        Ok(None)
    }

    /// The merge guard's look at what task `id`'s recorded commit `rev` brings: `Some` (the
    /// session halted, `refused`) when a path breaks a rule.
    pub(crate) fn refused_tree(
        &self,
        root: &Path,
        id: &str,
        state: &SessionState,
        rev: &str,
    ) -> Result<Option<Step>> {
        let refused = self.git.check_merge(root, rev)?;
        if refused.is_empty() {
            return Ok(None);
        }
        let what = format!(
            "metash refused to merge {rev}, task {id}'s recorded commit, into {}",
            root.display()
        );
        let why = guard::describe(&what, &refused);
        self.halt(self.refusal(state, id, why)).map(Some)
    }

    /// Before commit `rev` reaches the checkout: what a landing cut short left is undone; a
    /// person's local changes in its way are a checkpoint (`Some`).
    pub(crate) fn blocked(&self, root: &Path, node: &TaskNode, rev: &str) -> Result<Option<Step>> {
        let blocking = self.git.undo_interrupted_merge(root, rev)?;
        if blocking.is_empty() {
            return Ok(None);
        }
        let id = &node.id;
        self.raise_own(
            format!(
                "Uncommitted changes in {} block merging task {id} ({}): {}. Commit or stash \
                 them, then run `metash run --answer done` (or `--answer abort` to halt).",
                root.display(),
                node.title,
                blocking.join(", ")
            ),
            vec!["done".into(), "abort".into()],
            ResumeFor {
                role: "merge".into(),
                task: Some(id.clone()),
                asked: None,
            },
        )
        .map(Some)
    }

    /// Worktrees and branches of merged tasks are no longer needed: their commits are in HEAD;
    /// nor is the queue's worktree (the next phase's queue makes it again).
    fn remove_merged(&self, root: &Path, phase: u32) -> Result<()> {
        let state = self.store().state()?;
        let book = Book::of(&state);
        let merged: Vec<String> = Self::nodes(&state)
            .into_iter()
            .filter(|n| n.phase <= phase && book.merged_at(&n.id).is_some())
            .map(|n| n.id)
            .collect();
        for id in &merged {
            self.git.remove_worktree(&worktree_of(root, id), None)?;
        }
        let queue = queue_worktree(root);
        self.git.remove_worktree(&queue, Some(QUEUE_BRANCH))?;
        let branches: Vec<String> = merged.iter().map(|id| branch_of(id)).collect();
        self.git.delete_branches(&branches)
    }
}

fn book_answer(state: &SessionState) -> Option<&str> {
    state
        .variables
        .get(book::NS)
        .and_then(|m| m.get(Entry::LastAnswer.as_str()))
        .and_then(|v| v.as_str())
}
