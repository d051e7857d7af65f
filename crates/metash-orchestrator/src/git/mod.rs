//! The git operations the loop needs. The frequent ones run in-process through libgit2
//! ([`libgit`]); the rest, and whatever libgit2 cannot do as a person expects (a merge that
//! conflicts), through the `git` CLI (`std::process::Command`, arguments as a vector: no shell, no
//! quoting bugs). Every CLI call runs with `GIT_TERMINAL_PROMPT=0`, an editor that accepts the
//! default message, and no commit signing, so nothing ever waits for a person behind the
//! orchestrator's back. When the repository has no identity configured, commits are made as
//! `metash <metash@localhost>`.

pub mod diff;
pub mod guard;
mod land;
mod libgit;
mod queue;
mod repo;
mod revert;
pub mod trust;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{OrchestratorError, Result};
use repo::{Repo, RootRepo};

/// Paths of the project the orchestrator never commits: its own `.meta/`.
const EXCLUDE_META: &str = ":(exclude).meta";

/// Stops handing the run lock down when dropped.
pub struct HandDown<'a>(&'a Git);

impl Drop for HandDown<'_> {
    fn drop(&mut self) {
        self.0.hand_down(None);
    }
}

#[derive(Debug)]
pub struct Git {
    root: PathBuf,
    identity: OnceLock<Vec<String>>,
    /// Held while worktrees are added, removed or pruned and branches deleted: git reads every
    /// worktree's metadata for these, and a worktree being created concurrently makes it fail
    /// (`failed to read .git/worktrees/<x>/commondir`).
    worktrees: Mutex<()>,
    /// The run lock's fd, inherited by every git child (see [`Git::handing_down`]); -1 for none.
    run_lock: AtomicI32,
    /// The last run died during an in-process merge into the project's checkout (its marker was
    /// found): a file that merge writes may be half written.
    merge_cut_short: std::sync::atomic::AtomicBool,
    /// The repository's executable configuration, checked before every git operation
    /// ([`trust`]).
    trust: trust::Guard,
    /// The project's repository opened in-process, kept between operations ([`Repo`]).
    root_repo: RootRepo,
    /// Filters: whether the configuration (global and the repository's) names a filter driver,
    /// and whether the repository asks for one. libgit2 runs none, so where both hold, work-tree
    /// reads and writes go through the git CLI (git-lfs).
    filters: OnceLock<Filters>,
}

/// What the configuration and the repository say of filter drivers (see [`Git::in_process`]).
#[derive(Debug, Clone, Copy)]
struct Filters {
    configured: bool,
    used: bool,
}

/// The outcome of a merge or revert that may conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Merge {
    Clean,
    Conflict { files: Vec<String> },
}

impl Git {
    /// Git at `root`, made absolute once here: every command runs in some directory (a task
    /// worktree, the project), and a relative root would name another one in each.
    pub fn new(root: &Path) -> Self {
        let root = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
        let root = root.as_path();
        Self {
            root: root.to_path_buf(),
            identity: OnceLock::new(),
            worktrees: Mutex::new(()),
            run_lock: AtomicI32::new(-1),
            merge_cut_short: std::sync::atomic::AtomicBool::new(false),
            trust: trust::Guard::new(root),
            root_repo: RootRepo::default(),
            filters: OnceLock::new(),
        }
    }

    /// Reads the repository's executable git configuration and compares it with what a person
    /// accepted (`.meta/git-trust.json`); a project without a record gets one now
    /// ([`trust::Checked::Recorded`]). Call before anything else of a run, rollback or worker.
    ///
    /// # Errors
    /// [`OrchestratorError::GitConfigChanged`] naming each change; the record cannot be read or
    /// written.
    pub fn check_trust(&self) -> Result<trust::Checked> {
        self.trust.verify()
    }

    /// In-process (libgit2) work-tree operations are used unless a filter driver is configured
    /// and the repository asks for a filter (libgit2 would write a git-lfs pointer where git
    /// writes the file). Decided once.
    fn in_process(&self) -> bool {
        let f = self.filters();
        !(f.configured && f.used)
    }

    fn filters(&self) -> Filters {
        *self.filters.get_or_init(|| {
            let repo = libgit::project_gitdir(&self.root).and_then(|g| libgit::open(&g).ok());
            let configured = repo.as_ref().is_none_or(libgit::configures_filters);
            Filters {
                configured,
                used: configured && repo.as_ref().is_none_or(libgit::uses_filters),
            }
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn identity(&self) -> &[String] {
        self.identity.get_or_init(|| {
            let has = |k: &str| {
                self.output(&self.root, &["config", "--get", k])
                    .map(|o| o.status.success() && !o.stdout.is_empty())
                    .unwrap_or(false)
            };
            let mut v = Vec::new();
            if !has("user.name") {
                v.extend(["-c".to_string(), "user.name=metash".to_string()]);
            }
            if !has("user.email") {
                v.extend(["-c".to_string(), "user.email=metash@localhost".to_string()]);
            }
            v
        })
    }

    /// Runs git, waiting out another git process's `index.lock` (a run killed while git was
    /// committing leaves that git running for a moment).
    fn output(&self, dir: &Path, args: &[&str]) -> Result<Output> {
        let mut tries = 0;
        loop {
            let out = self.output_once(dir, args)?;
            let locked = !out.status.success()
                && String::from_utf8_lossy(&out.stderr).contains(".lock': File exists");
            if !locked || tries >= 50 {
                return Ok(out);
            }
            tries += 1;
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Every git started while the returned guard lives inherits `lock` (the run lock): if this
    /// process is killed while git runs, git finishes its work on its own, and the next run must
    /// not start before it has (it would find a worktree half removed, a merge half written).
    /// Holding the lock's open file keeps the next run waiting exactly that long.
    #[cfg(unix)]
    pub fn handing_down(&self, lock: &metash_store::lock::LockGuard) -> HandDown<'_> {
        use std::os::fd::AsRawFd;
        self.hand_down(Some(lock.as_raw_fd()));
        HandDown(self)
    }

    /// Elsewhere the run lock is not handed down (no fd inheritance through `pre_exec`).
    #[cfg(not(unix))]
    pub fn handing_down(&self, _lock: &metash_store::lock::LockGuard) -> HandDown<'_> {
        HandDown(self)
    }

    fn hand_down(&self, fd: Option<i32>) {
        self.run_lock.store(fd.unwrap_or(-1), Ordering::SeqCst);
    }

    fn output_once(&self, dir: &Path, args: &[&str]) -> Result<Output> {
        // Nothing runs while the executable configuration differs from the trusted one.
        self.trust.check()?;
        let mut cmd = Command::new("git");
        #[cfg(unix)]
        let lock = self.run_lock.load(Ordering::SeqCst);
        #[cfg(unix)]
        if lock >= 0 {
            use std::os::unix::process::CommandExt;
            // SAFETY: only fcntl(2), async-signal-safe, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let flags = libc::fcntl(lock, libc::F_GETFD);
                    if flags >= 0 {
                        libc::fcntl(lock, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
                    }
                    Ok(())
                });
            }
        }
        // In a task's worktree, git's metadata is found from the project's own `.git` (the
        // admin directory whose back-pointer names this worktree), never from the worktree's
        // `.git` file: an agent works there and could point that file at a repository whose
        // config runs a command.
        if let Some(admin) = self.admin_dir(dir) {
            cmd.env("GIT_DIR", admin).env("GIT_WORK_TREE", dir);
        }
        cmd.arg("-C")
            .arg(dir)
            // Nothing in a repository an agent touched may make this git run a program: no hooks,
            // no file-system monitor.
            .args([
                "-c",
                "commit.gpgsign=false",
                "-c",
                "core.hooksPath=/dev/null",
                "-c",
                "core.fsmonitor=false",
            ])
            // No background `git maintenance`/`gc` after every commit of the loop.
            .args(["-c", "maintenance.auto=false", "-c", "gc.auto=0"])
            .args(args)
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_EDITOR", "true")
            .env("GIT_MERGE_AUTOEDIT", "no")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| OrchestratorError::Git {
                dir: dir.to_path_buf(),
                args: args.join(" "),
                message: format!("cannot run git: {e} (is git installed?)"),
            })
    }

    /// The admin directory (`.git/worktrees/<name>`) of the linked worktree at `dir`, found by the
    /// `gitdir` back-pointers in the project's `.git` (which no agent can write). `None` for the
    /// project root and for a directory git does not list as a worktree.
    fn admin_dir(&self, dir: &Path) -> Option<PathBuf> {
        if dir == self.root {
            return None;
        }
        let want = dir.canonicalize().ok()?.join(".git");
        let points_here = |admin: &Path| {
            std::fs::read_to_string(admin.join("gitdir")).is_ok_and(|g| {
                let g = PathBuf::from(g.trim());
                g == want || g.canonicalize().is_ok_and(|c| c == want)
            })
        };
        let worktrees = self.root.join(".git").join("worktrees");
        // git names the admin directory after the worktree's own: looked at first (the loop asks
        // this for every git operation in a task's worktree, and a project may have many).
        if let Some(guess) = dir.file_name().map(|n| worktrees.join(n)) {
            if points_here(&guess) {
                return Some(guess);
            }
        }
        let entries = std::fs::read_dir(&worktrees).ok()?;
        entries
            .flatten()
            .map(|e| e.path())
            .find(|admin| points_here(admin))
    }

    /// Runs git in `dir`; its trimmed stdout, or an error with its stderr.
    pub fn run(&self, dir: &Path, args: &[&str]) -> Result<String> {
        let out = self.output(dir, args)?;
        if !out.status.success() {
            return Err(OrchestratorError::Git {
                dir: dir.to_path_buf(),
                args: args.join(" "),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Runs a committing command (with the identity fallback).
    fn run_committing(&self, dir: &Path, args: &[&str]) -> Result<Output> {
        let mut full: Vec<&str> = self.identity().iter().map(String::as_str).collect();
        full.extend_from_slice(args);
        self.output(dir, &full)
    }

    /// Whether `rev` resolves, and to what.
    pub fn resolve(&self, dir: &Path, rev: &str) -> Result<Option<String>> {
        if let Some(repo) = self.repo(dir) {
            return Ok(libgit::resolve(&repo, rev).map(|o| o.to_string()));
        }
        let spec = format!("{rev}^{{commit}}");
        let out = self.output(dir, &["rev-parse", "-q", "--verify", &spec])?;
        Ok(out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()))
    }

    pub fn head(&self, dir: &Path) -> Result<String> {
        if let Some(repo) = self.repo(dir) {
            if let Some(id) = libgit::resolve(&repo, "HEAD") {
                return Ok(id.to_string());
            }
        }
        self.run(dir, &["rev-parse", "HEAD"])
    }

    /// Checks that the project is a git repository with a commit to branch from (an unborn
    /// repository gets an empty first commit).
    ///
    /// # Errors
    /// Not a repository (with the command that makes it one), or git failing.
    pub fn ensure_repo(&self) -> Result<String> {
        let inside = self.output(&self.root, &["rev-parse", "--is-inside-work-tree"])?;
        if !inside.status.success() {
            return Err(OrchestratorError::Refused(format!(
                "{} is not a git repository; metash run works in git worktrees (run `git init` there first)",
                self.root.display()
            )));
        }
        if let Some(h) = self.resolve(&self.root, "HEAD")? {
            return Ok(h);
        }
        let out = self.run_committing(
            &self.root,
            &["commit", "--allow-empty", "-m", "metash: initial commit"],
        )?;
        if !out.status.success() {
            return Err(self.failed(&self.root, "commit --allow-empty", &out));
        }
        self.head(&self.root)
    }

    fn failed(&self, dir: &Path, args: &str, out: &Output) -> OrchestratorError {
        OrchestratorError::Git {
            dir: dir.to_path_buf(),
            args: args.to_string(),
            message: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        }
    }

    /// Removes the lock files a killed run's in-process git work left in what only metash writes
    /// (its task branches and task worktrees' admin directories). Call with the run lock held:
    /// then no other run is writing there. The paths removed.
    pub fn clear_stale_locks(&self) -> Vec<PathBuf> {
        let Some(gitdir) = libgit::project_gitdir(&self.root) else {
            return Vec::new();
        };
        let (locks, cut_short) =
            libgit::clear_stale_locks(&gitdir, &self.root.join(".meta").join("worktrees"));
        if cut_short {
            self.merge_cut_short.store(true, Ordering::SeqCst);
        }
        locks
    }

    /// Whether `refs/heads/<branch>` exists. Looks for the loose ref file first (the loop asks this
    /// several times per task, and a git process costs milliseconds); asks git when the ref may be
    /// packed or the repository is laid out differently.
    pub fn branch_exists(&self, branch: &str) -> Result<bool> {
        let git_dir = self.root.join(".git");
        if git_dir.is_dir() {
            if git_dir.join("refs/heads").join(branch).is_file() {
                return Ok(true);
            }
            if !git_dir.join("packed-refs").exists() && !git_dir.join("reftable").exists() {
                return Ok(false);
            }
        }
        Ok(self
            .resolve(&self.root, &format!("refs/heads/{branch}"))?
            .is_some())
    }

    /// Makes `path` a worktree on `branch`, creating the branch at `base` if it does not exist.
    /// Idempotent: an existing worktree is left alone. Returns whether it was created.
    /// Whether `path` is a whole worktree of the project: its `.git` there and its admin directory
    /// complete (a run killed while adding it leaves one without).
    pub fn is_worktree(&self, path: &Path) -> bool {
        path.join(".git").exists() && self.repo(path).is_some_and(|r| r.head().is_ok())
    }

    pub fn ensure_worktree(&self, path: &Path, branch: &str, base: &str) -> Result<bool> {
        self.trust.check()?;
        if path.join(".git").exists() {
            if self.is_worktree(path) {
                return Ok(false);
            }
            // Half made by a run killed while adding it (its admin directory is missing or
            // incomplete): it is ours, under `.meta/worktrees`; clear it and make it again.
            let _serial = self.worktrees.lock().unwrap_or_else(|e| e.into_inner());
            std::fs::remove_dir_all(path)
                .map_err(|e| OrchestratorError::io(path.display().to_string(), e))?;
            self.run(&self.root, &["worktree", "prune"])?;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| OrchestratorError::io(parent.display().to_string(), e))?;
        }
        let _serial = self.worktrees.lock().unwrap_or_else(|e| e.into_inner());
        // In-process first; anything unusual (a stale registration, a half-made directory) goes
        // to the CLI path below, which knows how to clear it.
        if !path.exists() && self.in_process() {
            if let Some(repo) = self.repo(&self.root) {
                let name = libgit::worktree_name(path);
                if libgit::add_worktree(&repo, &name, path, branch, base).is_ok() {
                    return Ok(true);
                }
            }
        }
        let p = path.to_string_lossy();
        let add = |this: &Self| -> Result<String> {
            if this.branch_exists(branch)? {
                this.run(&this.root, &["worktree", "add", "--force", &p, branch])
            } else {
                this.run(
                    &this.root,
                    &["worktree", "add", "--force", "-b", branch, &p, base],
                )
            }
        };
        if add(self).is_err() {
            // A worktree whose directory vanished is still registered, or a killed `worktree add`
            // left its directory without `.git`: (both are ours, under `.meta/worktrees`) clear
            // them and try again.
            if path.exists() {
                std::fs::remove_dir_all(path)
                    .map_err(|e| OrchestratorError::io(path.display().to_string(), e))?;
            }
            self.run(&self.root, &["worktree", "prune"])?;
            add(self)?;
        }
        Ok(true)
    }

    /// Removes the worktree, and its branch when given (their commits stay reachable from wherever
    /// they were merged).
    pub fn remove_worktree(&self, path: &Path, branch: Option<&str>) -> Result<()> {
        self.trust.check()?;
        if path.exists() {
            let _serial = self.worktrees.lock().unwrap_or_else(|e| e.into_inner());
            let p = path.to_string_lossy();
            let removed = match (self.repo(&self.root), self.admin_dir(path)) {
                (Some(repo), Some(admin)) => libgit::remove_worktree(&repo, &admin).is_ok(),
                _ => false,
            };
            if !removed
                && self
                    .run(&self.root, &["worktree", "remove", "--force", &p])
                    .is_err()
            {
                let _ = std::fs::remove_dir_all(path);
                self.run(&self.root, &["worktree", "prune"])?;
            }
        }
        if let Some(branch) = branch {
            self.delete_branches(&[branch.to_string()])?;
        }
        Ok(())
    }

    /// Deletes those of `branches` that exist, with one git process.
    pub fn delete_branches(&self, branches: &[String]) -> Result<()> {
        let mut args = vec!["branch", "-D", "-q"];
        let mut any = false;
        for b in branches {
            if self.branch_exists(b)? {
                args.push(b);
                any = true;
            }
        }
        if any {
            let _serial = self.worktrees.lock().unwrap_or_else(|e| e.into_inner());
            self.run(&self.root, &args)?;
        }
        Ok(())
    }

    /// Throws away everything in `dir` since `rev`: a merge in progress, uncommitted changes,
    /// untracked files, and commits after `rev` on the checked-out branch.
    pub fn reset_to(&self, dir: &Path, rev: &str) -> Result<()> {
        if self.merge_in_progress(dir)? {
            let _ = self.run(dir, &["merge", "--abort"]);
        }
        self.run(dir, &["reset", "--hard", "-q", rev])?;
        self.run(dir, &["clean", "-fdq", "-e", ".meta"])?;
        Ok(())
    }

    /// Whether a merge is in progress in `dir` (its git dir holds `MERGE_HEAD`). A file check, not
    /// a git process: the loop asks this for every attempt.
    pub fn merge_in_progress(&self, dir: &Path) -> Result<bool> {
        let dot_git = dir.join(".git");
        let git_dir = if dot_git.is_dir() {
            dot_git
        } else {
            match std::fs::read_to_string(&dot_git) {
                // A worktree: `.git` is a file `gitdir: <path>`.
                Ok(text) => match text.trim().strip_prefix("gitdir:") {
                    Some(p) => dir.join(p.trim()),
                    None => return Ok(self.resolve(dir, "MERGE_HEAD")?.is_some()),
                },
                Err(_) => return Ok(self.resolve(dir, "MERGE_HEAD")?.is_some()),
            }
        };
        Ok(git_dir.join("MERGE_HEAD").exists())
    }

    /// `git merge-base --is-ancestor a b`.
    pub fn is_ancestor(&self, dir: &Path, a: &str, b: &str) -> Result<bool> {
        if let Some(repo) = self.repo(dir) {
            if let (Some(x), Some(y)) = (libgit::resolve(&repo, a), libgit::resolve(&repo, b)) {
                return libgit::is_ancestor(&repo, x, y)
                    .map_err(libgit::failed(dir, "merge-base --is-ancestor"));
            }
        }
        let out = self.output(dir, &["merge-base", "--is-ancestor", a, b])?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(self.failed(dir, &format!("merge-base --is-ancestor {a} {b}"), &out)),
        }
    }

    /// Before merging `rev`: undo what an interrupted merge of `rev` left in `dir`. A run killed
    /// while git was writing the merge leaves the working tree (and index) partly updated and no
    /// `MERGE_HEAD`, and the next `git merge` refuses. Each changed or new path the merge writes
    /// (changed between the merge base and `rev`; other local changes are left alone) whose content is
    /// `HEAD`'s or `rev`'s version (or is absent where `rev` has none) is what that merge wrote:
    /// it is put back to `HEAD`. Anything else is somebody's work and is never touched: those
    /// paths are returned, for a person to commit or stash.
    pub fn undo_interrupted_merge(&self, dir: &Path, rev: &str) -> Result<Vec<String>> {
        let dirty = self.dirty_paths_merge_writes(dir, rev)?;
        if dirty.is_empty() {
            return Ok(Vec::new());
        }
        let mut foreign = Vec::new();
        let (mut in_head, mut not_in_head) = (Vec::new(), Vec::new());
        for path in &dirty {
            let on_disk = if dir.join(path).is_file() {
                Some(self.run(dir, &["hash-object", "--", path])?)
            } else {
                None
            };
            let head = self.blob(dir, "HEAD", path)?;
            let theirs = self.blob(dir, rev, path)?;
            if on_disk == head || on_disk == theirs || self.half_written(dir, rev, path) {
                if head.is_some() {
                    in_head.push(path.clone());
                } else {
                    not_in_head.push(path.clone());
                }
            } else {
                foreign.push(path.clone());
            }
        }
        if !foreign.is_empty() {
            return Ok(foreign);
        }
        let mut args = vec!["reset", "-q", "HEAD", "--"];
        args.extend(dirty.iter().map(String::as_str));
        self.run(dir, &args)?;
        if !in_head.is_empty() {
            let mut args = vec!["checkout", "-q", "HEAD", "--"];
            args.extend(in_head.iter().map(String::as_str));
            self.run(dir, &args)?;
        }
        for path in not_in_head {
            let _ = std::fs::remove_file(dir.join(path));
        }
        Ok(Vec::new())
    }

    /// After a run died during an in-process merge (only then): whether `path` holds a cut-short
    /// write of `rev`'s version, which that merge left (a thread killed mid-write, unlike a git
    /// process, does not finish the file).
    fn half_written(&self, dir: &Path, rev: &str, path: &str) -> bool {
        if !self.merge_cut_short.load(Ordering::SeqCst) {
            return false;
        }
        let Some(repo) = self.repo(dir) else {
            return false;
        };
        let (Some(theirs), Ok(on_disk)) =
            (libgit::resolve(&repo, rev), std::fs::read(dir.join(path)))
        else {
            return false;
        };
        libgit::is_partial_write_of(&repo, theirs, path, &on_disk)
    }

    /// Local changes (outside `.meta`) to paths that merging `rev` would write; other local
    /// changes do not stop a merge.
    fn dirty_paths_merge_writes(&self, dir: &Path, rev: &str) -> Result<Vec<String>> {
        self.trust.check()?;
        // In-process status compares files unfiltered: a git-lfs file would look changed.
        if let Some(repo) = self.repo(dir).filter(|_| self.in_process()) {
            if let Some(theirs) = libgit::resolve(&repo, rev) {
                let dirty = libgit::dirty_paths(&repo).map_err(libgit::failed(dir, "status"))?;
                if dirty.is_empty() {
                    return Ok(dirty);
                }
                let touched: std::collections::HashSet<String> = libgit::touched_by(&repo, theirs)
                    .map_err(libgit::failed(dir, "diff HEAD...rev"))?
                    .into_iter()
                    .collect();
                return Ok(dirty.into_iter().filter(|p| touched.contains(p)).collect());
            }
        }
        // Not `run`: its trimming would eat the first entry's leading status column.
        let out = self.output(
            dir,
            &[
                "status",
                "--porcelain",
                "-z",
                "--no-renames",
                "--untracked-files=all",
                "--",
                ".",
                EXCLUDE_META,
            ],
        )?;
        if !out.status.success() {
            return Err(self.failed(dir, "status", &out));
        }
        let status = String::from_utf8_lossy(&out.stdout).into_owned();
        if status.is_empty() {
            return Ok(Vec::new());
        }
        let touched = self.run(
            dir,
            &[
                "diff",
                "--name-only",
                "--no-renames",
                "-z",
                &format!("HEAD...{rev}"),
            ],
        )?;
        let touched: std::collections::HashSet<&str> = touched.split('\0').collect();
        Ok(status
            .split('\0')
            .filter(|e| e.len() > 3 && touched.contains(&e[3..]))
            .map(|e| e[3..].to_string())
            .collect())
    }

    /// The blob id of `path` in `tree`, if it has one.
    fn blob(&self, dir: &Path, tree: &str, path: &str) -> Result<Option<String>> {
        let out = self.output(
            dir,
            &["rev-parse", "-q", "--verify", &format!("{tree}:{path}")],
        )?;
        Ok(out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()))
    }

    /// Merges `rev` into the branch checked out in `dir` (always a merge commit, so a task's work
    /// stays one unit in history). A conflict leaves the merge in progress for a person.
    pub fn merge(&self, dir: &Path, rev: &str, message: &str) -> Result<Merge> {
        self.trust.check()?;
        // In-process when it merges cleanly. Into the project's own checkout, a marker in its
        // `.git` says a merge is underway: a run killed mid-merge leaves lock files no git
        // process will finish and remove, and the next run removes them (`clear_stale_locks`).
        if let Some(repo) = self.repo(dir).filter(|_| self.in_process()) {
            if let Some(theirs) = libgit::resolve(&repo, rev) {
                let marker = (dir == self.root)
                    .then(|| libgit::MergeMarker::set(repo.path()))
                    .transpose()
                    .map_err(|e| OrchestratorError::io("the in-process merge marker", e))?;
                let clean = libgit::merge_clean(&repo, theirs, message)
                    .map_err(libgit::failed(dir, &format!("merge {rev}")))?;
                drop(marker);
                if clean.is_some() {
                    return Ok(Merge::Clean);
                }
            }
        }
        let out =
            self.run_committing(dir, &["merge", "--no-ff", "--no-edit", "-m", message, rev])?;
        if out.status.success() {
            return Ok(Merge::Clean);
        }
        let files = self.conflicted(dir)?;
        if files.is_empty() {
            return Err(self.failed(dir, &format!("merge {rev}"), &out));
        }
        Ok(Merge::Conflict { files })
    }

    fn conflicted(&self, dir: &Path) -> Result<Vec<String>> {
        let text = self.run(dir, &["diff", "--name-only", "--diff-filter=U"])?;
        Ok(text
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect())
    }

    /// Commits every change in `dir` except `.meta/`; `None` when there was nothing to commit.
    /// `git bundle create` of `range` (a branch, with its whole history, or `a..b`): the bytes,
    /// which carry commits between machines through the store's server.
    pub fn bundle(&self, dir: &Path, range: &str) -> Result<Vec<u8>> {
        let file = bundle_file();
        let path = file.to_string_lossy().into_owned();
        let made = self.run(dir, &["bundle", "create", "--quiet", &path, range]);
        let bytes = made.and_then(|_| {
            std::fs::read(&file).map_err(|e| OrchestratorError::io(file.display().to_string(), e))
        });
        let _ = std::fs::remove_file(&file);
        bytes
    }

    /// Fetches `refspec` from a bundle's `bytes` into the repository of `dir`.
    pub fn fetch_bundle(&self, dir: &Path, bytes: &[u8], refspec: &str) -> Result<()> {
        let file = bundle_file();
        std::fs::write(&file, bytes)
            .map_err(|e| OrchestratorError::io(file.display().to_string(), e))?;
        let path = file.to_string_lossy().into_owned();
        let fetched = self.run(dir, &["fetch", "--quiet", &path, refspec]);
        let _ = std::fs::remove_file(&file);
        fetched.map(drop)
    }

    pub fn commit_all(&self, dir: &Path, message: &str) -> Result<Option<String>> {
        self.trust.check()?;
        // A `.gitattributes` the task adds may ask for a configured filter: then git commits.
        let in_process = self.repo(dir).filter(|r| {
            self.in_process() && !(self.filters().configured && libgit::touches_attributes(r))
        });
        if let Some(repo) = in_process {
            return libgit::commit_all(&repo, message, |w, p| guard::kept_out(w, p).is_some())
                .map(|o| o.map(|id| id.to_string()))
                .map_err(libgit::failed(dir, "add -A && commit"));
        }
        // Not `.META/`, a look-alike, a nested repository, a link out: as in-process (guard.rs).
        self.add_all_kept(dir)?;
        let staged = self.output(dir, &["diff", "--cached", "--quiet"])?;
        if staged.status.success() {
            return Ok(None);
        }
        let out = self.run_committing(dir, &["commit", "-q", "-m", message])?;
        if !out.status.success() {
            return Err(self.failed(dir, "commit", &out));
        }
        Ok(Some(self.head(dir)?))
    }

    /// Reverts one commit in `dir` with a new commit; a conflict leaves the revert in progress.
    pub fn revert(&self, dir: &Path, sha: &str) -> Result<Merge> {
        let out = self.run_committing(dir, &["revert", "--no-edit", sha])?;
        if out.status.success() {
            return Ok(Merge::Clean);
        }
        let files = self.conflicted(dir)?;
        if files.is_empty() {
            return Err(self.failed(dir, &format!("revert {sha}"), &out));
        }
        Ok(Merge::Conflict { files })
    }
}

/// A fresh temporary path for a bundle.
fn bundle_file() -> PathBuf {
    std::env::temp_dir().join(format!("metash-{}.bundle", uuid::Uuid::new_v4().simple()))
}
