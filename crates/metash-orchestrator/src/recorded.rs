//! metash uses a task's branch only at commits it recorded for that task (issue 30).
//!
//! A planner that could write `.git` made a commit adding `.meta/policy.toml`, pointed
//! `metash/task/t1` at it and planned a task `t1`: metash took the branch for its own and merged
//! it into the project. So the book now holds, per task, `branches.<id> = {base, tips}`:
//!
//! - the **base** is recorded *before* the branch is made, in the same update that records the
//!   attempt as running (a run killed in between finds no branch and records a fresh base);
//! - every commit metash moves the branch to is recorded as a **tip** when the attempt completes,
//!   in the update that records the task complete: the dependencies merged in for the attempt and
//!   the executor's commit. Until then `running.<id>` covers them: a killed run's worktree is
//!   reset to the attempt's head. A branch left at merges of the dependencies' recorded commits
//!   on the last recorded tip (an attempt that failed or was killed after merging, or a person
//!   who resolved the merge's conflict) is recognised by its shape and recorded;
//! - a branch found anywhere else is **refused**: the session halts (`refused`) naming the branch,
//!   where it points and what metash recorded, and nothing of that commit is used. Halting rather
//!   than failing the task: a retry would find the same branch, and a ref that moved by itself
//!   means something wrote `.git` that should not have; a person looks first.
//!
//! Merging uses the last recorded commit by its id, after checking that the branch still points
//! there (`merge.rs`), so a ref moved after that check changes nothing.

use std::path::Path;

use metash_protocol::{LogLevel, SessionState};
use serde_json::json;

use crate::book::{self, Book, BranchRecord, Entry, FailedTask, Halt, HaltReason, ResumeFor};
use crate::engine::{branch_of, worktree_of, Orchestrator, RunOutcome, Step};
use crate::error::{OrchestratorError, Result};
use crate::execute::Ready;
use crate::git::Merge;

/// Why metash will not use a task's branch (the whole message, for the halt report).
#[derive(Debug)]
pub(crate) struct Untrusted(pub String);

/// A task's worktree, on its branch at the last commit recorded for it.
pub(crate) struct Opened {
    /// Made now, on a new branch at `record.base`.
    pub fresh: bool,
    pub record: BranchRecord,
}

type Checked<T> = Result<std::result::Result<T, Untrusted>>;

impl Orchestrator<'_> {
    /// Task `id`'s worktree, clean, on its branch at the last commit recorded for it, holding the
    /// work of every dependency not yet merged into the project (their recorded commits, never
    /// their refs), with the attempt recorded as running. A new branch's base is recorded in the
    /// same update as the attempt, before the branch is made; the dependency merges are recorded
    /// with the attempt's completion. `Err(outcome)`: a dependency's merge conflicts (a
    /// checkpoint for a person), or the branch is not one metash recorded (the session halts).
    pub(crate) fn prepare_attempt(
        &self,
        id: &str,
    ) -> Result<std::result::Result<Ready, RunOutcome>> {
        let workspace = self.workspace();
        let state = self.store().state()?;
        let book = Book::of(&state);
        let task = state
            .task(id)
            .ok_or_else(|| OrchestratorError::UnknownTask(id.to_string()))?;
        let unmerged: Vec<(String, &BranchRecord)> = task
            .dependencies
            .iter()
            .filter(|d| book.merged_at(d).is_none())
            .filter_map(|d| book.branch(d).map(|r| (branch_of(d), r)))
            .collect();
        let wt = worktree_of(&workspace, id);
        let refused = |why: Untrusted| Ok(Err(RunOutcome::Halted(self.refusal(&state, id, why.0))));
        let (opened, begun) = match self.branch_tip(&branch_of(id))? {
            None => {
                let base = match unmerged.first() {
                    Some((_, r)) => r.last().to_string(),
                    None => self.git.head(&workspace)?,
                };
                let record = BranchRecord::at(&base);
                let begun = self.begin_attempt(id, &base, Some(&record))?;
                match self.make_task_worktree(id, &wt, record)? {
                    Ok(o) => (o, Some(begun)),
                    Err(why) => {
                        self.unbegin(id, &begun)?;
                        return refused(why);
                    }
                }
            }
            Some(tip) => {
                let deps: Vec<&BranchRecord> = unmerged.iter().map(|(_, r)| *r).collect();
                match self.reuse_task_worktree(id, &wt, &book, &tip, &deps)? {
                    Ok(o) => (o, None),
                    Err(why) => return refused(why),
                }
            }
        };
        let mut merges = Vec::new();
        for (dep, r) in &unmerged {
            let tip = r.last();
            if (opened.fresh && tip == opened.record.base)
                || self.git.is_ancestor(&wt, tip, "HEAD")?
            {
                continue;
            }
            let msg = format!("metash: bring {dep} into task {id}");
            match self.git.merge(&wt, tip, &msg)? {
                Merge::Clean => merges.push(self.git.head(&wt)?),
                Merge::Conflict { files } => {
                    if let Some(b) = &begun {
                        self.unbegin(id, b)?;
                    }
                    return self.dep_conflict(id, dep, &wt, &files);
                }
            }
        }
        let head = self.git.head(&wt)?;
        let mut begun = match begun {
            Some(b) => b,
            None => self.begin_attempt(id, &head, None)?,
        };
        begun.record = Some(opened.record);
        begun.merges = merges;
        Ok(Ok(Ready { wt, head, begun }))
    }

    /// Merging `dep` into task `id`'s worktree conflicts: a checkpoint for a person, who resolves
    /// it and commits there (that merge commit is then adopted: [`Self::merge_chain`]).
    fn dep_conflict(
        &self,
        id: &str,
        dep: &str,
        wt: &Path,
        files: &[String],
    ) -> Result<std::result::Result<Ready, RunOutcome>> {
        let step = self.raise_own(
            format!(
                "Merging {dep} into task {id}'s worktree conflicts in {}. Resolve the conflict in \
                 {} and commit, then run `metash run --answer done`.",
                files.join(", "),
                wt.display()
            ),
            vec!["done".into()],
            ResumeFor {
                role: "executor".into(),
                task: Some(id.to_string()),
                asked: None,
            },
        )?;
        match step {
            Step::Stop(outcome) => Ok(Err(outcome)),
            _ => Err(OrchestratorError::Refused(format!(
                "task {id}: the conflict merging {dep} raised no checkpoint"
            ))),
        }
    }

    /// A new branch for task `id` at `record.base` (already recorded), and its worktree.
    fn make_task_worktree(&self, id: &str, wt: &Path, record: BranchRecord) -> Checked<Opened> {
        if wt.join(".git").exists() {
            // A worktree whose branch was deleted by hand: made again on the new branch.
            self.git.remove_worktree(wt, None)?;
        }
        self.git.ensure_worktree(wt, &branch_of(id), &record.base)?;
        self.landed(
            id,
            wt,
            Opened {
                fresh: true,
                record,
            },
        )
    }

    /// Task `id`'s existing branch, at `tip`, used only if metash recorded `tip` for the task
    /// (or `tip` is a chain of merges of its dependencies' recorded commits on the last recorded
    /// one, which is recorded now); the worktree made or reused, and reset to the last recorded
    /// commit (whatever a failed or killed attempt left there).
    fn reuse_task_worktree(
        &self,
        id: &str,
        wt: &Path,
        book: &Book,
        tip: &str,
        deps: &[&BranchRecord],
    ) -> Checked<Opened> {
        let branch = branch_of(id);
        let record = match book.branch(id) {
            Some(r) if r.holds(tip) => r.clone(),
            Some(r) => match self.merge_chain(tip, r.last(), deps)? {
                Some(chain) => {
                    self.progress(
                        &format!(
                            "task {id}: {branch} is at {tip}, merges of its dependencies' recorded \
                             commits on the last one recorded (an attempt that stopped before \
                             recording them, or a person who resolved a conflict): recorded"
                        ),
                        LogLevel::Warn,
                    );
                    let moved = chain.iter().fold(r.clone(), |r, c| r.moved_to(c));
                    self.update(vec![book::set_for(Entry::Branches, id, json!(moved))])?;
                    moved
                }
                None => return Ok(Err(unrecorded(id, tip, Some(r)))),
            },
            None => return Ok(Err(unrecorded(id, tip, None))),
        };
        self.git.ensure_worktree(wt, &branch, record.last())?;
        self.git.reset_to(wt, record.last())?;
        self.landed(
            id,
            wt,
            Opened {
                fresh: false,
                record,
            },
        )
    }

    /// The commit to merge for task `id`: the last one recorded for it, which its branch must
    /// point at. `None`: nothing to merge (no branch was ever made, or it is gone and its last
    /// recorded commit is in `HEAD` already).
    pub(crate) fn recorded_tip(&self, id: &str, book: &Book) -> Checked<Option<String>> {
        crate::cost::checking(|| self.recorded_tip_now(id, book))
    }

    fn recorded_tip_now(&self, id: &str, book: &Book) -> Checked<Option<String>> {
        let root = self.workspace();
        let branch = branch_of(id);
        let tip = self.branch_tip(&branch)?;
        let record = book.branch(id);
        Ok(match (tip, record.map(BranchRecord::last)) {
            (None, None) => Ok(None),
            (Some(t), Some(last)) if t == last => Ok(Some(t)),
            (None, Some(last)) if self.git.is_ancestor(&root, last, "HEAD")? => Ok(None),
            (None, Some(last)) => Err(Untrusted(format!(
                "branch {branch} is gone and the last commit metash recorded for task {id}, \
                 {last}, is not in HEAD; restore it (`git branch {branch} {last}`) or roll the \
                 task back (`metash rollback {id}`), then run `metash run --retry`"
            ))),
            (Some(t), _) => Err(unrecorded(id, &t, record)),
        })
    }

    /// The halt report of a refused task: the session stops, naming the task and why.
    pub(crate) fn refusal(&self, state: &SessionState, id: &str, why: String) -> Halt {
        let phase = state.current_phase;
        Halt {
            reason: HaltReason::Refused,
            phase,
            failed: vec![FailedTask {
                id: id.to_string(),
                title: crate::execute::title_of(state, id),
                why: vec![why.clone()],
            }],
            message: format!("phase {phase} halted: task {id}: {why}"),
        }
    }

    /// The commit `refs/heads/<branch>` points at in the project's repository: read from its
    /// loose ref file when it holds a commit id, or absent when there is none and no packed refs
    /// (the loop asks a few times per task, and opening the repository costs about a
    /// millisecond), else resolved by git (a packed or symbolic ref).
    pub(crate) fn branch_tip(&self, branch: &str) -> Result<Option<String>> {
        crate::cost::checking(|| self.branch_tip_now(branch))
    }

    fn branch_tip_now(&self, branch: &str) -> Result<Option<String>> {
        let root = self.workspace();
        let git_dir = root.join(".git");
        match std::fs::read_to_string(git_dir.join("refs").join("heads").join(branch)) {
            Ok(text) if is_commit_id(text.trim()) => return Ok(Some(text.trim().to_string())),
            // No loose ref, and nowhere else a ref could be: no branch.
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && git_dir.is_dir()
                    && !git_dir.join("packed-refs").exists()
                    && !git_dir.join("reftable").exists() =>
            {
                return Ok(None);
            }
            _ => {}
        }
        self.git.resolve(&root, &format!("refs/heads/{branch}"))
    }

    /// Whether the worktree `wt` of task `id` is at `want`: its admin directory (found by name,
    /// and pointing back at `wt`) has the task's branch checked out, or its `HEAD` resolves there.
    fn worktree_at(&self, id: &str, wt: &Path, want: &str) -> Result<bool> {
        let admin = self.workspace().join(".git").join("worktrees").join(id);
        let read = |f: &str| std::fs::read_to_string(admin.join(f)).unwrap_or_default();
        let on_branch = read("HEAD").trim() == format!("ref: refs/heads/{}", branch_of(id))
            && Path::new(read("gitdir").trim()) == wt.join(".git");
        if on_branch && self.branch_tip(&branch_of(id))?.as_deref() == Some(want) {
            return Ok(true);
        }
        Ok(self.git.resolve(wt, "HEAD")?.as_deref() == Some(want))
    }

    /// The commits from `last` (exclusive) to `tip`, oldest first, when each is a merge of one of
    /// `deps`' recorded commits onto the one before (what preparing an attempt makes, and a
    /// person resolving its conflict); `None` for anything else.
    fn merge_chain(
        &self,
        tip: &str,
        last: &str,
        deps: &[&BranchRecord],
    ) -> Result<Option<Vec<String>>> {
        let root = self.workspace();
        let mut chain = Vec::new();
        let mut at = tip.to_string();
        while at != last {
            let parent = |n: u8| self.git.resolve(&root, &format!("{at}^{n}"));
            let (Some(first), Some(dep)) = (parent(1)?, parent(2)?) else {
                return Ok(None);
            };
            if chain.len() > deps.len()
                || parent(3)?.is_some()
                || !deps.iter().any(|r| r.holds(&dep))
            {
                return Ok(None);
            }
            chain.push(std::mem::replace(&mut at, first));
        }
        chain.reverse();
        Ok(Some(chain))
    }

    /// The worktree was made or reused: its branch and its `HEAD` must both be at the last
    /// recorded commit (a branch made by somebody else between the look and `worktree add`
    /// would have been checked out instead).
    fn landed(&self, id: &str, wt: &Path, opened: Opened) -> Checked<Opened> {
        let want = opened.record.last();
        let branch = branch_of(id);
        let tip = self.branch_tip(&branch)?;
        if tip.as_deref() == Some(want) && self.worktree_at(id, wt, want)? {
            return Ok(Ok(opened));
        }
        Ok(Err(Untrusted(format!(
            "branch {branch} (at {}) and its worktree are not both at {want}, the commit metash \
             recorded for task {id} and just put them at: something else wrote the branch or the \
             worktree meanwhile; look at it, delete it (`git branch -D {branch}`) and run \
             `metash run --retry`",
            tip.as_deref().unwrap_or("nothing"),
        ))))
    }
}

/// A full commit id (SHA-1 or SHA-256), as a loose ref file holds it.
pub(crate) fn is_commit_id(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Why a branch at `tip` is not task `id`'s, with what metash recorded and what a person can do.
fn unrecorded(id: &str, tip: &str, record: Option<&BranchRecord>) -> Untrusted {
    let branch = branch_of(id);
    let (recorded, back) = match record {
        None => (
            "nothing: metash never made this branch".to_string(),
            String::new(),
        ),
        Some(r) => (
            format!("base {}, tips {}", r.base, r.tips.join(", ")),
            format!(", or put it back (`git branch -f {branch} {}`)", r.last()),
        ),
    };
    Untrusted(format!(
        "branch {branch} points at {tip}, which metash did not record for task {id} (recorded: \
         {recorded}). metash uses a task's branch only at commits it made itself; something else \
         made or moved this one (an agent that could write .git?), and nothing of it was used. \
         Look at it (`git log -p {tip}`), then delete it (`git branch -D {branch}`){back}, and run \
         `metash run --retry`"
    ))
}
