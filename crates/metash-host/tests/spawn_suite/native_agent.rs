use std::time::{Duration, Instant};

use metash_host::{SpawnRequest, Spawner};
use metash_protocol::{AgentStatus, SpawnOptions};

use super::common::{live_processes_under, native_agent_exe, native_unavailable, Project};

fn project() -> Option<Project> {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("native agent tests", &why);
        return None;
    }
    let p = Project::new();
    p.agent(
        "native-a",
        "native",
        &native_agent_exe(),
        &["files.read", "process.spawn:sleep"],
    );
    Some(p)
}

fn spawn(
    host: &metash_host::Host,
    message: &str,
    timeout: Option<f64>,
) -> metash_protocol::AgentResponse {
    let mut req = SpawnRequest::new("native-a", "be brief", message);
    req.options = SpawnOptions {
        timeout_seconds: timeout,
        ..SpawnOptions::default()
    };
    host.spawn_agent(&req).unwrap()
}

#[test]
fn native_agent_success_and_error() {
    let Some(p) = project() else { return };
    let host = p.host(&["native"]);
    let r = spawn(&host, "echo hello there", None);
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert_eq!(r.data, "hello there");
    assert!(r.metadata.duration_ms > 0);
    let r = spawn(&host, "fail", None);
    assert_eq!(r.status, AgentStatus::Error);
    assert!(r.data.contains("boom"), "{}", r.data);
    let kinds = p.log_kinds();
    for k in ["spawn", "agent_started", "agent_event", "spawn_end"] {
        assert!(kinds.iter().any(|x| x == k), "no `{k}` event in {kinds:?}");
    }
}

/// An agent that dies says why: the end of its stderr is in the spawn's answer.
#[test]
fn a_native_agent_that_dies_says_why() {
    let Some(p) = project() else { return };
    let host = p.host(&["native"]);
    let r = spawn(&host, "die no module named helper", None);
    assert_eq!(r.status, AgentStatus::Error);
    assert!(r.data.contains("exited before finishing"), "{}", r.data);
    assert!(
        r.data.contains("stderr: fatal: no module named helper"),
        "{}",
        r.data
    );
}

/// Native execution is opt-in: without consent the agent never starts, and the spawn is refused
/// (a `ConsentRefused` error naming the command that grants it, not an agent's failure to retry).
#[test]
fn native_agent_without_consent_is_refused() {
    let Some(p) = project() else { return };
    let host = p.host(&[]);
    let err = host
        .spawn_agent(&SpawnRequest::new("native-a", "be brief", "echo hi"))
        .expect_err("refused");
    let metash_host::HostError::ConsentRefused {
        agent, capability, ..
    } = &err
    else {
        panic!("not a consent refusal: {err:?}");
    };
    assert_eq!(
        (agent.as_str(), capability.as_str()),
        ("native-a", "native")
    );
    let text = err.to_string();
    assert!(text.contains("native execution"), "{text}");
    assert!(
        text.contains("metash consent grant native-a native --sensitive --duration-s 86400"),
        "{text}"
    );
    assert!(!p.log_kinds().iter().any(|k| k == "agent_started"));
    let end = p.log_data("spawn_end");
    assert_eq!(
        end.last().map(|d| d["refused"].clone()),
        Some("native".into())
    );
}

/// Timeout: the whole process group (the agent ignoring SIGTERM and its `sleep 300` grandchild
/// holding stdout) is gone, the partial output comes back, and no lock is held.
#[test]
fn native_timeout_kills_the_tree_and_returns_partial_output() {
    let Some(p) = project() else { return };
    // The grandchild is a process start: allowed here, so that it exists to be killed.
    let host = p.host(&["native", "process.spawn:sleep"]);
    let t = Instant::now();
    // A grandchild this test alone starts (other suites may run `sleep 300` at the same time).
    let tag = format!(
        "{}{}",
        std::process::id(),
        Instant::now().elapsed().subsec_nanos()
    );
    // This test's agent is told from other tests' (the same program) by its directory; seen
    // while it runs, so that the check after its timeout can fail.
    let exe = native_agent_exe().display().to_string();
    let dir = p.path().canonicalize().expect("project");
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (exe, dir, seen, done) = (exe.clone(), dir.clone(), seen.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                if !live_processes_under(&exe, &dir).is_empty() {
                    seen.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let r = spawn(&host, &format!("hang {tag}"), Some(1.0));
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    watcher.join().expect("watcher");
    assert!(
        seen.load(std::sync::atomic::Ordering::SeqCst),
        "the agent was never seen running in {}",
        dir.display()
    );
    assert_eq!(r.status, AgentStatus::Timeout, "{r:?}");
    assert!(r.data.contains("partial"), "{}", r.data);
    // The grandchild really started (its start was asked and allowed), so its death is real.
    let started_sleep = p.log_data("consent_answer").iter().any(|d| {
        d["capability"].as_str().unwrap_or("").ends_with("/sleep") && d["answer"] == "allow_once"
    });
    assert!(started_sleep, "the grandchild was never allowed to start");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    std::thread::sleep(Duration::from_millis(250));
    assert!(
        live_processes_under(&exe, &dir).is_empty(),
        "the agent survived its timeout"
    );
    assert!(
        live_processes_under(&format!("sleep 300.{tag}"), &dir).is_empty(),
        "the grandchild survived"
    );
    // No lock left behind: a short-timeout update goes through at once.
    let store = metash_store::Store::open(p.path())
        .unwrap()
        .with_lock_timeout(Duration::from_millis(100));
    store
        .update_state("variables.after", serde_json::json!(1))
        .unwrap();
}

/// An agent's session state_update goes through update_state; outside `variables.*` it is refused.
#[test]
fn agent_state_updates_go_through_the_same_path() {
    let Some(p) = project() else { return };
    let host = p.host(&["native"]);
    let r = spawn(&host, "state variables.seen 7", None);
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert_eq!(
        host.get_state("variables.seen").unwrap(),
        serde_json::json!(7)
    );
    let recs = host.store().log().read_all().unwrap();
    let upd = recs
        .iter()
        .find(|r| r.kind == "state_update" && r.data["key"] == "variables.seen")
        .unwrap();
    assert_eq!(upd.agent.as_deref(), Some("native-a"));
    spawn(&host, "state status \"halted\"", None);
    assert_eq!(
        host.get_state("status").unwrap(),
        serde_json::json!("planning")
    );
    assert!(p.log_kinds().iter().any(|k| k == "denied"));
}

#[test]
fn native_agent_checkpoint() {
    let Some(p) = project() else { return };
    let host = p.host(&["native"]);
    let r = spawn(&host, "checkpoint", None);
    assert_eq!(r.status, AgentStatus::Checkpoint, "{r:?}");
    let signal: metash_protocol::CheckpointSignal = serde_json::from_str(&r.data).unwrap();
    assert_eq!(signal.message, "Pick one");
    assert_eq!(signal.resume_id.as_deref(), Some("pick"));
    assert_eq!(
        host.pending_checkpoint().unwrap().unwrap().agent,
        "native-a"
    );
}
