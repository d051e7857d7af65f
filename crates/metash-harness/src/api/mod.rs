//! metash's own streaming clients for model APIs: for roles that need text and tool calls but no
//! coding CLI. Each client turns one prompt (plus the persisted transcript) into one streamed
//! response; the turn layer persists the transcript so the continuation key resumes it.

pub mod anthropic;
pub mod chat;
pub(crate) mod http;
pub mod openai;
pub mod sse;
pub mod transcript;

use std::time::Duration;

use metash_protocol::{HarnessEvent, ToolCall, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use http::RetryPolicy;

use crate::error::Result;

/// A tool the model may call (the caller executes it and sends the result next turn).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the input object.
    #[serde(default = "empty_object_schema")]
    pub input_schema: Value,
}

fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// The result of a tool call from the previous turn, sent before this turn's prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResultInput {
    pub id: String,
    pub output: String,
    #[serde(default)]
    pub is_error: bool,
}

/// Everything a client needs for one request.
#[derive(Debug, Clone)]
pub struct ApiCall<'a> {
    pub base_url: &'a str,
    pub api_key: Option<&'a str>,
    pub model: &'a str,
    pub system: Option<&'a str>,
    pub max_tokens: Option<u32>,
    pub tools: &'a [ToolSpec],
    /// Provider-native messages/items so far, including this turn's user input.
    pub messages: &'a [Value],
    pub idle_timeout: Duration,
}

/// What a client collected from one streamed response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApiOutput {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Option<Usage>,
    pub stop_reason: Option<String>,
    /// Provider-native items to append to the transcript.
    pub transcript_items: Vec<Value>,
}

/// What clients report while streaming.
pub(crate) type OnEvent<'a> = &'a mut (dyn FnMut(HarnessEvent) + Send);

/// The caller's callback, shared by the retry and the event closures of one request (both emit).
pub(crate) struct Emitter<'a>(std::sync::Mutex<OnEvent<'a>>);

impl<'a> Emitter<'a> {
    pub(crate) fn new(on: OnEvent<'a>) -> Self {
        Self(std::sync::Mutex::new(on))
    }

    pub(crate) fn emit(&self, e: HarnessEvent) {
        if let Ok(mut f) = self.0.lock() {
            f(e);
        }
    }

    /// `post_sse`'s retry callback: each retry is a `Retry` event.
    pub(crate) fn retry(&self, attempt: u32, delay: std::time::Duration, status: Option<u16>) {
        self.emit(HarnessEvent::Retry {
            attempt,
            delay_ms: delay.as_millis() as u64,
            status,
        });
    }
}

fn join_url(base: &str, path: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}

/// One client's way with one streamed response: where it goes, how it authenticates, its body,
/// then each SSE event in and the output at the end. A new API client is one impl of this.
pub(crate) trait Collector: Default + Send {
    /// The endpoint below the base URL.
    const PATH: &'static str;
    /// The request's headers (the key among them when there is one) and its body.
    ///
    /// # Errors
    /// A key that cannot be a header value.
    fn request(call: &ApiCall<'_>) -> Result<(reqwest::header::HeaderMap, Value)>;
    /// One event; `Done` at the response's end.
    fn event(&mut self, ev: &sse::SseEvent, emit: &dyn Fn(HarnessEvent)) -> Result<http::Flow>;
    /// What the response said, once it is complete.
    fn finish(self, emit: &dyn Fn(HarnessEvent)) -> Result<ApiOutput>;
}

/// Streams one response of client `C`: POSTs its body and reads the stream; retries and events
/// go to `on`.
///
/// # Errors
/// As [`http::post_sse`], and whatever the client finds wrong in the stream.
pub(crate) async fn stream<C: Collector>(
    client: &reqwest::Client,
    call: &ApiCall<'_>,
    limits: &http::StreamLimits<'_>,
    on: OnEvent<'_>,
) -> Result<ApiOutput> {
    let url = join_url(call.base_url, C::PATH);
    let emitter = Emitter::new(on);
    let emit = |e: HarnessEvent| emitter.emit(e);
    let (headers, body) = C::request(call)?;
    let mut c = C::default();
    http::post_sse(
        client,
        &url,
        headers,
        &body,
        limits,
        &mut |attempt, delay, status| emitter.retry(attempt, delay, status),
        &mut |ev| c.event(&ev, &emit),
    )
    .await?;
    c.finish(&emit)
}

/// An API key as a header value; a key with bytes a header cannot hold is refused.
fn key_header(value: &str) -> Result<reqwest::header::HeaderValue> {
    reqwest::header::HeaderValue::from_str(value).map_err(|_| {
        crate::error::HarnessError::InvalidRequest("API key is not a valid header".into())
    })
}

/// An error the provider reported inside the stream: `code: message`.
fn stream_error(code: &str, message: &str) -> crate::error::HarnessError {
    crate::error::HarnessError::Api {
        status: None,
        message: format!("{code}: {message}"),
    }
}

/// An event's type: the JSON's own `type` field, else the SSE `event:` name.
fn event_kind<'a>(v: &'a Value, ev: &'a sse::SseEvent) -> &'a str {
    v.get("type")
        .and_then(Value::as_str)
        .unwrap_or(ev.event.as_str())
}

fn parse_json(data: &str) -> crate::error::Result<Value> {
    serde_json::from_str(data).map_err(|e| crate::error::HarnessError::Api {
        status: None,
        message: format!(
            "unparseable stream event ({e}): {}",
            data.chars().take(200).collect::<String>()
        ),
    })
}
