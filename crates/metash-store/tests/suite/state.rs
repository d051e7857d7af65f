use std::time::{Duration, Instant};

use metash_store::{Store, StoreError};
use serde_json::json;

use super::common::{project, snapshot, spawn_writer};

#[test]
fn init_writes_context_session_and_first_event() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::init(dir.path(), None).unwrap();
    let ctx = store.context().unwrap();
    for section in [
        "## Vision",
        "## Tech Stack",
        "## Architecture Constraints",
        "## Current Phase Focus",
    ] {
        assert!(ctx.contains(section), "template lacks {section}");
    }
    let state = store.state().unwrap();
    assert_eq!(state.revision, 1);
    assert_eq!(state.current_phase, 1);
    let log = store.log().read_all().unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].kind, "session_init");
    assert!(matches!(
        Store::init(dir.path(), None),
        Err(StoreError::AlreadyInitialized(_))
    ));
}

#[test]
fn open_without_init_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert!(err.to_string().contains("metash init"), "{err}");
}

#[test]
fn dotted_paths_update_variables_tasks_and_commits() {
    let (_dir, store) = project();
    store
        .update_state("variables.retry.count", json!(2))
        .unwrap();
    store
        .update_state(
            "plan",
            json!({"currentTaskIdx": 0, "tasks": [
                {"id": "01", "title": "a", "status": "complete", "dependencies": []},
                {"id": "02", "title": "b", "status": "pending", "dependencies": ["01"]}
            ]}),
        )
        .unwrap();
    store
        .update_state("plan.tasks.02.status", json!("failed"))
        .unwrap();
    store
        .update_state("plan.tasks.02.commits", json!(["abc"]))
        .unwrap();
    store
        .update_state("plan.tasks.02.commits.1", json!("def"))
        .unwrap();
    let rev = store.update_state("gapCount", json!(1)).unwrap();
    let state = store.state().unwrap();
    assert_eq!(state.revision, rev);
    assert_eq!(store.get("variables.retry.count").unwrap(), json!(2));
    assert_eq!(store.get("plan.tasks.02.status").unwrap(), json!("failed"));
    assert_eq!(
        store.get("plan.tasks.02.commits").unwrap(),
        json!(["abc", "def"])
    );
    assert_eq!(state.gap_count, 1);
    // Every update is a state_update event, and the log alone gives the same state.
    assert_eq!(store.rebuild().unwrap(), state);
}

#[test]
fn fenced_write_from_a_stale_revision_is_refused() {
    let (dir, store) = project();
    let seen = store.state().unwrap().revision;
    store.update_state("variables.x", json!(1)).unwrap(); // someone else got there first
    let before = snapshot(dir.path());
    let err = store
        .update_state_as(None, "variables.x", json!(99), Some(seen))
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Fenced { expected, found } if expected == seen && found == seen + 1),
        "{err}"
    );
    assert_eq!(snapshot(dir.path()), before);
    // With the current revision it goes through.
    store
        .update_state_as(None, "variables.x", json!(2), Some(seen + 1))
        .unwrap();
}

#[test]
fn lock_timeout_names_the_holder_and_changes_nothing() {
    let (dir, _store) = project();
    let mut holder = spawn_writer(dir.path(), &["hold"]);
    wait_for_line(&mut holder, "locked");
    let store = Store::open(dir.path())
        .unwrap()
        .with_lock_timeout(Duration::from_millis(200));
    let before = snapshot(dir.path());
    let t = Instant::now();
    let err = store.update_state("variables.x", json!(1)).unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(200));
    let msg = err.to_string();
    assert!(matches!(err, StoreError::LockTimeout { .. }), "{msg}");
    assert!(msg.contains(&format!("pid {}", holder.id())), "{msg}");
    assert_eq!(snapshot(dir.path()), before);

    // The holder dies: its lock goes with it and the next writer proceeds at once. No clock:
    // this store gives up after 200 ms (as above), so its success proves the lock was free
    // within that, while the fsyncs of the update may take what a loaded machine needs.
    holder.kill().unwrap();
    holder.wait().unwrap();
    store.update_state("variables.x", json!(1)).unwrap();
}

#[test]
fn default_lock_timeout_is_five_seconds() {
    assert_eq!(
        metash_store::DEFAULT_LOCK_TIMEOUT,
        Duration::from_millis(5000)
    );
}

fn wait_for_line(child: &mut std::process::Child, want: &str) {
    use std::io::BufRead;
    let stdout = child.stdout.as_mut().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), want);
}

#[test]
fn update_many_is_one_event_and_all_or_nothing() {
    let (dir, store) = project();
    let rev = store
        .update_many(
            Some("orchestrator"),
            vec![
                ("status".into(), json!("executing")),
                ("gapCount".into(), json!(2)),
                ("variables.note".into(), json!("x")),
            ],
            None,
        )
        .unwrap();
    let recs = store.log().read_all().unwrap();
    assert_eq!(recs.len(), 2, "one event for the three keys");
    assert_eq!(recs[1].seq, rev);
    assert_eq!(recs[1].agent.as_deref(), Some("orchestrator"));
    let state = store.state().unwrap();
    assert_eq!(state.gap_count, 2);
    assert_eq!(store.rebuild().unwrap(), state);

    // One bad key refuses the whole update.
    let before = snapshot(dir.path());
    let err = store
        .update_many(
            None,
            vec![
                ("gapCount".into(), json!(5)),
                ("status".into(), json!("nope")),
            ],
            None,
        )
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidValue { .. }), "{err}");
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn transact_sees_the_state_and_may_write_nothing() {
    let (_dir, store) = project();
    let rev0 = store.state().unwrap().revision;
    let rev = store.transact(None, |_| Ok(vec![])).unwrap();
    assert_eq!(rev, rev0);
    assert_eq!(store.log().read_all().unwrap().len(), 1);
    store
        .transact(None, |s| {
            Ok(vec![("currentPhase".into(), json!(s.current_phase + 1))])
        })
        .unwrap();
    assert_eq!(store.state().unwrap().current_phase, 2);
}

/// Seed 001's example, written by hand into a project (no `schema_version`, no `revision`), is
/// the session from then on: read as it is, logged as the new base, saved with its version.
#[test]
fn a_hand_written_seed_session_is_taken_as_it_is() {
    let (dir, _store) = project();
    let path = dir.path().join(".meta/session.json");
    std::fs::write(&path, metash_testkit::SEED_SESSION).unwrap();
    let store = Store::open(dir.path()).unwrap();
    let state = store.state().unwrap();
    assert_eq!(state.session_id, "550e8400-e29b-41d4-a716-446655440000");
    assert_eq!(state.plan.as_ref().unwrap().tasks.len(), 3);
    assert_eq!(store.get("status").unwrap(), json!("executing"));
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(saved["schema_version"], 1);
    assert_eq!(
        saved["revision"], 2,
        "logged after the project's own session_init"
    );
    // The log can give it back, and the next update builds on it.
    assert_eq!(store.rebuild().unwrap(), state);
    store
        .update_state("variables.last_verification_failed", json!(true))
        .unwrap();
    assert_eq!(store.get("status").unwrap(), json!("executing"));
    assert_eq!(store.log().verify().unwrap(), 3);
    // Opening again adopts nothing more.
    Store::open(dir.path()).unwrap();
    assert_eq!(store.log().read_all().unwrap().len(), 3);
}
