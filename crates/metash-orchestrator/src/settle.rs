//! Two things the merge queue (queue.rs) keeps beside its records, both about the moments between
//! them. **Settling**: an update made in the task's worktree (after a failed re-verification, or
//! a clean merge after a rebase that conflicted there) is recorded together with the verdict, so a
//! run killed in between leaves the task's branch at an update commit metash made but did not
//! record (or a conflicting update in progress, not yet handed to the executor). The next run
//! recognises that commit by its shape, a merge of the last recorded tip and a commit the
//! project's `HEAD` holds, and records it (to be verified again), or aborts the unrecorded merge;
//! anything else is left for `recorded_tip` to refuse. **The live step**: which task the queue is
//! updating, re-verifying or landing right now, written to `.meta/queue-now.json` without fsync,
//! over the last step in place (for `metash status` and `metash ui`; a crash may lose it, and a
//! step whose process is gone is not shown).

use std::path::PathBuf;

use metash_protocol::LogLevel;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::book::{self, Book, Entry, QueueEntry, QueueState};
use crate::engine::{branch_of, worktree_of, Orchestrator};
use crate::error::Result;

/// The queue's step at this moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveStep {
    pub task: String,
    pub state: QueueState,
    /// The `metash run` doing it.
    pub pid: u32,
}

fn live_file(meta: &std::path::Path) -> PathBuf {
    meta.join("queue-now.json")
}

/// The step the queue of the project whose `.meta` is `meta` is at, if a live run is at one.
pub fn live_step(meta: &std::path::Path) -> Option<LiveStep> {
    let text = std::fs::read_to_string(live_file(meta)).ok()?;
    let step: LiveStep = serde_json::from_str(&text).ok()?;
    (alive(step.pid) && step.state != QueueState::Landed).then_some(step)
}

/// Whether the run that wrote a live step still runs.
#[cfg(unix)]
fn alive(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        // SAFETY: kill(2) with signal 0 only checks that the process exists.
        .is_some_and(|pid| unsafe { libc::kill(pid, 0) } == 0)
}

/// Elsewhere there is no cheap check: the step is shown as the file says.
#[cfg(not(unix))]
fn alive(_pid: u32) -> bool {
    true
}

/// Writes `text` over `path` in place, padded with spaces to the file's length (a JSON reader
/// skips them), without truncating it: replacing a file (by `rename` or by truncation) makes
/// ext4 flush its data at once (`auto_da_alloc`), about a millisecond, three times per task. A
/// reader racing the write may see a mix and parse nothing: the step is then not shown.
fn overwrite(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let old = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
    let padded = format!("{text:<width$}", width = old.max(LIVE_WIDTH));
    // As long as the old text at least: nothing of it is left after the new one.
    file.write_all(padded.as_bytes())
}

/// The live step file's usual length: a step is written padded to it, so most never change it.
const LIVE_WIDTH: usize = 256;

impl Orchestrator<'_> {
    /// Says which step the queue is at (best effort: it is only shown).
    pub(crate) fn show(&self, task: &str, state: QueueState) {
        let meta = self.store().meta_dir();
        let step = LiveStep {
            task: task.to_string(),
            state,
            pid: std::process::id(),
        };
        let _ = overwrite(&live_file(meta), &json!(step).to_string());
    }

    /// A run killed between a clean update and its record: the task's worktree holds an update
    /// merge still in progress (aborted) or its branch an update commit (recorded now, to be
    /// verified again when it changed the tree). `true` when the entry changed.
    pub(crate) fn settle_update(&self, id: &str, book: &Book, entry: &QueueEntry) -> Result<bool> {
        let Some(record) = book.branch(id) else {
            return Ok(false);
        };
        let root = self.workspace();
        let wt = worktree_of(&root, id);
        let last = record.last();
        // The admin directory git made for the worktree, by name (the project's `.git` is no
        // agent's to write); `worktree_merging` would find it by its back-pointer.
        let admin = root.join(".git").join("worktrees").join(id);
        if admin.join("MERGE_HEAD").exists() && self.git.worktree_merging(&wt) {
            self.git.reset_to(&wt, last)?;
        }
        let Some(tip) = self.branch_tip(&branch_of(id))? else {
            return Ok(false);
        };
        if tip == last {
            return Ok(false);
        }
        let parents = self.git.parents(&root, &tip)?;
        let main = self.git.head(&root)?;
        let ours = parents.len() == 2
            && parents[0] == last
            && self.git.is_ancestor(&root, &parents[1], &main)?;
        if !ours {
            return Ok(false);
        }
        let changed = self.git.tree_of(&root, &tip)? != self.git.tree_of(&root, last)?;
        let reverify = changed && self.config.reverify_after_update;
        let settled = QueueEntry {
            state: if reverify {
                QueueState::Reverifying
            } else {
                QueueState::Waiting
            },
            head: last.to_string(),
            main: parents[1].clone(),
            ..entry.clone()
        };
        let mut updates = self.tip_updates(id, book, &tip);
        if reverify {
            updates.push(book::set_for(Entry::Verified, id, json!(false)));
        }
        updates.push(book::set_for(Entry::Queue, id, json!(settled)));
        self.update(updates)?;
        self.progress(
            &format!(
                "task {id}: {} is the update a killed run made (a merge of the task's last \
                 recorded commit and HEAD's {}): recorded",
                &tip[..tip.len().min(10)],
                &parents[1][..parents[1].len().min(10)]
            ),
            LogLevel::Warn,
        );
        Ok(true)
    }
}
