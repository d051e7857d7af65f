//! Runaway native agents: whatever they do, they are gone soon after their timeout, checked by
//! looking for surviving processes of their group and the pids they reported.

use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_runtime::InvocationStatus;

use super::common::*;

const TIMEOUT: Duration = Duration::from_millis(400);
/// How long after its deadline (or interrupt) a stop may take. The product needs a few hundred
/// milliseconds; the margin is for a loaded CI machine descheduling the host's threads. Every
/// agent here would otherwise run forever (a spin loop, `sleep_forever`), so staying under this
/// bound still proves the stop.
const STOP_WITHIN: Duration = Duration::from_secs(5);

fn runaway(prompt: &str, id: &str) -> (Vec<i32>, String) {
    let f = Fixture::new();
    let mut spec = f.native(id, &[], None);
    spec.timeout = TIMEOUT;
    let mut a = f.start(spec);
    let pgid = a.pid().unwrap();
    // In a PID namespace of its own, the pids the agent reports are that namespace's: the check
    // is then that nothing of the namespace survives.
    let host_ns = metash_runtime::native::procs::pid_namespace(std::process::id() as i32);
    let program = metash_runtime::native::procs::program(pgid);
    // Held open to the end of the check: the kernel gives a freed namespace's number to the next
    // one at once, so without this reference a parallel test's new namespace could take it and
    // that test's live processes would look like survivors of this one.
    let _ns_held = std::fs::File::open(format!("/proc/{program}/ns/pid"))
        .expect("open the agent's pid namespace");
    let ns = metash_runtime::native::procs::pid_namespace(program)
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
    // The deadline is set when the input is sent, after `t`: it cannot fire early.
    assert!(took >= TIMEOUT, "{prompt}: timed out early, after {took:?}");
    assert!(took < TIMEOUT + STOP_WITHIN, "{prompt}: took {took:?}");
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
    let took = t.elapsed();
    assert_eq!(o.status, InvocationStatus::Timeout);
    assert!(took >= TIMEOUT, "timed out early, after {took:?}");
    assert!(took < TIMEOUT + STOP_WITHIN, "{took:?}");
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
    // Killed, not Timeout: the 30 s deadline would have ended it otherwise.
    assert!(matches!(o.status, InvocationStatus::Killed { .. }), "{o:?}");
    assert!(
        t.elapsed() < Duration::from_millis(200 + 100) + STOP_WITHIN,
        "{:?}",
        t.elapsed()
    );
    assert!(metash_runtime::native::procs::group_members(pgid).is_empty());
    assert_eq!(f.events("r-int", LogKind::AgentKilled).len(), 1);
}
