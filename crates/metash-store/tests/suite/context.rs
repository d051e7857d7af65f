//! Issue 32: the owner changes the context explicitly (`Store::set_context`): recorded in the
//! log with both hashes and the diff, refused under a run and over an edit made behind metash's
//! back, crash-safe between the file and store.json; a relative workspace is made absolute.

use metash_store::{Store, StoreError, RUN_LOCK};

use super::common::project;

#[test]
fn a_context_change_is_installed_and_logged_with_its_diff() {
    let (dir, store) = project();
    let change = store
        .set_context("# Project: test\n\n## Vision\n\nGreetings.\n")
        .unwrap();
    assert_ne!(change.old_sha256, change.new_sha256);
    assert!(change.diff.contains("+Greetings."), "{}", change.diff);
    // Every later open accepts the new file and reads it.
    let again = Store::open(dir.path()).unwrap();
    assert!(again.context().unwrap().contains("Greetings."));
    let rec = again
        .log()
        .read_all()
        .unwrap()
        .into_iter()
        .find(|r| r.kind == "context_changed")
        .expect("context_changed logged");
    assert_eq!(rec.data["new_sha256"], change.new_sha256.as_str());
    assert_eq!(rec.data["old_sha256"], change.old_sha256.as_str());
    again.log().verify().unwrap();
    // The same text again changes nothing and logs nothing.
    let n = again.log().read_all().unwrap().len();
    let same = again.set_context(&again.context().unwrap()).unwrap();
    assert_eq!(same.old_sha256, same.new_sha256);
    assert_eq!(again.log().read_all().unwrap().len(), n);
}

#[test]
fn an_edit_behind_metashs_back_is_still_refused_and_not_built_on() {
    let (dir, store) = project();
    let path = dir.path().join(".meta/context.md");
    std::fs::write(&path, "# edited by hand\n").unwrap();
    let err = store.set_context("# new\n").unwrap_err();
    assert!(matches!(err, StoreError::ContextChanged { .. }), "{err}");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "# edited by hand\n"
    );
    assert!(Store::open(dir.path()).is_err());
}

#[test]
fn no_change_while_a_run_holds_the_run_lock() {
    let (dir, store) = project();
    let run = metash_store::lock::acquire(
        &dir.path().join(".meta").join(RUN_LOCK),
        std::time::Duration::from_secs(1),
    )
    .unwrap();
    let err = store.set_context("# new\n").unwrap_err();
    assert!(matches!(err, StoreError::Busy(_)), "{err}");
    assert!(err.to_string().contains("run"), "{err}");
    drop(run);
    store.set_context("# new\n").unwrap();
}

#[test]
fn a_change_cut_short_after_the_file_was_written_is_finished_on_open() {
    let (dir, store) = project();
    let meta = dir.path().join(".meta");
    let old = std::fs::read(meta.join("store.json")).unwrap();
    let new_sha = store.set_context("# second\n").unwrap().new_sha256;
    // As if killed between replacing context.md and recording its hash: store.json still names
    // the old hash, with the new one coming.
    let mut doc: serde_json::Value = serde_json::from_slice(&old).unwrap();
    doc["context_next_sha256"] = new_sha.clone().into();
    std::fs::write(meta.join("store.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
    // Opened: the new file is taken, and store.json records it.
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.context().unwrap(), "# second\n");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(meta.join("store.json")).unwrap()).unwrap();
    assert_eq!(doc["context_sha256"], new_sha.as_str());
    assert!(doc.get("context_next_sha256").is_none(), "{doc}");
    // Cut short before the file was written: the old file, still accepted.
    let (dir2, store2) = project();
    let meta2 = dir2.path().join(".meta");
    let mut doc2: serde_json::Value =
        serde_json::from_slice(&std::fs::read(meta2.join("store.json")).unwrap()).unwrap();
    doc2["context_next_sha256"] = "0".repeat(64).into();
    std::fs::write(meta2.join("store.json"), serde_json::to_vec(&doc2).unwrap()).unwrap();
    drop(store2);
    assert_eq!(
        Store::open(dir2.path()).unwrap().context().unwrap(),
        "# Project: test\n"
    );
}

#[test]
fn init_ignores_runtime_state_and_keeps_what_people_write() {
    let dir = tempfile::tempdir().unwrap();
    let ok = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ok(&["init", "-q"]);
    let store = Store::init(dir.path(), None).unwrap();
    store
        .update_state("variables.x", serde_json::json!(1))
        .unwrap();
    std::fs::write(dir.path().join(".meta/config.toml"), "").unwrap();
    std::fs::create_dir_all(dir.path().join(".meta/agents/a")).unwrap();
    std::fs::write(dir.path().join(".meta/agents/a/manifest.toml"), "").unwrap();
    std::fs::create_dir_all(dir.path().join(".meta/worktrees/t1")).unwrap();
    std::fs::write(dir.path().join(".meta/worktrees/t1/f"), "").unwrap();
    let status = ok(&["status", "--porcelain", "--untracked-files=all"]);
    let mut seen: Vec<&str> = status.lines().collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        [
            "?? .meta/.gitignore",
            "?? .meta/agents/a/manifest.toml",
            "?? .meta/config.toml",
            "?? .meta/context.md",
        ]
    );
}

#[test]
fn a_relative_workspace_is_made_absolute() {
    let dir = tempfile::tempdir().unwrap();
    Store::init(dir.path(), None).unwrap();
    let cwd = std::env::current_dir().unwrap();
    let rel = pathdiff(dir.path(), &cwd);
    let store = Store::open(&rel).unwrap();
    assert!(
        store.workspace().is_absolute(),
        "{}",
        store.workspace().display()
    );
    assert!(store.meta_dir().is_absolute());
}

/// `target` relative to `base` (`..` as needed).
fn pathdiff(target: &std::path::Path, base: &std::path::Path) -> std::path::PathBuf {
    let up = base.components().count() - 1;
    let mut p = std::path::PathBuf::new();
    for _ in 0..up {
        p.push("..");
    }
    p.join(target.strip_prefix("/").unwrap())
}
