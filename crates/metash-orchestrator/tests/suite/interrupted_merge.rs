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
