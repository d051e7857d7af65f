//! Issue 14: the host's git in a task's worktree never takes its metadata from the worktree's
//! `.git` file, which the agent working there can rewrite. A worktree whose `.git` points at a
//! planted repository (with a clean filter that runs a program) is still committed into the
//! project's own repository, and the planted program never runs.

use metash_orchestrator::git::Git;

use super::common::{git, Project};

#[test]
fn a_rewritten_worktree_git_file_is_ignored_by_the_hosts_git() {
    let p = Project::new("");
    let g = Git::new(p.path());
    let wt = p.path().join(".meta/worktrees/t1");
    assert!(g
        .ensure_worktree(&wt, "metash/t1", "HEAD")
        .expect("worktree"));

    // The agent's plant: a repository whose config defines a filter that runs a program, and
    // the worktree's `.git` file pointing at it, with attributes applying the filter.
    let evil = tempfile::tempdir().expect("tempdir");
    let pwned = evil.path().join("pwned");
    git(evil.path(), &["init", "-q"]);
    git(
        evil.path(),
        &[
            "config",
            "filter.x.clean",
            &format!("touch {}; cat", pwned.display()),
        ],
    );
    std::fs::write(
        wt.join(".git"),
        format!("gitdir: {}\n", evil.path().join(".git").display()),
    )
    .expect("plant");
    std::fs::write(wt.join(".gitattributes"), "* filter=x\n").expect("attributes");
    std::fs::write(wt.join("work.txt"), "work\n").expect("work");

    let sha = g
        .commit_all(&wt, "metash: task t1")
        .expect("commit")
        .expect("a commit");
    assert!(!pwned.exists(), "the planted filter ran");
    // The commit is in the project's repository, on the task's branch.
    assert_eq!(git(p.path(), &["rev-parse", "metash/t1"]), sha);
    let files = git(p.path(), &["ls-tree", "--name-only", "metash/t1"]);
    assert!(files.contains("work.txt"), "{files}");
    // The planted repository got nothing.
    let planted = std::process::Command::new("git")
        .arg("-C")
        .arg(evil.path())
        .args(["rev-parse", "--verify", "-q", "HEAD"])
        .output()
        .expect("git");
    assert!(
        !planted.status.success(),
        "a commit landed in the planted repository"
    );
}
