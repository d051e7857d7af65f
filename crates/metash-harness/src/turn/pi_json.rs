//! `pi-sdk`: pi's JSON mode. The first line is the session header (`{"type":"session","id"}`,
//! the key); then agent/turn/message events; an assistant message with `stopReason: "error"`
//! carries the provider's error.

use std::time::Duration;

use metash_protocol::{HarnessErrorCode, HarnessEvent, RunError, RunResult, ToolCall, Usage};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{Harness, RunTurnNonInteractiveRequest};
use crate::error::Result;
use crate::events::Emitter;
use crate::invocation::{build_invocation, materialize};
use crate::runner::run_piped_confined;

pub(super) async fn run(
    h: &Harness,
    req: &RunTurnNonInteractiveRequest,
    timeout: Option<Duration>,
    cancel: &CancellationToken,
    em: &mut Emitter<'_>,
) -> Result<RunResult> {
    let inv = req.invocation_request();
    let m = materialize(&inv)?;
    // Resolves a resumed key to its session file (or refuses with continuation_not_found).
    let spec = build_invocation(&inv, &m, &h.programs)?.spec;
    em.emit(HarnessEvent::TurnStarted {
        frontend: req.frontend,
        model: req.model.clone(),
    });
    let mut p = PiParser::default();
    let outcome = run_piped_confined(&spec, req.confiner.get(), timeout, cancel, &mut |line| {
        p.line(line, em)
    })
    .await?;
    let error = p.failure.take().or_else(|| {
        (!p.ended || !outcome.status.success()).then(|| RunError {
            code: HarnessErrorCode::HarnessFailed,
            message: format!(
                "pi exited with {}: {}",
                outcome.status,
                outcome.stderr_tail.trim()
            ),
            status: None,
        })
    });
    Ok(RunResult {
        success: error.is_none(),
        final_output: p.last_text,
        tool_calls: Vec::new(),
        stop_reason: p.stop_reason,
        usage: p.usage,
        cost_usd: None,
        error,
    })
}

#[derive(Default)]
struct PiParser {
    ended: bool,
    failure: Option<RunError>,
    last_text: Option<String>,
    stop_reason: Option<String>,
    usage: Option<Usage>,
}

impl PiParser {
    fn line(&mut self, line: &str, em: &mut Emitter<'_>) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            return;
        };
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
