//! The OpenAI Responses API, streamed: `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.output_text.delta`, `response.function_call_arguments.delta`
//! / `.done`, `response.output_item.done`, `response.completed` (usage), `response.incomplete`,
//! `response.failed` and `error`. Requests use `store: false` and carry the whole transcript, so a
//! continuation never depends on state kept at the provider.

use crate::attachments::Attachment;
use metash_protocol::{HarnessEvent, ToolCall, Usage};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

use super::http::Flow;
use super::sse::SseEvent;
use super::{
    event_kind, key_header, parse_json, stream_error, ApiCall, ApiOutput, Collector,
    ToolResultInput,
};
use crate::error::Result;

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
pub const DEFAULT_KEY_ENV: &str = "OPENAI_API_KEY";

/// This turn's input items: tool outputs first, then the user message.
pub fn user_items(
    prompt: &str,
    tool_results: &[ToolResultInput],
    files: &[Attachment],
) -> Vec<Value> {
    let mut items: Vec<Value> = tool_results
        .iter()
        .map(|r| json!({"type": "function_call_output", "call_id": r.id, "output": r.output}))
        .collect();
    let mut content: Vec<Value> = files.iter().map(Attachment::responses_part).collect();
    content.push(json!({"type": "input_text", "text": prompt}));
    items.push(json!({"type": "message", "role": "user", "content": content}));
    items
}

pub fn request_body(call: &ApiCall<'_>) -> Value {
    let mut body = json!({
        "model": call.model,
        "input": call.messages,
        "stream": true,
        "store": false,
    });
    if let Some(s) = call.system {
        body["instructions"] = json!(s);
    }
    if let Some(n) = call.max_tokens {
        body["max_output_tokens"] = json!(n);
    }
    if !call.tools.is_empty() {
        body["tools"] = call
            .tools
            .iter()
            .map(|t| json!({"type": "function", "name": t.name, "description": t.description, "parameters": t.input_schema}))
            .collect();
    }
    body
}

/// The hot event of a long answer, decoded without a `Value` tree.
#[derive(serde::Deserialize)]
struct FastTextDelta<'a> {
    #[serde(borrow)]
    delta: std::borrow::Cow<'a, str>,
}

pub(crate) fn bearer(key: Option<&str>) -> Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    if let Some(k) = key {
        headers.insert("authorization", key_header(&format!("Bearer {k}"))?);
    }
    Ok(headers)
}

/// What one Responses stream has said so far.
#[derive(Default)]
pub(crate) struct Collect {
    out: ApiOutput,
    items: Vec<Value>,
}

/// `response.failed` and an `error` event are `Api` errors.
impl Collector for Collect {
    const PATH: &'static str = "responses";

    fn request(call: &ApiCall<'_>) -> Result<(HeaderMap, Value)> {
        Ok((bearer(call.api_key)?, request_body(call)))
    }

    fn event(&mut self, ev: &SseEvent, emit: &dyn Fn(HarnessEvent)) -> Result<Flow> {
        if ev.event == "response.output_text.delta" {
            // Hot path: decode into a borrowed struct instead of a `Value` tree.
            if let Ok(d) = serde_json::from_str::<FastTextDelta<'_>>(&ev.data) {
                emit(HarnessEvent::TextDelta {
                    text: d.delta.into_owned(),
                });
                return Ok(Flow::Continue);
            }
        }
        let v = parse_json(&ev.data)?;
        let kind = event_kind(&v, ev);
        match kind {
            "response.output_text.delta" => {
                let t = v["delta"].as_str().unwrap_or("");
                emit(HarnessEvent::TextDelta {
                    text: t.to_string(),
                });
            }
            "response.output_item.done" => self.items.push(v["item"].clone()),
            "response.completed" | "response.incomplete" => {
                self.completed(kind, &v["response"]);
                return Ok(Flow::Done);
            }
            "response.failed" => {
                let e = &v["response"]["error"];
                return Err(stream_error(
                    e["code"].as_str().unwrap_or("failed"),
                    e["message"].as_str().unwrap_or("the response failed"),
                ));
            }
            "error" => {
                let e = v.get("error").unwrap_or(&v);
                return Err(stream_error(
                    e["code"].as_str().or(e["type"].as_str()).unwrap_or("error"),
                    e["message"].as_str().unwrap_or("stream error"),
                ));
            }
            _ => {}
        }
        Ok(Flow::Continue)
    }

    /// The answer's text and tool calls from the items; the replayable items for the transcript.
    fn finish(mut self, emit: &dyn Fn(HarnessEvent)) -> Result<ApiOutput> {
        for item in &self.items {
            match item["type"].as_str() {
                Some("message") => {
                    for part in item["content"].as_array().into_iter().flatten() {
                        if part["type"] == "output_text" {
                            self.out.text.push_str(part["text"].as_str().unwrap_or(""));
                        }
                    }
                }
                Some("function_call") => {
                    let args = item["arguments"].as_str().unwrap_or("{}");
                    let input =
                        serde_json::from_str(args).unwrap_or_else(|_| json!({ "raw": args }));
                    let call = ToolCall {
                        id: item["call_id"].as_str().unwrap_or("").to_string(),
                        name: item["name"].as_str().unwrap_or("").to_string(),
                        input,
                    };
                    emit(HarnessEvent::ToolCall { call: call.clone() });
                    self.out.tool_calls.push(call);
                }
                _ => {}
            }
        }
        // Reasoning items without `store` cannot be replayed; keep messages and calls.
        self.out.transcript_items = self
            .items
            .into_iter()
            .filter(|i| matches!(i["type"].as_str(), Some("message") | Some("function_call")))
            .map(|mut i| {
                if let Some(o) = i.as_object_mut() {
                    o.remove("id");
                    o.remove("status");
                }
                i
            })
            .collect();
        Ok(self.out)
    }
}

impl Collect {
    /// The final response: usage, why it stopped, and its items if no `.done` events listed them.
    fn completed(&mut self, kind: &str, r: &Value) {
        let u = &r["usage"];
        self.out.usage = Some(Usage {
            input_tokens: u["input_tokens"].as_u64().unwrap_or(0),
            output_tokens: u["output_tokens"].as_u64().unwrap_or(0),
            cache_read_tokens: u["input_tokens_details"]["cached_tokens"].as_u64(),
            cache_creation_tokens: None,
        });
        self.out.stop_reason = Some(if kind == "response.completed" {
            "completed".to_string()
        } else {
            r["incomplete_details"]["reason"]
                .as_str()
                .unwrap_or("incomplete")
                .to_string()
        });
        // Items only listed in the final response (some servers send no .done events).
        if self.items.is_empty() {
            if let Some(arr) = r["output"].as_array() {
                self.items.extend(arr.iter().cloned());
            }
        }
    }
}
