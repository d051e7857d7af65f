//! OpenAI-compatible chat completions, streamed (`data: {choices:[{delta}]}` … `data: [DONE]`), as
//! served by Ollama, vLLM and llama.cpp: content deltas, tool call deltas by index, finish reason,
//! and the usage chunk `stream_options.include_usage` asks for.

use crate::attachments::Attachment;
use metash_protocol::{HarnessEvent, ToolCall, Usage};
use serde_json::{json, Value};

use super::http::Flow;
use super::openai::bearer;
use super::sse::SseEvent;
use super::{parse_json, ApiCall, ApiOutput, Collector, ToolResultInput};
use crate::error::{HarnessError, Result};

pub const DEFAULT_BASE_URL: &str = "http://127.0.0.1:11434/v1";
pub const DEFAULT_KEY_ENV: &str = "OPENAI_API_KEY";

pub fn user_messages(
    prompt: &str,
    tool_results: &[ToolResultInput],
    files: &[Attachment],
) -> Vec<Value> {
    let mut msgs: Vec<Value> = tool_results
        .iter()
        .map(|r| json!({"role": "tool", "tool_call_id": r.id, "content": r.output}))
        .collect();
    if files.is_empty() {
        msgs.push(json!({"role": "user", "content": prompt}));
    } else {
        let mut parts: Vec<Value> = files.iter().map(Attachment::chat_part).collect();
        parts.push(json!({"type": "text", "text": prompt}));
        msgs.push(json!({"role": "user", "content": parts}));
    }
    msgs
}

pub fn request_body(call: &ApiCall<'_>) -> Value {
    let mut messages = Vec::with_capacity(call.messages.len() + 1);
    if let Some(s) = call.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    messages.extend(call.messages.iter().cloned());
    let mut body = json!({
        "model": call.model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(n) = call.max_tokens {
        body["max_tokens"] = json!(n);
    }
    if !call.tools.is_empty() {
        body["tools"] = call
            .tools
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}}))
            .collect();
    }
    body
}

#[derive(serde::Deserialize)]
struct FastChunk<'a> {
    #[serde(borrow, default)]
    choices: Vec<FastChoice<'a>>,
    #[serde(default)]
    usage: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct FastChoice<'a> {
    #[serde(borrow)]
    delta: FastChoiceDelta<'a>,
    #[serde(default)]
    finish_reason: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct FastChoiceDelta<'a> {
    #[serde(borrow, default)]
    content: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
}

#[derive(Default, Clone)]
struct PartialCall {
    id: String,
    name: String,
    args: String,
}

/// What one chat-completions stream has said so far.
#[derive(Default)]
pub(crate) struct Collect {
    out: ApiOutput,
    calls: Vec<PartialCall>,
}

/// An `error` object in the stream is an `Api` error.
impl Collector for Collect {
    const PATH: &'static str = "chat/completions";

    fn request(call: &ApiCall<'_>) -> Result<(reqwest::header::HeaderMap, Value)> {
        Ok((bearer(call.api_key)?, request_body(call)))
    }

    fn event(&mut self, ev: &SseEvent, emit: &dyn Fn(HarnessEvent)) -> Result<Flow> {
        if ev.data.trim() == "[DONE]" {
            return Ok(Flow::Done);
        }
        if self.fast_text(&ev.data, emit) {
            return Ok(Flow::Continue);
        }
        let v = parse_json(&ev.data)?;
        if let Some(e) = v.get("error") {
            return Err(HarnessError::Api {
                status: None,
                message: e["message"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| e.to_string()),
            });
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.out.usage = Some(Usage {
                input_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
                output_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
                cache_read_tokens: u["prompt_tokens_details"]["cached_tokens"].as_u64(),
                cache_creation_tokens: None,
            });
        }
        for choice in v["choices"].as_array().into_iter().flatten() {
            let d = &choice["delta"];
            if let Some(t) = d["content"].as_str() {
                self.text(t, emit);
            }
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                self.tool_call_delta(tc);
            }
            if let Some(r) = choice["finish_reason"].as_str() {
                self.out.stop_reason = Some(r.to_string());
            }
        }
        Ok(Flow::Continue)
    }

    /// The tool calls, complete; the assistant message for the transcript.
    fn finish(mut self, emit: &dyn Fn(HarnessEvent)) -> Result<ApiOutput> {
        let mut assistant = json!({"role": "assistant", "content": self.out.text});
        if !self.calls.is_empty() {
            let mut tool_calls = Vec::new();
            for c in std::mem::take(&mut self.calls) {
                let input =
                    serde_json::from_str(&c.args).unwrap_or_else(|_| json!({ "raw": c.args }));
                let call = ToolCall {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    input,
                };
                emit(HarnessEvent::ToolCall { call: call.clone() });
                self.out.tool_calls.push(call);
                tool_calls.push(json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.args}}));
            }
            assistant["tool_calls"] = json!(tool_calls);
        }
        self.out.transcript_items = vec![assistant];
        Ok(self.out)
    }
}

impl Collect {
    /// Hot path: a chunk carrying only a content delta, decoded without a `Value` tree. False
    /// when the chunk is anything else.
    fn fast_text(&mut self, data: &str, emit: &dyn Fn(HarnessEvent)) -> bool {
        let Ok(c) = serde_json::from_str::<FastChunk<'_>>(data) else {
            return false;
        };
        let [choice] = c.choices.as_slice() else {
            return false;
        };
        match (
            &choice.delta.content,
            &choice.delta.tool_calls,
            &choice.finish_reason,
        ) {
            (Some(t), None, None) if c.usage.is_none() => {
                self.text(t, emit);
                true
            }
            _ => false,
        }
    }

    fn text(&mut self, t: &str, emit: &dyn Fn(HarnessEvent)) {
        if !t.is_empty() {
            self.out.text.push_str(t);
            emit(HarnessEvent::TextDelta {
                text: t.to_string(),
            });
        }
    }

    /// A piece of a streamed tool call: its id, name and arguments arrive in fragments.
    fn tool_call_delta(&mut self, tc: &Value) {
        let idx = tc["index"].as_u64().unwrap_or(self.calls.len() as u64) as usize;
        if self.calls.len() <= idx {
            self.calls.resize(idx + 1, PartialCall::default());
        }
        let c = &mut self.calls[idx];
        if let Some(id) = tc["id"].as_str() {
            c.id = id.to_string();
        }
        if let Some(n) = tc["function"]["name"].as_str() {
            c.name.push_str(n);
        }
        if let Some(a) = tc["function"]["arguments"].as_str() {
            c.args.push_str(a);
        }
    }
}
