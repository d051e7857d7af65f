//! The PostgreSQL backend against a real server (Debian's, started by the test in a temporary
//! directory as an unprivileged user): migrations, the hash-chained log, and the lease protocol
//! of `metash worker` (claim, heartbeat, complete, reap) with its fencing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_protocol::LogKind;
use metash_store::pg::lease::{self, Outcome, TaskSpec};
use metash_store::pg::{self, log, Db};
use metash_store::{NewEvent, StoreError};
use metash_testkit::postgres::{prerequisites, Postgres};
use serde_json::json;

fn server() -> Option<Postgres> {
    match prerequisites().and_then(|bin| Postgres::start(&bin)) {
        Ok(pg) => Some(pg),
        Err(why) => {
            metash_testkit::skip("postgres store", &why);
            None
        }
    }
}

fn client(pg: &Postgres) -> Db {
    Db::open(&pg.url("postgres"), None).unwrap()
}

fn task(id: &str, deps: &[&str]) -> TaskSpec {
    TaskSpec {
        id: id.into(),
        deps: deps.iter().map(|d| (*d).to_string()).collect(),
        labels: Vec::new(),
        payload: json!({"n": id}),
    }
}

const LEASE: Duration = Duration::from_secs(30);

#[test]
fn migrations_apply_once_and_a_newer_schema_is_refused() {
    let Some(pg) = server() else { return };
    let mut c = client(&pg);
    // Again, and from two connections at once: the latest version, each applied once.
    let mut other = pg::connect(&pg.url("postgres"), None).unwrap();
    let t = std::thread::spawn(move || pg::migrate(&mut other).unwrap());
    assert_eq!(pg::migrate(c.client()).unwrap(), 3);
    assert_eq!(t.join().unwrap(), 3);
    let n: i64 = c
        .client()
        .query_one("SELECT count(*) FROM metash.migrations", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 3);
    c.client()
        .execute(
            "INSERT INTO metash.migrations (version, name) VALUES (99, 'future')",
            &[],
        )
        .unwrap();
    match pg::migrate(c.client()) {
        Err(StoreError::NewerVersion { found, .. }) => assert_eq!(found, "99"),
        other => panic!("{other:?}"),
    }
    // A password in the URL is refused before connecting: it belongs in the environment.
    match pg::connect(
        &format!("postgres://metash:secret@127.0.0.1:{}/postgres", pg.port),
        None,
    ) {
        Err(StoreError::Config(why)) => assert!(why.contains(pg::PASSWORD_ENV), "{why}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[test]
fn the_log_is_hash_chained_per_project_and_a_tampered_row_is_found() {
    let Some(pg) = server() else { return };
    let mut c = client(&pg);
    for i in 0..5 {
        let ev = NewEvent::new(LogKind::Progress, Some("a"), json!({"i": i}));
        log::append_now(&mut c, "p1", &[ev.clone(), ev]).unwrap();
        log::append_now(
            &mut c,
            "p2",
            &[NewEvent::new(LogKind::Progress, None, json!({"i": i}))],
        )
        .unwrap();
    }
    assert_eq!(log::verify(&mut c, "p1").unwrap(), 10);
    assert_eq!(log::verify(&mut c, "p2").unwrap(), 5);
    let recs = log::read_after(&mut c, "p1", 3, 4).unwrap();
    assert_eq!(
        recs.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![4, 5, 6, 7]
    );
    assert_eq!(recs[0].data["i"], 1);
    // Events a completion committed whose chaining never ran (its process died in between)
    // are chained by the next caller, after those already in the log.
    c.client()
        .execute(
            "INSERT INTO metash.pending (project, kind, data) VALUES ('p2', 'progress', '{\"late\": 1}')",
            &[],
        )
        .unwrap();
    assert_eq!(log::chain(&mut c, "p2").unwrap(), 1);
    assert_eq!(log::chain(&mut c, "p2").unwrap(), 0);
    assert_eq!(log::verify(&mut c, "p2").unwrap(), 6);
    assert_eq!(
        log::read_after(&mut c, "p2", 5, 1).unwrap()[0].data["late"],
        1
    );
    // A record changed behind metash's back: verify names it.
    c.client().execute(
        "UPDATE metash.log SET line = replace(line, '\"i\":3', '\"i\":4') WHERE project = 'p1' AND seq = 7",
        &[],
    )
    .unwrap();
    match log::verify(&mut c, "p1") {
        Err(StoreError::BrokenLog { seq, .. }) => assert_eq!(seq, 7),
        other => panic!("{other:?}"),
    }
}

#[test]
fn dependencies_gate_claims_and_completion_releases_dependents() {
    let Some(pg) = server() else { return };
    let mut c = client(&pg);
    lease::enqueue(
        &mut c,
        "p",
        &[task("a", &[]), task("b", &["a"]), task("c", &["a", "b"])],
    )
    .unwrap();
    let got = lease::claim(&mut c, "p", "w1", &[], 10, LEASE).unwrap();
    assert_eq!(
        got.iter().map(|l| l.task.as_str()).collect::<Vec<_>>(),
        vec!["a"]
    );
    assert!(lease::claim(&mut c, "p", "w2", &[], 10, LEASE)
        .unwrap()
        .is_empty());
    lease::complete(
        &mut c,
        "p",
        "a",
        got[0].token,
        Outcome::Done,
        &json!({"ok": 1}),
        &[],
    )
    .unwrap();
    let b = lease::claim(&mut c, "p", "w2", &[], 10, LEASE).unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].task, "b");
    assert!(b[0].token > got[0].token, "fencing tokens grow");
    // A failed task releases nothing.
    lease::complete(
        &mut c,
        "p",
        "b",
        b[0].token,
        Outcome::Failed,
        &json!({}),
        &[],
    )
    .unwrap();
    assert!(lease::claim(&mut c, "p", "w2", &[], 10, LEASE)
        .unwrap()
        .is_empty());
    let n = lease::counts(&mut c, "p").unwrap();
    assert_eq!((n.done, n.failed, n.waiting), (1, 1, 1));
    // Labels: a task asking for `gpu` goes only to a worker that has it.
    let mut gpu = task("g", &[]);
    gpu.labels = vec!["gpu".into()];
    lease::enqueue(&mut c, "p", &[gpu]).unwrap();
    assert!(
        lease::claim(&mut c, "p", "w3", &["linux".into()], 10, LEASE)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        lease::claim(
            &mut c,
            "p",
            "w4",
            &["gpu".into(), "linux".into()],
            10,
            LEASE
        )
        .unwrap()
        .len(),
        1
    );
    // A dependency not in the plan: nothing enqueued.
    assert!(lease::enqueue(&mut c, "p", &[task("x", &["nope"])]).is_err());
    assert_eq!(lease::counts(&mut c, "p").unwrap().ready, 0);
    assert!(log::verify(&mut c, "p").unwrap() >= 4);
}

#[test]
fn concurrent_claimers_never_take_the_same_task() {
    let Some(pg) = server() else { return };
    let mut c = client(&pg);
    let tasks: Vec<TaskSpec> = (0..300).map(|i| task(&format!("t{i:03}"), &[])).collect();
    lease::enqueue(&mut c, "p", &tasks).unwrap();
    let taken = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..6)
        .map(|w| {
            let url = pg.url("postgres");
            let taken = Arc::clone(&taken);
            std::thread::spawn(move || {
                let mut c = Db::open(&url, None).unwrap();
                loop {
                    let got = lease::claim(&mut c, "p", &format!("w{w}"), &[], 3, LEASE).unwrap();
                    if got.is_empty() {
                        return;
                    }
                    for l in got {
                        lease::complete(
                            &mut c,
                            "p",
                            &l.task,
                            l.token,
                            Outcome::Done,
                            &json!({}),
                            &[],
                        )
                        .unwrap();
                        taken.lock().unwrap().push(l.task);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let taken = taken.lock().unwrap();
    let unique: BTreeSet<_> = taken.iter().collect();
    assert_eq!(
        (taken.len(), unique.len()),
        (300, 300),
        "each task exactly once"
    );
    assert_eq!(lease::counts(&mut c, "p").unwrap().done, 300);
    let completed: i64 = c
        .client()
        .query_one(
            "SELECT count(*) FROM metash.log WHERE project = 'p' AND kind = 'task_completed'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(completed, 300, "one completion record per task");
    log::verify(&mut c, "p").unwrap();
}

#[test]
fn an_expired_lease_is_reaped_and_the_old_holders_completion_is_refused_and_logged() {
    let Some(pg) = server() else { return };
    let mut c = client(&pg);
    lease::enqueue(&mut c, "p", &[task("a", &[]), task("b", &["a"])]).unwrap();
    // Long enough that the claim, the heartbeat and the first reap each come well within it on
    // a loaded machine; the reap that must find the lease expired waits past it.
    let short = Duration::from_secs(5);
    let old = lease::claim(&mut c, "p", "slow", &[], 1, short)
        .unwrap()
        .remove(0);
    // A heartbeat keeps it; the reaper leaves a live lease alone.
    assert!(
        lease::heartbeat(&mut c, "p", &[("a".into(), old.token)], short)
            .unwrap()
            .is_empty()
    );
    assert!(lease::reap(&mut c, "p").unwrap().is_empty());
    // The heartbeat set the expiry from the database's `now()` before it returned, so this
    // sleep ends after it.
    std::thread::sleep(short + Duration::from_millis(500));
    assert_eq!(lease::reap(&mut c, "p").unwrap(), vec!["a".to_string()]);
    // The old holder's heartbeat says it lost the task.
    assert_eq!(
        lease::heartbeat(&mut c, "p", &[("a".into(), old.token)], short).unwrap(),
        vec!["a".to_string()]
    );
    let new = lease::claim(&mut c, "p", "fast", &[], 1, LEASE)
        .unwrap()
        .remove(0);
    assert_eq!((new.task.as_str(), new.attempt), ("a", 2));
    match lease::complete(
        &mut c,
        "p",
        "a",
        old.token,
        Outcome::Done,
        &json!({"by": "slow"}),
        &[],
    ) {
        Err(StoreError::LeaseLost(why)) => assert!(why.contains("stale"), "{why}"),
        other => panic!("{other:?}"),
    }
    lease::complete(
        &mut c,
        "p",
        "a",
        new.token,
        Outcome::Done,
        &json!({"by": "fast"}),
        &[],
    )
    .unwrap();
    // Done once: a second completion with the same token is refused too.
    assert!(lease::complete(&mut c, "p", "a", new.token, Outcome::Done, &json!({}), &[]).is_err());
    let result: serde_json::Value = c
        .client()
        .query_one(
            "SELECT result FROM metash.tasks WHERE project = 'p' AND id = 'a'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(result["by"], "fast");
    let kinds: Vec<String> = log::read_after(&mut c, "p", 0, 100)
        .unwrap()
        .into_iter()
        .map(|r| r.kind.as_str().to_string())
        .collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| *k == "task_completion_refused")
            .count(),
        2,
        "{kinds:?}"
    );
    assert_eq!(kinds.iter().filter(|k| *k == "task_completed").count(), 1);
    assert!(kinds.contains(&"leases_expired".to_string()));
    // Its dependent was released once.
    assert_eq!(
        lease::claim(&mut c, "p", "fast", &[], 5, LEASE)
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn a_database_restart_loses_nothing_committed() {
    let Some(mut pg) = server() else { return };
    let mut c = client(&pg);
    lease::enqueue(&mut c, "p", &[task("a", &[]), task("b", &[])]).unwrap();
    let l = lease::claim(&mut c, "p", "w", &[], 1, LEASE)
        .unwrap()
        .remove(0);
    lease::complete(
        &mut c,
        "p",
        &l.task,
        l.token,
        Outcome::Done,
        &json!({}),
        &[],
    )
    .unwrap();
    // Killed as a crash would, then started again: it recovers from its WAL.
    pg.kill();
    assert!(
        lease::claim(&mut c, "p", "w", &[], 1, LEASE).is_err(),
        "the old connection is gone"
    );
    pg.restart().unwrap();
    let mut c = Db::open(&pg.url("postgres"), None).unwrap();
    let n = lease::counts(&mut c, "p").unwrap();
    assert_eq!((n.done, n.ready), (1, 1));
    log::verify(&mut c, "p").unwrap();
}

#[test]
fn a_withdrawn_turn_loses_its_lease_and_its_completion_is_refused() {
    let Some(pg) = server() else { return };
    let mut c = client(&pg);
    lease::enqueue(
        &mut c,
        "p",
        &[task("t#1", &[]), task("t#2", &[]), task("u#1", &[])],
    )
    .unwrap();
    let held = lease::claim(&mut c, "p", "w", &[], 1, LEASE)
        .unwrap()
        .remove(0);
    assert_eq!(held.task, "t#1");
    let gone = lease::cancel(&mut c, "p", "t#").unwrap();
    assert_eq!(gone, vec!["t#1".to_string(), "t#2".to_string()]);
    assert_eq!(
        lease::heartbeat(&mut c, "p", &[("t#1".into(), held.token)], LEASE).unwrap(),
        vec!["t#1".to_string()]
    );
    assert!(matches!(
        lease::complete(
            &mut c,
            "p",
            "t#1",
            held.token,
            Outcome::Done,
            &json!({}),
            &[]
        ),
        Err(StoreError::LeaseLost(_))
    ));
    // Only the other task is left to claim.
    let rest = lease::claim(&mut c, "p", "w", &[], 5, LEASE).unwrap();
    assert_eq!(
        rest.iter().map(|l| l.task.as_str()).collect::<Vec<_>>(),
        vec!["u#1"]
    );
    // `_` and `%` in a prefix are matched as themselves.
    lease::enqueue(&mut c, "p", &[task("a_b#1", &[]), task("axb#1", &[])]).unwrap();
    assert_eq!(
        lease::cancel(&mut c, "p", "a_b#").unwrap(),
        vec!["a_b#1".to_string()]
    );
}
