//! Suspended is reachable mid-run (seed 002 §3, issue 18): from another process through the store
//! (what `metash agents suspend` does) or from this host directly (JSON-RPC `suspendAgent`). A
//! native agent's whole process group stops and goes on; a WASM guest stops making progress and
//! goes on; the spawn's deadline still ends both.

use std::time::{Duration, Instant};

use metash_host::control::{self, Applied, Want};
use metash_host::{SpawnRequest, Spawner};
use metash_protocol::{AgentStatus, SpawnOptions};
use metash_testkit::procs::state;

use super::common::*;

#[test]
fn a_native_agent_is_suspended_and_resumed_from_another_process() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("native suspend", &why);
        return;
    }
    let p = Project::new();
    p.agent(
        "sus-n",
        "native",
        &native_agent_exe(),
        &["process.spawn:sleep"],
    );
    // The grandchild is a process start: allowed here, so that there is a group to stop.
    let host = p.host(&["native", "process.spawn:sleep"]);
    let ws = p.path().to_path_buf();
    let canon = ws.canonicalize().unwrap();
    std::thread::scope(|s| {
        let run = s.spawn(|| {
            let mut req = SpawnRequest::new("sus-n", "", "hang 57");
            req.options = SpawnOptions {
                timeout_seconds: Some(8.0),
                ..SpawnOptions::default()
            };
            host.spawn_agent(&req).unwrap()
        });
        // The agent's grandchild, in the agent's process group.
        let mut pid = 0;
        wait_for("the agent's grandchild", || {
            // Its own: another test's agent may run `sleep 300.57…` too, but not in this project.
            pid = metash_testkit::procs::live_processes_under("sleep 300.57", &canon)
                .first()
                .copied()
                .unwrap_or(0);
            pid != 0
        });
        assert!(ask_control(&ws, "sus-n", Want::Suspended));
        wait_for("the group to stop", || state(pid) == 'T');
        assert!(
            !ask_control(&ws, "sus-n", Want::Suspended),
            "already suspended"
        );
        assert!(ask_control(&ws, "sus-n", Want::Active));
        wait_for("the group to go on", || state(pid) != 'T');
        let r = run.join().unwrap();
        assert_eq!(r.status, AgentStatus::Timeout, "{r:?}");
    });
    let kinds = p.log_kinds();
    let suspended = kinds.iter().position(|k| k == "agent_suspended").unwrap();
    let resumed = kinds.iter().position(|k| k == "agent_resumed").unwrap();
    assert!(suspended < resumed, "{kinds:?}");
    // A request made when nothing runs the agent does not freeze its next run.
    let store = metash_store::Store::open(p.path()).unwrap();
    control::request(&store, "sus-n", Want::Suspended).unwrap();
    let r = host
        .spawn_agent(&SpawnRequest::new("sus-n", "", "echo free"))
        .unwrap();
    assert_eq!((r.status, r.data.as_str()), (AgentStatus::Success, "free"));
}

/// A guest that writes `tick` forever, spinning between lines.
fn ticker() -> String {
    let line = metash_testkit::wasm::agent_msg(
        r#"{"type":"output","agent_id":"sus-w","chunk_id":"t","content_type":"text/plain","data":"tick"}"#,
    ) + "\n";
    let escaped: String = line.bytes().map(|b| format!("\\{b:02x}")).collect();
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "{escaped}")
  (func (export "_start") (local $i i32)
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const {len}))
    (loop $forever
      (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (local.set $i (i32.const 0))
      (loop $spin
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $spin (i32.lt_u (local.get $i) (i32.const 3000000))))
      (br $forever))))"#,
        len = line.len()
    )
}

#[test]
fn a_wasm_agent_is_suspended_and_resumed_by_its_host() {
    let p = Project::new();
    let wat = p.path().join("ticker.wat");
    std::fs::write(&wat, ticker()).unwrap();
    p.agent("sus-w", "wasm", &wat, &[]);
    let host = p.host(&[]);
    let ticks = || {
        p.records()
            .iter()
            .filter(|r| r.kind == "agent_event" && r.data["data"] == "tick")
            .count()
    };
    std::thread::scope(|s| {
        let run = s.spawn(|| {
            let mut req = SpawnRequest::new("sus-w", "", "go");
            req.options = SpawnOptions {
                // Room for a slow start and the pause below; the deadline still ends it.
                timeout_seconds: Some(10.0),
                ..SpawnOptions::default()
            };
            host.spawn_agent(&req).unwrap()
        });
        wait_for("ticks", || ticks() > 3);
        let applied = host.control_agent("sus-w", Want::Suspended).unwrap();
        assert_eq!(applied, Applied::Here { changed: true });
        // A tick said just before the pause may still be on its way to the log (the host's
        // reader, the journal's next batch): wait until the count stops moving, then it must
        // not move again. A guest that kept running adds a tick every few milliseconds.
        let held = settled(&host, ticks);
        std::thread::sleep(Duration::from_millis(700));
        host.flush_events().unwrap();
        assert_eq!(ticks(), held, "a suspended guest kept running");
        assert_eq!(
            host.control_agent("sus-w", Want::Active).unwrap(),
            Applied::Here { changed: true }
        );
        wait_for("ticks after resume", || ticks() > held + 2);
        let r = run.join().unwrap();
        assert_eq!(r.status, AgentStatus::Timeout, "{r:?}");
    });
    // Nothing runs it now: the host leaves a request for whoever does.
    assert!(matches!(
        host.control_agent("sus-w", Want::Suspended).unwrap(),
        Applied::Requested { .. }
    ));
}

/// The count `ticks` gives once it has not changed for 500 ms, everything buffered written
/// (at most 10 s: a guest that does not stop never settles).
fn settled(host: &metash_host::Host, ticks: impl Fn() -> usize) -> usize {
    let until = Instant::now() + Duration::from_secs(10);
    host.flush_events().unwrap();
    let (mut last, mut since) = (ticks(), Instant::now());
    while since.elapsed() < Duration::from_millis(500) {
        assert!(Instant::now() < until, "a suspended guest kept running");
        std::thread::sleep(Duration::from_millis(50));
        host.flush_events().unwrap();
        let now = ticks();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}
