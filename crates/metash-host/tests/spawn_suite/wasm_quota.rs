//! Issue 31 part 5 through the host for WASM agents: `[host] agent_disk` and `agent_files` bound
//! what a WASM agent with `files.write` adds to the project while it runs. A module that writes
//! as fast as it can is stopped, the answer names the limit, the start report shows both quotas
//! and how they are enforced, and what it wrote stays.

use std::path::Path;

use metash_host::{SpawnRequest, Spawner, WorkspaceAccess};
use metash_protocol::AgentStatus;
use metash_testkit::wasm::agent_msg;

use super::common::Project;

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

/// A WASI p1 module that makes `files` files in `out/` of its workspace preopen (fd 3), each of
/// `chunks` writes of 32 KiB, then says `WROTE-IT-ALL` and `done`; a refused open or write says
/// `REFUSED` and ends.
fn wat_fill(files: u32, chunks: u32) -> String {
    let esc = |s: &str| s.bytes().map(|b| format!("\\{b:02x}")).collect::<String>();
    let line = |json: &str| agent_msg(json) + "\n";
    let said = |what: &str| {
        line(&format!(
            r#"{{"type":"output","agent_id":"w","chunk_id":"c","content_type":"text/plain","data":"{what}"}}"#
        ))
    };
    let (all, refused, done) = (
        said("WROTE-IT-ALL"),
        said("REFUSED"),
        line(r#"{"type":"done"}"#),
    );
    let (all_at, refused_at, done_at) = (1024, 2048, 3072);
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open" (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $fd_close (param i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const {all_at}) "{all_b}")
  (data (i32.const {refused_at}) "{refused_b}")
  (data (i32.const {done_at}) "{done_b}")
  (data (i32.const 4096) "out/faaaaa")
  (func $emit (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func $refused
    (call $emit (i32.const {refused_at}) (i32.const {refused_n}))
    (call $emit (i32.const {done_at}) (i32.const {done_n})))
  (func (export "_start") (local $i i32) (local $c i32) (local $k i32) (local $fd i32)
    (block $all (loop $files
      (br_if $all (i32.ge_u (local.get $i) (i32.const {files})))
      (local.set $k (i32.const 0))
      (loop $name
        (i32.store8 (i32.add (i32.const 4101) (local.get $k))
          (i32.add (i32.const 97)
            (i32.and (i32.shr_u (local.get $i) (i32.mul (local.get $k) (i32.const 4))) (i32.const 15))))
        (local.set $k (i32.add (local.get $k) (i32.const 1)))
        (br_if $name (i32.lt_u (local.get $k) (i32.const 5))))
      (if (call $path_open (i32.const 3) (i32.const 0) (i32.const 4096) (i32.const 10)
            (i32.const 9) (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 16))
        (then (call $refused) (return)))
      (local.set $fd (i32.load (i32.const 16)))
      (local.set $c (i32.const 0))
      (block $written (loop $chunks
        (br_if $written (i32.ge_u (local.get $c) (i32.const {chunks})))
        (i32.store (i32.const 24) (i32.const 32768))
        (i32.store (i32.const 28) (i32.const 32768))
        (if (call $fd_write (local.get $fd) (i32.const 24) (i32.const 1) (i32.const 32))
          (then (call $refused) (return)))
        (local.set $c (i32.add (local.get $c) (i32.const 1)))
        (br $chunks)))
      (drop (call $fd_close (local.get $fd)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $files)))
    (call $emit (i32.const {all_at}) (i32.const {all_n}))
    (call $emit (i32.const {done_at}) (i32.const {done_n}))))
"#,
        all_b = esc(&all),
        all_n = all.len(),
        refused_b = esc(&refused),
        refused_n = refused.len(),
        done_b = esc(&done),
        done_n = done.len(),
    )
}

/// A project with a WASM agent `wq` running [`wat_fill`] under `config`, spawned with write
/// access: the answer.
fn fill(config: &str, files: u32, chunks: u32) -> (Project, metash_protocol::AgentResponse) {
    let p = Project::new();
    std::fs::create_dir_all(p.path().join("out")).unwrap();
    let wat = p.path().join("wq.wat");
    std::fs::write(&wat, wat_fill(files, chunks)).unwrap();
    p.agent("wq", "wasm", &wat, &["files.read", "files.write"]);
    p.config(config);
    let host = p.host(&["files.read", "files.write"]);
    let mut req = SpawnRequest::new("wq", "be brief", "fill");
    req.access = WorkspaceAccess::ReadWrite;
    let r = host.spawn_agent(&req).unwrap();
    (p, r)
}

/// The disk watcher's `limit_exceeded` events.
fn watcher_events(p: &Project) -> Vec<serde_json::Value> {
    p.log_data("limit_exceeded")
        .into_iter()
        .filter(|d| d["via"] == "disk-watch")
        .collect()
}

#[test]
fn a_wasm_agent_writing_a_gigabyte_stops_at_the_hosts_agent_disk_quota() {
    // 1 GiB in 1 MiB files.
    let (p, r) = fill("[host]\nagent_disk = \"20m\"\n", 1024, 32);
    assert_eq!(r.status, AgentStatus::Error, "{r:?}");
    assert!(r.data.contains("exceeded its disk limit"), "{}", r.data);
    assert!(!r.data.contains("WROTE-IT-ALL"), "{}", r.data);
    let hits = watcher_events(&p);
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0]["max"], 20 * MIB);
    let started = p.log_data("agent_started");
    let limits = &started.last().expect("agent_started")["limits"];
    assert_eq!(limits["disk_bytes"]["value"], 20 * MIB, "{limits}");
    assert_eq!(
        limits["disk_bytes"]["via"], "disk-watch+wasm-epoch",
        "{limits}"
    );
    assert_eq!(limits["files"]["value"], 100_000, "the default: {limits}");
    let (bytes, files) = usage(&p.path().join("out"));
    assert!(
        (20 * MIB..1024 * MIB).contains(&bytes) && files < 1024,
        "{bytes} bytes in {files} files"
    );
}

#[test]
fn a_wasm_agent_making_a_hundred_thousand_files_stops_at_the_hosts_agent_files_quota() {
    let (p, r) = fill("[host]\nagent_files = 500\n", 100_000, 0);
    assert_eq!(r.status, AgentStatus::Error, "{r:?}");
    assert!(r.data.contains("exceeded its files limit"), "{}", r.data);
    let hits = watcher_events(&p);
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0]["max"], 500);
    let started = p.log_data("agent_started");
    let limits = &started.last().expect("agent_started")["limits"];
    assert_eq!(limits["files"]["value"], 500, "{limits}");
    assert_eq!(limits["files"]["via"], "disk-watch+wasm-epoch", "{limits}");
    let (_, files) = usage(&p.path().join("out"));
    assert!((500..100_000).contains(&files), "{files} files");
}
