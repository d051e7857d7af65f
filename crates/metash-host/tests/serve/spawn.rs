//! Full spawns through JSON-RPC with the real host as the spawner: a model-backed role (metash's
//! own Anthropic client) against a loopback Messages server, driven from Python and from Rust.

use std::sync::Arc;

use metash_host::serve::RpcServer;
use serde_json::json;

use super::rpc::run_python_client;
use super::support::*;

#[test]
fn the_python_client_drives_a_full_spawn_and_receives_its_events() {
    let Some(python) = python3() else { return };
    let model = ModelServer::start(|c| {
        if c.text().contains("PY-TASK-7") {
            sse_text("PY-SUBAGENT-ANSWER")
        } else {
            sse_text("unexpected request")
        }
    });
    let p = Project::new();
    p.model_role("writer", &model.base);
    let host = p.host_with_env(&[("METASH_TEST_KEY", "sk-test-loopback")]);
    let server = RpcServer::new(host.clone(), host);
    let report = run_python_client(
        &python,
        server,
        &[
            "--spawn-agent",
            "writer",
            "--message",
            "PY-TASK-7",
            "--system",
            "You answer tersely.",
            "--expect-data",
            "PY-SUBAGENT-ANSWER",
        ],
    );
    assert!(report.contains("PASSED: 0 failure(s)"), "{report}");
    assert!(
        report.contains("an event of the spawned agent arrived"),
        "{report}"
    );

    // The model received the sub-agent's own prompt and nothing else.
    let posts = model.posts();
    assert_eq!(posts.len(), 1, "one model request");
    let body = posts[0].json();
    assert_eq!(body["messages"].as_array().unwrap().len(), 1, "{body}");
    assert!(body.to_string().contains("PY-TASK-7"));
    assert!(
        body["system"].to_string().contains("You answer tersely."),
        "{body}"
    );
    // And the spawn is in the log, as the client was told.
    let log = p.log();
    assert!(log
        .iter()
        .any(|r| r["agent"] == "writer" && r["kind"] == "spawn"));
    assert!(log
        .iter()
        .any(|r| r["agent"] == "writer" && r["kind"] == "spawn_end"));
}

#[test]
fn spawn_errors_from_the_host_are_json_rpc_errors_and_serving_goes_on() {
    let model = ModelServer::start(|_| sse_text("RUST-SUBAGENT-ANSWER"));
    let p = Project::new();
    p.model_role("writer", &model.base);
    let host = p.host_with_env(&[("METASH_TEST_KEY", "sk-test-loopback")]);
    let mut rpc = Rpc::with_server(RpcServer::new(host.clone(), host as Arc<_>));

    let e = rpc.err(
        "spawnAgent",
        json!({"agent_name": "nobody", "user_message": "hi"}),
    );
    assert_eq!(e["code"], -32001, "{e}");
    assert_eq!(e["data"]["kind"], "unknown_agent");
    assert!(e["message"].as_str().unwrap().contains("`nobody`"), "{e}");
    // Valid JSON, refused by the host's own checks.
    let e = rpc.err(
        "spawnAgent",
        json!({"agent_name": "writer", "user_message": "hi", "options": {"timeout_seconds": 0}}),
    );
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("timeout_seconds"),
        "{e}"
    );
    assert!(model.posts().is_empty(), "nothing reached the model");

    // The next spawn runs, and its events are notified.
    let r = rpc.ok(
        "spawnAgent",
        json!({"agent_name": "writer", "user_message": "go", "options": {"model_hint": "fast", "max_tokens": 32}}),
    );
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(r["data"], "RUST-SUBAGENT-ANSWER");
    assert!(r["metadata"]["tokens_used"].as_u64().unwrap() > 0, "{r}");
    let body = model.posts()[0].json();
    assert_eq!(body["model"], "claude-haiku-4-5");
    assert_eq!(body["max_tokens"], 32);
    let end = rpc
        .event(|e| e["kind"] == "spawn_end" && e["agent"] == "writer")
        .expect("a spawn_end notification");
    assert_eq!(end["data"]["status"], "success");
    let (result, _) = rpc.close();
    result.unwrap();
}

/// The same client against the real `metash serve --stdio` process, which the client starts
/// itself: a full spawn, events, bad input, and a clean exit (0) on EOF.
#[test]
fn the_python_client_drives_the_metash_serve_process() {
    let Some(python) = python3() else { return };
    let Some(metash) = metash_bin() else {
        metash_testkit::skip("metash binary tests", "the metash binary is not built next to this test (cargo build -p metash, or set METASH_BIN)");
        return;
    };
    let model = ModelServer::start(|_| sse_text("PROCESS-SUBAGENT-ANSWER"));
    let p = Project::new();
    p.model_role("writer", &model.base);
    let out = std::process::Command::new(python)
        .arg(client_script())
        .args([
            "--spawn-agent",
            "writer",
            "--message",
            "hi",
            "--expect-data",
            "PROCESS-SUBAGENT-ANSWER",
            "--",
        ])
        .arg(&metash)
        .arg("-C")
        .arg(p.path())
        .args(["serve", "--stdio", "--quiet"])
        .env("METASH_TEST_KEY", "sk-test-loopback")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stderr);
    eprintln!("{report}");
    assert!(out.status.success(), "{report}");
    assert!(
        report.contains("ok   server exited with 0 on EOF"),
        "{report}"
    );
    assert_eq!(model.posts().len(), 1);
}

/// The checkpoint flow over JSON-RPC: a WASM agent stops at a checkpoint (`status: checkpoint`,
/// the signal in `data`), the host is paused (spawnAgent refused with -32006), the client answers
/// it, and the answer reaches the next spawn (a model role) once.
#[test]
fn checkpoint_flow_over_json_rpc() {
    let model = ModelServer::start(|_| sse_text("noted"));
    let p = Project::new();
    p.model_role("writer", &model.base);
    p.wasm_agent(
        "asker",
        &[&agent_msg(
            r#"{"type":"checkpoint","reason":"decision_required","message":"Which auth provider?","options":["Auth0","Supabase"],"resume_id":"auth"}"#,
        )],
    );
    let host = p.host_with_env(&[("METASH_TEST_KEY", "sk-test-loopback")]);
    let mut rpc = Rpc::with_server(RpcServer::new(host.clone(), host as Arc<_>));

    let r = rpc.ok(
        "spawnAgent",
        json!({"agent_name": "asker", "user_message": "decide"}),
    );
    assert_eq!(r["status"], "checkpoint", "{r}");
    let signal: serde_json::Value = serde_json::from_str(r["data"].as_str().unwrap()).unwrap();
    assert_eq!(signal["type"], "checkpoint");
    assert_eq!(signal["options"], json!(["Auth0", "Supabase"]));
    assert!(rpc
        .event(|e| e["agent"] == "asker" && e["kind"] == "spawn")
        .is_some());

    let e = rpc.err(
        "spawnAgent",
        json!({"agent_name": "writer", "user_message": "next"}),
    );
    assert_eq!(e["code"], -32006, "{e}");
    assert_eq!(e["data"]["kind"], "checkpoint_pending");
    assert!(model.posts().is_empty());
    assert_eq!(rpc.ok("pendingCheckpoint", json!({}))["id"], "auth");

    let answer = rpc.ok("answerCheckpoint", json!({"answer": "supabase"}));
    assert_eq!(
        answer,
        json!({"checkpoint_id": "auth", "user_input": "Supabase"})
    );
    assert_eq!(
        rpc.ok("pendingCheckpoint", json!({})),
        serde_json::Value::Null
    );
    let e = rpc.err("answerCheckpoint", json!({"answer": "Auth0"}));
    assert_eq!(e["code"], -32002, "a second answer is refused: {e}");

    for _ in 0..2 {
        let r = rpc.ok(
            "spawnAgent",
            json!({"agent_name": "writer", "user_message": "WRITE-IT"}),
        );
        assert_eq!(r["status"], "success", "{r}");
    }
    let posts = model.posts();
    assert_eq!(posts.len(), 2);
    assert!(
        posts[0].text().contains("Supabase"),
        "the answer reaches the next spawn"
    );
    assert!(!posts[1].text().contains("Supabase"), "and no other");
}
