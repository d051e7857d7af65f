//! JSON-RPC over NDJSON: every method, event notifications, bad input of every kind (each answered
//! with its error while the server keeps serving), concurrency, batches and EOF.

use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::support::*;

fn fake_rpc(p: &Project) -> (Rpc, Sender<()>) {
    let (spawner, release) = FakeSpawner::new();
    (Rpc::start(p.host(), spawner), release)
}

#[test]
fn methods_answer_and_events_are_notified() {
    let p = Project::new();
    let (mut rpc, _release) = fake_rpc(&p);

    let r = rpc.ok(
        "updateState",
        json!({"key": "variables.retry_count", "value": 3}),
    );
    assert!(r["revision"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(
        rpc.ok("getState", json!({"key": "variables.retry_count"})),
        json!(3)
    );
    let whole = rpc.ok("getState", json!({}));
    assert_eq!(whole["variables"]["retry_count"], json!(3));
    assert_eq!(whole["revision"], r["revision"]);
    let ev = rpc
        .event(|e| e["kind"] == "state_update" && e["data"]["key"] == "variables.retry_count")
        .expect("a state_update notification");
    assert_eq!(ev["data"]["value"], json!(3));

    let logged = rpc.ok(
        "logProgress",
        json!({"message": "halfway there", "level": "warn"}),
    );
    let ev = rpc
        .event(|e| e["kind"] == "progress")
        .expect("a progress notification");
    assert_eq!(ev["seq"], logged["seq"]);
    assert_eq!(
        ev["data"],
        json!({"message": "halfway there", "level": "warn"})
    );
    // The level defaults to info.
    rpc.ok("logProgress", json!({"message": "plain"}));
    let ev = rpc
        .event(|e| e["kind"] == "progress" && e["data"]["message"] == "plain")
        .unwrap();
    assert_eq!(ev["data"]["level"], "info");

    let resp = rpc.ok(
        "spawnAgent",
        json!({"agent_name": "echo", "system_prompt": "SYS", "user_message": "MSG",
               "options": {"max_tokens": 50, "model_hint": "fast", "timeout_seconds": 1.5}}),
    );
    assert_eq!(resp["status"], "success");
    assert_eq!(resp["data"], "SYS|MSG|Some(50)");
    assert_eq!(
        resp["metadata"],
        json!({"tokens_used": 0, "duration_ms": 1})
    );

    assert_eq!(rpc.ok("pendingCheckpoint", json!({})), Value::Null);
    // Positional params follow the seed's order.
    let r = rpc.ok("updateState", json!(["variables.pos", [1, 2]]));
    assert!(r["revision"].is_u64());
    assert_eq!(rpc.ok("getState", json!(["variables.pos"])), json!([1, 2]));

    let (result, _) = rpc.close();
    result.unwrap();
}

#[test]
fn checkpoints_are_answered_once() {
    let p = Project::new();
    let host = p.host();
    let signal: metash_protocol::CheckpointSignal = serde_json::from_value(json!({
        "type": "checkpoint", "reason": "decision_required",
        "message": "Which auth provider?", "options": ["Auth0", "Supabase"],
        "resume_id": "step_2_auth"
    }))
    .unwrap();
    host.raise_checkpoint("planner", &signal).unwrap();
    let (spawner, _release) = FakeSpawner::new();
    let mut rpc = Rpc::start(host, spawner);
    let pending = rpc.ok("pendingCheckpoint", json!({}));
    assert_eq!(pending["id"], "step_2_auth");

    let e = rpc.err(
        "answerCheckpoint",
        json!({"checkpoint_id": "other", "answer": "Auth0"}),
    );
    assert_eq!(e["code"], -32002, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("step_2_auth"),
        "{e}"
    );
    let e = rpc.err("answerCheckpoint", json!({"answer": "Firebase"}));
    assert_eq!(e["code"], -32002, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("not one of the options"),
        "{e}"
    );

    let r = rpc.ok(
        "answerCheckpoint",
        json!({"checkpoint_id": "step_2_auth", "answer": "2"}),
    );
    assert_eq!(
        r,
        json!({"checkpoint_id": "step_2_auth", "user_input": "Supabase"})
    );
    let e = rpc.err("answerCheckpoint", json!({"answer": "Auth0"}));
    assert_eq!(e["code"], -32002);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("no checkpoint is pending"),
        "{e}"
    );
    assert_eq!(e["data"]["kind"], "rejected");
}

/// A consent question waiting for any client is listed by `pendingConsent` and answered once by
/// `answerConsent`; a bad answer names its field, a second answer is refused.
#[test]
fn consent_questions_are_listed_and_answered_once() {
    let p = Project::new();
    let host = p.host();
    let q = metash_policy::ConsentQuestion::new(
        "fetcher",
        "network:api.example.com".parse().unwrap(),
        "fetch the docs",
        Some(60),
    );
    let id = metash_host::asks::post(host.store(), &q, std::time::Duration::from_secs(60)).unwrap();
    let (spawner, _release) = FakeSpawner::new();
    let mut rpc = Rpc::start(host, spawner);
    let pending = rpc.ok("pendingConsent", json!({}));
    assert_eq!(pending[0]["id"], id.as_str());
    assert_eq!(pending[0]["capability"], "network:api.example.com");
    let e = rpc.err("answerConsent", json!({"id": id, "answer": "allow_for"}));
    assert!(e["message"].as_str().unwrap().contains("duration_s"), "{e}");
    let e = rpc.err("answerConsent", json!({"id": id, "answer": "maybe"}));
    assert!(e["message"].as_str().unwrap().contains("answer"), "{e}");
    let r = rpc.ok(
        "answerConsent",
        json!({"id": id, "answer": "allow_for", "duration_s": 30}),
    );
    assert_eq!(r, json!({"id": id, "answer": "allow_for"}));
    let e = rpc.err("answerConsent", json!({"id": id, "answer": "deny"}));
    assert!(
        e["message"].as_str().unwrap().contains("already answered"),
        "{e}"
    );
    assert_eq!(rpc.ok("pendingConsent", json!({})), json!([]));
}

/// Asserts `reply` is an error with `code` whose message contains `needle`.
fn assert_error(reply: &Value, id: Value, code: i64, needle: &str) {
    assert_eq!(reply["jsonrpc"], "2.0", "{reply}");
    assert_eq!(reply["id"], id, "{reply}");
    assert_eq!(reply["error"]["code"], code, "{reply}");
    let msg = reply["error"]["message"].as_str().unwrap();
    assert!(msg.contains(needle), "`{msg}` should mention `{needle}`");
}

#[test]
fn bad_input_on_every_method_gets_an_error_and_the_server_keeps_serving() {
    let p = Project::new();
    let (mut rpc, _release) = fake_rpc(&p);
    rpc.ok(
        "updateState",
        json!({"key": "variables.alive", "value": true}),
    );
    let alive = |rpc: &mut Rpc| {
        assert_eq!(
            rpc.ok("getState", json!({"key": "variables.alive"})),
            json!(true)
        );
    };

    // Transport-level garbage: each line gets its error, with id null.
    for (line, code, needle) in [
        (
            "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ",
            -32700,
            "parse error",
        ),
        ("not json at all", -32700, "parse error"),
        ("\u{1F600}{]", -32700, "parse error"),
        ("42", -32600, "JSON object"),
        ("[]", -32600, "empty batch"),
        (
            "{\"jsonrpc\": \"2.0\", \"id\": {\"a\": 1}, \"method\": \"getState\"}",
            -32600,
            "`id`",
        ),
    ] {
        rpc.send_raw(line);
        assert_error(&rpc.next_reply(), Value::Null, code, needle);
        alive(&mut rpc);
    }
    // Invalid bytes (not UTF-8) are a parse error too.
    rpc.send_raw("{\"jsonrpc\": \"2.0\", \"id\": 5, \"method\": \"getState\", \"x\": \"\u{0}\"}");
    let r = rpc.next_reply();
    assert!(r.get("error").is_some() || r.get("result").is_some(), "{r}");
    alive(&mut rpc);

    // Request-level: wrong envelope.
    rpc.send_raw(r#"{"id": 7, "method": "getState"}"#);
    assert_error(&rpc.next_reply(), json!(7), -32600, "`jsonrpc`");
    rpc.send_raw(r#"{"jsonrpc": "1.0", "id": 8, "method": "getState"}"#);
    assert_error(&rpc.next_reply(), json!(8), -32600, "`jsonrpc`");
    rpc.send_raw(r#"{"jsonrpc": "2.0", "id": 9, "method": 12}"#);
    assert_error(&rpc.next_reply(), json!(9), -32600, "`method`");
    rpc.send_raw(r#"{"jsonrpc": "2.0", "id": "s", "method": "getState", "params": "key"}"#);
    assert_error(&rpc.next_reply(), json!("s"), -32600, "`params`");
    alive(&mut rpc);

    // Unknown method.
    let r = rpc.call("spawn_agent", json!({}));
    assert_eq!(r["error"]["code"], -32601, "{r}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("spawnAgent"));
    alive(&mut rpc);

    // Every method: missing fields, wrong types, unknown fields, each naming the field.
    let cases: Vec<(&str, Value, i64, &str)> = vec![
        ("spawnAgent", json!({}), -32602, "`agent_name` is required"),
        (
            "spawnAgent",
            json!({"agent_name": "echo"}),
            -32602,
            "`user_message` is required",
        ),
        (
            "spawnAgent",
            json!({"agent_name": 5, "user_message": "x"}),
            -32602,
            "`agent_name` must be a string, got number 5",
        ),
        (
            "spawnAgent",
            json!({"agent_name": "", "user_message": "x"}),
            -32602,
            "`agent_name` must not be empty",
        ),
        (
            "spawnAgent",
            json!({"agent_name": "echo", "user_message": ["x"]}),
            -32602,
            "`user_message` must be a string",
        ),
        (
            "spawnAgent",
            json!({"agent_name": "echo", "user_message": "x", "system_prompt": false}),
            -32602,
            "`system_prompt` must be a string",
        ),
        (
            "spawnAgent",
            json!({"agent_name": "echo", "user_message": "x", "options": 3}),
            -32602,
            "`options` must be an object",
        ),
        (
            "spawnAgent",
            json!({"agent_name": "echo", "user_message": "x", "options": {"timeout_seconds": "ten"}}),
            -32602,
            "`options.timeout_seconds` must be a number >= 0, got string \"ten\"",
        ),
        (
            "spawnAgent",
            json!({"agent_name": "echo", "user_message": "x", "options": {"timeout_seconds": -1}}),
            -32602,
            "`options.timeout_seconds` must be a number >= 0",
        ),
        (
            "spawnAgent",
            json!({"agent_name": "echo", "user_message": "x", "options": {"max_tokens": 1.5}}),
            -32602,
            "`options.max_tokens` must be a non-negative integer",
        ),
        (
            "spawnAgent",
            json!({"agent_name": "echo", "user_message": "x", "options": {"model_hint": "huge"}}),
            -32602,
            "`options.model_hint` must be one of \"fast\", \"smart\"",
        ),
        (
            "spawnAgent",
            json!({"agent_name": "echo", "user_message": "x", "options": {"budget": 1}}),
            -32602,
            "`options.budget` is not a known parameter",
        ),
        (
            "spawnAgent",
            json!({"agent": "echo", "user_message": "x"}),
            -32602,
            "`agent` is not a known parameter",
        ),
        (
            "spawnAgent",
            json!(["echo", "s", "u", {}, "extra"]),
            -32602,
            "at most 4",
        ),
        (
            "spawnAgent",
            json!({"agent_name": "nobody-home", "user_message": "x"}),
            -32001,
            "unknown agent `nobody-home`",
        ),
        (
            "updateState",
            json!({"value": 1}),
            -32602,
            "`key` is required",
        ),
        (
            "updateState",
            json!({"key": "variables.a"}),
            -32602,
            "`value` is required",
        ),
        (
            "updateState",
            json!({"key": 1, "value": 1}),
            -32602,
            "`key` must be a string",
        ),
        (
            "updateState",
            json!({"key": "", "value": 1}),
            -32602,
            "`key` must not be empty",
        ),
        (
            "updateState",
            json!({"key": "no_such_field", "value": 1}),
            -32002,
            "no_such_field",
        ),
        (
            "updateState",
            json!({"key": "revision", "value": 1}),
            -32002,
            "revision",
        ),
        (
            "getState",
            json!({"key": ["a"]}),
            -32602,
            "`key` must be a string, got an array",
        ),
        (
            "getState",
            json!({"keys": "a"}),
            -32602,
            "`keys` is not a known parameter",
        ),
        ("logProgress", json!({}), -32602, "`message` is required"),
        (
            "logProgress",
            json!({"message": {"text": "hi"}}),
            -32602,
            "`message` must be a string, got an object",
        ),
        (
            "logProgress",
            json!({"message": "hi", "level": "debug"}),
            -32602,
            "`level` must be one of \"info\", \"warn\", \"error\", got \"debug\"",
        ),
        (
            "answerCheckpoint",
            json!({}),
            -32602,
            "`answer` is required",
        ),
        (
            "answerCheckpoint",
            json!({"answer": 2}),
            -32602,
            "`answer` must be a string",
        ),
        (
            "answerCheckpoint",
            json!({"answer": "x", "checkpoint_id": 3}),
            -32602,
            "`checkpoint_id` must be a string",
        ),
        (
            "answerCheckpoint",
            json!({"answer": "x"}),
            -32002,
            "no checkpoint is pending",
        ),
        (
            "pendingCheckpoint",
            json!({"x": 1}),
            -32602,
            "takes no parameters",
        ),
    ];
    for (method, params, code, needle) in cases {
        let id = rpc.start_call(method, params.clone());
        let r = rpc.response(id);
        assert_eq!(
            r["error"]["code"], code,
            "{method} {params}: expected {code}, got {r}"
        );
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(needle),
            "{method} {params}: `{msg}` should mention `{needle}`"
        );
        assert!(r["error"]["data"]["kind"].is_string(), "{r}");
        alive(&mut rpc);
    }

    // A notification gets no reply even when it fails; the next request is still answered.
    rpc.send_raw(r#"{"jsonrpc": "2.0", "method": "updateState", "params": {"key": 1}}"#);
    rpc.send_raw(r#"{"jsonrpc": "2.0", "method": "noSuchMethod"}"#);
    assert!(rpc.reply_within(Duration::from_millis(300)).is_none());
    alive(&mut rpc);

    // Nothing was changed by any of it.
    let state = rpc.ok("getState", json!({}));
    assert_eq!(state["variables"], json!({"alive": true}));
    let (result, rest) = rpc.close();
    result.unwrap();
    assert!(rest.iter().all(|m| m.get("method").is_some()), "{rest:?}");
}

#[test]
fn an_over_long_line_is_skipped_with_an_error() {
    let p = Project::new();
    let (spawner, _release) = FakeSpawner::new();
    let server = metash_host::serve::RpcServer::from_service(metash_host::serve::Service::new(
        p.host(),
        spawner,
    ))
    .with_max_line_bytes(1000);
    let mut rpc = Rpc::with_server(server);
    let big = "x".repeat(5000);
    rpc.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"logProgress","params":{{"message":"{big}"}}}}"#
    ));
    let r = rpc.next_reply();
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(r["error"]["data"]["kind"], "too_large");
    // The rest of that line was skipped: the next line is a request of its own.
    assert_eq!(
        rpc.ok("getState", json!({"key": "status"})),
        json!("planning")
    );
    let log = p.log();
    assert!(
        log.iter().all(|r| r["kind"] != "progress"),
        "nothing was logged"
    );
}

#[test]
fn a_panicking_handler_is_an_internal_error_and_serving_goes_on() {
    let p = Project::new();
    let (mut rpc, _release) = fake_rpc(&p);
    let e = rpc.err(
        "spawnAgent",
        json!({"agent_name": "panic", "user_message": "x"}),
    );
    assert_eq!(e["code"], -32603, "{e}");
    assert_eq!(e["data"]["kind"], "internal");
    assert_eq!(
        rpc.ok("getState", json!({"key": "status"})),
        json!("planning")
    );
}

#[test]
fn batches_answer_each_request_in_one_array() {
    let p = Project::new();
    let (mut rpc, _release) = fake_rpc(&p);
    rpc.send_raw(
        &json!([
            {"jsonrpc": "2.0", "id": "a", "method": "updateState", "params": {"key": "variables.b", "value": "x"}},
            {"jsonrpc": "2.0", "method": "logProgress", "params": {"message": "from a batch"}},
            {"jsonrpc": "2.0", "id": "c", "method": "nope"},
            5,
            {"jsonrpc": "2.0", "id": "e", "method": "getState", "params": {"key": "variables.b"}}
        ])
        .to_string(),
    );
    let reply = rpc.next_reply();
    let items = reply.as_array().expect("a batch reply is an array");
    assert_eq!(items.len(), 4, "{reply}");
    assert!(items[0]["result"]["revision"].is_u64());
    assert_eq!(items[1]["error"]["code"], -32601);
    assert_eq!(items[2]["error"]["code"], -32600);
    assert_eq!(items[2]["id"], Value::Null);
    assert_eq!(items[3]["result"], "x");
    assert!(rpc
        .event(|e| e["kind"] == "progress" && e["data"]["message"] == "from a batch")
        .is_some());
    // A batch of notifications only gets no reply at all.
    rpc.send_raw(r#"[{"jsonrpc": "2.0", "method": "logProgress", "params": {"message": "n"}}]"#);
    assert!(rpc.reply_within(Duration::from_millis(300)).is_none());
}

#[test]
fn a_long_spawn_does_not_block_other_requests_and_eof_waits_for_it() {
    let p = Project::new();
    let (mut rpc, release) = fake_rpc(&p);
    let spawn = rpc.start_call(
        "spawnAgent",
        json!({"agent_name": "slow", "user_message": "take your time"}),
    );
    // While the spawn waits, other requests are answered.
    let t = Instant::now();
    for i in 0..20 {
        rpc.ok("updateState", json!({"key": "variables.i", "value": i}));
        assert_eq!(rpc.ok("getState", json!({"key": "variables.i"})), json!(i));
    }
    assert!(t.elapsed() < Duration::from_secs(30));
    // End of input while the spawn is in flight: the server still answers it, then returns.
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        release.send(()).unwrap();
    });
    let (result, rest) = rpc.close();
    closer.join().unwrap();
    result.unwrap();
    let answer = rest
        .iter()
        .find(|m| m["id"] == json!(spawn))
        .expect("the spawn's response after EOF");
    assert_eq!(answer["result"]["data"], "slow done");
}

#[test]
fn concurrent_requests_each_get_their_own_response() {
    let p = Project::new();
    let (mut rpc, _release) = fake_rpc(&p);
    let ids: Vec<(u64, i64)> = (0..40)
        .map(|i| {
            (
                rpc.start_call(
                    "updateState",
                    json!({"key": format!("variables.k{i}"), "value": i}),
                ),
                i,
            )
        })
        .collect();
    let mut revisions = Vec::new();
    for (id, _) in &ids {
        let r = rpc.response(*id);
        revisions.push(r["result"]["revision"].as_u64().expect("a revision"));
    }
    revisions.sort_unstable();
    revisions.dedup();
    assert_eq!(revisions.len(), 40, "every update got its own revision");
    let vars = rpc.ok("getState", json!({"key": "variables"}));
    for (_, i) in ids {
        assert_eq!(vars[format!("k{i}")], json!(i));
    }
    // Every update was notified.
    for i in 0..40 {
        let key = format!("variables.k{i}");
        assert!(rpc
            .event(|e| e["kind"] == "state_update" && e["data"]["key"] == key.as_str())
            .is_some());
    }
}

#[test]
fn the_python_client_drives_the_server_and_receives_events() {
    let Some(python) = python3() else { return };
    let p = Project::new();
    let (spawner, _release) = FakeSpawner::new();
    let server = metash_host::serve::RpcServer::from_service(metash_host::serve::Service::new(
        p.host(),
        spawner,
    ));
    let out = run_python_client(&python, server, &[]);
    assert!(out.contains("PASSED: 0 failure(s)"), "{out}");
}

/// Runs the Python client with its stdin/stdout connected to `server` (in this process); returns
/// its report (stderr) after asserting it exited 0.
pub fn run_python_client(
    python: &std::path::Path,
    server: metash_host::serve::RpcServer,
    args: &[&str],
) -> String {
    use std::process::{Command, Stdio};
    let mut child = Command::new(python)
        .arg(client_script())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let to_client = child.stdin.take().unwrap();
    let from_client = child.stdout.take().unwrap();
    let served =
        std::thread::spawn(move || server.serve(std::io::BufReader::new(from_client), to_client));
    let out = child.wait_with_output().unwrap();
    served.join().unwrap().unwrap();
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("{report}");
    assert!(out.status.success(), "the Python client failed:\n{report}");
    report
}

/// `suspendAgent` / `resumeAgent`: an agent this server does not run gets a request for the
/// process that does (applied there; see `spawn_suite/suspend.rs`), recorded in the log; bad
/// parameters are refused by name.
#[test]
fn suspend_and_resume_are_methods() {
    let p = Project::new();
    let (mut rpc, _release) = fake_rpc(&p);
    let r = rpc.ok("suspendAgent", json!({"agent": "far-away"}));
    assert_eq!(r["applied"], "requested", "{r}");
    assert_eq!(r["want"], "suspended");
    let ev = rpc
        .event(|e| e["kind"] == "agent_control" && e["agent"] == "far-away")
        .expect("the request is an event");
    assert_eq!(ev["data"]["want"], "suspended");
    let r = rpc.ok("resumeAgent", json!(["far-away"]));
    assert_eq!(
        (r["applied"].as_str(), r["want"].as_str()),
        (Some("requested"), Some("active"))
    );
    for params in [
        json!({}),
        json!({"agent": ""}),
        json!({"agent": "a", "x": 1}),
    ] {
        let reply = rpc.call("suspendAgent", params.clone());
        assert_eq!(reply["error"]["code"], -32602, "{params}: {reply}");
    }
    let (result, _) = rpc.close();
    result.unwrap();
}
