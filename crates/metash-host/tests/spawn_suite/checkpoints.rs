use metash_host::{SpawnRequest, Spawner};
use metash_protocol::AgentStatus;
use serde_json::Value;

use super::common::{msg, native_agent_exe, native_unavailable, wat_agent, Project};

/// The answer reaches the next spawn exactly once (in its start context), and answering a
/// checkpoint that is not pending is an error.
#[test]
fn answer_is_delivered_to_the_next_spawn_once() {
    if let Some(why) = native_unavailable() {
        metash_testkit::skip("answer_is_delivered_to_the_next_spawn_once", &why);
        return;
    }
    let p = Project::new();
    let cp = msg(
        r#"{"type":"checkpoint","reason":"decision_required","message":"Which auth provider?","options":["Auth0","Supabase"],"resume_id":"auth"}"#,
    );
    let wat = p.path().join("cp.wat");
    std::fs::write(&wat, wat_agent(&[&cp], false)).unwrap();
    p.agent("asker", "wasm", &wat, &[]);
    p.agent("reader", "native", &native_agent_exe(), &[]);
    let host = p.host(&["native"]);

    let r = host
        .spawn_agent(&SpawnRequest::new("asker", "", "go"))
        .unwrap();
    assert_eq!(r.status, AgentStatus::Checkpoint);
    let err = host.answer_checkpoint(Some("other"), "Auth0").unwrap_err();
    assert!(err.to_string().contains("`other` is not pending"), "{err}");
    let err = host.answer_checkpoint(None, "Firebase").unwrap_err();
    assert!(err.to_string().contains("not one of the options"), "{err}");
    let data = host.answer_checkpoint(Some("auth"), "2").unwrap();
    assert_eq!(data.user_input, "Supabase", "an option by its number");
    assert!(
        host.answer_checkpoint(None, "Auth0").is_err(),
        "a second answer is refused"
    );

    let first = host
        .spawn_agent(&SpawnRequest::new("reader", "", "config"))
        .unwrap();
    let cfg: Value = serde_json::from_str(&first.data).unwrap();
    assert_eq!(cfg["resume_data"]["checkpoint_id"], "auth");
    assert_eq!(cfg["resume_data"]["user_input"], "Supabase");
    let second = host
        .spawn_agent(&SpawnRequest::new("reader", "", "config"))
        .unwrap();
    let cfg: Value = serde_json::from_str(&second.data).unwrap();
    assert!(cfg["resume_data"].is_null(), "delivered twice: {cfg}");
}

/// While a checkpoint waits, the host is paused: no spawn runs (so no second checkpoint can replace
/// the first).
#[test]
fn one_pending_checkpoint_at_a_time() {
    let p = Project::new();
    let cp = msg(r#"{"type":"checkpoint","reason":"human_action","message":"Plug in the key"}"#);
    let wat = p.path().join("cp.wat");
    std::fs::write(&wat, wat_agent(&[&cp], false)).unwrap();
    p.agent("asker", "wasm", &wat, &[]);
    let host = p.host(&[]);
    let r = host
        .spawn_agent(&SpawnRequest::new("asker", "", "go"))
        .unwrap();
    assert_eq!(r.status, AgentStatus::Checkpoint);
    let first = host.pending_checkpoint().unwrap().unwrap();
    let spawns_before = p.log_kinds().iter().filter(|k| *k == "spawn").count();
    let err = host
        .spawn_agent(&SpawnRequest::new("asker", "", "go"))
        .unwrap_err();
    assert!(err.to_string().contains("waiting for an answer"), "{err}");
    assert_eq!(
        p.log_kinds().iter().filter(|k| *k == "spawn").count(),
        spawns_before
    );
    assert_eq!(host.pending_checkpoint().unwrap().unwrap(), first);
    // Free text where no options are given.
    let data = host
        .answer_checkpoint(None, "  done, it is plugged in ")
        .unwrap();
    assert_eq!(data.user_input, "done, it is plugged in");
}
