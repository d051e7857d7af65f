//! Each bad input is a clear error, and every file under `.meta/` is unchanged byte for byte.

use metash_store::{Store, StoreError};
use serde_json::json;

use super::common::{project, snapshot};

fn refused(store: &Store, ws: &std::path::Path, key: &str, value: serde_json::Value) -> StoreError {
    let before = snapshot(ws);
    let err = store.update_state(key, value).unwrap_err();
    assert_eq!(
        snapshot(ws),
        before,
        "{key}: files changed by a refused update"
    );
    err
}

fn with_plan(store: &Store) {
    store
        .update_state(
            "plan",
            json!({"currentTaskIdx": 0, "tasks": [
                {"id": "01", "title": "a", "status": "pending", "dependencies": []}
            ]}),
        )
        .unwrap();
}

#[test]
fn status_outside_the_enum() {
    let (dir, store) = project();
    let err = refused(&store, dir.path(), "status", json!("paused"));
    assert!(matches!(err, StoreError::InvalidValue { .. }));
    assert!(err.to_string().contains("paused"), "{err}");
}

#[test]
fn wrong_type() {
    let (dir, store) = project();
    let err = refused(&store, dir.path(), "gapCount", json!("three"));
    assert!(err.to_string().contains("gapCount"), "{err}");
    let err = refused(&store, dir.path(), "variables", json!([1, 2]));
    assert!(matches!(err, StoreError::InvalidValue { .. }), "{err}");
}

#[test]
fn unknown_key_paths() {
    let (dir, store) = project();
    for key in [
        "nope",
        "plan.tasks.01.status",
        "status.inner",
        "",
        "variables..x",
        "revision",
        "sessionId",
    ] {
        let err = refused(&store, dir.path(), key, json!(1));
        assert!(matches!(err, StoreError::UnknownKey { .. }), "{key}: {err}");
    }
}

#[test]
fn task_that_does_not_exist_and_missing_dependency() {
    let (dir, store) = project();
    with_plan(&store);
    let err = refused(
        &store,
        dir.path(),
        "plan.tasks.07.status",
        json!("complete"),
    );
    assert!(err.to_string().contains("no task with id `07`"), "{err}");
    let err = refused(
        &store,
        dir.path(),
        "plan.tasks.01.dependencies",
        json!(["99"]),
    );
    assert!(err.to_string().contains("missing task `99`"), "{err}");
    let err = refused(
        &store,
        dir.path(),
        "plan.tasks",
        json!([
            {"id": "01", "title": "a", "status": "pending", "dependencies": []},
            {"id": "01", "title": "b", "status": "pending", "dependencies": []}
        ]),
    );
    assert!(err.to_string().contains("duplicate task id"), "{err}");
    let err = refused(&store, dir.path(), "plan.tasks.01.status", json!("done"));
    assert!(matches!(err, StoreError::InvalidValue { .. }), "{err}");
}

#[test]
fn changed_context_stops_every_command() {
    let (dir, store) = project();
    let ctx = dir.path().join(".meta/context.md");
    std::fs::write(&ctx, "# Project: edited\n").unwrap();
    let err = refused(&store, dir.path(), "variables.x", json!(1));
    assert!(matches!(err, StoreError::ContextChanged { .. }), "{err}");
    assert!(err.to_string().contains("context.md changed"), "{err}");
    assert!(matches!(
        Store::open(dir.path()),
        Err(StoreError::ContextChanged { .. })
    ));
}

#[test]
fn unparseable_session_file_is_never_overwritten() {
    let (dir, store) = project();
    store.update_state("variables.x", json!(1)).unwrap();
    let path = dir.path().join(".meta/session.json");
    let good = std::fs::read_to_string(&path).unwrap();
    let broken = good.replacen("\"status\": \"planning\"", "\"status\": planning", 1);
    assert_ne!(broken, good);
    std::fs::write(&path, &broken).unwrap();
    let err = refused(&store, dir.path(), "variables.x", json!(2));
    let msg = err.to_string();
    assert!(
        matches!(err, StoreError::BadSessionFile { line, .. } if line > 1),
        "{msg}"
    );
    assert!(
        msg.contains("session.json") && msg.contains("metash state rebuild"),
        "{msg}"
    );

    // The way out: rebuild from the log, keeping the bad file aside.
    let state = store.rebuild_and_save().unwrap();
    assert_eq!(state.variables["x"], json!(1));
    let kept: Vec<_> = std::fs::read_dir(dir.path().join(".meta"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("session.json.bad-")
        })
        .collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(std::fs::read_to_string(kept[0].path()).unwrap(), broken);
}

#[test]
fn session_file_that_does_not_match_the_schema_is_never_overwritten() {
    let (dir, store) = project();
    let path = dir.path().join(".meta/session.json");
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, good.replacen("\"planning\"", "\"sleeping\"", 1)).unwrap();
    let err = refused(&store, dir.path(), "variables.x", json!(2));
    assert!(err.to_string().contains("sleeping"), "{err}");
    let line = good.lines().position(|l| l.contains("\"status\"")).unwrap() + 1;
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("session.json:{line}:")),
        "names line {line}: {msg}"
    );
    assert_eq!(
        msg.matches("line").count(),
        0,
        "position given once, as file:line:col: {msg}"
    );
}

/// A full disk: a 64 KiB tmpfs mounted for the test (skips, saying why, where mounting is not
/// allowed).
#[test]
fn full_disk_is_a_clear_error_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&mnt)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        metash_testkit::skip(
            "full_disk_is_a_clear_error_and_loses_nothing",
            "cannot mount a tmpfs here",
        );
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let store = Store::init(&mnt, Some("# small\n")).unwrap();
    store.update_state("variables.small", json!(1)).unwrap();
    // Grow one value until the disk is full: on the way the log append or the session.json write
    // (the two halves of an update) runs out of space first; either way nothing may change.
    let mut failures = 0;
    for kib in 1..200 {
        let before = snapshot(&mnt);
        let state_before = store.state().unwrap();
        match store.update_state("variables.big", json!("x".repeat(kib * 1024))) {
            Ok(_) => continue,
            Err(err) => {
                assert!(matches!(err, StoreError::DiskFull { .. }), "{err}");
                assert!(err.to_string().contains("disk full"), "{err}");
                assert_eq!(
                    snapshot(&mnt),
                    before,
                    "a failed write at {kib} KiB left something behind"
                );
                let reopened = Store::open(&mnt).unwrap();
                assert_eq!(
                    reopened.state().unwrap(),
                    state_before,
                    "recovery applied a failed write"
                );
                assert_eq!(reopened.rebuild().unwrap(), state_before);
                failures += 1;
                if failures == 5 {
                    break;
                }
            }
        }
    }
    assert!(failures > 0, "the 64 KiB disk never filled");
    store.log().verify().unwrap();
}
