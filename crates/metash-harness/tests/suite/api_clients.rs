//! The direct API clients against loopback servers speaking each provider's exact SSE protocol.

use std::path::Path;
use std::time::{Duration, Instant};

use metash_harness::api::{ToolResultInput, ToolSpec};
use metash_harness::{
    CancellationToken, Endpoint, Harness, Programs, RunTurnNonInteractiveRequest,
};
use metash_protocol::{
    HarnessContinuationRef, HarnessErrorCode, HarnessEvent, HarnessEventEnvelope, HarnessFrontend,
    RunTurnNonInteractiveResponse,
};
use serde_json::json;

use super::support::*;

fn harness() -> Harness {
    let mut h = Harness::new(Programs::default()).unwrap();
    h.retry.base_delay = Duration::from_millis(20);
    h
}

/// One provider's client against one loopback server, with its own agent state directory.
struct Client<'a> {
    h: Harness,
    server: &'a MockServer,
    frontend: HarnessFrontend,
    dir: tempfile::TempDir,
}

impl<'a> Client<'a> {
    fn new(server: &'a MockServer, frontend: HarnessFrontend) -> Self {
        Self {
            h: harness(),
            server,
            frontend,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn asp(&self) -> &Path {
        self.dir.path()
    }

    fn request(&self, key: Option<&str>, prompt: &str) -> RunTurnNonInteractiveRequest {
        let (frontend, asp) = (self.frontend, self.asp());
        let base = match frontend {
            HarnessFrontend::AnthropicApi => self.server.base.clone(),
            _ => format!("{}/v1", self.server.base),
        };
        let mut req = RunTurnNonInteractiveRequest::new(frontend, asp, asp, prompt);
        req.cp_session_id = "cp-1".into();
        req.run_id = "run-1".into();
        req.model = Some(match frontend {
            HarnessFrontend::AnthropicApi => "claude-sonnet-4-5".into(),
            HarnessFrontend::OpenaiResponses => "gpt-5.1".into(),
            _ => "test-model".into(),
        });
        req.options.endpoint = Some(Endpoint {
            base_url: base,
            api_key_env: Some("METASH_TEST_KEY".into()),
            provider_name: None,
        });
        req.env.insert("METASH_TEST_KEY".into(), "sk-test".into());
        req.continuation = key.map(|k| HarnessContinuationRef {
            provider: frontend.provider(),
            key: Some(k.into()),
        });
        req
    }

    async fn run(
        &self,
        req: &RunTurnNonInteractiveRequest,
    ) -> (RunTurnNonInteractiveResponse, Vec<HarnessEventEnvelope>) {
        let (resp, events) = run_turn(&self.h, req).await;
        assert_envelopes(&events);
        (resp, events)
    }

    /// A turn: `prompt`, resuming `key` when given.
    async fn turn(
        &self,
        key: Option<&str>,
        prompt: &str,
    ) -> (RunTurnNonInteractiveResponse, Vec<HarnessEventEnvelope>) {
        self.run(&self.request(key, prompt)).await
    }

    /// The turn after a tool call: its result (`id`, `output`), then `prompt`.
    async fn after_tool(
        &self,
        key: &str,
        id: &str,
        output: &str,
        prompt: &str,
    ) -> (RunTurnNonInteractiveResponse, Vec<HarnessEventEnvelope>) {
        let mut req = self.request(Some(key), prompt);
        req.tool_results = vec![ToolResultInput {
            id: id.into(),
            output: output.into(),
            is_error: false,
        }];
        self.run(&req).await
    }
}

fn assert_envelopes(events: &[HarnessEventEnvelope]) {
    for e in events {
        assert_eq!(e.cp_session_id, "cp-1");
        assert_eq!(e.run_id, "run-1");
    }
    // Once observed, the continuation is on every later event.
    if let Some(first) = events.iter().position(|e| e.continuation.is_some()) {
        assert!(events[first..].iter().all(|e| e.continuation.is_some()));
        assert!(matches!(
            events[first].payload,
            Some(HarnessEvent::ContinuationObserved { .. })
        ));
    }
}

fn error_event(events: &[HarnessEventEnvelope]) -> Option<(HarnessErrorCode, String, Option<u16>)> {
    events.iter().find_map(|e| match &e.payload {
        Some(HarnessEvent::Error {
            code,
            message,
            status,
        }) => Some((*code, message.clone(), *status)),
        _ => None,
    })
}

#[tokio::test]
async fn anthropic_text_then_resume_sends_the_previous_messages() {
    let server = MockServer::start(|_| anthropic_text("second answer")).await;
    server.push(anthropic_text("Hello there friend"));
    let c = Client::new(&server, HarnessFrontend::AnthropicApi);
    let mut req = c.request(None, "hi");
    req.options.system_prompt = Some("be brief".into());
    req.max_tokens = Some(123);
    let (r1, events) = c.run(&req).await;
    assert!(r1.result.success, "{:?}", r1.result);
    assert_eq!(
        r1.result.final_output.as_deref(),
        Some("Hello there friend")
    );
    let usage = r1.result.usage.clone().unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (11, 7));
    let key = r1.continuation.clone().unwrap().key.unwrap();
    assert_eq!(
        r1.continuation.as_ref().unwrap().provider,
        metash_protocol::ProviderDomain::Anthropic
    );
    let deltas: String = events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(HarnessEvent::TextDelta { text }) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, "Hello there friend");
    let first = &server.posts()[0];
    assert_eq!(first.path, "/v1/messages");
    assert_eq!(first.header("x-api-key"), Some("sk-test"));
    assert_eq!(first.header("anthropic-version"), Some("2023-06-01"));
    let body = first.json();
    assert_eq!(body["system"], "be brief");
    assert_eq!(body["max_tokens"], 123);
    assert_eq!(body["stream"], true);
    assert!(c
        .asp()
        .join("transcripts")
        .join(format!("{key}.json"))
        .is_file());

    let req2 = c.request(Some(&key), "and again");
    let (r2, _) = c.run(&req2).await;
    assert_eq!(r2.continuation.unwrap().key.as_deref(), Some(key.as_str()));
    let msgs = server.posts()[1].json()["messages"].clone();
    assert_eq!(msgs.as_array().unwrap().len(), 3, "{msgs}");
    assert_eq!(msgs[0]["content"][0]["text"], "hi");
    assert_eq!(msgs[1]["role"], "assistant");
    assert_eq!(msgs[1]["content"][0]["text"], "Hello there friend");
    assert_eq!(msgs[2]["content"][0]["text"], "and again");
}

#[tokio::test]
async fn anthropic_tool_use_is_returned_and_its_result_sent_next_turn() {
    let server = MockServer::start(|_| anthropic_text("done")).await;
    server.push(anthropic_tool_use(
        "toolu_1",
        "read_file",
        json!({"path": "a.txt", "lines": [1, 2]}),
    ));
    let c = Client::new(&server, HarnessFrontend::AnthropicApi);
    let mut req = c.request(None, "read it");
    req.tools = vec![ToolSpec {
        name: "read_file".into(),
        description: "reads".into(),
        input_schema: json!({"type":"object"}),
    }];
    let (r1, events) = c.run(&req).await;
    assert_eq!(r1.result.stop_reason.as_deref(), Some("tool_use"));
    assert_eq!(r1.result.tool_calls.len(), 1);
    assert_eq!(
        r1.result.tool_calls[0].input,
        json!({"path": "a.txt", "lines": [1, 2]})
    );
    assert!(events.iter().any(
        |e| matches!(&e.payload, Some(HarnessEvent::ToolCall { call }) if call.name == "read_file")
    ));
    assert_eq!(server.posts()[0].json()["tools"][0]["name"], "read_file");
    let key = r1.continuation.unwrap().key.unwrap();
    let (r2, _) = c.after_tool(&key, "toolu_1", "contents", "go on").await;
    assert!(r2.result.success);
    let msgs = server.posts()[1].json()["messages"].clone();
    assert_eq!(msgs[1]["content"][1]["type"], "tool_use");
    assert_eq!(msgs[2]["content"][0]["type"], "tool_result");
    assert_eq!(msgs[2]["content"][0]["tool_use_id"], "toolu_1");
}

#[tokio::test]
async fn a_429_is_retried_after_retry_after() {
    let server = MockServer::start(|_| anthropic_text("finally")).await;
    server.push(too_many("1"));
    let c = Client::new(&server, HarnessFrontend::AnthropicApi);
    let start = Instant::now();
    let (r, events) = c.turn(None, "hi").await;
    assert!(r.result.success);
    assert!(
        start.elapsed() >= Duration::from_millis(950),
        "waited {:?}",
        start.elapsed()
    );
    assert_eq!(server.posts().len(), 2);
    assert!(events.iter().any(|e| matches!(
        e.payload,
        Some(HarnessEvent::Retry {
            attempt: 1,
            delay_ms: 1000,
            status: Some(429)
        })
    )));
}

#[tokio::test]
async fn a_400_becomes_an_error_event_with_the_providers_message_and_no_retry() {
    let server = MockServer::start(|_| {
        anthropic_error(400, "invalid_request_error", "max_tokens: too large")
    })
    .await;
    let c = Client::new(&server, HarnessFrontend::AnthropicApi);
    let (r, events) = c.turn(None, "hi").await;
    assert!(!r.result.success);
    assert!(r.continuation.is_none(), "a failed first turn has no key");
    let (code, message, status) = error_event(&events).unwrap();
    assert_eq!(code, HarnessErrorCode::ApiError);
    assert_eq!(status, Some(400));
    assert!(message.contains("max_tokens: too large"), "{message}");
    assert_eq!(server.posts().len(), 1);
    assert!(
        !c.asp().join("transcripts").exists(),
        "nothing persisted for a failed turn"
    );
}

#[tokio::test]
async fn a_stream_cut_midway_is_an_error_not_a_short_answer() {
    let server =
        MockServer::start(|_| cut(anthropic_text("never finishes this sentence"), 4)).await;
    let c = Client::new(&server, HarnessFrontend::AnthropicApi);
    let (r, events) = c.turn(None, "hi").await;
    assert!(!r.result.success);
    let (code, message, _) = error_event(&events).unwrap();
    assert_eq!(code, HarnessErrorCode::ApiError);
    assert!(message.contains("ended before"), "{message}");
}

#[tokio::test]
async fn a_5xx_exhausting_retries_reports_the_last_error() {
    let server =
        MockServer::start(|_| anthropic_error(529, "overloaded_error", "Overloaded")).await;
    let mut c = Client::new(&server, HarnessFrontend::AnthropicApi);
    c.h.retry.max_retries = 2;
    let (r, events) = c.turn(None, "hi").await;
    assert!(!r.result.success);
    assert_eq!(server.posts().len(), 3);
    assert!(error_event(&events).unwrap().1.contains("Overloaded"));
}

#[tokio::test]
async fn cancellation_and_timeout_end_a_stalled_stream() {
    let server = MockServer::start(|_| Reply::Stall).await;
    let c = Client::new(&server, HarnessFrontend::AnthropicApi);
    let mut req = c.request(None, "hi");
    req.timeout_ms = Some(300);
    let (r, _) = c.run(&req).await;
    assert_eq!(r.result.error.unwrap().code, HarnessErrorCode::Timeout);

    req.timeout_ms = None;
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c2.cancel();
    });
    let r =
        c.h.run_turn_non_interactive(&req, &cancel, &mut |_| {})
            .await
            .unwrap();
    assert_eq!(r.result.error.unwrap().code, HarnessErrorCode::Cancelled);
}

#[tokio::test]
async fn responses_text_tool_call_resume_and_cut() {
    let server = MockServer::start(|_| responses_text("ok")).await;
    server.push(responses_function_call(
        "call_1",
        "get_weather",
        "{\"city\":\"Paris\"}",
    ));
    let c = Client::new(&server, HarnessFrontend::OpenaiResponses);
    let (r1, _) = c.turn(None, "weather?").await;
    assert!(r1.result.success, "{:?}", r1.result);
    assert_eq!(r1.result.tool_calls[0].name, "get_weather");
    assert_eq!(r1.result.tool_calls[0].input, json!({"city": "Paris"}));
    let p = &server.posts()[0];
    assert_eq!(p.path, "/v1/responses");
    assert_eq!(p.header("authorization"), Some("Bearer sk-test"));
    assert_eq!(p.json()["store"], false);
    let key = r1.continuation.unwrap().key.unwrap();
    let (r2, _) = c.after_tool(&key, "call_1", "sunny", "thanks").await;
    assert_eq!(r2.result.final_output.as_deref(), Some("ok"));
    assert_eq!(r2.result.usage.unwrap().input_tokens, 13);
    let input = server.posts()[1].json()["input"].clone();
    assert_eq!(input[0]["content"][0]["text"], "weather?");
    assert_eq!(input[1]["type"], "function_call");
    assert_eq!(input[1]["call_id"], "call_1");
    assert_eq!(input[2]["type"], "function_call_output");
    assert_eq!(input[3]["content"][0]["text"], "thanks");

    server.push(cut(responses_text("partial"), 5));
    let (r3, events) = c.turn(None, "x").await;
    assert!(!r3.result.success);
    assert!(error_event(&events).unwrap().1.contains("ended before"));
    server.push(openai_error(400, "Unsupported parameter: 'foo'"));
    let (r4, events) = c.turn(None, "x").await;
    assert!(!r4.result.success);
    assert!(error_event(&events)
        .unwrap()
        .1
        .contains("Unsupported parameter"));
}

#[tokio::test]
async fn chat_completions_text_tool_calls_resume_and_errors() {
    let server = MockServer::start(|_| chat_text("plain answer")).await;
    server.push(chat_tool_call("call_9", "search", "{\"q\":\"rust sse\"}"));
    let c = Client::new(&server, HarnessFrontend::OpenaiChat);
    let mut req = c.request(None, "find");
    req.options.system_prompt = Some("sys".into());
    let (r1, _) = c.run(&req).await;
    assert_eq!(r1.result.tool_calls[0].input, json!({"q": "rust sse"}));
    assert_eq!(r1.result.stop_reason.as_deref(), Some("tool_calls"));
    let body = server.posts()[0].json();
    assert_eq!(body["messages"][0]["role"], "system");
    assert_eq!(body["stream_options"]["include_usage"], true);
    let key = r1.continuation.unwrap().key.unwrap();
    let (r2, _) = c.after_tool(&key, "call_9", "found", "next").await;
    assert_eq!(r2.result.final_output.as_deref(), Some("plain answer"));
    assert_eq!(r2.result.usage.unwrap().output_tokens, 4);
    let msgs = server.posts()[1].json()["messages"].clone();
    assert_eq!(msgs[0]["role"], "user");
    assert_eq!(msgs[1]["tool_calls"][0]["id"], "call_9");
    assert_eq!(msgs[2]["role"], "tool");
    assert_eq!(msgs[3]["content"], "next");

    server.push(openai_error(400, "model not found"));
    let (r3, _) = c.turn(None, "x").await;
    assert!(r3.result.error.unwrap().message.contains("model not found"));
    server.push(too_many("0"));
    let (r4, _) = c.turn(None, "x").await;
    assert!(r4.result.success);
    server.push(cut(chat_text("a b c d"), 3));
    let (r5, _) = c.turn(None, "x").await;
    assert!(!r5.result.success);
}

#[tokio::test]
async fn api_keys_are_refused_across_providers_and_frontends() {
    let server = MockServer::start(|_| chat_text("x")).await;
    let c = Client::new(&server, HarnessFrontend::OpenaiChat);
    // Provider mismatch: an anthropic continuation on an openai frontend.
    let mut req = c.request(None, "x");
    req.continuation = Some(HarnessContinuationRef {
        provider: metash_protocol::ProviderDomain::Anthropic,
        key: Some("k".into()),
    });
    let err =
        c.h.run_turn_non_interactive(&req, &CancellationToken::new(), &mut |_| {})
            .await
            .unwrap_err();
    assert_eq!(err.code(), HarnessErrorCode::ProviderMismatch);
    // An unknown key never silently starts fresh.
    let req = c.request(Some("0000-unknown"), "x");
    let err =
        c.h.run_turn_non_interactive(&req, &CancellationToken::new(), &mut |_| {})
            .await
            .unwrap_err();
    assert_eq!(err.code(), HarnessErrorCode::ContinuationNotFound);
    assert_eq!(server.count(), 0, "no request was sent");
}

/// Seed 003's `attachments`: a text file and a PNG reach each API wire in its own shape (text
/// wrapped with its path, the image base64 as the provider takes it), before the prompt; a file
/// that is neither is refused naming it, and no request is made.
#[tokio::test]
async fn attachments_reach_each_wire_and_bad_ones_are_refused_before_any_request() {
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
    for (frontend, reply) in [
        (HarnessFrontend::AnthropicApi, anthropic_text("seen")),
        (HarnessFrontend::OpenaiResponses, responses_text("seen")),
        (HarnessFrontend::OpenaiChat, chat_text("seen")),
    ] {
        let server = MockServer::start(move |_| reply.clone()).await;
        let c = Client::new(&server, frontend);
        std::fs::write(c.asp().join("notes.md"), "remember the milk").unwrap();
        std::fs::write(c.asp().join("shot.png"), PNG).unwrap();
        let mut req = c.request(None, "what do you see?");
        req.attachments = vec!["notes.md".into(), "shot.png".into()];
        let (r, _) = c.run(&req).await;
        assert!(r.result.success, "{frontend:?}: {:?}", r.result);
        let body = server.posts()[0].json();
        let (parts, text_key, image) = match frontend {
            HarnessFrontend::AnthropicApi => (
                body["messages"][0]["content"].clone(),
                "text",
                body["messages"][0]["content"][1]["source"]["data"].clone(),
            ),
            HarnessFrontend::OpenaiResponses => (
                body["input"][0]["content"].clone(),
                "text",
                body["input"][0]["content"][1]["image_url"].clone(),
            ),
            _ => (
                body["messages"][0]["content"].clone(),
                "text",
                body["messages"][0]["content"][1]["image_url"]["url"].clone(),
            ),
        };
        assert_eq!(
            parts[0][text_key], "<attachment path=\"notes.md\">\nremember the milk\n</attachment>",
            "{frontend:?}: {body}"
        );
        assert!(
            image.as_str().is_some_and(|d| d.contains("iVBORw0KGgo")),
            "{frontend:?}: {body}"
        );
        assert_eq!(parts[2][text_key], "what do you see?", "{frontend:?}");

        std::fs::write(c.asp().join("blob.bin"), [0xff, 0xfe, 0x00]).unwrap();
        req.attachments = vec!["blob.bin".into()];
        let err =
            c.h.run_turn_non_interactive(&req, &CancellationToken::new(), &mut |_| {})
                .await
                .expect_err("refused");
        assert_eq!(err.code(), HarnessErrorCode::InvalidRequest);
        assert!(err.to_string().contains("blob.bin"), "{err}");
        assert_eq!(server.posts().len(), 1, "{frontend:?}: a request was made");
    }
}
