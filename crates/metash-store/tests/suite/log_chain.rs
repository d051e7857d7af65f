use std::io::Write;

use metash_protocol::LogKind;

use metash_store::{NewEvent, StoreError};
use serde_json::json;

use super::common::project;

fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn appends_are_gapless_and_chained() {
    let (_dir, store) = project();
    store
        .append(
            LogKind::Progress,
            None,
            json!({"message": "hi", "level": "info"}),
        )
        .unwrap();
    let batch: Vec<_> = (0..10)
        .map(|i| NewEvent::new(LogKind::parse("output"), Some("agent-a"), json!({"i": i})))
        .collect();
    let recs = store.append_batch(&batch).unwrap();
    assert_eq!(recs.first().unwrap().seq, 3);
    assert_eq!(recs.last().unwrap().seq, 12);
    let all = store.log().read_all().unwrap();
    for w in all.windows(2) {
        assert_eq!(w[1].prev, w[0].hash);
        assert_eq!(w[1].seq, w[0].seq + 1);
    }
    assert_eq!(all[5].agent.as_deref(), Some("agent-a"));
    assert_eq!(store.log().verify().unwrap(), 12);
}

#[test]
fn state_events_can_only_come_from_update_state() {
    let (_dir, store) = project();
    let err = store
        .append(
            LogKind::StateUpdate,
            None,
            json!({"key": "status", "value": "halted"}),
        )
        .unwrap_err();
    assert!(matches!(err, StoreError::Rejected(_)), "{err}");
}

/// Verification names the first broken event, for an edit, a deletion and a reorder.
#[test]
fn verify_names_the_first_broken_event() {
    let (dir, store) = project();
    for i in 0..5 {
        store.update_state("variables.i", json!(i)).unwrap();
    }
    let path = dir.path().join(".meta/events.jsonl");
    let good = lines(&path);
    assert_eq!(good.len(), 6);

    // Edited payload of event 3.
    let mut edited = good.clone();
    edited[2] = edited[2].replace("\"value\":1", "\"value\":7");
    assert_ne!(edited[2], good[2]);
    std::fs::write(&path, edited.join("\n") + "\n").unwrap();
    match store.log().verify() {
        Err(StoreError::BrokenLog { seq, reason, .. }) => {
            assert_eq!(seq, 3);
            assert!(reason.contains("hash mismatch"), "{reason}");
        }
        other => panic!("{other:?}"),
    }

    // Event 4 deleted.
    let mut dropped = good.clone();
    dropped.remove(3);
    std::fs::write(&path, dropped.join("\n") + "\n").unwrap();
    match store.log().verify() {
        Err(StoreError::BrokenLog { seq, reason, .. }) => {
            assert_eq!(seq, 4);
            assert!(reason.contains("seq 5"), "{reason}");
        }
        other => panic!("{other:?}"),
    }

    // A re-hashed forgery still breaks the chain at the next event: `prev` no longer matches.
    std::fs::write(&path, good.join("\n") + "\n").unwrap();
    assert_eq!(store.log().verify().unwrap(), 6);
}

/// A torn final line (a crashed, unacknowledged append) is cut off, not treated as corruption.
#[test]
fn torn_tail_is_repaired_on_the_next_write() {
    let (dir, store) = project();
    store.update_state("variables.a", json!(1)).unwrap();
    let path = dir.path().join(".meta/events.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"{\"seq\":3,\"ts\":\"2026").unwrap();
    drop(f);
    assert_eq!(store.log().verify().unwrap(), 2);
    store.update_state("variables.a", json!(2)).unwrap();
    assert_eq!(store.log().verify().unwrap(), 3);
    assert_eq!(store.rebuild().unwrap(), store.state().unwrap());
}

#[test]
fn rebuild_ignores_other_events_and_matches_the_file() {
    let (_dir, store) = project();
    store.update_state("status", json!("executing")).unwrap();
    store
        .append(
            LogKind::parse("lifecycle"),
            Some("a"),
            json!({"to": "active"}),
        )
        .unwrap();
    store.kv("a").unwrap().set("k", json!(1)).unwrap();
    store.update_state("currentPhase", json!(2)).unwrap();
    store
        .append(LogKind::Progress, None, json!({"message": "m"}))
        .unwrap();
    let state = store.state().unwrap();
    assert_eq!(state.revision, 5);
    assert_eq!(store.rebuild().unwrap(), state);
    assert_eq!(store.rebuild_until(2).unwrap().current_phase, 1);
}

/// Every record carries its format's version; one written by a newer metash (its hash intact) is
/// refused with the file and the record named, and the log is left as it was.
#[test]
fn a_record_from_a_newer_metash_is_refused_by_name() {
    use sha2::{Digest, Sha256};
    let (dir, store) = project();
    store
        .append(LogKind::Progress, None, json!({"m": 1}))
        .unwrap();
    let path = dir.path().join(".meta/events.jsonl");
    let all = lines(&path);
    assert!(
        all.iter().all(|l| l.starts_with("{\"schema_version\":1,")),
        "{all:?}"
    );
    // The last record re-made as version 2, hash recomputed so only the version is wrong.
    let last = all.last().unwrap();
    let body = &last[..last.find(",\"hash\":\"").unwrap()];
    let body = body.replacen("\"schema_version\":1,", "\"schema_version\":2,", 1);
    let hash = hex::encode(Sha256::digest(format!("{body}}}").as_bytes()));
    let mut text: Vec<String> = all[..all.len() - 1].to_vec();
    text.push(format!("{body},\"hash\":\"{hash}\"}}"));
    let bytes = format!("{}\n", text.join("\n"));
    std::fs::write(&path, &bytes).unwrap();
    let err = store.log().read_all().unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, StoreError::NewerVersion { ref found, .. } if found == "2"),
        "{msg}"
    );
    assert!(
        msg.contains("events.jsonl") && msg.contains("log record"),
        "{msg}"
    );
    assert!(store.append(LogKind::Progress, None, json!({})).is_err());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), bytes);
}

/// A reader in another process follows the log by byte offset (`metash ui`): batches of at most
/// `max`, nothing missed or repeated across calls, a line still being written left for the next
/// call, and an offset past the end (the log cut back) refused so the reader starts over.
#[test]
fn read_from_follows_the_log_in_bounded_batches() {
    let (_dir, store) = project();
    for i in 0..7 {
        store
            .append(LogKind::Progress, None, json!({"i": i}))
            .unwrap();
    }
    let total = store.log().tail().unwrap().seq;
    let (mut seen, mut offset) = (Vec::new(), 0);
    loop {
        let (recs, next) = store.log().read_from(offset, 3).unwrap();
        assert!(recs.len() <= 3);
        if recs.is_empty() {
            assert_eq!(next, offset);
            break;
        }
        seen.extend(recs.iter().map(|r| r.seq));
        offset = next;
    }
    assert_eq!(seen, (1..=total).collect::<Vec<_>>());
    // A torn (unfinished) line is not a record yet.
    let path = store.workspace().join(".meta/events.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"{\"seq\":").unwrap();
    let (recs, next) = store.log().read_from(offset, 3).unwrap();
    assert!(recs.is_empty());
    assert_eq!(next, offset);
    assert!(store.log().read_from(offset + 1_000_000, 3).is_err());
}
