//! Live revocation (seed 002 §2, issue 18): a grant that ends while the agent runs, revoked from
//! another handle (as `metash consent revoke` in another process is) or expired, reaches the
//! agent at once as a `consent_revoke` event, which `metash-agent` applies to `granted()`; the
//! agent goes on with its fallback. One agent source (`metash-agent`'s `revocable` example), run
//! native and as WASM.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use metash_host::{Host, SpawnRequest, Spawner};
use metash_policy::{AgentDirs, Policy, Registry};
use metash_protocol::AgentStatus;

use super::common::*;

fn policy(ws: &Path) -> Policy {
    let store = metash_store::Store::open(ws).unwrap();
    Policy::new(store, Registry::discover(&AgentDirs::new(ws, None)))
}

/// Waits (at most 30 s) until agent `id` has said `waiting`: it is listening for the revocation.
fn wait_until_listening(ws: &Path, id: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        let store = metash_store::Store::open(ws).unwrap();
        let said = store.log().read_all().unwrap().iter().any(|r| {
            r.agent.as_deref() == Some(id)
                && r.kind == "agent_event"
                && r.data["type"] == "output"
                && r.data["data"]
                    .as_str()
                    .is_some_and(|d| d.contains("waiting"))
        });
        if said {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{id} never said it was waiting");
}

/// Spawns `id` listening for the end of `memory`; `revoke`: another handle revokes it once the
/// agent listens, else the grant (2 s) expires. Returns the agent's answer.
fn run(p: &Project, host: &Host, id: &str, revoke: bool) -> String {
    run_prompt(p, host, id, revoke, "memory")
}

/// As [`run`], for the capability the prompt names first.
fn run_prompt(p: &Project, host: &Host, id: &str, revoke: bool, prompt: &str) -> String {
    let grant_s = if revoke { 600 } else { 2 };
    let cap = prompt.split_whitespace().next().unwrap().to_string();
    policy(p.path())
        .grant(id, &cap.parse().unwrap(), grant_s, false, "test")
        .unwrap();
    let ws = p.path().to_path_buf();
    let agent = id.to_string();
    let revoker = std::thread::spawn(move || {
        wait_until_listening(&ws, &agent);
        if revoke {
            policy(&ws)
                .revoke(&agent, &cap.parse().unwrap(), "test")
                .unwrap();
        }
    });
    let r = host
        .spawn_agent(&SpawnRequest::new(id, "", prompt))
        .unwrap();
    revoker.join().unwrap();
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    r.data
}

fn check(p: &Project, id: &str, data: &str, why: &str) {
    assert!(data.contains("revoked memory"), "{data}");
    assert!(
        data.contains("no longer granted"),
        "granted() kept it: {data}"
    );
    assert!(data.contains("falling back"), "{data}");
    let sent: Vec<_> = p
        .records()
        .into_iter()
        .filter(|r| r.kind == "consent_revoke_sent" && r.agent.as_deref() == Some(id))
        .collect();
    assert_eq!(sent.len(), 1, "told once: {sent:?}");
    assert_eq!(sent[0].data["capability"], "memory");
    assert_eq!(sent[0].data["why"], why);
}

fn example(target: Option<&str>, test: &str) -> Option<PathBuf> {
    match metash_testkit::build_example("revocable", target) {
        Ok(p) => Some(p),
        Err(why) => {
            metash_testkit::skip(test, &why);
            None
        }
    }
}

#[test]
fn a_native_agent_hears_of_a_revocation_at_once_and_falls_back() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("native revocation", &why);
        return;
    }
    let Some(exe) = example(None, "native revocation") else {
        return;
    };
    let p = Project::new();
    p.agent("rev-n", "native", &exe, &["memory"]);
    let host = p.host(&["native"]);
    let data = run(&p, &host, "rev-n", true);
    check(&p, "rev-n", &data, "revoked");
    // And an expiry, with no one revoking.
    let data = run(&p, &host, "rev-n", false);
    assert!(data.contains("expires_at 20"), "{data}");
    let expired = p
        .log_data("consent_revoke_sent")
        .into_iter()
        .filter(|d| d["why"] == "expired")
        .count();
    assert_eq!(expired, 1);
}

#[test]
fn a_wasm_agent_hears_of_a_revocation_at_once_and_falls_back() {
    let Some(wasm) = example(Some("wasm32-wasip1"), "wasm revocation") else {
        return;
    };
    let p = Project::new();
    p.agent("rev-w", "wasm", &wasm, &["memory"]);
    let host = p.host(&[]);
    let data = run(&p, &host, "rev-w", true);
    check(&p, "rev-w", &data, "revoked");
}

/// A file grant revoked mid-run is withdrawn from the agent's view before it is told: the same
/// read that worked before the revocation is refused after it, in both sandboxes, and the agent
/// still answers. The log says what was withdrawn.
fn files_withdrawn(p: &Project, host: &Host, id: &str) {
    std::fs::write(p.path().join("notes.txt"), "cached notes").unwrap();
    let data = run_prompt(p, host, id, true, "files.read notes.txt");
    assert!(data.contains("read before: cached notes"), "{data}");
    assert!(data.contains("read after: refused"), "{data}");
    assert!(!data.contains("read after: cached"), "{data}");
    assert!(data.contains("falling back"), "{data}");
    let sent: Vec<_> = p
        .log_data("consent_revoke_sent")
        .into_iter()
        .filter(|d| d["capability"] == "files.read")
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(sent[0]["withdrawn"]["path"].is_string(), "{sent:?}");
    assert_eq!(
        std::fs::read_to_string(p.path().join("notes.txt")).unwrap(),
        "cached notes",
        "the host's file is untouched"
    );
}

#[test]
fn a_native_agent_loses_a_revoked_file_grant_mid_run() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("native file revocation", &why);
        return;
    }
    let Some(exe) = example(None, "native file revocation") else {
        return;
    };
    let p = Project::new();
    p.agent("rev-fn", "native", &exe, &["files.read"]);
    let host = p.host(&["native"]);
    files_withdrawn(&p, &host, "rev-fn");
}

#[test]
fn a_wasm_agent_loses_a_revoked_file_grant_mid_run() {
    let Some(wasm) = example(Some("wasm32-wasip1"), "wasm file revocation") else {
        return;
    };
    let p = Project::new();
    p.agent("rev-fw", "wasm", &wasm, &["files.read"]);
    let host = p.host(&[]);
    files_withdrawn(&p, &host, "rev-fw");
}
