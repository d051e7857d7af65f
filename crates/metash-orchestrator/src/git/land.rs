//! The merge queue's clean path (`crate::queue`), away from the task's worktree: the commit that
//! lands a task is made on the project's `HEAD` (a merge of the task's tip, or its commits
//! replayed there), shown in the queue's own worktree only when the verifier must see it, and
//! the project's checkout is then fast-forwarded to it. Bringing the task's worktree up to date
//! would write there every file that landed since the task branched (most of a task's cost in
//! the queue: each new file is an inode); here the only files written are the task's own, once
//! in the queue's worktree and once in the checkout.
//!
//! In-process (libgit2) the merge and the replay are made in memory, from the object database;
//! where a filter driver is in use (`Git::in_process`) they are made by the `git` CLI in the
//! queue's worktree instead. A conflict changes nothing: the caller brings the task up to date
//! in its own worktree, where the executor resolves it.

use std::path::Path;

use git2::{build::CheckoutBuilder, Oid, Repository, Sort};

use super::{libgit, Git};
use crate::error::{OrchestratorError, Result};

impl Git {
    /// The merge of `theirs` into `onto` as a commit of its own (`onto` its first parent), made
    /// without touching any checkout; `None` when it conflicts. Through the CLI (filters), it
    /// is made in the queue's worktree `queue` (on `branch`: [`Git::show_in_queue`]).
    ///
    /// # Errors
    /// git fails.
    pub fn merge_onto(
        &self,
        (queue, branch): (&Path, &str),
        onto: &str,
        theirs: &str,
        message: &str,
    ) -> Result<Option<String>> {
        self.trust.check()?;
        if let Some(repo) = self.repo(&self.root).filter(|_| self.in_process()) {
            let (ours, theirs) = (commit_id(&repo, onto)?, commit_id(&repo, theirs)?);
            return merged_in_memory(&repo, ours, theirs, message)
                .map(|o| o.map(|id| id.to_string()))
                .map_err(libgit::failed(
                    &self.root,
                    &format!("merge {theirs} (in memory)"),
                ));
        }
        self.show_in_queue(queue, branch, onto)?;
        let out = self.run_committing(
            queue,
            &["merge", "--no-ff", "--no-edit", "-m", message, theirs],
        )?;
        if out.status.success() {
            return Ok(Some(self.head(queue)?));
        }
        let conflicted = !self.conflicted(queue)?.is_empty();
        let _ = self.run(queue, &["merge", "--abort"]);
        if conflicted {
            return Ok(None);
        }
        Err(self.failed(queue, &format!("merge {theirs}"), &out))
    }

    /// The commits of `tip` that `onto` lacks (not merges; oldest first) replayed on `onto`, as
    /// `git rebase` does (a commit whose change `onto` already holds is dropped): the new tip, or
    /// `None` when one conflicts. Through the CLI (filters), in the queue's worktree `queue`.
    ///
    /// # Errors
    /// git fails.
    pub fn replay_onto(
        &self,
        (queue, branch): (&Path, &str),
        onto: &str,
        tip: &str,
    ) -> Result<Option<String>> {
        self.trust.check()?;
        if let Some(repo) = self.repo(&self.root).filter(|_| self.in_process()) {
            let (base, tip) = (commit_id(&repo, onto)?, commit_id(&repo, tip)?);
            return replayed_in_memory(&repo, base, tip)
                .map(|o| o.map(|id| id.to_string()))
                .map_err(libgit::failed(&self.root, "rebase (in memory)"));
        }
        self.show_in_queue(queue, branch, tip)?;
        let out = self.run_committing(queue, &["rebase", "--no-autostash", "-q", onto])?;
        if out.status.success() {
            return Ok(Some(self.head(queue)?));
        }
        let conflicted = !self.conflicted(queue)?.is_empty();
        let _ = self.run(queue, &["rebase", "--abort"]);
        if conflicted {
            return Ok(None);
        }
        Err(self.failed(queue, &format!("rebase {onto}"), &out))
    }

    /// A commit with `tip`'s tree and the parents `onto` and `tip`: what `git merge --no-ff tip`
    /// on `onto` makes when `tip` holds `onto`.
    ///
    /// # Errors
    /// git fails.
    pub fn landing_commit(&self, onto: &str, tip: &str, message: &str) -> Result<String> {
        self.trust.check()?;
        if let Some(repo) = self.repo(&self.root) {
            let (ours, theirs) = (commit_id(&repo, onto)?, commit_id(&repo, tip)?);
            let made = (|| {
                let (ours, theirs) = (repo.find_commit(ours)?, repo.find_commit(theirs)?);
                let sig = libgit::signature(&repo)?;
                repo.commit(
                    None,
                    &sig,
                    &sig,
                    message,
                    &theirs.tree()?,
                    &[&ours, &theirs],
                )
            })();
            return made
                .map(|id| id.to_string())
                .map_err(libgit::failed(&self.root, "commit-tree"));
        }
        let tree = format!("{tip}^{{tree}}");
        let args = ["commit-tree", &tree, "-p", onto, "-p", tip, "-m", message];
        let out = self.run_committing(&self.root, &args)?;
        if !out.status.success() {
            return Err(self.failed(&self.root, "commit-tree", &out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Makes the queue's worktree `queue` exactly commit `rev` (made first if missing, on
    /// `branch`): only the files that differ are written, and whatever a verifier (or a killed
    /// run) left there is removed, ignored files included. Its `HEAD` is detached at `rev`.
    ///
    /// # Errors
    /// git fails.
    pub fn show_in_queue(&self, queue: &Path, branch: &str, rev: &str) -> Result<()> {
        self.trust.check()?;
        // Whole (its `.git` there, its admin directory complete), it is used as it is; else it
        // is made (again: `ensure_worktree` clears a half-made one).
        let whole = queue.join(".git").exists();
        let repo = match self.repo(queue).filter(|r| whole && r.head().is_ok()) {
            Some(repo) => Some(repo),
            None => {
                self.ensure_worktree(queue, branch, rev)?;
                self.repo(queue)
            }
        };
        if let Some(repo) = repo.filter(|_| self.in_process()) {
            let id = commit_id(&repo, rev)?;
            let shown = (|| {
                let commit = repo.find_commit(id)?;
                let mut how = CheckoutBuilder::new();
                how.force().remove_untracked(true).remove_ignored(true);
                repo.checkout_tree(commit.as_object(), Some(&mut how))?;
                if detach_in_place(repo.path(), id) {
                    return Ok(());
                }
                repo.set_head_detached(id)
            })();
            return shown.map_err(libgit::failed(queue, &format!("checkout {rev}")));
        }
        self.run(queue, &["checkout", "-q", "-f", "--detach", rev])?;
        self.run(queue, &["clean", "-ffdxq"])?;
        Ok(())
    }

    /// Points `refs/heads/<branch>` at `rev` (a task's branch once its commits were replayed
    /// away from its worktree).
    ///
    /// # Errors
    /// git fails.
    pub fn set_branch(&self, branch: &str, rev: &str, message: &str) -> Result<()> {
        self.trust.check()?;
        let name = format!("refs/heads/{branch}");
        if let Some(repo) = self.repo(&self.root) {
            let id = commit_id(&repo, rev)?;
            return repo
                .reference(&name, id, true, message)
                .map(drop)
                .map_err(libgit::failed(&self.root, &format!("update-ref {name}")));
        }
        self.run(&self.root, &["update-ref", "-m", message, &name, rev])
            .map(drop)
    }

    /// Moves the project's checkout from `from` to `to`, which holds it: the files that differ
    /// are written, then the checked-out branch moves. `false` (nothing done) when `HEAD` is no
    /// longer `from`. In-process, the marker of a merge into the checkout is there meanwhile
    /// (a run killed mid-write leaves it, and the next one undoes what was written:
    /// `Git::undo_interrupted_merge`).
    ///
    /// # Errors
    /// git fails, or local changes are in the way (the caller looked for them first).
    pub fn fast_forward(&self, from: &str, to: &str, message: &str) -> Result<bool> {
        self.trust.check()?;
        if let Some(repo) = self.repo(&self.root).filter(|_| self.in_process()) {
            let (from, to) = (commit_id(&repo, from)?, commit_id(&repo, to)?);
            let marker = libgit::MergeMarker::set(repo.path())
                .map_err(|e| OrchestratorError::io("the in-process merge marker", e))?;
            let moved = fast_forward_in(&repo, from, to, message)
                .map_err(libgit::failed(&self.root, &format!("merge --ff-only {to}")))?;
            drop(marker);
            return Ok(moved);
        }
        if self.head(&self.root)? != from {
            return Ok(false);
        }
        self.run(&self.root, &["merge", "--ff-only", "-q", to])?;
        Ok(true)
    }
}

/// The commit `rev` names in `repo`, or an error naming it.
fn commit_id(repo: &Repository, rev: &str) -> Result<Oid> {
    libgit::resolve(repo, rev).ok_or_else(|| OrchestratorError::Git {
        dir: repo.path().to_path_buf(),
        args: format!("rev-parse {rev} (libgit2)"),
        message: format!("{rev} is not a commit"),
    })
}

/// Points the `HEAD` of the worktree whose admin directory is `admin` at `id`, detached, by
/// writing over the file in place, when the new text is at least as long as the old (a detached
/// `HEAD` always is, once detached); `false` when it did not. git's way, a `HEAD.lock` made and
/// renamed over `HEAD`, makes a new inode and has ext4 flush the file it replaces (most of a
/// millisecond here, once per task in the queue). Only for the queue's worktree, which is
/// metash's and which nothing reads the history of: no reflog entry is written; a write cut
/// short leaves a `HEAD` git cannot read, and the worktree is made again (`Git::show_in_queue`).
fn detach_in_place(admin: &Path, id: Oid) -> bool {
    use std::io::Write;
    let path = admin.join("HEAD");
    let text = format!("{id}\n");
    let fits = std::fs::metadata(&path).is_ok_and(|m| m.len() <= text.len() as u64);
    fits && std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .is_ok()
}

/// `ours` and `theirs` merged in memory into a commit with both as parents; `None` on a conflict.
fn merged_in_memory(
    repo: &Repository,
    ours: Oid,
    theirs: Oid,
    message: &str,
) -> std::result::Result<Option<Oid>, git2::Error> {
    let (ours, theirs) = (repo.find_commit(ours)?, repo.find_commit(theirs)?);
    let mut index = repo.merge_commits(&ours, &theirs, None)?;
    if index.has_conflicts() {
        return Ok(None);
    }
    let tree = repo.find_tree(index.write_tree_to(repo)?)?;
    let sig = libgit::signature(repo)?;
    repo.commit(None, &sig, &sig, message, &tree, &[&ours, &theirs])
        .map(Some)
}

/// The non-merge commits in `tip` and not in `base`, oldest first, picked onto `base` in memory
/// (authors and messages kept; one that changes nothing there dropped): the last, or `None` on
/// a conflict.
fn replayed_in_memory(
    repo: &Repository,
    base: Oid,
    tip: Oid,
) -> std::result::Result<Option<Oid>, git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(tip)?;
    walk.hide(base)?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)?;
    let sig = libgit::signature(repo)?;
    let mut at = repo.find_commit(base)?;
    for id in walk {
        let commit = repo.find_commit(id?)?;
        if commit.parent_count() > 1 {
            continue;
        }
        let mut index = repo.cherrypick_commit(&commit, &at, 0, None)?;
        if index.has_conflicts() {
            return Ok(None);
        }
        let tree = index.write_tree_to(repo)?;
        if tree == at.tree_id() {
            continue;
        }
        let tree = repo.find_tree(tree)?;
        let message = commit.message_raw().unwrap_or_default();
        let new = repo.commit(None, &commit.author(), &sig, message, &tree, &[&at])?;
        at = repo.find_commit(new)?;
    }
    Ok(Some(at.id()))
}

/// The checkout of `repo` moved from `from` to `to` (files first, then the branch, only if it
/// is still at `from`); `false` when `HEAD` is elsewhere.
fn fast_forward_in(
    repo: &Repository,
    from: Oid,
    to: Oid,
    message: &str,
) -> std::result::Result<bool, git2::Error> {
    let head = repo.head()?;
    if head.peel_to_commit()?.id() != from {
        return Ok(false);
    }
    let target = repo.find_commit(to)?;
    // Local changes the new files would overwrite make the checkout refuse: the caller found
    // none (others are left alone).
    repo.checkout_tree(target.as_object(), Some(CheckoutBuilder::new().safe()))?;
    match head.name() {
        Some(name) if head.is_branch() => {
            repo.reference_matching(name, to, true, from, message)?;
        }
        _ => repo.set_head_detached(to)?,
    }
    Ok(true)
}
