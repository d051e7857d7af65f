//! Per-action consent for starting processes (the native exec gate): with a live gate every exec of
//! the agent and its children waits for the gate; the agent's own start does not; a refusal fails
//! the exec with `EPERM`, is logged as `sandbox_denied` and explained to the agent on stdin; a gate
//! that never answers does not outlive the invocation's deadline; without a gate nothing is
//! installed.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_runtime::{ActionGate, Gate, GateVerdict, GatedAction, InvocationStatus};

use super::common::*;

macro_rules! require_exec_gate {
    () => {
        require_native!();
        if let Err(why) = metash_runtime::native::exec_gate::available() {
            metash_testkit::skip(module_path!(), &why);
            return;
        }
    };
}

/// A gate that records every exec it is asked about and answers with a fixed verdict, optionally
/// after waiting until the test releases it.
struct TestGate {
    verdict: GateVerdict,
    calls: Mutex<Vec<(String, Vec<String>)>>,
    hold: Option<(Mutex<bool>, Condvar)>,
}

impl TestGate {
    fn new(verdict: GateVerdict) -> Arc<Self> {
        Arc::new(Self {
            verdict,
            calls: Mutex::new(Vec::new()),
            hold: None,
        })
    }

    fn holding(verdict: GateVerdict) -> Arc<Self> {
        Arc::new(Self {
            verdict,
            calls: Mutex::new(Vec::new()),
            hold: Some((Mutex::new(true), Condvar::new())),
        })
    }

    fn release(&self) {
        if let Some((held, cv)) = &self.hold {
            *held.lock().unwrap() = false;
            cv.notify_all();
        }
    }

    fn calls(&self) -> Vec<(String, Vec<String>)> {
        self.calls.lock().unwrap().clone()
    }

    fn programs(&self) -> Vec<String> {
        self.calls().into_iter().map(|(p, _)| p).collect()
    }
}

impl ActionGate for TestGate {
    fn decide(&self, _agent: &str, action: &GatedAction<'_>) -> GateVerdict {
        if let GatedAction::Exec { program, argv } = action {
            self.calls
                .lock()
                .unwrap()
                .push((program.to_string(), argv.to_vec()));
        }
        if let Some((held, cv)) = &self.hold {
            // Bounded, so a failing test cannot leave the supervisor blocked forever.
            let g = held.lock().unwrap();
            let _ = cv
                .wait_timeout_while(g, Duration::from_secs(20), |h| *h)
                .unwrap();
        }
        self.verdict.clone()
    }
}

fn deny() -> GateVerdict {
    GateVerdict::Deny {
        code: "exec_refused_by_test".into(),
        message: "the test says no".into(),
        hint: Some("ask again later".into()),
    }
}

/// `Seccomp_filters` of a live process (how many filters it runs under).
fn seccomp_filters(pid: i32) -> Option<u32> {
    // The program's process (in its PID namespace, the spawned process's grandchild).
    let pid = metash_runtime::native::procs::program(pid);
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp_filters:"))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn exec_gate_allows_and_sees_program_and_argv() {
    require_exec_gate!();
    let f = Fixture::new();
    let gate = TestGate::new(GateVerdict::Allow);
    let mut spec = f.native("g-allow", &["files.read"], None);
    spec.gate = Gate(Some(gate.clone()));
    // A PATH search: the first candidate does not exist and is not asked about.
    spec.env = vec![("PATH".into(), "/nonexistent-dir:/usr/bin".into())];
    let mut a = f.start(spec);
    let report = &f.events("g-allow", LogKind::AgentStarted)[0].data;
    assert_eq!(report["exec_gate"], "seccomp-user-notif", "{report}");
    assert_eq!(seccomp_filters(a.pid().unwrap()), Some(2));

    // The agent's own start (the exec of the entry) was not gated.
    assert_eq!(text(&run(&mut a, "echo hi").1), "hi");
    assert!(gate.calls().is_empty(), "{:?}", gate.calls());

    let (_, ev) = run(&mut a, "exec /bin/true");
    assert_eq!(text(&ev), "EXEC-OK:exit=0:stdout=", "{ev:?}");
    assert_eq!(
        gate.calls(),
        vec![("/bin/true".to_string(), vec!["/bin/true".to_string()])]
    );

    let (_, ev) = run(&mut a, "exec /bin/echo hello gate");
    assert_eq!(text(&ev), "EXEC-OK:exit=0:stdout=hello gate");
    assert_eq!(
        gate.calls()[1],
        (
            "/bin/echo".to_string(),
            vec!["/bin/echo".into(), "hello".into(), "gate".into()]
        )
    );

    let (_, ev) = run(&mut a, "exec true");
    assert_eq!(text(&ev), "EXEC-OK:exit=0:stdout=");
    assert_eq!(gate.programs()[2..], ["/usr/bin/true".to_string()]);

    // A child's exec and a re-exec in the same process are gated too.
    let (_, ev) = run(&mut a, "exec /bin/sh -c /bin/true");
    assert_eq!(text(&ev), "EXEC-OK:exit=0:stdout=");
    let calls = gate.calls();
    assert_eq!(
        calls[3],
        (
            "/bin/sh".to_string(),
            vec!["/bin/sh".into(), "-c".into(), "/bin/true".into()]
        )
    );
    assert_eq!(calls[4].0, "/bin/true");
    assert_eq!(calls.len(), 5, "{calls:?}");
    assert!(f.events("g-allow", LogKind::SandboxDenied).is_empty());
    a.shutdown().unwrap();
}

#[test]
fn exec_gate_denial_reaches_agent_and_log() {
    require_exec_gate!();
    let f = Fixture::new();
    let gate = TestGate::new(deny());
    let mut spec = f.native("g-deny", &["files.read"], None);
    spec.gate = Gate(Some(gate.clone()));
    let mut a = f.start(spec);
    let (o, ev) = run(&mut a, "exec /bin/true");
    assert!(matches!(o.status, InvocationStatus::Done { .. }), "{o:?}");
    let t = text(&ev);
    // The agent's exec failed with EPERM...
    assert!(t.contains("(errno 1)"), "{t}");
    assert!(!t.contains("EXEC-OK"), "{t}");
    // ...and the host's explanation reached it on stdin.
    let host = t
        .split('|')
        .find_map(|part| part.strip_prefix("HOST:"))
        .unwrap_or_else(|| panic!("the agent got no notice: {t}"));
    let notice: serde_json::Value = serde_json::from_str(host).unwrap();
    assert_eq!(notice["type"], "error");
    assert_eq!(notice["code"], "exec_refused_by_test");
    assert_eq!(notice["hint"], "ask again later");
    assert!(
        notice["message"].as_str().unwrap().contains("/bin/true"),
        "{notice}"
    );
    assert!(f.logged_denial("g-deny"));
    let denied = f.events("g-deny", LogKind::SandboxDenied);
    assert_eq!(denied.len(), 1, "{denied:?}");
    let d = &denied[0].data;
    assert_eq!(d["what"], "exec");
    assert_eq!(d["program"], "/bin/true");
    assert_eq!(d["code"], "exec_refused_by_test");
    assert_eq!(d["via"], "seccomp-user-notif");
    assert_eq!(gate.programs(), ["/bin/true"]);
    // The agent keeps working after a refusal.
    assert_eq!(text(&run(&mut a, "echo still here").1), "still here");
    a.shutdown().unwrap();
}

#[test]
fn exec_without_gate_installs_nothing() {
    require_native!();
    let f = Fixture::new();
    let mut a = f.start(f.native("g-none", &["files.read"], None));
    let report = &f.events("g-none", LogKind::AgentStarted)[0].data;
    assert_eq!(report["exec_gate"], false, "{report}");
    // Only the EPERM filter: no notify filter, so no listener and no supervisor to answer it.
    assert_eq!(seccomp_filters(a.pid().unwrap()), Some(1));
    let (_, ev) = run(&mut a, "exec /bin/echo free");
    assert_eq!(text(&ev), "EXEC-OK:exit=0:stdout=free");
    assert!(f.events("g-none", LogKind::SandboxDenied).is_empty());
    a.shutdown().unwrap();
}

#[test]
fn exec_gate_that_never_answers_does_not_hang_the_host() {
    require_exec_gate!();
    const TIMEOUT: Duration = Duration::from_millis(400);
    // The gate never answers until released, so a host that waited for it would hang: a bound
    // of a few seconds proves it did not, with room for a loaded machine.
    const STOP_WITHIN: Duration = Duration::from_secs(5);
    let f = Fixture::new();
    let gate = TestGate::holding(deny());
    let mut spec = f.native("g-slow", &["files.read"], None);
    spec.gate = Gate(Some(gate.clone()));
    spec.timeout = TIMEOUT;
    let mut a = f.start(spec);
    let pgid = a.pid().unwrap();
    let t = Instant::now();
    let (o, _) = run(&mut a, "exec /bin/true");
    let took = t.elapsed();
    assert_eq!(o.status, InvocationStatus::Timeout, "{o:?}");
    assert!(took >= TIMEOUT, "timed out early: {took:?}");
    assert!(took < TIMEOUT + STOP_WITHIN, "took {took:?}");
    assert_eq!(gate.programs(), ["/bin/true"]);
    // Nothing of the agent survived, the waiting child included.
    assert!(group_gone(pgid, Duration::ZERO), "survivors in the group");
    // Dropping the agent (and its sandbox) does not wait for the gate either.
    let t = Instant::now();
    drop(a);
    assert!(t.elapsed() < STOP_WITHIN, "{:?}", t.elapsed());
    // The late answer finds the notification gone: no denial is logged for a dead process.
    gate.release();
    std::thread::sleep(Duration::from_millis(100));
    assert!(f.events("g-slow", LogKind::SandboxDenied).is_empty());
}

/// A script agent in a package directory: `agent.py` (`#!/usr/bin/env python3`) imports `helper.py`
/// beside it and starts `/usr/bin/true` when asked.
fn script_package(dir: &std::path::Path) -> std::path::PathBuf {
    let pkg = dir.join("pkg");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("helper.py"), "WORD = 'from the package'\n").unwrap();
    let entry = pkg.join("agent.py");
    std::fs::write(
        &entry,
        r#"#!/usr/bin/env python3
import json, subprocess, sys
def say(**m):
    sys.stdout.write(json.dumps({"schema_version": "0.1", **m}) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    if msg["type"] != "input":
        continue
    try:
        import helper
        word = helper.WORD
    except Exception as e:
        word = "no package: " + type(e).__name__
    try:
        ran = subprocess.run(["/usr/bin/true"]).returncode == 0
    except Exception as e:
        ran = "refused: " + type(e).__name__
    say(type="output", agent_id="s", chunk_id="a:0", content_type="text/plain", data=f"{word}|{ran}")
    say(type="done")
"#,
    )
    .unwrap();
    std::fs::set_permissions(&entry, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    entry
}

#[test]
fn a_script_starts_its_interpreter_unasked_and_reads_its_package_nothing_more() {
    require_exec_gate!();
    if !std::path::Path::new("/usr/bin/python3").exists() {
        return metash_testkit::skip("script agent", "no /usr/bin/python3");
    }
    let f = Fixture::new();
    let entry = script_package(f.dir.path());
    for (id, package) in [("s-pkg", true), ("s-bare", false)] {
        let gate = TestGate::new(GateVerdict::Allow);
        let mut spec = f.native(id, &[], None);
        spec.entry = entry.clone();
        spec.package = package.then(|| entry.parent().unwrap().to_path_buf());
        spec.gate = Gate(Some(gate.clone()));
        let mut a = f.start(spec);
        let said = text(&run(&mut a, "go").1);
        // `env` starting python3 was not asked about; the agent's own exec of `true` was.
        assert_eq!(gate.programs(), ["/usr/bin/true"], "{id}: {said}");
        if package {
            assert_eq!(said, "from the package|True");
        } else {
            assert!(said.starts_with("no package:"), "{said}");
        }
    }
}
