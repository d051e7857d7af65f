//! The git operations of the merge queue (`crate::queue`), all in a task's worktree except the
//! look at what landed: bringing a branch up to date (merge or rebase), finding a merge or rebase
//! in progress from the worktree's admin directory (never its `.git` file, which the agent can
//! write), committing a resolution, and what a resolution left unresolved. Every git process runs
//! as every other of metash's (`Git::output`): hooks and fsmonitor off, the trust check first,
//! the worktree's metadata taken from the project's `.git`.

use std::path::Path;

use super::{Git, Merge};
use crate::error::Result;

/// The lines git writes around a conflict (the `=======` between them is left out: a Markdown
/// heading underline looks the same).
const MARKERS: [&str; 2] = ["<<<<<<< ", ">>>>>>> "];

impl Git {
    /// The tree of commit `rev` in `dir`'s repository.
    ///
    /// # Errors
    /// git fails.
    pub fn tree_of(&self, dir: &Path, rev: &str) -> Result<Option<String>> {
        if let Some(repo) = self.repo(dir) {
            return Ok(repo
                .revparse_single(rev)
                .and_then(|o| o.peel_to_tree())
                .map(|t| t.id().to_string())
                .ok());
        }
        let out = self.output(
            dir,
            &["rev-parse", "-q", "--verify", &format!("{rev}^{{tree}}")],
        )?;
        Ok(out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()))
    }

    /// `HEAD` of `dir` and how it relates to commit `rev`: `(head, head_in_rev, rev_in_head)`.
    /// One repository open and one merge base, where `head` and two `is_ancestor` calls would
    /// take three of each (the queue asks this twice per task).
    ///
    /// # Errors
    /// git fails.
    pub fn head_against(&self, dir: &Path, rev: &str) -> Result<(String, bool, bool)> {
        if let Some(repo) = self.repo(dir) {
            if let (Some(head), Some(other)) = (
                super::libgit::resolve(&repo, "HEAD"),
                super::libgit::resolve(&repo, rev),
            ) {
                let base = match repo.merge_base(head, other) {
                    Ok(base) => Some(base),
                    Err(e) if e.code() == git2::ErrorCode::NotFound => None,
                    Err(e) => return Err(super::libgit::failed(dir, "merge-base")(e)),
                };
                return Ok((head.to_string(), base == Some(head), base == Some(other)));
            }
        }
        let head = self.head(dir)?;
        let head_in_rev = self.is_ancestor(dir, &head, rev)?;
        let rev_in_head = self.is_ancestor(dir, rev, &head)?;
        Ok((head, head_in_rev, rev_in_head))
    }

    /// The parents of commit `rev`, in order.
    ///
    /// # Errors
    /// git fails.
    pub fn parents(&self, dir: &Path, rev: &str) -> Result<Vec<String>> {
        if let Some(repo) = self.repo(dir) {
            if let Ok(c) = repo.revparse_single(rev).and_then(|o| o.peel_to_commit()) {
                return Ok(c.parent_ids().map(|p| p.to_string()).collect());
            }
        }
        let line = self.run(dir, &["rev-list", "--parents", "-n", "1", rev])?;
        Ok(line
            .split_whitespace()
            .skip(1)
            .map(str::to_string)
            .collect())
    }

    /// Whether a merge or a rebase is in progress in the task worktree `wt`, read from its admin
    /// directory in the project's `.git` (found by back-pointer; the worktree's own `.git` file
    /// is the agent's to write). A directory git does not list as a worktree has none.
    pub fn worktree_merging(&self, wt: &Path) -> bool {
        self.admin_dir(wt).is_some_and(|admin| {
            ["MERGE_HEAD", "rebase-merge", "rebase-apply"]
                .iter()
                .any(|f| admin.join(f).exists())
        })
    }

    /// Replays the branch checked out in `dir` onto `onto` (`git rebase`). A conflict aborts the
    /// rebase (the branch is back where it was) and is returned with the files it named.
    ///
    /// # Errors
    /// git fails for another reason.
    pub fn rebase(&self, dir: &Path, onto: &str) -> Result<Merge> {
        let out = self.run_committing(dir, &["rebase", "--no-autostash", "-q", onto])?;
        if out.status.success() {
            return Ok(Merge::Clean);
        }
        let files = self.conflicted(dir)?;
        let _ = self.run(dir, &["rebase", "--abort"]);
        if files.is_empty() {
            return Err(self.failed(dir, &format!("rebase {onto}"), &out));
        }
        Ok(Merge::Conflict { files })
    }

    /// Commits the merge in progress in `dir` as a resolver left it: every change outside
    /// `.meta` staged as a task's commit is (less what the guard keeps out), then `git commit`,
    /// which makes the merge commit git prepared. `Err(paths)` when some are still unmerged.
    ///
    /// # Errors
    /// git fails.
    pub fn commit_resolution(
        &self,
        dir: &Path,
        message: &str,
    ) -> Result<std::result::Result<String, Vec<String>>> {
        self.add_all_kept(dir)?;
        let unmerged = self.conflicted(dir)?;
        if !unmerged.is_empty() {
            return Ok(Err(unmerged));
        }
        let out = self.run_committing(dir, &["commit", "-q", "--no-edit", "-m", message])?;
        if !out.status.success() {
            return Err(self.failed(dir, "commit (resolution)", &out));
        }
        Ok(Ok(self.head(dir)?))
    }

    /// Of `files` (relative to `dir`), those that still hold a conflict marker line. Only regular
    /// files are read (a link is not followed).
    pub fn with_markers(&self, dir: &Path, files: &[String]) -> Vec<String> {
        files
            .iter()
            .filter(|f| {
                let path = dir.join(f);
                let regular = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
                regular
                    && std::fs::read(&path).is_ok_and(|bytes| {
                        String::from_utf8_lossy(&bytes)
                            .lines()
                            .any(|l| MARKERS.iter().any(|m| l.starts_with(m)))
                    })
            })
            .cloned()
            .collect()
    }

    /// The commits (not merges) in `to` but not in `from` that touch any of `files`: the work a
    /// conflict is with.
    ///
    /// # Errors
    /// git fails.
    pub fn commits_touching(
        &self,
        dir: &Path,
        from: &str,
        to: &str,
        files: &[String],
    ) -> Result<Vec<String>> {
        let range = format!("{from}..{to}");
        let mut args = vec!["log", "--no-merges", "--format=%H", &range, "--"];
        args.extend(files.iter().map(String::as_str));
        Ok(self
            .run(dir, &args)?
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect())
    }
}

impl Git {
    /// Whether `dir` has local changes or untracked files (outside `.meta`).
    ///
    /// # Errors
    /// git fails.
    pub fn dirty(&self, dir: &Path) -> Result<bool> {
        self.trust.check()?;
        // In-process status compares files unfiltered: a git-lfs file would look changed.
        if let Some(repo) = self.repo(dir).filter(|_| self.in_process()) {
            return Ok(!super::libgit::dirty_paths(&repo)
                .map_err(super::libgit::failed(dir, "status"))?
                .is_empty());
        }
        let out = self.output(
            dir,
            &[
                "status",
                "--porcelain",
                "--untracked-files=all",
                "--",
                ".",
                super::EXCLUDE_META,
            ],
        )?;
        if !out.status.success() {
            return Err(self.failed(dir, "status", &out));
        }
        Ok(!out.stdout.is_empty())
    }
}
