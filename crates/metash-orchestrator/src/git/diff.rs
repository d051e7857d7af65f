//! A task's change as a person reviews it (issue 15's diff card): what the task's work changed
//! against the commit it started from, computed by libgit2's diff (no hand-written diffing).
//!
//! Which two versions:
//! - a task being worked on (the book's `running` entry): from the head its attempt started at
//!   to its worktree's files as they are now, uncommitted changes and new files included;
//! - a task with commits: from the parent of its first commit to its last commit;
//! - otherwise, a task branch that exists: from where it left the project's `HEAD` to its tip
//!   (or its worktree's files, when the worktree is there).
//!
//! `.meta/` is never shown. A diff is cut at [`MAX_LINES`] lines, and says so.

use std::path::Path;

use git2::{Delta, Diff, DiffFormat, DiffOptions, Oid, Repository};
use metash_protocol::SessionState;

use super::libgit;
use crate::error::{OrchestratorError, Result};

/// The most lines a diff shows (a review card, not a patch tool).
pub const MAX_LINES: usize = 5_000;

/// What one line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    Context,
    Added,
    Removed,
}

/// One line of a hunk, with its numbers in the old and the new version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub kind: LineKind,
    pub old: Option<u32>,
    pub new: Option<u32>,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// `@@ -a,b +c,d @@ …`
    pub header: String,
    pub lines: Vec<Line>,
}

/// How a file changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileChange {
    Added,
    Deleted,
    Modified,
    Renamed,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDiff {
    pub path: String,
    /// The path before a rename.
    pub old_path: Option<String>,
    pub change: FileChange,
    pub binary: bool,
    pub hunks: Vec<Hunk>,
}

/// The version a diff ends at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffEnd {
    /// The task worktree's files now.
    Worktree(std::path::PathBuf),
    Commit(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDiff {
    pub base: String,
    pub end: DiffEnd,
    pub files: Vec<FileDiff>,
    /// Cut at [`MAX_LINES`].
    pub truncated: bool,
}

fn failed(root: &Path) -> impl Fn(git2::Error) -> OrchestratorError + '_ {
    move |e| OrchestratorError::Git {
        dir: root.to_path_buf(),
        args: "diff (libgit2)".into(),
        message: e.message().to_string(),
    }
}

/// Task `id`'s change in the project at `root` (state read by the caller); `None` when the task
/// has no work to show yet (no commits, no branch) or the project has no repository.
///
/// # Errors
/// The repository cannot be read.
pub fn task_diff(root: &Path, state: &SessionState, id: &str) -> Result<Option<TaskDiff>> {
    let Some(gitdir) = libgit::project_gitdir(root) else {
        return Ok(None);
    };
    let repo = libgit::open(&gitdir).map_err(failed(root))?;
    let Some(task) = state.task(id) else {
        return Ok(None);
    };
    let book = crate::Book::of(state);
    let worktree = crate::engine::worktree_of(root, id);
    let has_worktree = worktree.join(".git").exists();
    let commits = task.commits.clone().unwrap_or_default();
    let branch = crate::engine::branch_of(id);
    let (base, end) =
        if let (Some(run), true) = (book.running.get(id).and_then(|r| r.as_ref()), has_worktree) {
            (run.head.clone(), DiffEnd::Worktree(worktree.clone()))
        } else if let (Some(first), Some(last)) = (commits.first(), commits.last()) {
            let Some(parent) = libgit::resolve(&repo, &format!("{first}^")) else {
                return Ok(None);
            };
            (parent.to_string(), DiffEnd::Commit(last.clone()))
        } else if let Some(tip) = libgit::resolve(&repo, &branch) {
            let head = libgit::resolve(&repo, "HEAD");
            let base = match head {
                Some(h) => repo.merge_base(h, tip).map_err(failed(root))?,
                None => return Ok(None),
            };
            let end = if has_worktree {
                DiffEnd::Worktree(worktree.clone())
            } else {
                DiffEnd::Commit(tip.to_string())
            };
            (base.to_string(), end)
        } else {
            return Ok(None);
        };
    let mut out = TaskDiff {
        base,
        end,
        files: Vec::new(),
        truncated: false,
    };
    // A worktree's files are read through its own repository (its index, its checkout).
    let wt_repo = match &out.end {
        DiffEnd::Worktree(w) => Some(
            libgit::open(&gitdir.join("worktrees").join(libgit::worktree_name(w)))
                .map_err(failed(root))?,
        ),
        DiffEnd::Commit(_) => None,
    };
    diff_into(wt_repo.as_ref().unwrap_or(&repo), &mut out).map_err(failed(root))?;
    Ok(Some(out))
}

fn change_of(d: Delta) -> FileChange {
    match d {
        Delta::Added | Delta::Untracked => FileChange::Added,
        Delta::Deleted => FileChange::Deleted,
        Delta::Modified => FileChange::Modified,
        Delta::Renamed => FileChange::Renamed,
        _ => FileChange::Other,
    }
}

/// Diffs `out.base` to `out.end` in `repo` and walks the patch into `out`.
fn diff_into(repo: &Repository, out: &mut TaskDiff) -> std::result::Result<(), git2::Error> {
    let base_tree = repo.find_commit(Oid::from_str(&out.base)?)?.tree()?;
    let mut opts = DiffOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .show_untracked_content(true)
        .context_lines(3);
    let diff = match &out.end {
        DiffEnd::Commit(sha) => {
            let tree = repo.find_commit(Oid::from_str(sha)?)?.tree()?;
            repo.diff_tree_to_tree(Some(&base_tree), Some(&tree), Some(&mut opts))?
        }
        DiffEnd::Worktree(_) => {
            repo.diff_tree_to_workdir_with_index(Some(&base_tree), Some(&mut opts))?
        }
    };
    collect(&diff, out)
}

/// Walks the patch into files, hunks and lines, skipping `.meta/`.
fn collect(diff: &Diff<'_>, out: &mut TaskDiff) -> std::result::Result<(), git2::Error> {
    let mut lines = 0usize;
    let mut skip = false;
    diff.print(DiffFormat::Patch, |delta, hunk, line| {
        let path = delta
            .new_file()
            .path()
            .or_else(|| delta.old_file().path())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let is_new_file = out.files.last().is_none_or(|f| f.path != path);
        if is_new_file {
            skip = path == ".meta" || path.starts_with(".meta/");
            if !skip {
                let old = delta
                    .old_file()
                    .path()
                    .map(|p| p.to_string_lossy().into_owned())
                    .filter(|o| *o != path);
                out.files.push(FileDiff {
                    path: path.clone(),
                    old_path: old,
                    change: change_of(delta.status()),
                    binary: delta.flags().is_binary(),
                    hunks: Vec::new(),
                });
            }
        }
        if skip {
            return true;
        }
        let Some(file) = out.files.last_mut() else {
            return true;
        };
        if line.origin() == 'B' {
            file.binary = true;
        }
        let kind = match line.origin() {
            '+' => LineKind::Added,
            '-' => LineKind::Removed,
            ' ' => LineKind::Context,
            _ => return true,
        };
        if lines >= MAX_LINES {
            out.truncated = true;
            return false;
        }
        if let Some(h) = hunk {
            let header = String::from_utf8_lossy(h.header()).trim_end().to_string();
            if file.hunks.last().is_none_or(|last| last.header != header) {
                file.hunks.push(Hunk {
                    header,
                    lines: Vec::new(),
                });
            }
        }
        if let Some(h) = file.hunks.last_mut() {
            lines += 1;
            h.lines.push(Line {
                kind,
                old: line.old_lineno(),
                new: line.new_lineno(),
                text: String::from_utf8_lossy(line.content())
                    .trim_end_matches(['\n', '\r'])
                    .to_string(),
            });
        }
        true
    })
    .or_else(|e| if out.truncated { Ok(()) } else { Err(e) })
}
