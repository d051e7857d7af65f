use std::time::{Duration, SystemTime};

use metash_store::{Retention, StoreError};
use serde_json::json;

use super::common::project;

#[test]
fn each_agent_sees_only_its_own_namespace() {
    let (_dir, store) = project();
    store
        .kv("alice")
        .unwrap()
        .set("token_budget", json!(10))
        .unwrap();
    store
        .kv("bob")
        .unwrap()
        .set("token_budget", json!(20))
        .unwrap();
    assert_eq!(
        store.kv("alice").unwrap().get("token_budget").unwrap(),
        Some(json!(10))
    );
    assert_eq!(
        store.kv("bob").unwrap().get("token_budget").unwrap(),
        Some(json!(20))
    );
    assert_eq!(store.kv("carol").unwrap().list().unwrap().len(), 0);
    store.kv("alice").unwrap().delete("token_budget").unwrap();
    assert_eq!(
        store.kv("alice").unwrap().get("token_budget").unwrap(),
        None
    );
    assert_eq!(
        store.kv("bob").unwrap().get("token_budget").unwrap(),
        Some(json!(20))
    );
    // Writes are logged against the agent.
    let kv_events: Vec<_> = store
        .log()
        .read_all()
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == "kv_set")
        .collect();
    assert_eq!(kv_events.len(), 3);
    assert_eq!(kv_events[0].agent.as_deref(), Some("alice"));
}

#[test]
fn namespace_names_cannot_escape() {
    let (_dir, store) = project();
    for bad in ["../x", "a/b", ".hidden", ""] {
        assert!(
            matches!(store.kv(bad), Err(StoreError::InvalidName { .. })),
            "{bad}"
        );
    }
}

#[test]
fn scratchpad_is_shared() {
    let (dir, store) = project();
    store
        .scratchpad()
        .set("plan_notes", json!("use sqlite"))
        .unwrap();
    let other = metash_store::Store::open(dir.path()).unwrap();
    assert_eq!(
        other.scratchpad().get("plan_notes").unwrap(),
        Some(json!("use sqlite"))
    );
}

#[test]
fn gc_removes_by_age_then_oldest_first_by_size() {
    let (_dir, store) = project();
    let arts = store.artifacts();
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    for (name, age_days, size) in [
        ("old.txt", 40, 10),
        ("a.bin", 3, 400),
        ("b.bin", 2, 400),
        ("c.bin", 1, 400),
    ] {
        let p = arts.put(name, &vec![b'x'; size], Some("agent")).unwrap();
        let f = std::fs::File::options().write(true).open(&p).unwrap();
        f.set_modified(now - day * age_days).unwrap();
    }
    let report = arts
        .gc(
            Retention {
                max_age: day * 30,
                max_total_bytes: 900,
            },
            now,
        )
        .unwrap();
    assert_eq!(report.removed, vec!["old.txt", "a.bin"]);
    assert_eq!(report.kept, 2);
    assert_eq!(report.kept_bytes, 800);
    assert!(!arts.dir().join("a.bin").exists() && arts.dir().join("c.bin").exists());
    let gc = store
        .log()
        .read_all()
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == "gc")
        .count();
    assert_eq!(gc, 1);
}

/// Documents written before documents were versioned (bare data) are read as they are, wrapped
/// at their next write or by `migrate_docs`; a newer one is refused and left alone.
#[test]
fn unversioned_documents_are_read_migrated_and_newer_ones_refused() {
    let (dir, store) = project();
    let meta = dir.path().join(".meta");
    std::fs::create_dir_all(meta.join("kv")).unwrap();
    std::fs::write(meta.join("kv/old.json"), r#"{"k": 1}"#).unwrap();
    std::fs::write(meta.join("budget.json"), r#"{"spent": 3}"#).unwrap();
    assert_eq!(store.kv("old").unwrap().get("k").unwrap(), Some(json!(1)));
    assert_eq!(store.read_doc("budget").unwrap(), json!({"spent": 3}));

    let would = store.migrate_docs(true).unwrap();
    assert_eq!(
        would,
        vec![meta.join("budget.json"), meta.join("kv/old.json")]
    );
    assert_eq!(
        std::fs::read_to_string(meta.join("kv/old.json")).unwrap(),
        r#"{"k": 1}"#
    );
    assert_eq!(store.migrate_docs(false).unwrap(), would);
    let on_disk: serde_json::Value =
        serde_json::from_slice(&std::fs::read(meta.join("kv/old.json")).unwrap()).unwrap();
    assert_eq!(on_disk, json!({"schema_version": 1, "data": {"k": 1}}));
    assert!(store.migrate_docs(true).unwrap().is_empty());
    assert_eq!(store.kv("old").unwrap().get("k").unwrap(), Some(json!(1)));

    let newer = r#"{"schema_version": 9, "data": {"k": 2}}"#;
    std::fs::write(meta.join("kv/new.json"), newer).unwrap();
    let err = store.kv("new").unwrap().set("k", json!(3)).unwrap_err();
    assert!(
        matches!(err, StoreError::NewerVersion { ref found, .. } if found == "9"),
        "{err}"
    );
    assert!(err.to_string().contains("kv/new.json"), "{err}");
    assert_eq!(
        std::fs::read_to_string(meta.join("kv/new.json")).unwrap(),
        newer
    );
    assert!(store.migrate_docs(false).is_err());
}
