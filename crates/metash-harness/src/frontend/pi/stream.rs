//! `pi-sdk`: pi's JSON mode. The first line is the session header (`{"type":"session","id"}`,
//! the key); then agent/turn/message events; an assistant message with `stopReason: "error"`
//! carries the provider's error.

use metash_protocol::{HarnessErrorCode, HarnessEvent, RunError, RunResult, ToolCall, Usage};
use serde_json::Value;

use crate::events::Emitter;
use crate::frontend::process::{exited_early, turn_result};
use crate::frontend::TurnParser;
use crate::runner::PipedOutcome;

#[derive(Default)]
pub(super) struct PiParser {
    ended: bool,
    failure: Option<RunError>,
    last_text: Option<String>,
    stop_reason: Option<String>,
    usage: Option<Usage>,
}

impl TurnParser for PiParser {
    fn finish(mut self: Box<Self>, outcome: &PipedOutcome) -> RunResult {
        let error = self.failure.take().or_else(|| {
            (!self.ended || !outcome.status.success()).then(|| exited_early("pi", outcome, ""))
        });
        turn_result(self.last_text, self.stop_reason, self.usage, error)
    }

    fn line(&mut self, v: &Value, em: &mut Emitter<'_>) {
        match v["type"].as_str().unwrap_or("") {
            "session" => {
                if let Some(id) = v["id"].as_str() {
                    em.observe_key(id);
                }
            }
            "message_update" => {
                let e = &v["assistantMessageEvent"];
                if e["type"] == "text_delta" {
                    em.emit(HarnessEvent::TextDelta {
                        text: e["delta"].as_str().unwrap_or("").into(),
                    });
                }
            }
            "message_end" => {
                let msg = &v["message"];
                if msg["role"] != "assistant" {
                    return;
                }
                let text: String = msg["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|c| c["type"] == "text")
                    .filter_map(|c| c["text"].as_str())
                    .collect();
                if !text.is_empty() {
                    self.last_text = Some(text.clone());
                    em.emit(HarnessEvent::Message {
                        role: "assistant".into(),
                        text,
                    });
                }
                self.stop_reason = msg["stopReason"].as_str().map(str::to_string);
                let u = &msg["usage"];
                if u.is_object() {
                    let prev = self.usage.take().unwrap_or_default();
                    self.usage = Some(Usage {
                        input_tokens: prev.input_tokens + u["input"].as_u64().unwrap_or(0),
                        output_tokens: prev.output_tokens + u["output"].as_u64().unwrap_or(0),
                        cache_read_tokens: u["cacheRead"].as_u64(),
                        cache_creation_tokens: u["cacheWrite"].as_u64(),
                    });
                }
                if matches!(self.stop_reason.as_deref(), Some("error") | Some("aborted")) {
                    self.failure = Some(RunError {
                        code: HarnessErrorCode::ApiError,
                        message: msg["errorMessage"]
                            .as_str()
                            .unwrap_or("pi: request failed")
                            .into(),
                        status: None,
                    });
                }
            }
            "tool_execution_start" => em.emit(HarnessEvent::ToolCall {
                call: ToolCall {
                    id: v["toolCallId"].as_str().unwrap_or("").into(),
                    name: v["toolName"].as_str().unwrap_or("").into(),
                    input: v["args"].clone(),
                },
            }),
            "tool_execution_end" => em.emit(HarnessEvent::ToolResult {
                id: v["toolCallId"].as_str().unwrap_or("").into(),
                output: tool_output(&v["result"]),
                is_error: v["isError"].as_bool().unwrap_or(false),
            }),
            "agent_end" => self.ended = true,
            _ => {}
        }
    }
}

/// A pi tool result as text: its `content` parts' text joined (what the model reads), the raw
/// JSON only when it has no such parts.
fn tool_output(result: &Value) -> String {
    match result {
        Value::String(s) => s.clone(),
        other => match other["content"].as_array() {
            Some(parts) if parts.iter().any(|p| p["text"].is_string()) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            _ => other.to_string(),
        },
    }
}
