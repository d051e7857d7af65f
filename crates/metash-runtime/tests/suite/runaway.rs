//! Runaway native agents: whatever they do, they are gone within timeout + 250 ms, checked by
//! looking for surviving processes of their group and the pids they reported.

use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_runtime::InvocationStatus;

use super::common::*;

const TIMEOUT: Duration = Duration::from_millis(400);
const SLACK: Duration = Duration::from_millis(250);

fn runaway(prompt: &str, id: &str) -> (Vec<i32>, String) {
    let f = Fixture::new();
    let mut spec = f.native(id, &[], None);
    spec.timeout = TIMEOUT;
    let mut a = f.start(spec);
    let pgid = a.pid().unwrap();
    // In a PID namespace of its own, the pids the agent reports are that namespace's: the check
    // is then that nothing of the namespace survives.
    let host_ns = metash_runtime::native::procs::pid_namespace(std::process::id() as i32);
    let ns =
        metash_runtime::native::procs::pid_namespace(metash_runtime::native::procs::program(pgid))
            .filter(|ns| Some(ns) != host_ns.as_ref());
    let t = Instant::now();
    let (o, ev) = run(&mut a, prompt);
    let took = t.elapsed();
    assert_eq!(o.status, InvocationStatus::Timeout, "{o:?}");
    let out = text(&ev);
    // Pids the agent reported ("CHILD:123", "GRANDCHILD:456:...").
    let mut pids: Vec<i32> = out
        .split(|c: char| !c.is_ascii_digit() && c != '-')
        .filter_map(|s| s.parse().ok())
        .filter(|&p: &i32| p > 1)
        .collect();
    pids.push(pgid);
    let survivors: Vec<i32> = metash_runtime::native::procs::group_members(pgid);
    assert!(
        survivors.is_empty(),
        "{prompt}: survivors in the group {survivors:?}"
    );
    match &ns {
        Some(ns) => {
            let left = metash_runtime::native::procs::namespace_members(ns);
            assert!(left.is_empty(), "{prompt}: {left:?} survived in {ns}");
        }
        None => {
            for p in &pids {
                assert!(
                    !metash_runtime::native::procs::alive(*p),
                    "{prompt}: pid {p} survived"
                );
            }
        }
    }
    assert!(took < TIMEOUT + SLACK, "{prompt}: took {took:?}");
    (pids, out)
}

#[test]
fn runaway_infinite_loop() {
    require_native!();
    runaway("spin", "r-spin");
}

#[test]
fn runaway_child_ignoring_sigterm() {
    require_native!();
    let (pids, out) = runaway("child-ignore-term", "r-child");
    assert!(out.starts_with("CHILD:"), "{out}");
    assert!(pids.len() >= 2);
}

#[test]
fn runaway_grandchild_holding_stdout() {
    require_native!();
    let (_, out) = runaway("grandchild-stdout", "r-grand");
    assert!(out.starts_with("GRANDCHILD:"), "{out}");
    // seccomp refused the grandchild's attempt to leave the process group.
    assert!(out.ends_with("setsid=-1"), "{out}");
}

#[test]
fn wasm_runaway_loop() {
    let f = Fixture::new();
    let mut spec = f.wasm("r-wasm", &wat_spin(), &[], None);
    spec.timeout = TIMEOUT;
    let mut a = f.start(spec);
    let t = Instant::now();
    let (o, _) = run(&mut a, "go");
    assert_eq!(o.status, InvocationStatus::Timeout);
    assert!(t.elapsed() < TIMEOUT + SLACK, "{:?}", t.elapsed());
}

#[test]
fn native_interrupt_while_running() {
    require_native!();
    let f = Fixture::new();
    let mut spec = f.native("r-int", &[], None);
    spec.timeout = Duration::from_secs(30);
    spec.shutdown_grace = Duration::from_millis(100);
    let mut a = f.start(spec);
    let pgid = a.pid().unwrap();
    let stop = a.interrupter();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        stop.interrupt();
    });
    let t = Instant::now();
    let (o, _) = run(&mut a, "child-ignore-term");
    h.join().unwrap();
    assert!(matches!(o.status, InvocationStatus::Killed { .. }), "{o:?}");
    assert!(
        t.elapsed() < Duration::from_millis(200 + 100) + SLACK,
        "{:?}",
        t.elapsed()
    );
    assert!(metash_runtime::native::procs::group_members(pgid).is_empty());
    assert_eq!(f.events("r-int", LogKind::AgentKilled).len(), 1);
}
