//! The lifecycle state machine on both sandboxes: illegal transitions, suspend/resume.

use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_runtime::{InvocationStatus, LifecycleState};

use super::common::*;

#[test]
fn illegal_transitions_are_rejected() {
    let f = Fixture::new();
    let mut a =
        f.rt.register(f.wasm("l-ill", &wat_echo(), &[], None))
            .unwrap();
    assert_eq!(a.state(), LifecycleState::Registered);
    let err = a.invoke("x", &[], &mut |_| {}).unwrap_err();
    assert_eq!(err.code(), "illegal_transition");
    assert!(
        err.to_string().contains("cannot invoke while registered"),
        "{err}"
    );
    assert_eq!(a.suspend().unwrap_err().code(), "illegal_transition");
    a.start().unwrap();
    assert_eq!(a.start().unwrap_err().code(), "illegal_transition");
    assert_eq!(a.suspend().unwrap_err().code(), "illegal_transition");
    assert_eq!(a.resume().unwrap_err().code(), "illegal_transition");
    run(&mut a, "go");
    assert_eq!(a.state(), LifecycleState::Active);
    assert_eq!(a.resume().unwrap_err().code(), "illegal_transition");
    a.shutdown().unwrap();
    assert_eq!(a.state(), LifecycleState::Terminated);
    assert_eq!(
        a.invoke("x", &[], &mut |_| {}).unwrap_err().code(),
        "illegal_transition"
    );
    assert_eq!(a.shutdown().unwrap_err().code(), "illegal_transition");
    // Each legal transition is in the log, in order.
    let kinds_seen: Vec<LogKind> = f
        .sink
        .events()
        .into_iter()
        .filter(|e| e.agent.as_deref() == Some("l-ill"))
        .map(|e| e.kind)
        .filter(|k| k.as_str().starts_with("agent_") && *k != LogKind::AgentEvent)
        .collect();
    assert_eq!(
        kinds_seen,
        [
            LogKind::AgentInstanceRegistered,
            LogKind::AgentStarted,
            LogKind::AgentActive,
            LogKind::AgentInvoked,
            LogKind::AgentInvocationEnd,
            LogKind::AgentTerminated
        ]
    );
}

#[test]
fn wasm_suspend_resume_between_invocations() {
    let f = Fixture::new();
    let mut a = f.start(f.wasm("l-wsus", &wat_echo(), &[], None));
    assert_eq!(text(&run(&mut a, "go").1), "OK");
    a.suspend().unwrap();
    assert_eq!(a.state(), LifecycleState::Suspended);
    assert_eq!(
        a.invoke("x", &[], &mut |_| {}).unwrap_err().code(),
        "illegal_transition"
    );
    a.resume().unwrap();
    assert_eq!(text(&run(&mut a, "go").1), "OK");
    assert_eq!(f.events("l-wsus", LogKind::AgentSuspended).len(), 1);
    assert_eq!(f.events("l-wsus", LogKind::AgentResumed).len(), 1);
}

/// `pid`'s state (as in `/proc/<pid>/stat`) once `done` holds for it, or its last state after
/// 10 s. Signals act asynchronously; a generous deadline keeps a loaded machine from failing
/// the test while a state that never comes still does.
fn state_when(pid: i32, done: impl Fn(char) -> bool) -> char {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (state, _) = metash_runtime::native::procs::stat(pid).expect("the agent is alive");
        if done(state) || Instant::now() > deadline {
            return state;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn native_suspend_resume_stops_the_process() {
    require_native!();
    let f = Fixture::new();
    let mut a = f.start(f.native("l-nsus", &[], None));
    let pid = a.pid().unwrap();
    assert_eq!(text(&run(&mut a, "echo one").1), "one");
    a.suspend().unwrap();
    // SIGSTOP takes effect when the kernel next schedules the process: wait for it.
    let state = state_when(pid, |s| s == 'T');
    assert_eq!(state, 'T', "SIGSTOP did not stop the agent");
    assert_eq!(
        a.invoke("echo x", &[], &mut |_| {}).unwrap_err().code(),
        "illegal_transition"
    );
    a.resume().unwrap();
    let state = state_when(pid, |s| s != 'T');
    assert_ne!(state, 'T', "SIGCONT did not resume the agent");
    assert_eq!(text(&run(&mut a, "echo two").1), "two");
    a.shutdown().unwrap();
}

#[test]
fn native_agent_that_exits_is_terminated() {
    require_native!();
    let f = Fixture::new();
    let mut a = f.start(f.native("l-exit", &[], None));
    let (o, _) = run(&mut a, "exit 7");
    assert_eq!(
        o.status,
        InvocationStatus::Exited {
            code: Some(7),
            signal: None
        }
    );
    assert_eq!(a.state(), LifecycleState::Terminated);
    // Nothing on stderr: nothing reported.
    assert_eq!(o.stderr, None);
}

/// Why a native agent died is in its outcome and its log record: the end of its stderr.
#[test]
fn a_native_agent_that_dies_leaves_its_stderr_in_the_outcome() {
    require_native!();
    let f = Fixture::new();
    let mut a = f.start(f.native("l-die", &[], None));
    let (o, _) = run(&mut a, "die cannot find module @metash/sdk");
    assert!(
        matches!(o.status, InvocationStatus::Exited { code: Some(9), .. }),
        "{o:?}"
    );
    assert_eq!(
        o.stderr.as_deref().map(str::trim_end),
        Some("fatal: cannot find module @metash/sdk")
    );
    let end = &f.events("l-die", LogKind::AgentInvocationEnd)[0].data;
    assert!(
        end["stderr"].as_str().unwrap().contains("@metash/sdk"),
        "{end}"
    );
}

#[test]
fn start_event_reports_limits() {
    let f = Fixture::new();
    let mut a =
        f.rt.register(f.wasm("l-lim", &wat_echo(), &[], Some("32Mi")))
            .unwrap();
    let report = a.start().unwrap();
    assert_eq!(report["limits"]["memory_bytes"]["value"], 32 * 1024 * 1024);
    assert_eq!(report["limits"]["memory_bytes"]["via"], "wasm-store-limits");
    assert_eq!(report["limits"]["timeout_ms"]["via"], "wasm-epoch");
    if native_unavailable().is_none() {
        let mut n = f.start(f.native("l-nlim", &["files.read"], Some("128Mi")));
        let ev = &f.events("l-nlim", LogKind::AgentStarted)[0].data;
        println!("native start report: {ev}");
        assert!(ev["limits"]["memory_bytes"]["via"].is_string());
        assert!(ev["limits"]["pids"]["via"].is_string());
        assert_eq!(ev["workspace_access"], "read-only");
        n.shutdown().unwrap();
    }
}

#[test]
fn module_cache_survives_a_new_runtime() {
    let f = Fixture::new();
    let spec = f.wasm("l-cache", &wat_echo(), &[], None);
    let mut a = f.rt.register(spec.clone()).unwrap();
    assert_eq!(a.start().unwrap()["module_cache"], "compiled");
    let mut b = f.rt.register(spec.clone()).unwrap();
    assert_eq!(b.start().unwrap()["module_cache"], "memory");
    // A new runtime (new process, same cache dir) loads from disk.
    let rt2 = metash_runtime::Runtime::new(
        metash_runtime::RuntimeConfig {
            cache_dir: f.dir.path().join("cache"),
            cache_key: metash_runtime::CacheKey::ephemeral().expect("cache key"),
        },
        std::sync::Arc::new(metash_runtime::NullSink),
    )
    .unwrap();
    let mut c = rt2.register(spec).unwrap();
    assert_eq!(c.start().unwrap()["module_cache"], "disk");
    assert_eq!(text(&run(&mut c, "go").1), "OK");
}

/// Several threads starting the same, not yet cached module at once all start (the compile cache
/// used to race on one temp file name per process).
#[test]
fn parallel_first_starts_of_one_module_all_succeed() {
    let h = Fixture::new();
    for round in 0..8 {
        // A distinct module each round, so every round is a first compile.
        let echo = wat_echo();
        let cut = echo.trim_end().rfind(')').unwrap();
        let wat = format!("{} (global i32 (i32.const {round})))", &echo[..cut]);
        let specs: Vec<_> = (0..6)
            .map(|i| h.wasm(&format!("par{round}-{i}"), &wat, &[], None))
            .collect();
        std::thread::scope(|s| {
            for spec in specs {
                let h = &h;
                s.spawn(move || {
                    let mut a = h.start(spec);
                    let (out, _) = run(&mut a, "go");
                    assert_eq!(
                        out.status.agent_status(),
                        metash_protocol::AgentStatus::Success
                    );
                });
            }
        });
    }
}
