//! A native agent starts in the host's own memory (`native::vspawn`: `clone(CLONE_VM)`, no copy of
//! the host), and its PID namespace's init keeps running there for as long as the agent runs.
//! What that must never let happen, each tried for real: a host signal handler running in that
//! init (it would write the host's memory), and the init sitting in the agent's memory cgroup
//! (the cgroup's OOM killer, choosing by resident size, would pick it, and with it every process
//! sharing its memory: the host).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use metash_protocol::LogKind;
use metash_runtime::InvocationStatus;

use super::common::*;

static URGENT: AtomicUsize = AtomicUsize::new(0);

extern "C" fn count_urgent(_: libc::c_int) {
    URGENT.fetch_add(1, Ordering::SeqCst);
}

/// The memory cgroup (v1 `memory` line, or the v2 line) of `pid`.
fn memory_cgroup(pid: i32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "memory"))
        })
        .or_else(|| lines.iter().find(|l| l.starts_with("0::")))
        .and_then(|l| l.splitn(3, ':').nth(2))
        .map(str::to_string)
}

#[test]
fn no_host_signal_handler_runs_in_the_init_that_shares_its_memory() {
    require_native!();
    // SAFETY: installing a handler that only bumps an atomic; SIGURG is ignored by default, so
    // nothing else in the test binary relies on it.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = count_urgent as *const () as usize;
        libc::sigemptyset(&mut act.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGURG, &act, std::ptr::null_mut()), 0);
        // The control: the handler runs here.
        libc::raise(libc::SIGURG);
    }
    assert_eq!(
        URGENT.load(Ordering::SeqCst),
        1,
        "the handler must work here"
    );
    let f = Fixture::new();
    let mut a = f.start(f.native("s-sig", &[], None));
    let init = a.pid().unwrap();
    let program = metash_runtime::native::procs::program(init);
    assert_ne!(
        program, init,
        "a PID namespace whose init is the spawned process"
    );
    for _ in 0..5 {
        // SAFETY: kill(2) on the agent's own init, which shares this process's memory: had it
        // kept this process's handler, the handler would run there and bump the same counter.
        assert_eq!(unsafe { libc::kill(init, libc::SIGURG) }, 0);
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        URGENT.load(Ordering::SeqCst),
        1,
        "a host handler ran in the init"
    );
    assert_eq!(text(&run(&mut a, "echo still here").1), "still here");
    a.shutdown().unwrap();
}

#[test]
fn only_the_program_joins_the_memory_cgroup_and_its_oom_kill_spares_the_host() {
    require_native!();
    let f = Fixture::new();
    let mut a = f.start(f.native("s-oom", &[], Some("64Mi")));
    let report = f.events("s-oom", LogKind::AgentStarted)[0].data.clone();
    if report["limits"]["memory_bytes"]["via"] == "rlimit" {
        let why = "no writable memory cgroup here (the limit is an rlimit)";
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("skipping: {why}");
        return;
    }
    let init = a.pid().unwrap();
    let program = metash_runtime::native::procs::program(init);
    let ours = memory_cgroup(std::process::id() as i32);
    assert!(ours.is_some());
    assert_eq!(
        memory_cgroup(init),
        ours,
        "the init stays in the host's cgroup"
    );
    let agents = memory_cgroup(program).unwrap_or_default();
    assert!(
        agents.contains("metash"),
        "the program is in the agent's: {agents}"
    );
    // This process (the host) is made larger than the limit, so a cgroup OOM killer that could
    // see the init would pick it: by resident size, the init's (this process's memory) would
    // beat the program's, and killing it kills every process sharing that memory, this one too.
    let ballast: Vec<u8> = vec![1u8; 192 << 20];
    assert!(ballast.iter().step_by(4096).all(|&b| b == 1));
    // The program allocates past its limit: the cgroup's OOM killer acts (the status says so),
    // and this process is still here to see it.
    let (o, ev) = run(&mut a, "alloc 512");
    drop(ballast);
    assert!(!text(&ev).contains("ALLOC-OK"), "{}", text(&ev));
    assert_eq!(
        o.status,
        InvocationStatus::LimitExceeded {
            limit: "memory".into()
        }
    );
    assert!(
        group_gone(init, Duration::from_millis(500)),
        "the tree is gone"
    );
}
