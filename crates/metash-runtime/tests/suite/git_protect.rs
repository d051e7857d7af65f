//! Issue 30 part 1 at the runtime: a path of `spec.protected` (the project's `.git`) stays
//! read-only inside a writable grant, for a native agent (a read-only bind in its mount
//! namespace) and a WASM agent (the same in its view); a grant inside a hidden directory is never
//! given, except the workspace itself. Each agent proves it ran by writing a marker where it may.

use std::path::Path;

use metash_protocol::LogKind;

use super::common::*;

/// A workspace holding a `.git` directory with a config and a hooks directory.
fn with_git(f: &Fixture) -> std::path::PathBuf {
    let git = f.workspace().join(".git");
    std::fs::create_dir_all(git.join("hooks")).unwrap();
    std::fs::write(git.join("config"), "[core]\n\tbare = false\n").unwrap();
    git
}

fn unchanged(git: &Path) {
    assert_eq!(
        std::fs::read_to_string(git.join("config")).unwrap(),
        "[core]\n\tbare = false\n"
    );
    assert!(!git.join("hooks/pre-commit").exists());
}

#[test]
fn a_native_agent_with_files_write_cannot_write_protected_git() {
    require_native!();
    let f = Fixture::new();
    let git = with_git(&f);
    let ws = f.workspace();
    let at = |rel: &str| ws.join(rel).display().to_string();
    for (i, (what, want)) in [
        (format!("write {}", at("marker.txt")), "WRITE-OK"),
        (
            format!("write {}", at(".git/config")),
            "write: Read-only file system",
        ),
        (
            format!("write {}", at(".git/hooks/pre-commit")),
            "write: Read-only file system",
        ),
    ]
    .iter()
    .enumerate()
    {
        let id = format!("n-git-{i}");
        let mut spec = f.native(&id, &["files.read", "files.write"], None);
        spec.protected = vec![git.clone()];
        let mut a = f.start(spec);
        let (_, ev) = run(&mut a, what);
        assert!(text(&ev).starts_with(want), "{what}: {}", text(&ev));
    }
    assert_eq!(std::fs::read(ws.join("marker.txt")).unwrap(), b"pwned");
    unchanged(&git);
    let started = f.events("n-git-1", LogKind::AgentStarted);
    let protected = &started[0].data["protected"];
    assert_eq!(protected["via"], "mount-namespace", "{protected}");
    let canonical = git.canonicalize().unwrap().display().to_string();
    assert_eq!(protected["paths"][0], canonical.as_str(), "{protected}");
}

#[test]
fn a_wasm_agent_with_files_write_cannot_write_protected_git() {
    let f = Fixture::new();
    let git = with_git(&f);
    for (i, (path, want)) in [
        ("marker.txt", "OK"),
        (".git/config", "the sandbox refused"),
        (".git/hooks/pre-commit", "the sandbox refused"),
    ]
    .iter()
    .enumerate()
    {
        let id = format!("w-git-{i}");
        let mut spec = f.wasm(
            &id,
            &wat_open(path, true),
            &["files.read", "files.write"],
            None,
        );
        spec.protected = vec![git.clone()];
        let mut a = f.start(spec);
        let (_, ev) = run(&mut a, "go");
        assert_eq!(text(&ev), *want, "{path}");
    }
    assert!(f.workspace().join("marker.txt").exists());
    unchanged(&git);
    let started = f.events("w-git-1", LogKind::AgentStarted);
    let protected = &started[0].data["protected"];
    assert_eq!(protected["paths"][0], "/workspace/.git", "{protected}");
}

/// A grant inside a hidden directory is refused; the workspace itself may lie there (a task
/// worktree the host made under `.meta/worktrees/`).
#[test]
fn a_grant_inside_hidden_state_is_refused_but_the_workspace_may_be_there() {
    require_native!();
    let f = Fixture::new();
    let meta = f.workspace().join(".meta");
    let wt = meta.join("worktrees/t1");
    std::fs::create_dir_all(&wt).unwrap();
    std::fs::write(meta.join("consent.json"), SECRET).unwrap();
    let mut spec = f.native("n-inside", &["files.read"], None);
    spec.hidden = vec![meta.clone()];
    spec.paths = vec![metash_runtime::PathAccess {
        path: meta.join("consent.json"),
        write: false,
    }];
    let err =
        f.rt.register(spec)
            .and_then(|mut a| a.start())
            .expect_err("a grant inside .meta must be refused");
    assert!(err.to_string().contains("metash's own state"), "{err}");
    // The workspace in `.meta/worktrees/t1` runs, and reads nothing above it.
    let mut spec = f.native("n-worktree", &["files.read", "files.write"], None);
    spec.workspace = wt.clone();
    spec.hidden = vec![meta.clone()];
    let mut a = f.start(spec);
    let (_, ev) = run(&mut a, &format!("write {}", wt.join("m").display()));
    assert_eq!(text(&ev), "WRITE-OK");
    let (_, ev) = run(
        &mut a,
        &format!("read {}", meta.join("consent.json").display()),
    );
    assert!(!text(&ev).contains(SECRET), "{}", text(&ev));
}

/// A protected path that is a symlink inside a writable grant cannot be kept read-only (the link
/// could be replaced): the agent does not start.
#[test]
fn a_symlinked_protected_path_in_a_writable_grant_is_refused() {
    require_native!();
    let f = Fixture::new();
    let real = f.dir.path().join("real-git");
    std::fs::create_dir_all(&real).unwrap();
    std::os::unix::fs::symlink(&real, f.workspace().join(".git")).unwrap();
    let mut spec = f.native("n-link", &["files.read", "files.write"], None);
    spec.protected = vec![f.workspace().join(".git")];
    let err =
        f.rt.register(spec)
            .and_then(|mut a| a.start())
            .expect_err("a symlinked .git in a writable grant must be refused");
    assert!(err.to_string().contains("symlink"), "{err}");
}
