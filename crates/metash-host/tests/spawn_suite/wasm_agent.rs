use std::time::{Duration, Instant};

use metash_host::{SpawnRequest, Spawner};
use metash_protocol::{AgentStatus, SpawnOptions};

use super::common::{msg, wat_agent, Project};

fn with_wasm(lines: &[&str], spin: bool) -> (Project, metash_host::Host) {
    let p = Project::new();
    let wat = p.path().join("agent.wat");
    std::fs::write(&wat, wat_agent(lines, spin)).unwrap();
    p.agent("wasm-a", "wasm", &wat, &[]);
    let host = p.host(&[]);
    (p, host)
}

fn spawn(host: &metash_host::Host, timeout: Option<f64>) -> metash_protocol::AgentResponse {
    let mut req = SpawnRequest::new("wasm-a", "", "go");
    req.options = SpawnOptions {
        timeout_seconds: timeout,
        ..SpawnOptions::default()
    };
    host.spawn_agent(&req).unwrap()
}

#[test]
fn wasm_success() {
    let out = msg(
        r#"{"type":"output","agent_id":"wasm-a","chunk_id":"c1","content_type":"text/plain","data":"from wasm"}"#,
    );
    let done = msg(r#"{"type":"done"}"#);
    let (_p, host) = with_wasm(&[&out, &done], false);
    let r = spawn(&host, None);
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert_eq!(r.data, "from wasm");
}

#[test]
fn wasm_error() {
    let err = msg(r#"{"type":"error","code":"bad","message":"it broke"}"#);
    let done = msg(r#"{"type":"done","status":"error"}"#);
    let (_p, host) = with_wasm(&[&err, &done], false);
    let r = spawn(&host, None);
    assert_eq!(r.status, AgentStatus::Error);
    assert!(r.data.contains("it broke"), "{}", r.data);
}

#[test]
fn wasm_timeout_returns_partial_output() {
    let out = msg(
        r#"{"type":"output","agent_id":"wasm-a","chunk_id":"c1","content_type":"text/plain","data":"half"}"#,
    );
    let (_p, host) = with_wasm(&[&out], true);
    let t = Instant::now();
    let r = spawn(&host, Some(0.5));
    assert_eq!(r.status, AgentStatus::Timeout, "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(r.data, "half");
    super::common::assert_clean(_p.path());
}

/// `[host] wasm_fuel`: a spinning agent runs out of fuel (a deterministic bound) long before its
/// 60 s timeout, and the answer names the limit.
#[test]
fn wasm_fuel_from_the_config_bounds_the_work() {
    let (p, _) = with_wasm(&[], true);
    p.config("[host]\nwasm_fuel = 5000000\n");
    let host = p.host(&[]);
    let t = Instant::now();
    let r = spawn(&host, Some(60.0));
    assert_eq!(r.status, AgentStatus::Error, "{r:?}");
    assert!(r.data.contains("fuel"), "{}", r.data);
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

#[test]
fn wasm_checkpoint_is_persisted_before_it_is_returned() {
    let cp = msg(
        r#"{"type":"checkpoint","reason":"decision_required","message":"Which auth provider?","options":["Auth0","Supabase"],"resume_id":"step_2_auth_decision"}"#,
    );
    let (p, host) = with_wasm(&[&cp], false);
    let r = spawn(&host, None);
    assert_eq!(r.status, AgentStatus::Checkpoint);
    let signal: metash_protocol::CheckpointSignal = serde_json::from_str(&r.data).unwrap();
    assert_eq!(signal.options, vec!["Auth0", "Supabase"]);
    let state = metash_store::Store::open(p.path())
        .unwrap()
        .state()
        .unwrap();
    let pending = state.pending_checkpoint.unwrap();
    assert_eq!(pending.id, "step_2_auth_decision");
    assert_eq!(pending.agent, "wasm-a");
}

#[test]
fn unknown_agent_is_a_clear_error() {
    let (_p, host) = with_wasm(&[], false);
    let err = host
        .spawn_agent(&SpawnRequest::new("nobody", "", "hi"))
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("unknown agent `nobody`") && msg.contains("wasm-a"),
        "{msg}"
    );
}
