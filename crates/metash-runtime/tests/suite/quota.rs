//! Issue 31 part 5: a native agent's disk and file quotas. What it adds under what it may write
//! is measured while it runs; past a quota its tree is killed, the invocation ends
//! `limit_exceeded` naming the quota (with a `limit_exceeded` event saying how much against what),
//! and what it wrote stays for inspection. One file cannot outgrow the quota between two
//! measurements (`RLIMIT_FSIZE`).

use std::path::Path;
use std::time::{Duration, Instant};

use metash_protocol::LogKind;
use metash_runtime::limits::WriteQuota;
use metash_runtime::InvocationStatus;

use super::common::*;

const MIB: u64 = 1 << 20;

/// Bytes and entries under `dir` (not following links).
fn usage(dir: &Path) -> (u64, u64) {
    let (mut bytes, mut files) = (0, 0);
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let md = e.metadata().unwrap();
        files += 1;
        if md.is_dir() {
            let (b, f) = usage(&e.path());
            bytes += b;
            files += f;
        } else {
            bytes += md.len();
        }
    }
    (bytes, files)
}

/// Runs `script` (written into the workspace) with `/bin/sh` in a native agent that may write
/// its workspace under `quota`: the outcome, its text and how long it took.
fn run_script(
    f: &Fixture,
    id: &str,
    quota: WriteQuota,
    script: &str,
) -> (InvocationStatus, String, Duration) {
    std::fs::write(f.workspace().join("work.sh"), script).unwrap();
    let mut spec = f.native(id, &["files.read", "files.write"], None);
    spec.write_quota = quota;
    spec.timeout = Duration::from_secs(60);
    let mut a = f.start(spec);
    let t = Instant::now();
    let (o, ev) = run(&mut a, "exec /bin/sh work.sh");
    (o.status, text(&ev), t.elapsed())
}

/// The one `limit_exceeded` event of the disk watcher for `id`.
fn watcher_event(f: &Fixture, id: &str) -> serde_json::Value {
    let hits: Vec<_> = f
        .events(id, LogKind::LimitExceeded)
        .into_iter()
        .filter(|e| e.data["via"] == "disk-watch")
        .collect();
    assert_eq!(hits.len(), 1, "{hits:?}");
    hits[0].data.clone()
}

#[test]
fn a_gigabyte_written_in_pieces_stops_at_the_disk_quota() {
    require_native!();
    let f = Fixture::new();
    // 1 GiB in 1 MiB files, one process each: only the watcher can stop this.
    let script = "i=0; while [ $i -lt 1024 ]; do head -c 1048576 /dev/zero > part$i || exit 7; \
                  i=$((i+1)); done; echo WROTE-IT-ALL";
    let quota = WriteQuota::new(Some("50m".into()), None);
    let (status, out, took) = run_script(&f, "q-disk", quota.clone(), script);
    assert_eq!(
        status,
        InvocationStatus::LimitExceeded {
            limit: "disk".into()
        },
        "{out}"
    );
    assert!(!out.contains("WROTE-IT-ALL"), "{out}");
    let hit = quota
        .hit
        .get()
        .expect("the caller's copy of the quota holds the hit");
    assert_eq!(hit.max, 50 * MIB);
    let ev = watcher_event(&f, "q-disk");
    assert_eq!(
        (ev["limit"].clone(), ev["max"].clone()),
        ("disk".into(), (50 * MIB).into())
    );
    assert!(ev["used"].as_u64().unwrap() > 50 * MIB, "{ev}");
    // Left in place, and far from the gigabyte it set out to write.
    let (bytes, _) = usage(&f.workspace());
    assert!(bytes > 50 * MIB, "what it wrote was removed: {bytes}");
    assert!(
        bytes < 512 * MIB,
        "it wrote {bytes} bytes before it was stopped"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn one_gigabyte_file_stops_at_the_disk_quota() {
    require_native!();
    let f = Fixture::new();
    let quota = WriteQuota::new(Some("50m".into()), None);
    let (status, out, _) = run_script(
        &f,
        "q-file",
        quota,
        "dd if=/dev/zero of=big bs=1M count=1024 2>&1; echo dd-ended-$?",
    );
    assert_eq!(
        status,
        InvocationStatus::LimitExceeded {
            limit: "disk".into()
        },
        "{out}"
    );
    let big = std::fs::metadata(f.workspace().join("big")).unwrap().len();
    // RLIMIT_FSIZE: the file stops one byte past the quota, whenever the watcher looks.
    assert_eq!(big, 50 * MIB + 1, "{out}");
    let ev = watcher_event(&f, "q-file");
    assert_eq!(ev["limit"], "disk");
}

#[test]
fn a_hundred_thousand_files_stop_at_the_file_quota() {
    require_native!();
    let f = Fixture::new();
    let script = "mkdir many && cd many && i=0; while [ $i -lt 100000 ]; do : > f$i || exit 7; \
                  i=$((i+1)); done; echo MADE-THEM-ALL";
    let quota = WriteQuota::new(None, Some(2_000));
    let (status, out, took) = run_script(&f, "q-files", quota, script);
    assert_eq!(
        status,
        InvocationStatus::LimitExceeded {
            limit: "files".into()
        },
        "{out}"
    );
    assert!(!out.contains("MADE-THEM-ALL"), "{out}");
    let ev = watcher_event(&f, "q-files");
    assert_eq!(ev["max"], 2_000);
    assert!(ev["used"].as_u64().unwrap() > 2_000, "{ev}");
    let (_, files) = usage(&f.workspace().join("many"));
    assert!(files > 2_000, "what it made was removed: {files}");
    assert!(files < 100_000, "it made all {files}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn the_start_report_shows_the_write_quotas_and_a_reader_has_none_to_watch() {
    require_native!();
    let f = Fixture::new();
    let mut spec = f.native("q-report", &["files.read", "files.write"], None);
    spec.write_quota = WriteQuota::new(Some("3Gi".into()), Some(1234));
    let a = f.start(spec);
    let started = f.events("q-report", LogKind::AgentStarted);
    let limits = &started.last().unwrap().data["limits"];
    assert_eq!(limits["disk_bytes"]["value"], 3u64 << 30, "{limits}");
    assert_eq!(limits["disk_bytes"]["via"], "disk-watch+rlimit-fsize");
    assert_eq!(limits["files"]["value"], 1234, "{limits}");
    drop(a);
    let _ = f.start(f.native("q-reader", &["files.read"], None));
    let started = f.events("q-reader", LogKind::AgentStarted);
    let limits = &started.last().unwrap().data["limits"];
    assert_eq!(
        limits["disk_bytes"]["value"],
        2u64 << 30,
        "the default: {limits}"
    );
    assert_eq!(limits["files"]["value"], 100_000, "the default: {limits}");
    assert_eq!(limits["files"]["via"], "none", "nothing writable: {limits}");
}

#[test]
fn writes_within_the_quota_change_nothing() {
    require_native!();
    let f = Fixture::new();
    let quota = WriteQuota::new(Some("50m".into()), Some(100));
    let (status, out, _) = run_script(
        &f,
        "q-ok",
        quota.clone(),
        "head -c 1048576 /dev/zero > one && echo fine",
    );
    assert!(
        matches!(status, InvocationStatus::Done { .. }),
        "{status:?} {out}"
    );
    assert!(out.contains("fine"), "{out}");
    assert_eq!(quota.hit.get(), None);
}
