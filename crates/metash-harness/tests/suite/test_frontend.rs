//! A frontend defined in this one file and added with one registry line: the seam a new CLI or
//! API client plugs into. Its "program" is `/bin/sh` printing JSON lines, so the turn goes
//! through the same materialize → argv → confined spawn → parser path as Claude Code, Codex and
//! pi. Wire names are the protocol's closed set (seed 003), so it serves an existing one
//! (`openai-chat`), replacing metash's chat client in this harness only.

use std::path::Path;

use metash_harness::runner::PipedOutcome;
use metash_harness::{
    BuildProcessInvocationSpecRequest, CancellationToken, Emitter, Frontend, FrontendInfo, Harness,
    KeyHeader, Materialized, Programs, Registry, Result, RunTurnNonInteractiveRequest, TurnParser,
};
use metash_protocol::{
    FrontendKind, HarnessEvent, HarnessEventEnvelope, HarnessFrontend, RunResult, Usage,
};
use serde_json::Value;

const INFO: FrontendInfo = FrontendInfo {
    id: HarnessFrontend::OpenaiChat,
    kind: FrontendKind::Sdk,
    program: None,
    state_dir: "echo",
    upstream: "http://127.0.0.1:9/v1",
    base_url_env: "ECHO_BASE_URL",
    key_env: "ECHO_KEY",
    role_key_env: None,
    fixed_key_env: None,
    key_header: KeyHeader::Bearer,
    default_model: None,
    any_model: true,
    permission_prompt: false,
};

/// Echoes the prompt back as `{"key"}`, `{"text"}`, `{"usage"}` lines.
struct Echo;

impl Frontend for Echo {
    fn info(&self) -> &FrontendInfo {
        &INFO
    }

    fn materialize(&self, req: &BuildProcessInvocationSpecRequest) -> Result<Materialized> {
        let dir = req.asp_home.join(INFO.state_dir);
        metash_harness::fsutil::write_atomic(&dir.join("prompt"), b"echo\n")?;
        let mut m = Materialized::default();
        m.env.insert("ECHO_DIR".into(), dir.display().to_string());
        Ok(m)
    }

    fn argv(
        &self,
        req: &BuildProcessInvocationSpecRequest,
        _materialized: &Materialized,
        _programs: &Programs,
        _warnings: &mut Vec<String>,
    ) -> Result<Vec<String>> {
        let script = r#"printf '{"key":"echo-1"}\n{"text":"%s from %s"}\n{"usage":[3,5]}\n' "$1" "$(cat "$ECHO_DIR/prompt")""#;
        let prompt = req.prompt.clone().unwrap_or_default();
        Ok(["/bin/sh", "-c", script, "echo", &prompt]
            .map(String::from)
            .to_vec())
    }

    fn parser(&self) -> Option<Box<dyn TurnParser>> {
        Some(Box::new(EchoParser::default()))
    }
}

#[derive(Default)]
struct EchoParser {
    text: Option<String>,
    usage: Option<Usage>,
}

impl TurnParser for EchoParser {
    fn line(&mut self, v: &Value, em: &mut Emitter<'_>) {
        if let Some(k) = v["key"].as_str() {
            em.observe_key(k);
        }
        if let Some(t) = v["text"].as_str() {
            self.text = Some(t.to_string());
            em.emit(HarnessEvent::Message {
                role: "assistant".into(),
                text: t.to_string(),
            });
        }
        if let Some([i, o]) = v["usage"].as_array().map(Vec::as_slice) {
            self.usage = Some(Usage {
                input_tokens: i.as_u64().unwrap_or(0),
                output_tokens: o.as_u64().unwrap_or(0),
                ..Usage::default()
            });
        }
    }

    fn finish(self: Box<Self>, outcome: &PipedOutcome) -> RunResult {
        RunResult {
            success: outcome.status.success() && self.text.is_some(),
            final_output: self.text,
            usage: self.usage,
            ..RunResult::default()
        }
    }
}

fn harness() -> Harness {
    let mut h = Harness::new(Programs::default()).unwrap();
    h.registry = Registry::builtin().with(Echo); // the one registry line
    h
}

#[tokio::test]
async fn a_frontend_in_one_file_runs_a_whole_turn() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let req = RunTurnNonInteractiveRequest::new(
        HarnessFrontend::OpenaiChat,
        root.join("asp"),
        root,
        "hello",
    );
    let mut events: Vec<HarnessEventEnvelope> = Vec::new();
    let mut sink = |e: HarnessEventEnvelope| events.push(e);
    let resp = harness()
        .run_turn_non_interactive(&req, &CancellationToken::new(), &mut sink)
        .await
        .unwrap();
    assert!(resp.result.success, "{:?}", resp.result.error);
    assert_eq!(resp.result.final_output.as_deref(), Some("hello from echo"));
    assert_eq!(
        resp.continuation.and_then(|c| c.key).as_deref(),
        Some("echo-1")
    );
    assert_eq!(resp.result.usage.map(|u| u.output_tokens), Some(5));
    let kinds: Vec<String> = events
        .iter()
        .filter_map(|e| serde_json::to_value(&e.payload).ok())
        .filter_map(|v| v["type"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        kinds,
        [
            "turn_started",
            "continuation_observed",
            "message",
            "usage",
            "turn_completed"
        ]
    );
    assert!(Path::new(&root.join("asp/echo/prompt")).is_file());
}

#[test]
fn the_registry_serves_it_for_invocation_specs_and_capabilities() {
    let dir = tempfile::tempdir().unwrap();
    let mut req = BuildProcessInvocationSpecRequest::new(
        HarnessFrontend::OpenaiChat,
        dir.path().join("asp"),
        dir.path(),
    );
    req.prompt = Some("hi".into());
    let h = harness();
    let spec = h.build_process_invocation_spec(&req).unwrap().spec;
    assert_eq!(spec.argv[0], "/bin/sh");
    assert!(spec.env.contains_key("ECHO_DIR"));
    // The built-in registry still knows openai-chat as metash's API client.
    let builtin = metash_harness::build_process_invocation_spec(&req, &Programs::default());
    assert!(builtin.is_err());
    let caps = h.capabilities();
    let kind = caps
        .providers
        .iter()
        .flat_map(|p| &p.frontends)
        .find(|f| f.frontend == HarnessFrontend::OpenaiChat)
        .map(|f| f.kind);
    assert_eq!(kind, Some(FrontendKind::Sdk));
}
