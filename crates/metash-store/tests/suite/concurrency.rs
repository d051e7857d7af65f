use metash_protocol::LogKind;
use serde_json::json;

use super::common::{project, spawn_writer};

/// 8 processes x 500 increments of one counter: none lost, none doubled, and one state_update
/// event each.
#[test]
fn eight_processes_times_500_increments() {
    let (dir, store) = project();
    let children: Vec<_> = (0..8)
        .map(|_| spawn_writer(dir.path(), &["incr", "500"]))
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "writer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(store.get("variables.counter").unwrap(), json!(4000));
    let records = store.log().read_all().unwrap();
    let updates = records
        .iter()
        .filter(|r| r.kind == LogKind::StateUpdate)
        .count();
    assert_eq!(updates, 4000);
    // Gapless seq, and the state equals the one rebuilt from the log.
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.seq, i as u64 + 1);
    }
    assert_eq!(store.rebuild().unwrap(), store.state().unwrap());
}

/// Threads in one process each with their own handle serialise through the same lock.
#[test]
fn threads_with_separate_handles_do_not_lose_updates() {
    let (dir, _store) = project();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let store = metash_store::Store::open(dir.path()).unwrap();
                for _ in 0..50 {
                    store
                        .modify_state(None, "variables.n", |v| {
                            Ok(json!(v.and_then(|v| v.as_i64()).unwrap_or(0) + 1))
                        })
                        .unwrap();
                }
            });
        }
    });
    let store = metash_store::Store::open(dir.path()).unwrap();
    assert_eq!(store.get("variables.n").unwrap(), json!(200));
}

/// `rounds` times: the lock is held, another try waits `wait` for it and gives up with a
/// `LockTimeout`, the lock is released, and a try with no time left right after must find it free.
fn free_right_after_release(rounds: usize, wait: std::time::Duration) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.lock");
    let zero = std::time::Duration::ZERO;
    for round in 0..rounds {
        let held = metash_store::lock::acquire(&path, zero).unwrap();
        let err = metash_store::lock::acquire(&path, wait).unwrap_err();
        assert!(
            matches!(err, metash_store::StoreError::LockTimeout { .. }),
            "round {round}: {err}"
        );
        drop(held);
        if let Err(e) = metash_store::lock::acquire(&path, zero) {
            panic!("round {round}: the lock was not free right after its release: {e}");
        }
    }
}

/// A try that gives up at once leaves nothing waiting behind it: the holder's own next try, right
/// after its release, finds the lock free. (A waiter left over from the failed try used to take
/// the lock on release and hold it until it noticed the caller was gone.)
#[test]
fn a_failed_try_leaves_no_waiter_behind() {
    free_right_after_release(50, std::time::Duration::ZERO);
}

/// A caller that waited and gave up leaves its waiter blocked in the kernel; at the release it
/// takes the lock and drops it at once. A try with no time left made in that instant must not
/// report the lock as held.
#[test]
fn a_waiter_whose_caller_gave_up_does_not_make_the_lock_look_held() {
    free_right_after_release(200, std::time::Duration::from_millis(1));
}
