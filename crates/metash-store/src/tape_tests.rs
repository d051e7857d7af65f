#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn store() -> (tempfile::TempDir, Store) {
    let d = tempfile::tempdir().unwrap();
    let store = Store::init(d.path(), None).unwrap();
    (d, store)
}

fn exchange(tapes: &Tapes<'_>, seq: u32, req: &[u8], resp: &[u8]) -> TapeExchange {
    TapeExchange {
        seq,
        route: "model".into(),
        method: "POST".into(),
        target: "/v1/messages".into(),
        at_ms: 0,
        request_headers: vec![("content-type".into(), "application/json".into())],
        request_body: tapes.put_blob(req, false).unwrap(),
        status: 200,
        response_headers: vec![],
        head_ms: 3,
        chunks: vec![(3, 2), (5, resp.len() as u64 - 2)],
        response_body: tapes.put_blob(resp, false).unwrap(),
        end: "complete".into(),
        duration_ms: 6,
    }
}

fn tape(tapes: &Tapes<'_>, id: &str, body: &[u8]) -> Tape {
    Tape {
        schema_version: TAPE_SCHEMA_VERSION,
        id: id.into(),
        session_id: None,
        agent: "executor".into(),
        frontend: Some("claude-code".into()),
        task: Some("01".into()),
        attempt: Some(1),
        started_at: format!("2026-11-27T00:00:0{}Z", id.len() % 10),
        ended_at: "2026-11-27T00:00:09Z".into(),
        exchanges: vec![exchange(tapes, 1, body, b"data: hi\n\n")],
        spawn: None,
    }
}

#[test]
fn blobs_are_content_addressed_once_and_checked_on_read() {
    let (_d, store) = store();
    let tapes = Tapes::new(&store);
    let a = tapes.put_blob(b"hello", false).unwrap();
    let b = tapes.put_blob(b"hello", false).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        a.sha256,
        "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    );
    assert_eq!(std::fs::read_dir(tapes.blob_dir()).unwrap().count(), 1);
    assert_eq!(tapes.blob(&a.sha256).unwrap(), b"hello");
    std::fs::write(tapes.blob_dir().join(&a.sha256), b"jello").unwrap();
    assert!(matches!(
        tapes.blob(&a.sha256),
        Err(StoreError::BadFile { .. })
    ));
    // A damaged blob (a power cut's zeros) is written anew by the next turn holding its bytes.
    tapes.put_blob(b"hello", false).unwrap();
    assert_eq!(tapes.blob(&a.sha256).unwrap(), b"hello");
    assert!(tapes.blob("../../session.json").is_err());
}

#[test]
fn a_saved_tape_is_listed_read_back_and_linked_from_the_log() {
    let (_d, store) = store();
    let tapes = Tapes::new(&store);
    let t = tape(&tapes, "t1", b"{\"prompt\":1}");
    let seq = store.log().tail().unwrap().seq;
    let at = tapes.save(&t).unwrap();
    assert!(at > seq);
    assert_eq!(tapes.get("t1").unwrap(), t);
    let list = tapes.list().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].exchanges, list[0].bytes), (1, 12 + 10));
    let recs = store.log().read_all().unwrap();
    let rec = recs.iter().find(|r| r.seq == at).unwrap();
    assert_eq!(rec.kind, LogKind::Tape);
    assert_eq!(rec.data["id"], "t1");
    assert_eq!(rec.data["task"], "01");
    assert!(tapes.get("../x").is_err());
}

#[test]
fn tapes_are_not_for_git() {
    let (d, _store) = store();
    let ignore = std::fs::read_to_string(d.path().join(".meta/.gitignore")).unwrap();
    // Everything is ignored but the allow-list, which never names tapes.
    assert!(ignore.lines().any(|l| l == "*"));
    assert!(!ignore.contains("tapes"));
}

#[test]
fn gc_removes_old_then_oldest_tapes_and_their_unshared_blobs() {
    let (_d, store) = store();
    let tapes = Tapes::new(&store);
    for (id, body) in [("a", &b"shared"[..]), ("bb", b"only-b"), ("ccc", b"shared")] {
        tapes.save(&tape(&tapes, id, body)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    // Nothing is old, everything fits: kept.
    let r = tapes
        .gc(TapeRetention::default(), SystemTime::now())
        .unwrap();
    assert!(r.removed.is_empty());
    // A budget for one tape: the two oldest go; "shared" stays (ccc names it); "only-b" is
    // named by no tape now, but was written within the hour (a turn still recording could
    // name it): kept for now.
    let one = TapeRetention {
        max_age: Duration::from_secs(3600),
        max_total_bytes: 16,
    };
    let r = tapes.gc(one, SystemTime::now()).unwrap();
    assert_eq!(r.removed, vec!["a".to_string(), "bb".to_string()]);
    assert_eq!(tapes.list().unwrap().len(), 1);
    let only_b = hex::encode(Sha256::digest(b"only-b"));
    let shared = hex::encode(Sha256::digest(b"shared"));
    assert_eq!(tapes.blob(&only_b).unwrap(), b"only-b");
    assert_eq!(tapes.blob(&shared).unwrap(), b"shared");
    // Everything older than an hour, from a day ahead: all gone, the blobs too.
    let later = SystemTime::now() + Duration::from_secs(86_400);
    let r = tapes.gc(one, later).unwrap();
    assert_eq!(r.removed, vec!["ccc".to_string()]);
    assert!(tapes.blob(&shared).is_err());
    assert!(tapes.blob(&only_b).is_err());
    let gcs = store
        .log()
        .read_all()
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == LogKind::Gc)
        .count();
    assert_eq!(gcs, 2);
}

#[test]
fn a_blob_reused_by_a_new_turn_is_touched_and_spared() {
    let (_d, store) = store();
    let tapes = Tapes::new(&store);
    let b = tapes.put_blob(b"reused", false).unwrap();
    let path = tapes.blob_dir().join(&b.sha256);
    let old = SystemTime::now() - Duration::from_secs(3 * 86_400);
    std::fs::File::options()
        .append(true)
        .open(&path)
        .unwrap()
        .set_modified(old)
        .unwrap();
    // Written long ago and named by no index: swept...
    let keep_after = SystemTime::now() - BLOB_GRACE;
    assert_eq!(
        tapes
            .sweep_blobs(&HashSet::new(), false, keep_after)
            .unwrap(),
        1
    );
    // ...unless a turn reuses it first.
    let b = tapes.put_blob(b"reused", false).unwrap();
    std::fs::File::options()
        .append(true)
        .open(&path)
        .unwrap()
        .set_modified(old)
        .unwrap();
    tapes.put_blob(b"reused", false).unwrap();
    assert_eq!(
        tapes
            .sweep_blobs(&HashSet::new(), false, keep_after)
            .unwrap(),
        0
    );
    assert_eq!(tapes.blob(&b.sha256).unwrap(), b"reused");
}

#[test]
fn a_newer_index_is_refused_and_never_collected() {
    let (_d, store) = store();
    let tapes = Tapes::new(&store);
    std::fs::create_dir_all(tapes.dir()).unwrap();
    std::fs::write(
        tapes.dir().join("future.json"),
        br#"{"schema_version": 99, "id": "future"}"#,
    )
    .unwrap();
    assert!(matches!(
        tapes.get("future"),
        Err(StoreError::NewerVersion { .. })
    ));
    let later = SystemTime::now() + Duration::from_secs(10 * 365 * 86_400);
    tapes.gc(TapeRetention::default(), later).unwrap();
    assert!(tapes.dir().join("future.json").exists());
}
