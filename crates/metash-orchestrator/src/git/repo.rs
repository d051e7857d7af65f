//! The repositories the in-process git work opens ([`Git::repo`]): a task worktree's through its
//! admin directory in the project's `.git` (never the worktree's own `.git` file, which an agent
//! can write), the project's own kept open between operations ([`RootRepo`]).

use std::path::Path;
use std::sync::Mutex;

use super::{libgit, Git};

/// The project's repository, kept open between in-process operations: opening it costs a
/// fraction of a millisecond, and each fresh open reads (and inflates) again every commit and
/// tree the next walk or merge needs, several times per task in the merge queue. One user at a
/// time takes it (a worker thread wanting it meanwhile opens its own). libgit2 reads refs from
/// disk on every lookup, looks again for objects it misses, rereads a changed configuration
/// file, and the index is reread when taken ([`Git::repo`]): what it answers is what a fresh
/// open would.
#[derive(Default)]
pub(super) struct RootRepo(Mutex<Option<git2::Repository>>);

impl std::fmt::Debug for RootRepo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RootRepo")
    }
}

/// A repository opened in-process; the project's own goes back to [`RootRepo`] when dropped.
pub(crate) struct Repo<'a> {
    repo: Option<git2::Repository>,
    home: Option<&'a RootRepo>,
}

impl From<git2::Repository> for Repo<'_> {
    fn from(repo: git2::Repository) -> Self {
        Self {
            repo: Some(repo),
            home: None,
        }
    }
}

impl std::ops::Deref for Repo<'_> {
    type Target = git2::Repository;

    fn deref(&self) -> &git2::Repository {
        // Present until dropped.
        self.repo
            .as_ref()
            .unwrap_or_else(|| unreachable!("a Repo holds its repository"))
    }
}

impl Drop for Repo<'_> {
    fn drop(&mut self) {
        if let (Some(home), Some(repo)) = (self.home, self.repo.take()) {
            *home.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(repo);
        }
    }
}

impl Git {
    /// The repository of `dir` opened in-process: the project's own `.git` for the root, the
    /// admin directory for a task worktree; `None` for anything else (the CLI handles it).
    pub(super) fn repo(&self, dir: &Path) -> Option<Repo<'_>> {
        if dir != self.root {
            let gitdir = self.admin_dir(dir)?;
            return libgit::open(&gitdir).ok().map(Repo::from);
        }
        let gitdir = libgit::project_gitdir(&self.root)?;
        let cached = self
            .root_repo
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .filter(|r| r.path() == gitdir.as_path());
        let repo = match cached {
            Some(repo) => {
                // As a fresh open would: the index as it is on disk now (reread only when it
                // changed).
                if let Ok(mut index) = repo.index() {
                    let _ = index.read(false);
                }
                repo
            }
            None => libgit::open(&gitdir).ok()?,
        };
        Some(Repo {
            repo: Some(repo),
            home: Some(&self.root_repo),
        })
    }
}
