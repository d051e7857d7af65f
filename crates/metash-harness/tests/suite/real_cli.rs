//! The real CLIs (installed by scripts/setup into .tools from the npm registry) against loopback
//! servers. Each run gets its own aspHome (so its own HOME / CODEX_HOME / pi agent dir), stdin
//! null, and every other traffic switched off. Missing CLIs: the test prints why it skipped.

use std::path::{Path, PathBuf};
use std::time::Duration;

use metash_harness::runner::run_piped;
use metash_harness::{
    build_process_invocation_spec, CancellationToken, Endpoint, Harness, HarnessError, Program,
    Programs, RunTurnNonInteractiveRequest,
};
use metash_protocol::{
    HarnessContinuationRef, HarnessErrorCode, HarnessEvent, HarnessEventEnvelope, HarnessFrontend,
    ProcessInvocationSpec, ProviderDomain, RunTurnNonInteractiveResponse,
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

/// Where a test's turns run: a temp root with the CLI's cwd (`work`) and agent state (`asp`)
/// under it, and a harness.
struct Place {
    root: tempfile::TempDir,
    cwd: PathBuf,
    asp: PathBuf,
    h: Harness,
}

impl Place {
    fn new() -> Self {
        Self::with(programs())
    }

    fn with(programs: Programs) -> Self {
        let root = tempfile::tempdir().unwrap();
        let cwd = root.path().join("work");
        std::fs::create_dir_all(&cwd).unwrap();
        let asp = root.path().join("asp");
        Self {
            root,
            cwd,
            asp,
            h: Harness::new(programs).unwrap(),
        }
    }

    /// A directory beside `work`, created.
    fn other_dir(&self, name: &str) -> PathBuf {
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn request(
        &self,
        server: &MockServer,
        frontend: HarnessFrontend,
        prompt: &str,
        key: Option<&str>,
    ) -> RunTurnNonInteractiveRequest {
        self.request_in(server, frontend, &self.cwd, prompt, key)
    }

    fn request_in(
        &self,
        server: &MockServer,
        frontend: HarnessFrontend,
        cwd: &Path,
        prompt: &str,
        key: Option<&str>,
    ) -> RunTurnNonInteractiveRequest {
        turn_request(server, frontend, &self.asp, cwd, prompt, key)
    }

    async fn run(
        &self,
        req: &RunTurnNonInteractiveRequest,
    ) -> (RunTurnNonInteractiveResponse, Vec<HarnessEventEnvelope>) {
        run_turn(&self.h, req).await
    }

    async fn turn(
        &self,
        server: &MockServer,
        frontend: HarnessFrontend,
        prompt: &str,
        key: Option<&str>,
    ) -> (RunTurnNonInteractiveResponse, Vec<HarnessEventEnvelope>) {
        self.run(&self.request(server, frontend, prompt, key)).await
    }

    /// A turn the harness must refuse before it starts.
    async fn refused(&self, req: &RunTurnNonInteractiveRequest) -> HarnessError {
        self.h
            .run_turn_non_interactive(req, &CancellationToken::new(), &mut |_| {})
            .await
            .unwrap_err()
    }
}

/// The CLI's loopback model, answering `reply(first)` to the first request (when given) and
/// `reply(then)` to every other, and a fresh place; None (skipped) when the CLI is missing.
async fn model_and_place(
    program: Program,
    reply: fn(&str) -> Reply,
    first: Option<&str>,
    then: &'static str,
) -> Option<(MockServer, Place)> {
    require(program)?;
    let server = MockServer::start(move |_| reply(then)).await;
    if let Some(first) = first {
        server.push(reply(first));
    }
    Some((server, Place::new()))
}

/// A two-turn conversation with one CLI, named by `tag`: the prompts are `{tag}-FIRST` and
/// `{tag}-SECOND`, the model answers `{tag}-ONE` and then `{tag}-TWO`.
struct Conversation {
    server: MockServer,
    p: Place,
    frontend: HarnessFrontend,
    tag: &'static str,
    first: RunTurnNonInteractiveResponse,
    events: Vec<HarnessEventEnvelope>,
    key: String,
}

impl Conversation {
    /// The first turn, done and answered; None (skipped) when the CLI is missing.
    async fn start(frontend: HarnessFrontend, tag: &'static str) -> Option<Self> {
        let (program, reply): (Program, fn(&str) -> Reply) = match frontend {
            HarnessFrontend::CodexCli => (Program::Codex, responses_text),
            HarnessFrontend::PiSdk => (Program::Pi, chat_text),
            _ => (Program::Claude, anthropic_text),
        };
        let then: &'static str = format!("{tag}-TWO").leak();
        let (server, p) =
            model_and_place(program, reply, Some(&format!("{tag}-ONE")), then).await?;
        let (first, events) = p
            .turn(&server, frontend, &format!("{tag}-FIRST"), None)
            .await;
        assert!(first.result.success, "{:?}", first.result);
        assert_eq!(
            first.result.final_output.as_deref(),
            Some(format!("{tag}-ONE").as_str())
        );
        let key = first.continuation.clone().unwrap().key.unwrap();
        Some(Self {
            server,
            p,
            frontend,
            tag,
            first,
            events,
            key,
        })
    }

    /// The second turn, resuming from `cwd`: it succeeds, and the model's request carries the
    /// first turn in its `field`.
    async fn resume(&self, cwd: &Path, field: &str) -> RunTurnNonInteractiveResponse {
        let prompt = format!("{}-SECOND", self.tag);
        let req = self
            .p
            .request_in(&self.server, self.frontend, cwd, &prompt, Some(&self.key));
        let (r, _) = self.p.run(&req).await;
        assert!(r.result.success, "{:?}", r.result);
        assert_eq!(
            r.continuation.as_ref().unwrap().key.as_deref(),
            Some(self.key.as_str())
        );
        let resumed = requests_with(&self.server, &prompt);
        assert!(!resumed.is_empty(), "no request carried {prompt}");
        let sent = resumed[0][field].to_string();
        for earlier in [format!("{}-FIRST", self.tag), format!("{}-ONE", self.tag)] {
            assert!(sent.contains(&earlier), "history not sent: {sent}");
        }
        r
    }
}

/// Runs a spec's process to its end with the test's timeout: its exit and stdout lines.
async fn run_spec(spec: &ProcessInvocationSpec) -> Vec<String> {
    let mut lines = Vec::new();
    let out = run_piped(
        spec,
        Some(Duration::from_millis(TIMEOUT_MS)),
        &CancellationToken::new(),
        &mut |l| lines.push(l.to_string()),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "{}", out.stderr_tail);
    lines
}

#[tokio::test]
async fn agent_sdk_observes_the_key_resumes_with_history_and_refuses_another_cwd() {
    let Some(c) = Conversation::start(HarnessFrontend::AgentSdk, "CLAUDE").await else {
        return;
    };
    let (server, p, key) = (&c.server, &c.p, &c.key);
    assert!(c.events.iter().any(
        |e| matches!(&e.payload, Some(HarnessEvent::ContinuationObserved { key: k }) if k == key)
    ));
    assert!(matches!(
        c.events.last().unwrap().payload,
        Some(HarnessEvent::TurnCompleted { .. })
    ));
    c.resume(&p.cwd, "messages").await;

    // Claude resumes only from the same cwd: refused up front, nothing spawned.
    let before = server.count();
    let other = p.other_dir("elsewhere");
    let err = p
        .refused(&p.request_in(
            server,
            HarnessFrontend::AgentSdk,
            &other,
            "x",
            Some(key.as_str()),
        ))
        .await;
    assert_eq!(err.code(), HarnessErrorCode::ContinuationNotFound);
    assert!(err.to_string().contains("another cwd"), "{err}");
    assert_eq!(server.count(), before);
}

#[tokio::test]
async fn a_provider_mismatch_is_refused_before_any_process_starts() {
    let Some((server, p)) = model_and_place(Program::Claude, anthropic_text, None, "never").await
    else {
        return;
    };
    for frontend in [
        HarnessFrontend::AgentSdk,
        HarnessFrontend::ClaudeCode,
        HarnessFrontend::CodexCli,
        HarnessFrontend::PiSdk,
    ] {
        let mut req = p.request(&server, frontend, "x", None);
        let other = match frontend.provider() {
            ProviderDomain::Anthropic => ProviderDomain::Openai,
            ProviderDomain::Openai => ProviderDomain::Anthropic,
        };
        req.continuation = Some(HarnessContinuationRef {
            provider: other,
            key: Some("some-key".into()),
        });
        let err = p.refused(&req).await;
        assert_eq!(
            err.code(),
            HarnessErrorCode::ProviderMismatch,
            "{frontend:?}"
        );
    }
    assert_eq!(server.count(), 0, "no process ever reached the server");
    assert!(!p.asp.exists(), "nothing was materialized");
}

#[tokio::test]
async fn claude_code_spawned_from_the_spec_alone_completes_a_turn() {
    let Some((server, place)) =
        model_and_place(Program::Claude, anthropic_text, None, "SPEC-ONLY-OK").await
    else {
        return;
    };
    // The turn request's invocation half: nothing else reaches the process.
    let req = place
        .request(&server, HarnessFrontend::ClaudeCode, "hello", None)
        .invocation_request();
    let spec = build_process_invocation_spec(&req, &programs())
        .unwrap()
        .spec;
    let lines = run_spec(&spec).await;
    let result: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(result["type"], "result");
    assert_eq!(result["is_error"], false);
    assert_eq!(result["result"], "SPEC-ONLY-OK");
}

#[tokio::test]
async fn codex_observes_the_thread_resumes_with_history_and_runs_from_its_spec() {
    let Some(c) = Conversation::start(HarnessFrontend::CodexCli, "CODEX").await else {
        return;
    };
    let (server, p, key) = (&c.server, &c.p, &c.key);
    assert_eq!(
        c.first.continuation.as_ref().unwrap().provider,
        ProviderDomain::Openai
    );
    // Resume from another cwd works for Codex (same provider definition).
    c.resume(&p.other_dir("other"), "input").await;

    // A different provider definition would not resume: refused before spawning.
    let mut bad = p.request(server, HarnessFrontend::CodexCli, "x", Some(key.as_str()));
    bad.options.endpoint.as_mut().unwrap().provider_name = Some("another".into());
    let before = server.count();
    let err = p.refused(&bad).await;
    assert_eq!(err.code(), HarnessErrorCode::ContinuationNotFound);
    assert_eq!(server.count(), before);

    // The spec alone is enough to run a turn.
    let inv = p
        .request(server, HarnessFrontend::CodexCli, "SPEC-PROMPT", None)
        .invocation_request();
    let spec = build_process_invocation_spec(&inv, &programs())
        .unwrap()
        .spec;
    let lines = run_spec(&spec).await;
    assert!(
        lines.iter().any(|l| l.contains("\"turn.completed\"")),
        "{lines:?}"
    );
}

#[tokio::test]
async fn pi_sdk_observes_the_session_and_resumes_with_history() {
    let Some(c) = Conversation::start(HarnessFrontend::PiSdk, "PI").await else {
        return;
    };
    let (server, p) = (&c.server, &c.p);
    c.resume(&p.other_dir("other"), "messages").await;
    let err = p
        .refused(&p.request(server, HarnessFrontend::PiSdk, "x", Some("no-such-session")))
        .await;
    assert_eq!(err.code(), HarnessErrorCode::ContinuationNotFound);
}

/// Unknown keys are refused by the resume rules before any process starts: the programs here do
/// not exist, so reaching a spawn would have failed with `program_not_found` instead.
#[tokio::test]
async fn unknown_keys_are_refused_before_spawning() {
    let server = MockServer::start(|_| anthropic_text("never")).await;
    let missing = metash_harness::Programs {
        claude: Some("/nonexistent/claude".into()),
        codex: Some("/nonexistent/codex".into()),
        pi: Some("/nonexistent/pi".into()),
    };
    let p = Place::with(missing);
    for frontend in [
        HarnessFrontend::AgentSdk,
        HarnessFrontend::ClaudeCode,
        HarnessFrontend::CodexCli,
        HarnessFrontend::PiSdk,
    ] {
        let req = p.request(
            &server,
            frontend,
            "x",
            Some("0199aaaa-0000-7000-8000-000000000000"),
        );
        let err = p.refused(&req).await;
        assert_eq!(
            err.code(),
            HarnessErrorCode::ContinuationNotFound,
            "{frontend:?}: {err}"
        );
    }
    // Without a key the same harness does try to spawn, and says the program is missing.
    let req = p.request(&server, HarnessFrontend::CodexCli, "x", None);
    let err = p.refused(&req).await;
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
    let p = Place::new();
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
        let (r, events) = p.turn(&server, frontend, "x", None).await;
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
        let place = Place::new();
        let turn = place.request(&server, frontend, "INTERACTIVE-PROMPT", None);
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
