//! The loop's frequent git operations in-process, through libgit2 (the `git2` crate): resolving
//! revisions, ancestry, committing a worktree, clean merges, status, and adding and removing task
//! worktrees. A git process costs 2–10 ms; a task needed about fifteen (issue 18 measured ~42 ms
//! of host time per task, mostly git). What libgit2 cannot do the way a person expects, a merge
//! that conflicts above all (it must be left in progress, with markers, for a person to finish),
//! still goes through the `git` CLI, as does anything rare.
//!
//! libgit2 runs no hooks, no filter processes, no fsmonitor and never signs, so a repository an
//! agent touched cannot make it run a program. For the same reason it cannot give git-lfs files
//! their contents: where a filter driver is configured ([`configures_filters`]), `Git` writes and
//! reads work trees through the git CLI instead. A task worktree is opened through its admin
//! directory in the project's own `.git` (never through the worktree's `.git` file, which the
//! agent can write).

use std::path::{Path, PathBuf};

use git2::{
    build::CheckoutBuilder, IndexAddOption, MergeOptions, Oid, Repository, RepositoryOpenFlags,
    Signature, StatusOptions,
};

use crate::error::{OrchestratorError, Result};

/// The prefix of metash's own state, never committed.
const META: &str = ".meta";

/// A libgit2 failure as the orchestrator's git error, naming the operation.
pub(super) fn failed(dir: &Path, op: &str) -> impl Fn(git2::Error) -> OrchestratorError {
    let (dir, op) = (dir.to_path_buf(), op.to_string());
    move |e| OrchestratorError::Git {
        dir: dir.clone(),
        args: format!("{op} (libgit2)"),
        message: e.message().to_string(),
    }
}

/// Opens exactly `gitdir` (the project's `.git`, or a worktree's admin directory), never searching
/// upwards.
pub(super) fn open(gitdir: &Path) -> std::result::Result<Repository, git2::Error> {
    Repository::open_ext(
        gitdir,
        RepositoryOpenFlags::NO_SEARCH,
        std::iter::empty::<&std::ffi::OsStr>(),
    )
}

/// The commit `rev` names, if it names one.
pub(super) fn resolve(repo: &Repository, rev: &str) -> Option<Oid> {
    repo.revparse_single(rev)
        .and_then(|o| o.peel_to_commit())
        .map(|c| c.id())
        .ok()
}

/// `git merge-base --is-ancestor a b`.
pub(super) fn is_ancestor(repo: &Repository, a: Oid, b: Oid) -> Result<bool, git2::Error> {
    Ok(a == b || repo.graph_descendant_of(b, a)?)
}

/// Who commits: the repository's configured identity, else `metash <metash@localhost>` (as the
/// CLI path does).
pub(super) fn signature(repo: &Repository) -> Result<Signature<'static>, git2::Error> {
    match repo.signature() {
        Ok(s) => Ok(s.to_owned()),
        Err(_) => Signature::now("metash", "metash@localhost"),
    }
}

fn outside_meta(path: &Path) -> bool {
    !path.starts_with(META)
}

/// `git add -A -- . ':(exclude).meta'` then a commit if anything is staged; the new commit.
/// `kept_out(workdir, path)` says what is never added: not only `.meta`, but any `.git`/`.meta`
/// look-alike, nested repository or link out (the caller passes `guard::kept_out`).
pub(super) fn commit_all(
    repo: &Repository,
    message: &str,
    kept_out: fn(Option<&Path>, &Path) -> bool,
) -> Result<Option<Oid>, git2::Error> {
    let mut index = repo.index()?;
    let workdir = repo.workdir().map(Path::to_path_buf);
    let mut skip_meta = |path: &Path, _: &[u8]| i32::from(kept_out(workdir.as_deref(), path));
    index.add_all(["*"], IndexAddOption::DEFAULT, Some(&mut skip_meta))?;
    index.update_all(["*"], Some(&mut skip_meta))?;
    index.write()?;
    let tree_id = index.write_tree()?;
    let head = repo.head()?.peel_to_commit()?;
    if head.tree_id() == tree_id {
        return Ok(None);
    }
    let tree = repo.find_tree(tree_id)?;
    let sig = signature(repo)?;
    repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &[&head])
        .map(Some)
}

/// Merges `theirs` into the branch checked out in `repo`'s worktree with a merge commit (never a
/// fast-forward). `Ok(None)` when it would conflict: nothing was changed, and the caller lets the
/// CLI make the merge a person finishes. A merge that is not needed (already contained) makes no
/// commit, as `git merge` says "Already up to date".
///
/// The working tree and index are brought to the merged tree before the branch moves: killed in
/// between, the next run finds the merge's files as local changes of `HEAD` and puts them back
/// (`Git::undo_interrupted_merge`), as after a killed `git merge`.
pub(super) fn merge_clean(
    repo: &Repository,
    theirs: Oid,
    message: &str,
) -> Result<Option<()>, git2::Error> {
    let head_ref = repo.head()?;
    let ours = head_ref.peel_to_commit()?;
    if is_ancestor(repo, theirs, ours.id())? {
        return Ok(Some(()));
    }
    let their_commit = repo.find_commit(theirs)?;
    let mut index = repo.merge_commits(&ours, &their_commit, Some(&MergeOptions::new()))?;
    if index.has_conflicts() {
        return Ok(None);
    }
    let tree = repo.find_tree(index.write_tree_to(repo)?)?;
    // Files with local changes that the merge would overwrite make the checkout refuse: the
    // caller found none (other local changes are left alone), so a refusal is an error.
    repo.checkout_tree(tree.as_object(), Some(CheckoutBuilder::new().safe()))?;
    let sig = signature(repo)?;
    let commit = repo.commit(None, &sig, &sig, message, &tree, &[&ours, &their_commit])?;
    match head_ref.name() {
        Some(name) if head_ref.is_branch() => {
            repo.reference(name, commit, true, message)?;
        }
        _ => repo.set_head_detached(commit)?,
    }
    Ok(Some(()))
}

/// Paths (outside `.meta`) that differ from `HEAD` in the index or the working tree, untracked
/// files included: `git status --porcelain --untracked-files=all`'s paths.
pub(super) fn dirty_paths(repo: &Repository) -> Result<Vec<String>, git2::Error> {
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .renames_head_to_index(false)
        .renames_index_to_workdir(false);
    let statuses = repo.statuses(Some(&mut opts))?;
    Ok(statuses
        .iter()
        .filter_map(|e| e.path().map(str::to_string))
        .filter(|p| outside_meta(Path::new(p)))
        .collect())
}

/// Paths changed between the merge base of `HEAD` and `rev`, and `rev` (`git diff --name-only
/// HEAD...rev`).
pub(super) fn touched_by(repo: &Repository, rev: Oid) -> Result<Vec<String>, git2::Error> {
    let head = repo.head()?.peel_to_commit()?.id();
    let base = repo.find_commit(repo.merge_base(head, rev)?)?.tree()?;
    let theirs = repo.find_commit(rev)?.tree()?;
    let diff = repo.diff_tree_to_tree(Some(&base), Some(&theirs), None)?;
    Ok(diff
        .deltas()
        .flat_map(|d| [d.old_file().path(), d.new_file().path()])
        .flatten()
        .map(|p| p.to_string_lossy().into_owned())
        .collect())
}

/// Adds the worktree `path` named `name` on `branch`, creating the branch at `base` when it does
/// not exist.
pub(super) fn add_worktree(
    repo: &Repository,
    name: &str,
    path: &Path,
    branch: &str,
    base: &str,
) -> Result<(), git2::Error> {
    let reference = match repo.find_branch(branch, git2::BranchType::Local) {
        Ok(b) => b.into_reference(),
        Err(_) => {
            let at = repo.revparse_single(base)?.peel_to_commit()?;
            repo.branch(branch, &at, false)?.into_reference()
        }
    };
    let mut opts = git2::WorktreeAddOptions::new();
    opts.reference(Some(&reference));
    repo.worktree(name, path, Some(&opts))?;
    Ok(())
}

/// Removes the worktree whose admin directory is `admin`, with its working tree.
pub(super) fn remove_worktree(repo: &Repository, admin: &Path) -> Result<(), git2::Error> {
    let name = admin
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let wt = repo.find_worktree(&name)?;
    let mut opts = git2::WorktreePruneOptions::new();
    opts.valid(true).working_tree(true).locked(false);
    wt.prune(Some(&mut opts))
}

/// The admin directory name git gives a worktree at `path` (its last component).
pub(super) fn worktree_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "worktree".into())
}

/// Whether the configuration git reads for `repo` (system, global, the repository's, with their
/// includes) names a filter driver (`filter.<name>.clean`, `.smudge` or `.process`): libgit2
/// runs no external filter, so where one is configured the work tree is written and read through
/// the git CLI. An unreadable configuration counts as one (the CLI is always right).
pub(super) fn configures_filters(repo: &Repository) -> bool {
    let Ok(config) = repo.config().and_then(|mut c| c.snapshot()) else {
        return true;
    };
    let Ok(mut entries) = config.entries(None) else {
        return true;
    };
    while let Some(entry) = entries.next() {
        let Ok(entry) = entry else {
            return true;
        };
        let name = entry.name().unwrap_or_default().to_ascii_lowercase();
        if name.starts_with("filter.")
            && [".clean", ".smudge", ".process"]
                .iter()
                .any(|s| name.ends_with(s))
        {
            return true;
        }
    }
    false
}

/// Whether the repository asks for a filter anywhere: `filter=` in `info/attributes`, in the
/// file `core.attributesFile` names, or in a `.gitattributes` of `HEAD`'s tree. A filter driver
/// configured for the whole system (Debian's git-lfs package installs one in /etc/gitconfig) says
/// nothing about a repository that tracks no file through it, and libgit2 writes such a
/// repository's files exactly as git does. Read once per run; a `.gitattributes` an executor adds
/// sends that commit to the CLI (`touches_attributes`).
pub(super) fn uses_filters(repo: &Repository) -> bool {
    let mentions = |bytes: &[u8]| bytes.windows(7).any(|w| w == b"filter=");
    let info = repo.path().join("info").join("attributes");
    if std::fs::read(&info).is_ok_and(|b| mentions(&b)) {
        return true;
    }
    let global = repo
        .config()
        .and_then(|c| c.get_path("core.attributesFile"))
        .ok();
    if global.is_some_and(|p| std::fs::read(p).is_ok_and(|b| mentions(&b))) {
        return true;
    }
    let Ok(tree) = repo.head().and_then(|h| h.peel_to_tree()) else {
        return false;
    };
    let mut found = false;
    let _ = tree.walk(git2::TreeWalkMode::PreOrder, |_, entry| {
        if entry.name() == Some(".gitattributes") {
            found = repo
                .find_blob(entry.id())
                .is_ok_and(|b| mentions(b.content()));
        }
        if found {
            git2::TreeWalkResult::Abort
        } else {
            git2::TreeWalkResult::Ok
        }
    });
    found
}

/// Whether a `.gitattributes` file differs from `HEAD` in the work tree or index: a commit that
/// adds or changes one may change which files go through a filter, so it is made by the CLI.
pub(super) fn touches_attributes(repo: &Repository) -> bool {
    dirty_paths(repo).map_or(true, |paths| {
        paths.iter().any(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n == ".gitattributes")
        })
    })
}

/// The project's `.git` directory, when it is one (not a file pointing elsewhere).
pub(super) fn project_gitdir(root: &Path) -> Option<PathBuf> {
    let g = root.join(".git");
    g.is_dir().then_some(g)
}

/// The file in the project's `.git` that says an in-process merge into the project's checkout
/// is underway; removed when it ends (dropped), left by a run killed mid-merge.
const MERGING: &str = "metash-merging";

/// What the marker says once a run has cleared the cut-short merge's locks.
const CLEARED: &str = "locks cleared";

/// Present while an in-process merge into the project's own checkout runs.
pub(super) struct MergeMarker(PathBuf);

impl MergeMarker {
    pub(super) fn set(gitdir: &Path) -> std::io::Result<Self> {
        let path = gitdir.join(MERGING);
        std::fs::write(&path, std::process::id().to_string())?;
        Ok(Self(path))
    }
}

impl Drop for MergeMarker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The locks a merge into the checked-out branch takes: the index, `HEAD`, the branch's ref and
/// reflog, packed refs.
fn merge_locks(gitdir: &Path) -> Vec<PathBuf> {
    let mut locks = vec![
        gitdir.join("index.lock"),
        gitdir.join("HEAD.lock"),
        gitdir.join("packed-refs.lock"),
    ];
    if let Ok(head) = std::fs::read_to_string(gitdir.join("HEAD")) {
        if let Some(r) = head.trim().strip_prefix("ref: ") {
            if !r.contains("..") {
                locks.push(gitdir.join(format!("{r}.lock")));
                locks.push(gitdir.join("logs").join(format!("{r}.lock")));
            }
        }
    }
    locks
}

/// Lock files (`*.lock`) under `gitdir/refs/heads/metash/` and in the admin directories of
/// worktrees that live under `ours` (metash's task worktrees), and, when a run was killed during
/// an in-process merge into the project's checkout (its marker is there), the locks that merge
/// takes: what an in-process operation killed mid-write leaves behind. A git process would have
/// finished on its own; a thread cannot.
/// Also says whether the marker was there (a merge into the checkout was cut short: its files may
/// be half written). The marker stays until the next merge into the checkout, which first puts
/// back what the cut-short one wrote (`Git::undo_interrupted_merge`) and then replaces and removes
/// it: a run killed before that leaves the checkout as dirty as it found it, and the marker still
/// says why. Its locks are cleared once (the marker then says [`CLEARED`]).
pub(super) fn clear_stale_locks(gitdir: &Path, ours: &Path) -> (Vec<PathBuf>, bool) {
    let mut locks = Vec::new();
    let marker = gitdir.join(MERGING);
    let interrupted = marker.exists();
    if interrupted && !std::fs::read_to_string(&marker).is_ok_and(|t| t == CLEARED) {
        locks.extend(merge_locks(gitdir).into_iter().filter(|l| l.exists()));
        let _ = std::fs::write(&marker, CLEARED);
    }
    collect_locks(&gitdir.join("refs/heads/metash"), &mut locks);
    if let Ok(admins) = std::fs::read_dir(gitdir.join("worktrees")) {
        for admin in admins.flatten().map(|e| e.path()) {
            let mine = std::fs::read_to_string(admin.join("gitdir"))
                .is_ok_and(|g| Path::new(g.trim()).starts_with(ours));
            if mine {
                if let Ok(files) = std::fs::read_dir(&admin) {
                    locks.extend(
                        files
                            .flatten()
                            .map(|e| e.path())
                            .filter(|p| p.extension().is_some_and(|x| x == "lock")),
                    );
                }
            }
        }
    }
    locks.retain(|l| std::fs::remove_file(l).is_ok());
    (locks, interrupted)
}

/// Whether `on_disk` is what writing `rev`'s version of `path` leaves when cut short: a prefix
/// of it (the empty file included).
pub(super) fn is_partial_write_of(repo: &Repository, rev: Oid, path: &str, on_disk: &[u8]) -> bool {
    let blob = repo
        .find_commit(rev)
        .and_then(|c| c.tree())
        .and_then(|t| t.get_path(Path::new(path)))
        .and_then(|e| repo.find_blob(e.id()));
    blob.is_ok_and(|b| b.content().starts_with(on_disk))
}

fn collect_locks(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_locks(&p, out);
        } else if p.extension().is_some_and(|x| x == "lock") {
            out.push(p);
        }
    }
}
