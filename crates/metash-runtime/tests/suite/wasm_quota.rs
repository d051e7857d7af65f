//! Issue 31 part 5 for WASM agents: the disk and file quotas over what a guest may write (its
//! read-write preopens). A WASI module that writes as fast as it can is stopped at its next epoch
//! once the watcher sees it past a quota; the invocation ends `limit_exceeded` naming the quota,
//! a `limit_exceeded` event says how much against what, and what it wrote stays.

use std::path::Path;
use std::time::{Duration, Instant};

use metash_protocol::LogKind;
use metash_runtime::limits::WriteQuota;
use metash_runtime::InvocationStatus;

use super::common::*;

const MIB: u64 = 1 << 20;
/// The bytes each `fd_write` writes (the zeroed upper half of the module's one page).
const CHUNK: u64 = 32 * 1024;

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

/// A WASI p1 module that creates `files` files in `out/` of its workspace preopen (fd 3), each
/// `chunks` writes of [`CHUNK`] bytes, then says `OK` and `done`. A refused open or write says
/// "the sandbox refused" and ends.
fn wat_fill(files: u32, chunks: u32) -> String {
    // The name's five letters (`a`..`p`, one per nibble of the file's number) follow `out/f`.
    let body = format!(
        r#"(local $i i32) (local $c i32) (local $k i32) (local $fd i32)
  (block $all (loop $files
    (br_if $all (i32.ge_u (local.get $i) (i32.const {files})))
    (local.set $k (i32.const 0))
    (loop $name
      (i32.store8 (i32.add (i32.add (global.get $path) (i32.const 5)) (local.get $k))
        (i32.add (i32.const 97)
          (i32.and (i32.shr_u (local.get $i) (i32.mul (local.get $k) (i32.const 4))) (i32.const 15))))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br_if $name (i32.lt_u (local.get $k) (i32.const 5))))
    (if (call $path_open (i32.const 3) (i32.const 0) (global.get $path) (global.get $path_len)
          (i32.const 9) (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 16))
      (then (call $denied) (call $done) (return)))
    (local.set $fd (i32.load (i32.const 16)))
    (local.set $c (i32.const 0))
    (block $written (loop $chunks
      (br_if $written (i32.ge_u (local.get $c) (i32.const {chunks})))
      (i32.store (i32.const 24) (i32.const 32768))
      (i32.store (i32.const 28) (i32.const {CHUNK}))
      (if (call $fd_write (local.get $fd) (i32.const 24) (i32.const 1) (i32.const 32))
        (then (call $denied) (call $done) (return)))
      (local.set $c (i32.add (local.get $c) (i32.const 1)))
      (br $chunks)))
    (drop (call $fd_close (local.get $fd)))
    (local.set $i (i32.add (local.get $i) (i32.const 1)))
    (br $files)))
  (call $ok) (call $done)"#
    );
    wat_module(
        "out/faaaaa",
        &body,
        r#"(import "wasi_snapshot_preview1" "fd_close" (func $fd_close (param i32) (result i32)))"#,
    )
}

/// Runs [`wat_fill`] in a WASM agent that may write its workspace under `quota`: the outcome,
/// its text and how long it took.
fn run_fill(
    f: &Fixture,
    id: &str,
    quota: WriteQuota,
    files: u32,
    chunks: u32,
) -> (InvocationStatus, String, Duration) {
    std::fs::create_dir_all(f.workspace().join("out")).unwrap();
    let wat = wat_fill(files, chunks);
    let mut spec = f.wasm(id, &wat, &["files.read", "files.write"], None);
    spec.write_quota = quota;
    spec.timeout = Duration::from_secs(60);
    let mut a = f.start(spec);
    let t = Instant::now();
    let (o, ev) = run(&mut a, "fill");
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

fn limit(name: &str) -> InvocationStatus {
    InvocationStatus::LimitExceeded { limit: name.into() }
}

#[test]
fn a_wasm_guest_writing_a_gigabyte_in_pieces_stops_at_the_disk_quota() {
    let f = Fixture::new();
    // 1 GiB in 1 MiB files.
    let quota = WriteQuota::new(Some("50m".into()), None);
    let (status, out, took) = run_fill(&f, "wq-disk", quota.clone(), 1024, 32);
    assert_eq!(status, limit("disk"), "{out}");
    assert!(!out.contains("OK"), "it wrote it all: {out}");
    let hit = quota.hit.get().expect("the caller's copy holds the hit");
    assert_eq!(hit.max, 50 * MIB);
    let ev = watcher_event(&f, "wq-disk");
    assert_eq!(
        (ev["limit"].clone(), ev["max"].clone()),
        ("disk".into(), (50 * MIB).into())
    );
    assert!(ev["used"].as_u64().unwrap() > 50 * MIB, "{ev}");
    assert!(
        ev["message"]
            .as_str()
            .unwrap()
            .contains("the guest was stopped"),
        "{ev}"
    );
    let (bytes, files) = usage(&f.workspace().join("out"));
    eprintln!("wrote {bytes} bytes in {files} files in {took:?}; the watcher saw {ev}");
    assert!(bytes > 50 * MIB, "what it wrote was removed: {bytes}");
    assert!(
        bytes < 1024 * MIB && files < 1024,
        "it wrote {bytes} bytes in {files} files before it was stopped"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn a_wasm_guest_growing_one_file_stops_at_the_disk_quota() {
    let f = Fixture::new();
    // One file of 2 GiB: no rlimit for a guest, the watcher alone stops it.
    let quota = WriteQuota::new(Some("50m".into()), None);
    let chunks = u32::try_from(2048 * MIB / CHUNK).unwrap();
    let (status, out, _) = run_fill(&f, "wq-file", quota, 1, chunks);
    assert_eq!(status, limit("disk"), "{out}");
    assert!(!out.contains("OK"), "it wrote it all: {out}");
    let big = std::fs::metadata(f.workspace().join("out/faaaaa"))
        .unwrap()
        .len();
    eprintln!("one file of {big} bytes");
    assert!(
        (50 * MIB..2048 * MIB).contains(&big),
        "the file is {big} bytes"
    );
    assert_eq!(watcher_event(&f, "wq-file")["limit"], "disk");
}

#[test]
fn a_wasm_guest_making_a_hundred_thousand_files_stops_at_the_file_quota() {
    let f = Fixture::new();
    let quota = WriteQuota::new(None, Some(2_000));
    let (status, out, took) = run_fill(&f, "wq-files", quota, 100_000, 0);
    assert_eq!(status, limit("files"), "{out}");
    assert!(!out.contains("OK"), "it made them all: {out}");
    let ev = watcher_event(&f, "wq-files");
    assert_eq!(ev["max"], 2_000);
    assert!(ev["used"].as_u64().unwrap() > 2_000, "{ev}");
    let (_, files) = usage(&f.workspace().join("out"));
    eprintln!("made {files} files in {took:?}; the watcher saw {ev}");
    assert!(files > 2_000, "what it made was removed: {files}");
    assert!(files < 100_000, "it made all {files}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn once_past_its_quota_a_wasm_agent_stops_at_once_in_its_next_invocation() {
    let f = Fixture::new();
    std::fs::create_dir_all(f.workspace().join("out")).unwrap();
    let mut spec = f.wasm(
        "wq-again",
        &wat_fill(100_000, 0),
        &["files.read", "files.write"],
        None,
    );
    spec.write_quota = WriteQuota::new(None, Some(500));
    spec.timeout = Duration::from_secs(60);
    let mut a = f.start(spec);
    assert_eq!(run(&mut a, "fill").0.status, limit("files"));
    let (_, before) = usage(&f.workspace().join("out"));
    std::fs::remove_file(f.workspace().join("out/faaaaa")).unwrap();
    let (o, ev) = run(&mut a, "again");
    assert_eq!(o.status, limit("files"), "{}", text(&ev));
    let (_, after) = usage(&f.workspace().join("out"));
    // Stopped at its first epoch check, before it could remake the one file removed.
    assert_eq!(after, before - 1, "{before} then {after}");
    assert_eq!(watcher_event(&f, "wq-again")["max"], 500, "logged once");
}

#[test]
fn the_wasm_start_report_shows_the_write_quotas_and_a_reader_has_none_to_watch() {
    let f = Fixture::new();
    let mut spec = f.wasm(
        "wq-report",
        &wat_echo(),
        &["files.read", "files.write"],
        None,
    );
    spec.write_quota = WriteQuota::new(Some("3Gi".into()), Some(1234));
    let a = f.start(spec);
    let started = f.events("wq-report", LogKind::AgentStarted);
    let limits = &started.last().unwrap().data["limits"];
    assert_eq!(limits["disk_bytes"]["value"], 3u64 << 30, "{limits}");
    assert_eq!(limits["disk_bytes"]["via"], "disk-watch+wasm-epoch");
    assert_eq!(limits["files"]["value"], 1234, "{limits}");
    assert_eq!(limits["files"]["via"], "disk-watch+wasm-epoch");
    let ws = f.workspace().canonicalize().unwrap();
    let note = limits["files"]["note"].as_str().unwrap();
    assert!(note.contains(&ws.display().to_string()), "{note}");
    assert_eq!(limits["memory_bytes"]["via"], "wasm-store-limits", "kept");
    drop(a);
    let _ = f.start(f.wasm("wq-reader", &wat_echo(), &["files.read"], None));
    let started = f.events("wq-reader", LogKind::AgentStarted);
    let limits = &started.last().unwrap().data["limits"];
    assert_eq!(
        limits["disk_bytes"]["value"],
        2u64 << 30,
        "default: {limits}"
    );
    assert_eq!(limits["files"]["value"], 100_000, "default: {limits}");
    assert_eq!(limits["files"]["via"], "none", "nothing writable: {limits}");
}

#[test]
fn a_wasm_guest_writing_within_its_quotas_is_not_stopped() {
    let f = Fixture::new();
    let quota = WriteQuota::new(Some("50m".into()), Some(100));
    // 10 files of 1 MiB.
    let (status, out, _) = run_fill(&f, "wq-ok", quota.clone(), 10, 32);
    assert!(
        matches!(status, InvocationStatus::Done { .. }),
        "{status:?} {out}"
    );
    assert_eq!(out, "OK");
    assert_eq!(quota.hit.get(), None);
    let (bytes, files) = usage(&f.workspace().join("out"));
    assert_eq!((bytes, files), (10 * MIB, 10), "the writes happened");
}
