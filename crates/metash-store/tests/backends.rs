//! One suite, both backends: every case below runs against the file store (`.meta/`) and
//! against the PostgreSQL store (`[store] url`, a real server this test starts), through the
//! same `Store` API. A case is a function of a fresh project; the two tests run the list.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};

use metash_protocol::LogKind;
use metash_store::{KvQuota, NewEvent, Store, StoreError};
use metash_testkit::postgres::{prerequisites, Postgres};
use serde_json::{json, Value};

type Case = fn(&Path, &Store);

const CASES: &[(&str, Case)] = &[
    ("init_and_open", init_and_open),
    (
        "state_updates_fold_and_rebuild",
        state_updates_fold_and_rebuild,
    ),
    ("a_stale_revision_is_fenced", a_stale_revision_is_fenced),
    (
        "update_many_is_all_or_nothing",
        update_many_is_all_or_nothing,
    ),
    ("transact_may_write_nothing", transact_may_write_nothing),
    (
        "processes_do_not_lose_increments",
        processes_do_not_lose_increments,
    ),
    ("kv_scratchpad_and_quota", kv_scratchpad_and_quota),
    (
        "documents_change_with_their_event",
        documents_change_with_their_event,
    ),
    ("the_log_reads_every_way", the_log_reads_every_way),
];

/// Runs each case on a fresh project from `make`, naming the case when it fails.
fn run_all(make: &dyn Fn(&str) -> (tempfile::TempDir, Store)) {
    for (name, case) in CASES {
        let (dir, store) = make(name);
        eprintln!("case {name}");
        case(dir.path(), &store);
    }
}

#[test]
fn every_case_on_the_file_backend() {
    run_all(&|_| {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(dir.path(), Some("# Project: test\n")).unwrap();
        assert!(store.server_project().is_none());
        (dir, store)
    });
}

#[test]
fn every_case_on_the_postgres_backend() {
    let server = match prerequisites().and_then(|bin| Postgres::start(&bin)) {
        Ok(s) => s,
        Err(why) => return metash_testkit::skip("postgres backend suite", &why),
    };
    let url = server.url("postgres");
    run_all(&|name| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".meta")).unwrap();
        std::fs::write(
            dir.path().join(".meta/config.toml"),
            format!("[store]\nurl = \"{url}\"\nproject = \"{name}\"\n"),
        )
        .unwrap();
        let store = Store::init(dir.path(), Some("# Project: test\n")).unwrap();
        assert_eq!(store.server_project(), Some(name));
        assert!(
            !dir.path().join(".meta/events.jsonl").exists()
                && !dir.path().join(".meta/session.json").exists(),
            "nothing of the store is written locally but the context's copy"
        );
        (dir, store)
    });
}

fn init_and_open(ws: &Path, store: &Store) {
    let again = Store::open(ws).unwrap();
    assert_eq!(again.state().unwrap(), store.state().unwrap());
    assert_eq!(again.context().unwrap(), "# Project: test\n");
    assert!(matches!(
        Store::init(ws, None),
        Err(StoreError::AlreadyInitialized(_))
    ));
    let first = store.log().read_all().unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].kind, LogKind::SessionInit);
    assert_eq!(store.state().unwrap().revision, 1);
    // The context's copy edited: refused, as the file store refuses an edited context.md.
    std::fs::write(ws.join(".meta/context.md"), "# changed\n").unwrap();
    assert!(matches!(
        store.update_state("variables.x", json!(1)),
        Err(StoreError::ContextChanged { .. })
    ));
    std::fs::write(ws.join(".meta/context.md"), "# Project: test\n").unwrap();
}

fn state_updates_fold_and_rebuild(_: &Path, store: &Store) {
    let r1 = store
        .update_state("variables.greeting", json!("hi"))
        .unwrap();
    let r2 = store
        .update_state("variables.nested", json!({"a": [1, 2]}))
        .unwrap();
    assert_eq!(r2, r1 + 1, "the revision is the seq of its event");
    assert_eq!(store.get("variables.greeting").unwrap(), json!("hi"));
    assert_eq!(store.get("variables.nested.a").unwrap(), json!([1, 2]));
    let state = store.state().unwrap();
    assert_eq!(state.revision, r2);
    assert_eq!(store.rebuild().unwrap(), state);
    assert_eq!(store.rebuild_and_save().unwrap(), state);
    assert_eq!(store.rebuild_until(r1).unwrap().revision, r1);
    assert!(matches!(
        store.update_state("no_such_key", json!(1)),
        Err(StoreError::UnknownKey { .. })
    ));
}

fn a_stale_revision_is_fenced(_: &Path, store: &Store) {
    let at = store.state().unwrap().revision;
    store.update_state("variables.a", json!(1)).unwrap();
    let tail = store.log().tail().unwrap();
    match store.update_state_as(Some("late"), "variables.a", json!(2), Some(at)) {
        Err(StoreError::Fenced { expected, found }) => {
            assert_eq!((expected, found), (at, at + 1));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(store.log().tail().unwrap(), tail, "nothing written");
    assert_eq!(store.get("variables.a").unwrap(), json!(1));
}

fn update_many_is_all_or_nothing(_: &Path, store: &Store) {
    let before = store.state().unwrap();
    let bad = store.update_many(
        None,
        vec![
            ("variables.one".into(), json!(1)),
            ("status".into(), json!("not-a-status")),
        ],
        None,
    );
    assert!(bad.is_err());
    assert_eq!(store.state().unwrap(), before, "nothing applied");
    let rev = store
        .update_many(
            Some("a"),
            vec![
                ("variables.one".into(), json!(1)),
                ("variables.two".into(), json!(2)),
            ],
            None,
        )
        .unwrap();
    let last = store.log().tail().unwrap();
    assert_eq!(last.seq, rev, "one event for both");
}

fn transact_may_write_nothing(_: &Path, store: &Store) {
    let tail = store.log().tail().unwrap();
    let rev = store.transact(None, |_| Ok(Vec::new())).unwrap();
    assert_eq!(rev, store.state().unwrap().revision);
    assert_eq!(store.log().tail().unwrap(), tail);
    let rev = store
        .transact(Some("t"), |s| {
            Ok(vec![("variables.phase_was".into(), json!(s.current_phase))])
        })
        .unwrap();
    assert_eq!(rev, tail.seq + 1);
}

/// Four processes (the crate's writer binary) x 50 increments of one counter, each through its
/// own `Store::open`: none lost, none doubled.
fn processes_do_not_lose_increments(ws: &Path, store: &Store) {
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_metash-store-writer"))
                .arg(ws)
                .args(["incr", "50"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(store.get("variables.counter").unwrap(), json!(200));
    let records = store.log().read_all().unwrap();
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.seq, i as u64 + 1, "gapless");
    }
    assert_eq!(store.rebuild().unwrap(), store.state().unwrap());
}

fn kv_scratchpad_and_quota(_: &Path, store: &Store) {
    let kv = store.kv("agent-a").unwrap();
    kv.set("k", json!({"v": 1})).unwrap();
    assert_eq!(kv.get("k").unwrap(), Some(json!({"v": 1})));
    assert_eq!(store.kv("agent-b").unwrap().get("k").unwrap(), None);
    let quota = KvQuota {
        max_keys: 1,
        max_bytes: 1_000,
    };
    assert!(kv.set_within("k2", json!(2), quota).is_err());
    assert_eq!(
        kv.list().unwrap().len(),
        1,
        "nothing written past the quota"
    );
    kv.delete("k").unwrap();
    assert!(kv.list().unwrap().is_empty());
    store.scratchpad().set("shared", json!("yes")).unwrap();
    assert_eq!(
        Store::open(store.workspace())
            .unwrap()
            .scratchpad()
            .get("shared")
            .unwrap(),
        Some(json!("yes"))
    );
    let kv_events = store
        .log()
        .read_all()
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == LogKind::KvSet)
        .count();
    assert_eq!(kv_events, 3);
}

fn documents_change_with_their_event(_: &Path, store: &Store) {
    assert_eq!(store.read_doc("grants").unwrap(), Value::Null);
    let rec = store
        .update_doc("grants", |doc| {
            *doc = json!({"grants": ["x"]});
            Ok(NewEvent::new(LogKind::ConsentGrant, None, json!({"x": 1})))
        })
        .unwrap();
    assert_eq!(rec.kind, LogKind::ConsentGrant);
    assert_eq!(store.read_doc("grants").unwrap(), json!({"grants": ["x"]}));
    let tail = store.log().tail().unwrap();
    let failed = store.update_doc("grants", |doc| {
        *doc = json!("changed");
        Err(StoreError::Rejected("no".into()))
    });
    assert!(failed.is_err());
    assert_eq!(store.read_doc("grants").unwrap(), json!({"grants": ["x"]}));
    assert_eq!(store.log().tail().unwrap(), tail, "no event either");
}

fn the_log_reads_every_way(_: &Path, store: &Store) {
    for i in 0..30 {
        store
            .append(LogKind::Progress, Some("a"), json!({"i": i}))
            .unwrap();
    }
    assert!(store.append(LogKind::StateUpdate, None, json!({})).is_err());
    assert_eq!(store.log().verify().unwrap(), 31);
    // Followed in pages from the start: each record once, in order.
    let (mut seen, mut at) = (Vec::new(), 0);
    loop {
        let (page, next) = store.log().read_from(at, 7).unwrap();
        if page.is_empty() {
            break;
        }
        seen.extend(page.into_iter().map(|r| r.seq));
        at = next;
    }
    assert_eq!(seen, (1..=31).collect::<Vec<u64>>());
    let mut newest = Vec::new();
    store
        .log()
        .scan_back(|r| {
            newest.push(r.seq);
            newest.len() < 3
        })
        .unwrap();
    assert_eq!(newest, vec![31, 30, 29]);
    assert_eq!(store.log().tail().unwrap().seq, 31);
}
