//! The Anthropic Messages API, streamed: `message_start`, `content_block_start` (text, tool_use,
//! thinking), `content_block_delta` (`text_delta`, `input_json_delta`, `thinking_delta`,
//! `signature_delta`), `content_block_stop`, `message_delta` (stop reason, usage), `message_stop`,
//! `ping`, and in-stream `error`.

use crate::attachments::Attachment;
use metash_protocol::{HarnessEvent, ToolCall, Usage};
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{json, Value};

use super::http::Flow;
use super::sse::SseEvent;
use super::{
    event_kind, key_header, parse_json, stream_error, ApiCall, ApiOutput, Collector,
    ToolResultInput,
};
use crate::error::{HarnessError, Result};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_KEY_ENV: &str = "ANTHROPIC_API_KEY";
const DEFAULT_MAX_TOKENS: u32 = 4096;

/// This turn's user message: tool results first (the API requires them right after the
/// assistant's tool_use), then the prompt.
pub fn user_message(prompt: &str, tool_results: &[ToolResultInput], files: &[Attachment]) -> Value {
    let mut content: Vec<Value> = tool_results
        .iter()
        .map(|r| json!({"type": "tool_result", "tool_use_id": r.id, "content": r.output, "is_error": r.is_error}))
        .collect();
    content.extend(files.iter().map(Attachment::anthropic_block));
    content.push(json!({"type": "text", "text": prompt}));
    json!({"role": "user", "content": content})
}

pub fn request_body(call: &ApiCall<'_>) -> Value {
    let mut body = json!({
        "model": call.model,
        "max_tokens": call.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "messages": call.messages,
        "stream": true,
    });
    if let Some(s) = call.system {
        body["system"] = json!(s);
    }
    if !call.tools.is_empty() {
        body["tools"] = call
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
    }
    body
}

#[derive(serde::Deserialize)]
struct FastDelta<'a> {
    index: usize,
    #[serde(borrow)]
    delta: FastDeltaBody<'a>,
}

#[derive(serde::Deserialize)]
struct FastDeltaBody<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(borrow, default)]
    text: Option<std::borrow::Cow<'a, str>>,
}

#[derive(Default)]
struct Block {
    kind: String,
    text: String,
    id: String,
    name: String,
    json: String,
    raw: Value,
}

/// What one Messages stream has said so far: its content blocks, usage, stop reason.
#[derive(Default)]
pub(crate) struct Collect {
    out: ApiOutput,
    blocks: Vec<Block>,
    usage: Usage,
}

/// An in-stream `error` event (e.g. `overloaded_error`) is an `Api` error.
impl Collector for Collect {
    const PATH: &'static str = "v1/messages";

    fn request(call: &ApiCall<'_>) -> Result<(HeaderMap, Value)> {
        let mut headers = HeaderMap::new();
        headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        if let Some(k) = call.api_key {
            headers.insert("x-api-key", key_header(k)?);
        }
        Ok((headers, request_body(call)))
    }

    fn event(&mut self, ev: &SseEvent, emit: &dyn Fn(HarnessEvent)) -> Result<Flow> {
        // Hot path: text deltas are nearly every event of a long answer; decode them into a
        // borrowed struct instead of a `Value` tree.
        if ev.event == "content_block_delta" {
            if let Ok(d) = serde_json::from_str::<FastDelta<'_>>(&ev.data) {
                if d.delta.kind == "text_delta" {
                    if let (Some(b), Some(t)) = (self.blocks.get_mut(d.index), d.delta.text) {
                        b.text.push_str(&t);
                        emit(HarnessEvent::TextDelta {
                            text: t.into_owned(),
                        });
                        return Ok(Flow::Continue);
                    }
                }
            }
        }
        let v = parse_json(&ev.data)?;
        match event_kind(&v, ev) {
            "message_start" => {
                let u = &v["message"]["usage"];
                self.usage.input_tokens = u["input_tokens"].as_u64().unwrap_or(0);
                self.usage.output_tokens = u["output_tokens"].as_u64().unwrap_or(0);
                self.usage.cache_read_tokens = u["cache_read_input_tokens"].as_u64();
                self.usage.cache_creation_tokens = u["cache_creation_input_tokens"].as_u64();
            }
            "content_block_start" => self.block_start(&v),
            "content_block_delta" => self.block_delta(&v, emit),
            "message_delta" => {
                if let Some(r) = v["delta"]["stop_reason"].as_str() {
                    self.out.stop_reason = Some(r.to_string());
                }
                if let Some(n) = v["usage"]["output_tokens"].as_u64() {
                    self.usage.output_tokens = n;
                }
                if let Some(n) = v["usage"]["input_tokens"].as_u64() {
                    self.usage.input_tokens = n;
                }
            }
            "message_stop" => return Ok(Flow::Done),
            "error" => {
                let e = &v["error"];
                return Err(stream_error(
                    e["type"].as_str().unwrap_or("error"),
                    e["message"].as_str().unwrap_or("stream error"),
                ));
            }
            _ => {}
        }
        Ok(Flow::Continue)
    }

    /// The answer's text and tool calls from the blocks; the assistant turn for the transcript.
    fn finish(mut self, emit: &dyn Fn(HarnessEvent)) -> Result<ApiOutput> {
        let mut content = Vec::new();
        for b in std::mem::take(&mut self.blocks) {
            match b.kind.as_str() {
                "text" => {
                    self.out.text.push_str(&b.text);
                    content.push(json!({"type": "text", "text": b.text}));
                }
                "tool_use" => {
                    let input: Value = if b.json.trim().is_empty() {
                        b.raw.get("input").cloned().unwrap_or_else(|| json!({}))
                    } else {
                        serde_json::from_str(&b.json).map_err(|e| HarnessError::Api {
                            status: None,
                            message: format!("tool input of {} is not JSON: {e}", b.name),
                        })?
                    };
                    let call = ToolCall {
                        id: b.id.clone(),
                        name: b.name.clone(),
                        input: input.clone(),
                    };
                    emit(HarnessEvent::ToolCall { call: call.clone() });
                    self.out.tool_calls.push(call);
                    content.push(
                        json!({"type": "tool_use", "id": b.id, "name": b.name, "input": input}),
                    );
                }
                "thinking" => {
                    let mut raw = b.raw.clone();
                    raw["thinking"] = json!(b.text);
                    content.push(raw);
                }
                "" => {}
                _ => content.push(b.raw),
            }
        }
        self.out.usage = Some(self.usage);
        self.out.transcript_items = vec![json!({"role": "assistant", "content": content})];
        Ok(self.out)
    }
}

impl Collect {
    fn block_start(&mut self, v: &Value) {
        let cb = &v["content_block"];
        let idx = v["index"].as_u64().unwrap_or(self.blocks.len() as u64) as usize;
        if self.blocks.len() <= idx {
            self.blocks.resize_with(idx + 1, Block::default);
        }
        self.blocks[idx] = Block {
            kind: cb["type"].as_str().unwrap_or("").to_string(),
            text: cb["text"].as_str().unwrap_or("").to_string(),
            id: cb["id"].as_str().unwrap_or("").to_string(),
            name: cb["name"].as_str().unwrap_or("").to_string(),
            json: String::new(),
            raw: cb.clone(),
        };
    }

    fn block_delta(&mut self, v: &Value, emit: &dyn Fn(HarnessEvent)) {
        let idx = v["index"].as_u64().unwrap_or(0) as usize;
        let d = &v["delta"];
        let Some(b) = self.blocks.get_mut(idx) else {
            return;
        };
        match d["type"].as_str().unwrap_or("") {
            "text_delta" => {
                let t = d["text"].as_str().unwrap_or("");
                b.text.push_str(t);
                emit(HarnessEvent::TextDelta {
                    text: t.to_string(),
                });
            }
            "input_json_delta" => b.json.push_str(d["partial_json"].as_str().unwrap_or("")),
            "thinking_delta" => b.text.push_str(d["thinking"].as_str().unwrap_or("")),
            "signature_delta" => {
                b.raw["signature"] = d["signature"].clone();
            }
            _ => {}
        }
    }
}
