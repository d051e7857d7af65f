//! Where a project's git metadata is, found only from what no agent can write: the project's own
//! `.git` directory (kept read-only for every agent). A linked worktree's `.git` file names its
//! admin directory, but the agent working there can rewrite it (`gitdir: ~/.ssh`,
//! `commondir` = `/etc`), so it is never read to decide anything: the admin directory is the one
//! whose `gitdir` back-pointer in `<project>/.git/worktrees/` names the worktree, and the common
//! directory is the project's `.git` itself. Shared by the host (what a CLI role may read) and
//! the orchestrator (where its git runs).

use std::path::{Path, PathBuf};

/// The project's common git directory: `<project>/.git` when it is a directory (`None` for a
/// project that is not a repository, or is itself a linked worktree or submodule checkout).
pub fn common_dir(project: &Path) -> Option<PathBuf> {
    let git = project.join(".git");
    git.symlink_metadata()
        .is_ok_and(|m| m.is_dir())
        .then_some(git)
}

/// The admin directory (`<project>/.git/worktrees/<name>`) of the linked worktree at `dir`, found
/// by the `gitdir` back-pointers in the project's `.git`. `None` for the project root, for a
/// directory git does not list as a worktree, and for an admin entry that resolves outside
/// `<project>/.git/worktrees/` (a symlink there).
pub fn admin_dir(project: &Path, dir: &Path) -> Option<PathBuf> {
    let dir = dir.canonicalize().ok()?;
    let project = project.canonicalize().ok()?;
    if dir == project {
        return None;
    }
    let worktrees = common_dir(&project)?
        .join("worktrees")
        .canonicalize()
        .ok()?;
    let want = dir.join(".git");
    let entries = std::fs::read_dir(&worktrees).ok()?;
    entries.flatten().map(|e| e.path()).find_map(|admin| {
        let points_here = std::fs::read_to_string(admin.join("gitdir")).is_ok_and(|g| {
            let g = PathBuf::from(g.trim());
            g == want || g.canonicalize().is_ok_and(|c| c == want)
        });
        let admin = admin.canonicalize().ok()?;
        (points_here && admin.parent() == Some(worktrees.as_path())).then_some(admin)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(ok, "git {args:?}");
    }

    #[test]
    fn the_admin_dir_comes_from_the_back_pointer_not_the_worktree_file() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().canonicalize().expect("root");
        git(&root, &["init", "-q"]);
        git(&root, &["commit", "-q", "--allow-empty", "-m", "init"]);
        let wt = root.join("wt");
        git(
            &root,
            &[
                "worktree",
                "add",
                "-q",
                "--detach",
                wt.to_str().expect("utf-8"),
            ],
        );
        let admin = admin_dir(&root, &wt).expect("admin dir");
        assert!(admin.starts_with(root.join(".git/worktrees")), "{admin:?}");
        // The worktree's own `.git` file rewritten: the answer does not move.
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).expect("dir");
        std::fs::write(
            wt.join(".git"),
            format!("gitdir: {}\n", elsewhere.display()),
        )
        .expect("rewrite");
        assert_eq!(admin_dir(&root, &wt), Some(admin));
        assert_eq!(admin_dir(&root, &root), None);
        assert_eq!(admin_dir(&root, &elsewhere), None);
        assert_eq!(common_dir(&root), Some(root.join(".git")));
    }
}
