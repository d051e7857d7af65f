//! The real CLIs (installed by scripts/setup into .tools from the npm registry) against loopback
//! servers. Each run gets its own aspHome (so its own HOME / CODEX_HOME / pi agent dir), stdin
//! null, and every other traffic switched off. Missing CLIs: the test prints why it skipped.

use std::path::Path;
use std::time::Duration;

use metash_harness::runner::run_piped;
use metash_harness::{
    build_process_invocation_spec, BuildProcessInvocationSpecRequest, CancellationToken, Endpoint,
    Harness, Program, RunTurnNonInteractiveRequest,
};
use metash_protocol::{
    HarnessContinuationRef, HarnessErrorCode, HarnessEvent, HarnessEventEnvelope, HarnessFrontend,
    ProviderDomain, RunTurnNonInteractiveResponse,
};
use serde_json::Value;

use super::support::*;

const TIMEOUT_MS: u64 = 180_000;

fn turn_request(
    server: &MockServer,
    frontend: HarnessFrontend,
    asp: &Path,
    cwd: &Path,
    prompt: &str,
    key: Option<&str>,
) -> RunTurnNonInteractiveRequest {
    let mut req = RunTurnNonInteractiveRequest::new(frontend, asp, cwd, prompt);
    req.cp_session_id = "cp-real".into();
    req.options.isolated_home = true;
    req.options.skip_permissions = true;
    req.timeout_ms = Some(TIMEOUT_MS);
    match frontend.provider() {
        ProviderDomain::Anthropic => {
            req.model = Some("claude-sonnet-4-5".into());
            req.options.endpoint = Some(Endpoint {
                base_url: server.base.clone(),
                api_key_env: None,
                provider_name: None,
            });
            req.env
                .insert("ANTHROPIC_API_KEY".into(), "sk-ant-test".into());
        }
        ProviderDomain::Openai => {
            req.model = Some(
                if frontend == HarnessFrontend::PiSdk {
                    "test-model"
                } else {
                    "gpt-5.1-codex"
                }
                .into(),
            );
            req.options.endpoint = Some(Endpoint {
                base_url: format!("{}/v1", server.base),
                api_key_env: Some("METASH_TEST_OPENAI_KEY".into()),
                provider_name: Some("loopback".into()),
            });
            req.env
                .insert("METASH_TEST_OPENAI_KEY".into(), "sk-test".into());
        }
    }
    req.continuation = key.map(|k| HarnessContinuationRef {
        provider: frontend.provider(),
        key: Some(k.into()),
    });
    req
}

async fn run(
    h: &Harness,
    req: &RunTurnNonInteractiveRequest,
) -> (RunTurnNonInteractiveResponse, Vec<HarnessEventEnvelope>) {
    let mut events = Vec::new();
    let resp = h
        .run_turn_non_interactive(req, &CancellationToken::new(), &mut |e| events.push(e))
        .await
        .unwrap();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1);
    }
    (resp, events)
}

fn body_mentions(c: &Captured, needle: &str) -> bool {
    String::from_utf8_lossy(&c.body).contains(needle)
}

/// The model requests that carry this conversation (CLIs may send side requests too).
fn requests_with(server: &MockServer, needle: &str) -> Vec<Value> {
    server
        .posts()
        .into_iter()
        .filter(|c| body_mentions(c, needle))
        .map(|c| c.json())
        .collect()
}

fn dirs() -> (tempfile::TempDir, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let cwd = root.path().join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    (root, cwd)
}

#[tokio::test]
async fn agent_sdk_observes_the_key_resumes_with_history_and_refuses_another_cwd() {
    let Some(_) = require(Program::Claude) else {
        return;
    };
    let server = MockServer::start(|_| anthropic_text("ANSWER-TWO")).await;
    server.push(anthropic_text("ANSWER-ONE"));
    let (root, cwd) = dirs();
    let asp = root.path().join("asp");
    let h = Harness::new(programs()).unwrap();
    let (r1, events) = run(
        &h,
        &turn_request(
            &server,
            HarnessFrontend::AgentSdk,
            &asp,
            &cwd,
            "FIRST-PROMPT",
            None,
        ),
    )
    .await;
    assert!(r1.result.success, "{:?}", r1.result);
    assert_eq!(r1.result.final_output.as_deref(), Some("ANSWER-ONE"));
    let key = r1.continuation.clone().unwrap().key.unwrap();
    assert!(events.iter().any(
        |e| matches!(&e.payload, Some(HarnessEvent::ContinuationObserved { key: k }) if *k == key)
    ));
    assert!(matches!(
        events.last().unwrap().payload,
        Some(HarnessEvent::TurnCompleted { .. })
    ));

    let (r2, _) = run(
        &h,
        &turn_request(
            &server,
            HarnessFrontend::AgentSdk,
            &asp,
            &cwd,
            "SECOND-PROMPT",
            Some(&key),
        ),
    )
    .await;
    assert!(r2.result.success, "{:?}", r2.result);
    assert_eq!(r2.continuation.unwrap().key.as_deref(), Some(key.as_str()));
    let resumed = requests_with(&server, "SECOND-PROMPT");
    assert!(!resumed.is_empty());
    let sent = resumed[0]["messages"].to_string();
    assert!(
        sent.contains("FIRST-PROMPT") && sent.contains("ANSWER-ONE"),
        "history not sent: {sent}"
    );

    // Claude resumes only from the same cwd: refused up front, nothing spawned.
    let before = server.count();
    let other = root.path().join("elsewhere");
    std::fs::create_dir_all(&other).unwrap();
    let err = h
        .run_turn_non_interactive(
            &turn_request(
                &server,
                HarnessFrontend::AgentSdk,
                &asp,
                &other,
                "x",
                Some(&key),
            ),
            &CancellationToken::new(),
            &mut |_| {},
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), HarnessErrorCode::ContinuationNotFound);
    assert!(err.to_string().contains("another cwd"), "{err}");
    assert_eq!(server.count(), before);
}

#[tokio::test]
async fn a_provider_mismatch_is_refused_before_any_process_starts() {
    let Some(_) = require(Program::Claude) else {
        return;
    };
    let server = MockServer::start(|_| anthropic_text("never")).await;
    let (root, cwd) = dirs();
    let asp = root.path().join("asp");
    let h = Harness::new(programs()).unwrap();
    for frontend in [
        HarnessFrontend::AgentSdk,
        HarnessFrontend::ClaudeCode,
        HarnessFrontend::CodexCli,
        HarnessFrontend::PiSdk,
    ] {
        let mut req = turn_request(&server, frontend, &asp, &cwd, "x", None);
        let other = match frontend.provider() {
            ProviderDomain::Anthropic => ProviderDomain::Openai,
            ProviderDomain::Openai => ProviderDomain::Anthropic,
        };
        req.continuation = Some(HarnessContinuationRef {
            provider: other,
            key: Some("some-key".into()),
        });
        let err = h
            .run_turn_non_interactive(&req, &CancellationToken::new(), &mut |_| {})
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            HarnessErrorCode::ProviderMismatch,
            "{frontend:?}"
        );
    }
    assert_eq!(server.count(), 0, "no process ever reached the server");
    assert!(!asp.exists(), "nothing was materialized");
}

#[tokio::test]
async fn claude_code_spawned_from_the_spec_alone_completes_a_turn() {
    let Some(_) = require(Program::Claude) else {
        return;
    };
    let server = MockServer::start(|_| anthropic_text("SPEC-ONLY-OK")).await;
    let (root, cwd) = dirs();
    let mut req = BuildProcessInvocationSpecRequest::new(
        HarnessFrontend::ClaudeCode,
        root.path().join("asp"),
        &cwd,
    );
    req.prompt = Some("hello".into());
    req.model = Some("claude-sonnet-4-5".into());
    req.options.isolated_home = true;
    req.options.endpoint = Some(Endpoint {
        base_url: server.base.clone(),
        api_key_env: None,
        provider_name: None,
    });
    req.env
        .insert("ANTHROPIC_API_KEY".into(), "sk-ant-test".into());
    let spec = build_process_invocation_spec(&req, &programs())
        .unwrap()
        .spec;
    let mut lines = Vec::new();
    let out = run_piped(
        &spec,
        Some(Duration::from_millis(TIMEOUT_MS)),
        &CancellationToken::new(),
        &mut |l| lines.push(l.to_string()),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "{}", out.stderr_tail);
    let result: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(result["type"], "result");
    assert_eq!(result["is_error"], false);
    assert_eq!(result["result"], "SPEC-ONLY-OK");
}

#[tokio::test]
async fn codex_observes_the_thread_resumes_with_history_and_runs_from_its_spec() {
    let Some(_) = require(Program::Codex) else {
        return;
    };
    let server = MockServer::start(|_| responses_text("CODEX-TWO")).await;
    server.push(responses_text("CODEX-ONE"));
    let (root, cwd) = dirs();
    let asp = root.path().join("asp");
    let h = Harness::new(programs()).unwrap();
    let (r1, _) = run(
        &h,
        &turn_request(
            &server,
            HarnessFrontend::CodexCli,
            &asp,
            &cwd,
            "CODEX-FIRST",
            None,
        ),
    )
    .await;
    assert!(r1.result.success, "{:?}", r1.result);
    assert_eq!(r1.result.final_output.as_deref(), Some("CODEX-ONE"));
    let key = r1.continuation.clone().unwrap().key.unwrap();
    assert_eq!(r1.continuation.unwrap().provider, ProviderDomain::Openai);

    // Resume from another cwd works for Codex (same provider definition).
    let other = root.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let (r2, _) = run(
        &h,
        &turn_request(
            &server,
            HarnessFrontend::CodexCli,
            &asp,
            &other,
            "CODEX-SECOND",
            Some(&key),
        ),
    )
    .await;
    assert!(r2.result.success, "{:?}", r2.result);
    assert_eq!(r2.continuation.unwrap().key.as_deref(), Some(key.as_str()));
    let resumed = requests_with(&server, "CODEX-SECOND");
    let sent = resumed[0]["input"].to_string();
    assert!(
        sent.contains("CODEX-FIRST") && sent.contains("CODEX-ONE"),
        "history not sent: {sent}"
    );

    // A different provider definition would not resume: refused before spawning.
    let mut bad = turn_request(
        &server,
        HarnessFrontend::CodexCli,
        &asp,
        &cwd,
        "x",
        Some(&key),
    );
    bad.options.endpoint.as_mut().unwrap().provider_name = Some("another".into());
    let before = server.count();
    let err = h
        .run_turn_non_interactive(&bad, &CancellationToken::new(), &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), HarnessErrorCode::ContinuationNotFound);
    assert_eq!(server.count(), before);

    // The spec alone is enough to run a turn.
    let inv = turn_request(
        &server,
        HarnessFrontend::CodexCli,
        &asp,
        &cwd,
        "SPEC-PROMPT",
        None,
    )
    .invocation_request();
    let spec = build_process_invocation_spec(&inv, &programs())
        .unwrap()
        .spec;
    let mut lines = Vec::new();
    let out = run_piped(
        &spec,
        Some(Duration::from_millis(TIMEOUT_MS)),
        &CancellationToken::new(),
        &mut |l| lines.push(l.to_string()),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "{}", out.stderr_tail);
    assert!(
        lines.iter().any(|l| l.contains("\"turn.completed\"")),
        "{lines:?}"
    );
}

#[tokio::test]
async fn pi_sdk_observes_the_session_and_resumes_with_history() {
    let Some(_) = require(Program::Pi) else {
        return;
    };
    let server = MockServer::start(|_| chat_text("PI-TWO")).await;
    server.push(chat_text("PI-ONE"));
    let (root, cwd) = dirs();
    let asp = root.path().join("asp");
    let h = Harness::new(programs()).unwrap();
    let (r1, _) = run(
        &h,
        &turn_request(
            &server,
            HarnessFrontend::PiSdk,
            &asp,
            &cwd,
            "PI-FIRST",
            None,
        ),
    )
    .await;
    assert!(r1.result.success, "{:?}", r1.result);
    assert_eq!(r1.result.final_output.as_deref(), Some("PI-ONE"));
    let key = r1.continuation.unwrap().key.unwrap();
    let other = root.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let (r2, _) = run(
        &h,
        &turn_request(
            &server,
            HarnessFrontend::PiSdk,
            &asp,
            &other,
            "PI-SECOND",
            Some(&key),
        ),
    )
    .await;
    assert!(r2.result.success, "{:?}", r2.result);
    let resumed = requests_with(&server, "PI-SECOND");
    let sent = resumed[0]["messages"].to_string();
    assert!(
        sent.contains("PI-FIRST") && sent.contains("PI-ONE"),
        "history not sent: {sent}"
    );
    let err = h
        .run_turn_non_interactive(
            &turn_request(
                &server,
                HarnessFrontend::PiSdk,
                &asp,
                &cwd,
                "x",
                Some("no-such-session"),
            ),
            &CancellationToken::new(),
            &mut |_| {},
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), HarnessErrorCode::ContinuationNotFound);
}

/// Unknown keys are refused by the resume rules before any process starts: the programs here do
/// not exist, so reaching a spawn would have failed with `program_not_found` instead.
#[tokio::test]
async fn unknown_keys_are_refused_before_spawning() {
    let server = MockServer::start(|_| anthropic_text("never")).await;
    let (root, cwd) = dirs();
    let asp = root.path().join("asp");
    let missing = metash_harness::Programs {
        claude: Some("/nonexistent/claude".into()),
        codex: Some("/nonexistent/codex".into()),
        pi: Some("/nonexistent/pi".into()),
    };
    let h = Harness::new(missing).unwrap();
    for frontend in [
        HarnessFrontend::AgentSdk,
        HarnessFrontend::ClaudeCode,
        HarnessFrontend::CodexCli,
        HarnessFrontend::PiSdk,
    ] {
        let req = turn_request(
            &server,
            frontend,
            &asp,
            &cwd,
            "x",
            Some("0199aaaa-0000-7000-8000-000000000000"),
        );
        let err = h
            .run_turn_non_interactive(&req, &CancellationToken::new(), &mut |_| {})
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            HarnessErrorCode::ContinuationNotFound,
            "{frontend:?}: {err}"
        );
    }
    // Without a key the same harness does try to spawn, and says the program is missing.
    let req = turn_request(&server, HarnessFrontend::CodexCli, &asp, &cwd, "x", None);
    let err = h
        .run_turn_non_interactive(&req, &CancellationToken::new(), &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), HarnessErrorCode::ProgramNotFound);
    assert_eq!(server.count(), 0);
}

/// A provider error reaches the caller as an `error` event carrying the provider's own message.
#[tokio::test]
async fn provider_errors_from_the_clis_become_error_events() {
    let server = MockServer::start(|c| {
        if c.path.contains("/responses") {
            openai_error(400, "CODEX-SIDE-BAD-REQUEST")
        } else if c.path.contains("/chat/completions") {
            openai_error(400, "PI-SIDE-BAD-REQUEST")
        } else {
            anthropic_error(400, "invalid_request_error", "CLAUDE-SIDE-BAD-REQUEST")
        }
    })
    .await;
    let (root, cwd) = dirs();
    let asp = root.path().join("asp");
    let h = Harness::new(programs()).unwrap();
    for (frontend, program, needle) in [
        (
            HarnessFrontend::AgentSdk,
            Program::Claude,
            "CLAUDE-SIDE-BAD-REQUEST",
        ),
        (
            HarnessFrontend::CodexCli,
            Program::Codex,
            "CODEX-SIDE-BAD-REQUEST",
        ),
        (HarnessFrontend::PiSdk, Program::Pi, "PI-SIDE-BAD-REQUEST"),
    ] {
        if require(program).is_none() {
            continue;
        }
        let (r, events) = run(&h, &turn_request(&server, frontend, &asp, &cwd, "x", None)).await;
        assert!(!r.result.success);
        let err = r.result.error.clone().unwrap();
        assert_eq!(
            err.code,
            HarnessErrorCode::ApiError,
            "{frontend:?}: {err:?}"
        );
        assert!(
            err.message.contains(needle),
            "{frontend:?}: {}",
            err.message
        );
        assert!(events.iter().any(|e| matches!(&e.payload, Some(HarnessEvent::Error { message, .. }) if message.contains(needle))));
    }
}

/// An interactive spec on a pty (how a control plane hosts it in a terminal) sends the initial
/// prompt to the model: the interactive argv/env are enough on their own.
#[tokio::test]
async fn interactive_specs_on_a_pty_reach_the_model() {
    use std::io::Read;
    let server = MockServer::start(|c| {
        if c.path.contains("/responses") {
            responses_text("INTERACTIVE-OK")
        } else {
            anthropic_text("INTERACTIVE-OK")
        }
    })
    .await;
    for (frontend, program) in [
        (HarnessFrontend::ClaudeCode, Program::Claude),
        (HarnessFrontend::CodexCli, Program::Codex),
    ] {
        if require(program).is_none() {
            continue;
        }
        let (root, cwd) = dirs();
        let turn = turn_request(
            &server,
            frontend,
            &root.path().join("asp"),
            &cwd,
            "INTERACTIVE-PROMPT",
            None,
        );
        let mut inv = turn.invocation_request();
        inv.interaction_mode = metash_protocol::InteractionMode::Interactive;
        inv.io_mode = metash_protocol::IoMode::Pty;
        inv.options.trust_cwd = true;
        let spec = build_process_invocation_spec(&inv, &programs())
            .unwrap()
            .spec;
        let mut p = metash_harness::runner::spawn_pty(&spec, 40, 120).unwrap();
        let mut master = p.master.try_clone().unwrap();
        let screen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s2 = screen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                s2.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while requests_with(&server, "INTERACTIVE-PROMPT").is_empty()
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = p.child.kill();
        let _ = p.child.wait();
        let text = String::from_utf8_lossy(&screen.lock().unwrap()).into_owned();
        assert!(
            !requests_with(&server, "INTERACTIVE-PROMPT").is_empty(),
            "{frontend:?} never sent the prompt; screen:\n{}",
            text.chars()
                .rev()
                .take(3000)
                .collect::<String>()
                .chars()
                .rev()
                .collect::<String>()
        );
    }
}
