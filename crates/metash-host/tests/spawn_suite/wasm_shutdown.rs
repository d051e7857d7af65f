//! Seed 002 §3's `shutdown()` for WASM agents (issue 18): an agent whose manifest declares
//! `hooks = ["shutdown"]` is run once more with `shutdown` before it is terminated, and the state
//! it flushes there is kept; an agent without the hook is not run again.

use metash_host::{SpawnRequest, Spawner};
use metash_protocol::AgentStatus;

use super::common::*;

#[test]
fn a_wasm_agent_with_the_shutdown_hook_flushes_its_state_and_others_are_not_rerun() {
    let wasm = match metash_testkit::build_example("flusher", Some("wasm32-wasip1")) {
        Ok(p) => p,
        Err(why) => {
            metash_testkit::skip("wasm shutdown hook", &why);
            return;
        }
    };
    let p = Project::new();
    p.agent("flush-w", "wasm", &wasm, &["memory"]);
    p.agent("plain-w", "wasm", &wasm, &["memory"]);
    let manifest = p.path().join(".meta/agents/flush-w/manifest.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, format!("{text}hooks = [\"shutdown\"]\n")).unwrap();
    let host = p.host(&["memory"]);
    let store = metash_store::Store::open(p.path()).unwrap();

    for (agent, flushed) in [
        ("flush-w", Some(serde_json::json!(true))),
        ("plain-w", None),
    ] {
        let r = host
            .spawn_agent(&SpawnRequest::new(agent, "", "the report"))
            .unwrap();
        assert_eq!(r.status, AgentStatus::Success, "{r:?}");
        assert_eq!(r.data, "working on the report");
        assert_eq!(
            store.kv(agent).unwrap().get("flushed").unwrap(),
            flushed,
            "{agent}"
        );
    }
    let runs: Vec<_> = p
        .records()
        .into_iter()
        .filter(|r| r.kind == "agent_shutdown_run")
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].agent.as_deref(), Some("flush-w"));
    let invoked = p
        .records()
        .iter()
        .filter(|r| r.kind == "agent_invoked" && r.agent.as_deref() == Some("plain-w"))
        .count();
    assert_eq!(invoked, 1, "an agent without the hook ran again");
    let terminated = p.log_data("agent_terminated");
    assert!(
        terminated.iter().all(|d| d["how"] == "graceful"),
        "{terminated:?}"
    );
}
