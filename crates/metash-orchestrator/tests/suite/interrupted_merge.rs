//! A run killed while git was writing a merge leaves the project's tree half-merged (no
//! `MERGE_HEAD`): the next merge puts back exactly what that merge wrote and merges again, while
//! anybody's own local changes are never touched (a change to a file the merge writes is returned
//! for a person; a change elsewhere does not stop the merge).

use metash_orchestrator::git::{Git, Merge};

use super::common::git;

/// A repository whose `task` branch changes `bye.txt` and adds `new.txt`.
fn repo() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    git(d, &["init", "-q", "-b", "main"]);
    std::fs::write(d.join("bye.txt"), "bye\n").unwrap();
    std::fs::write(d.join("keep.txt"), "keep\n").unwrap();
    git(d, &["add", "-A"]);
    git(d, &["commit", "-q", "-m", "base"]);
    git(d, &["checkout", "-q", "-b", "task"]);
    std::fs::write(d.join("bye.txt"), "bye from the task\n").unwrap();
    std::fs::write(d.join("new.txt"), "new\n").unwrap();
    git(d, &["add", "-A"]);
    git(d, &["commit", "-q", "-m", "task"]);
    git(d, &["checkout", "-q", "main"]);
    t
}

#[test]
fn what_an_interrupted_merge_wrote_is_undone_and_the_merge_goes_through() {
    let t = repo();
    let d = t.path();
    // What git had written when it was killed: one file updated in tree and index, one added.
    std::fs::write(d.join("bye.txt"), "bye from the task\n").unwrap();
    std::fs::write(d.join("new.txt"), "new\n").unwrap();
    git(d, &["add", "bye.txt"]);
    // Somebody's unrelated work, which must survive and must not block.
    std::fs::write(d.join("keep.txt"), "my edit\n").unwrap();
    std::fs::write(d.join("notes.txt"), "mine\n").unwrap();

    let g = Git::new(d);
    assert!(g.undo_interrupted_merge(d, "task").unwrap().is_empty());
    assert_eq!(std::fs::read_to_string(d.join("bye.txt")).unwrap(), "bye\n");
    assert!(!d.join("new.txt").exists());
    assert!(matches!(
        g.merge(d, "task", "merge task").unwrap(),
        Merge::Clean
    ));
    assert_eq!(
        std::fs::read_to_string(d.join("bye.txt")).unwrap(),
        "bye from the task\n"
    );
    assert_eq!(
        std::fs::read_to_string(d.join("keep.txt")).unwrap(),
        "my edit\n"
    );
    assert_eq!(
        std::fs::read_to_string(d.join("notes.txt")).unwrap(),
        "mine\n"
    );
}

#[test]
fn somebodys_change_to_a_file_the_merge_writes_is_left_alone_and_named() {
    let t = repo();
    let d = t.path();
    std::fs::write(d.join("bye.txt"), "my own edit\n").unwrap();
    let g = Git::new(d);
    assert_eq!(
        g.undo_interrupted_merge(d, "task").unwrap(),
        vec!["bye.txt".to_string()]
    );
    assert_eq!(
        std::fs::read_to_string(d.join("bye.txt")).unwrap(),
        "my own edit\n"
    );
}

#[test]
fn a_clean_tree_is_not_touched() {
    let t = repo();
    let d = t.path();
    let head = git(d, &["rev-parse", "HEAD"]);
    let g = Git::new(d);
    assert!(g.undo_interrupted_merge(d, "task").unwrap().is_empty());
    assert_eq!(git(d, &["rev-parse", "HEAD"]), head);
    assert_eq!(git(d, &["status", "--porcelain"]), "");
}

/// The in-process merge into the project's checkout makes a merge commit with both parents,
/// updates tree and index, and leaves nothing behind (no marker, no lock).
#[test]
fn an_in_process_merge_commits_both_parents_and_leaves_no_marker() {
    let t = repo();
    let d = t.path();
    let main = git(d, &["rev-parse", "HEAD"]);
    let task = git(d, &["rev-parse", "task"]);
    let g = Git::new(d);
    assert!(matches!(
        g.merge(d, "task", "merge task").unwrap(),
        Merge::Clean
    ));
    assert_eq!(
        git(d, &["rev-parse", "HEAD^1", "HEAD^2"]),
        format!("{main}\n{task}")
    );
    assert_eq!(git(d, &["log", "-1", "--format=%s"]), "merge task");
    assert_eq!(
        git(d, &["status", "--porcelain"]),
        "",
        "tree and index match"
    );
    assert_eq!(std::fs::read_to_string(d.join("new.txt")).unwrap(), "new\n");
    assert!(!d.join(".git/metash-merging").exists());
    assert!(!d.join(".git/index.lock").exists());
}

/// A run killed during an in-process merge into the project's checkout leaves its marker and
/// locks: the next run removes exactly those. Without the marker, a lock in the project's `.git`
/// (somebody's git at work) is never touched; locks in metash's own branches always go.
#[test]
fn locks_a_killed_in_process_merge_left_are_cleared_only_with_its_marker() {
    let t = repo();
    let d = t.path();
    git(d, &["branch", "metash/task/a"]);
    let lock = |p: &str| {
        let p = d.join(".git").join(p);
        std::fs::write(&p, "").unwrap();
        p
    };
    let ours = lock("refs/heads/metash/task/a.lock");
    let index = lock("index.lock");
    let branch = lock("refs/heads/main.lock");
    let g = Git::new(d);
    assert_eq!(g.clear_stale_locks(), vec![ours.clone()]);
    assert!(
        index.exists() && branch.exists(),
        "not ours without the marker"
    );
    std::fs::write(d.join(".git/metash-merging"), "1").unwrap();
    let mut cleared = g.clear_stale_locks();
    cleared.sort();
    assert_eq!(cleared, vec![index.clone(), branch.clone()]);
    assert!(!index.exists() && !branch.exists());
    // The marker stays until the next merge into the checkout (which undoes what it left).
    assert!(d.join(".git/metash-merging").exists());
    // The merge then goes through.
    assert!(matches!(
        g.merge(d, "task", "merge task").unwrap(),
        Merge::Clean
    ));
    assert!(!d.join(".git/metash-merging").exists());
}

/// `commit_all` (in-process) is `git add -A` outside `.meta` and a commit: new files, dotfiles
/// and files in new directories included, deletions recorded, ignored files and `.meta` left out;
/// nothing to commit is `None`.
#[test]
fn commit_all_takes_everything_but_meta_and_ignored_files() {
    let t = repo();
    let d = t.path();
    let g = Git::new(d);
    assert_eq!(g.commit_all(d, "nothing").unwrap(), None);
    std::fs::write(d.join(".gitignore"), "*.log\n").unwrap();
    std::fs::write(d.join(".hidden"), "h\n").unwrap();
    std::fs::create_dir_all(d.join("deep/er")).unwrap();
    std::fs::write(d.join("deep/er/x.txt"), "x\n").unwrap();
    std::fs::write(d.join("noise.log"), "n\n").unwrap();
    std::fs::create_dir_all(d.join(".meta")).unwrap();
    std::fs::write(d.join(".meta/session.json"), "{}").unwrap();
    std::fs::remove_file(d.join("keep.txt")).unwrap();
    let sha = g.commit_all(d, "work").unwrap().expect("a commit");
    assert_eq!(git(d, &["rev-parse", "HEAD"]), sha);
    let files = git(d, &["ls-tree", "-r", "--name-only", "HEAD"]);
    assert_eq!(files, ".gitignore\n.hidden\nbye.txt\ndeep/er/x.txt");
    // The configured identity, as a `git commit` there would use; metash's own without one.
    let configured = std::process::Command::new("git")
        .args(["-C", &d.display().to_string(), "config", "user.name"])
        .output()
        .unwrap();
    let name = String::from_utf8_lossy(&configured.stdout)
        .trim()
        .to_string();
    let want = if name.is_empty() {
        "metash".to_string()
    } else {
        name
    };
    assert_eq!(
        git(d, &["log", "-1", "--format=%s%n%an"]),
        format!("work\n{want}")
    );
}

/// A run killed during an in-process merge can leave a file half written (a thread does not finish
/// the file the way a killed git process does): with the merge's marker, a prefix of the task's
/// version (the empty file included) is recognised as that merge's and undone; without it, the
/// same bytes are somebody's work and block the merge.
#[test]
fn a_half_written_file_is_undone_only_after_a_cut_short_in_process_merge() {
    for marker in [false, true] {
        let t = repo();
        let d = t.path();
        std::fs::write(d.join("new.txt"), "").unwrap();
        std::fs::write(d.join("bye.txt"), "bye fr").unwrap();
        if marker {
            std::fs::write(d.join(".git/metash-merging"), "1").unwrap();
        }
        let g = Git::new(d);
        g.clear_stale_locks();
        let blocking = g.undo_interrupted_merge(d, "task").unwrap();
        if marker {
            assert!(blocking.is_empty(), "{blocking:?}");
            assert!(matches!(
                g.merge(d, "task", "merge task").unwrap(),
                Merge::Clean
            ));
            assert_eq!(
                std::fs::read_to_string(d.join("bye.txt")).unwrap(),
                "bye from the task\n"
            );
        } else {
            let mut blocking = blocking;
            blocking.sort();
            assert_eq!(blocking, vec!["bye.txt".to_string(), "new.txt".to_string()]);
            assert_eq!(
                std::fs::read_to_string(d.join("bye.txt")).unwrap(),
                "bye fr"
            );
        }
    }
}
