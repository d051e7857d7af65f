#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;

use super::*;

/// A project with a few state and KV records, and its `.meta/config.toml`.
fn project() -> (tempfile::TempDir, Store) {
    let d = tempfile::tempdir().unwrap();
    let ws = d.path().join("p");
    let store = Store::init(&ws, Some("# Project: fork\n")).unwrap();
    std::fs::write(store.meta_dir().join("config.toml"), "[orchestrator]\n").unwrap();
    store.update_state("variables.step", json!(1)).unwrap();
    store
        .kv("executor")
        .unwrap()
        .set("k", json!("before"))
        .unwrap();
    store.update_state("variables.step", json!(2)).unwrap();
    store
        .kv("executor")
        .unwrap()
        .set("k", json!("after"))
        .unwrap();
    (d, store)
}

fn spec(prefix: &Prefix) -> ForkSpec {
    ForkSpec {
        state: prefix.state().unwrap(),
        context: "# Project: fork\n".into(),
        data: json!({"origin": {"seq": prefix.seq()}}),
    }
}

#[test]
fn seq_zero_and_past_the_end_are_refused_naming_the_value() {
    let (_d, store) = project();
    let e = read_prefix(store.workspace(), 0).unwrap_err().to_string();
    assert!(e.contains("seq 0"), "{e}");
    let last = store.log().verify().unwrap();
    let e = read_prefix(store.workspace(), last + 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&format!("seq {}", last + 1)), "{e}");
    assert!(e.contains(&format!("its last record is {last}")), "{e}");
}

#[test]
fn a_fork_holds_the_prefix_byte_for_byte_then_its_own_session() {
    let (d, store) = project();
    let log = std::fs::read(store.log().path()).unwrap();
    // Up to the first KV write: step 1, k = before.
    let at = store.kv("executor").unwrap().set("x", json!(0)).unwrap() - 3;
    let prefix = read_prefix(store.workspace(), at).unwrap();
    assert_eq!(prefix.seq(), at);
    let into = d.path().join("fork");
    let (fork, id) = create(&into, store.meta_dir(), &prefix, spec(&prefix)).unwrap();
    assert_ne!(id, store.state().unwrap().session_id);

    let forked = std::fs::read(fork.log().path()).unwrap();
    assert_eq!(&forked[..prefix.bytes.len()], &log[..prefix.bytes.len()]);
    assert_eq!(
        fork.log().verify().unwrap(),
        at + 2,
        "prefix, fork, session_init"
    );
    let records = fork.log().read_all().unwrap();
    assert_eq!(records[at as usize].kind, LogKind::Fork);
    assert_eq!(records[at as usize].data["session_id"], json!(id));

    let fork = Store::open(&into).unwrap();
    let state = fork.state().unwrap();
    assert_eq!(state.session_id, id);
    assert_eq!(state.variables["step"], json!(1));
    assert_eq!(fork.rebuild().unwrap().variables["step"], json!(1));
    assert_eq!(
        fork.kv("executor").unwrap().get("k").unwrap(),
        Some(json!("before"))
    );
    assert!(fork.meta_dir().join("config.toml").is_file());
    // The fork goes on as a store of its own.
    fork.update_state("variables.step", json!(3)).unwrap();
    assert_eq!(fork.log().verify().unwrap(), at + 3);
    assert_eq!(store.state().unwrap().variables["step"], json!(2));
}

#[test]
fn a_fork_into_a_project_is_refused() {
    let (d, store) = project();
    let prefix = read_prefix(store.workspace(), 2).unwrap();
    let into = d.path().join("other");
    Store::init(&into, None).unwrap();
    let e = create(&into, store.meta_dir(), &prefix, spec(&prefix)).unwrap_err();
    assert!(matches!(e, StoreError::AlreadyInitialized(_)), "{e}");
}

/// A one-exchange tape of `id` whose request body is `body`, saved (with its `tape` record).
fn save_tape(store: &Store, id: &str, body: &[u8]) -> u64 {
    use crate::tape::{Tape, TapeExchange, TAPE_SCHEMA_VERSION};
    let tapes = Tapes::new(store);
    let exchange = TapeExchange {
        seq: 1,
        route: "model".into(),
        method: "POST".into(),
        target: "/v1/messages".into(),
        at_ms: 0,
        request_headers: vec![],
        request_body: tapes.put_blob(body, false).unwrap(),
        status: 200,
        response_headers: vec![],
        head_ms: 1,
        chunks: vec![(1, 2)],
        response_body: tapes.put_blob(b"ok", false).unwrap(),
        end: "complete".into(),
        duration_ms: 2,
    };
    tapes
        .save(&Tape {
            schema_version: TAPE_SCHEMA_VERSION,
            id: id.into(),
            session_id: None,
            agent: "executor".into(),
            frontend: None,
            task: Some("a".into()),
            attempt: Some(1),
            started_at: "2026-11-27T00:00:00Z".into(),
            ended_at: "2026-11-27T00:00:01Z".into(),
            exchanges: vec![exchange],
            spawn: None,
        })
        .unwrap()
}

#[test]
fn the_tapes_the_prefix_names_are_copied_with_their_blobs() {
    let (d, store) = project();
    let at = save_tape(&store, "t1", b"first");
    save_tape(&store, "t2", b"second");
    let prefix = read_prefix(store.workspace(), at).unwrap();
    let (fork, _) = create(
        &d.path().join("f"),
        store.meta_dir(),
        &prefix,
        spec(&prefix),
    )
    .unwrap();
    let tapes = Tapes::new(&fork);
    let t1 = tapes.get("t1").unwrap();
    assert_eq!(
        tapes.blob(&t1.exchanges[0].request_body.sha256).unwrap(),
        b"first"
    );
    assert!(
        tapes.get("t2").is_err(),
        "t2 was recorded after the fork point"
    );
    let mark = &fork.log().read_all().unwrap()[at as usize];
    assert_eq!(mark.data["tapes"], json!(1));
}
