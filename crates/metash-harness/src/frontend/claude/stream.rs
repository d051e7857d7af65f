//! `agent-sdk` (and `claude-code` run headless): Claude Code's stream-json output mapped to our
//! events. Lines: `system/init` (the key), `assistant` / `user` messages, `stream_event` partials,
//! and a final `result` whose `is_error` decides success (HARNESSES.md: `subtype` alone lies).

use std::path::Path;

use metash_protocol::{HarnessErrorCode, HarnessEvent, RunError, RunResult, ToolCall, Usage};
use serde_json::Value;

use super::invocation::{claude_project_dir, claude_session_file};
use crate::error::{HarnessError, Result};
use crate::events::Emitter;
use crate::frontend::process::exited_early;
use crate::frontend::TurnParser;
use crate::runner::PipedOutcome;

/// Claude resumes a session only from the cwd it was started in (HARNESSES.md); say so up front
/// instead of letting it fail or start fresh.
pub(super) fn check_resumable(config: &Path, cwd: &Path, key: &str) -> Result<()> {
    if claude_session_file(config, cwd, key).is_file() {
        return Ok(());
    }
    let projects = config.join("projects");
    let elsewhere = std::fs::read_dir(&projects).ok().and_then(|rd| {
        rd.flatten()
            .find(|d| d.path().join(format!("{key}.jsonl")).is_file())
            .map(|d| d.file_name().to_string_lossy().into_owned())
    });
    Err(HarnessError::ContinuationNotFound(match elsewhere {
        Some(dir) => format!(
            "Claude session {key} was started from another cwd (project {dir}, not {}); Claude resumes only from the same cwd",
            claude_project_dir(cwd)
        ),
        None => format!("no Claude session {key} under {}", projects.display()),
    }))
}

#[derive(Default)]
pub(super) struct ClaudeParser {
    result: Option<RunResult>,
    saw_result: bool,
    last_text: Option<String>,
}

impl TurnParser for ClaudeParser {
    fn finish(mut self: Box<Self>, outcome: &PipedOutcome) -> RunResult {
        let mut result = self.result.take().unwrap_or_default();
        if self.saw_result {
            return result;
        }
        result.success = false;
        result.error = Some(exited_early("claude", outcome, " before its result line"));
        result
    }

    fn line(&mut self, v: &Value, em: &mut Emitter<'_>) {
        if let Some(id) = v["session_id"].as_str() {
            em.observe_key(id);
        }
        match v["type"].as_str().unwrap_or("") {
            "assistant" => {
                for block in v["message"]["content"].as_array().into_iter().flatten() {
                    match block["type"].as_str() {
                        Some("text") => {
                            let text = block["text"].as_str().unwrap_or("").to_string();
                            self.last_text = Some(text.clone());
                            em.emit(HarnessEvent::Message {
                                role: "assistant".into(),
                                text,
                            });
                        }
                        Some("tool_use") => em.emit(HarnessEvent::ToolCall {
                            call: ToolCall {
                                id: block["id"].as_str().unwrap_or("").into(),
                                name: block["name"].as_str().unwrap_or("").into(),
                                input: block["input"].clone(),
                            },
                        }),
                        _ => {}
                    }
                }
            }
            "user" => {
                for block in v["message"]["content"].as_array().into_iter().flatten() {
                    if block["type"] == "tool_result" {
                        let output = match &block["content"] {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        };
                        em.emit(HarnessEvent::ToolResult {
                            id: block["tool_use_id"].as_str().unwrap_or("").into(),
                            output,
                            is_error: block["is_error"].as_bool().unwrap_or(false),
                        });
                    }
                }
            }
            "stream_event" => {
                let e = &v["event"];
                if e["type"] == "content_block_delta" && e["delta"]["type"] == "text_delta" {
                    em.emit(HarnessEvent::TextDelta {
                        text: e["delta"]["text"].as_str().unwrap_or("").into(),
                    });
                }
            }
            "result" => self.result(v),
            _ => {}
        }
    }
}

impl ClaudeParser {
    /// The final `result` line: success is `is_error == false` and `subtype == "success"` (the
    /// subtype alone lies), with usage and Claude's own cost figure.
    fn result(&mut self, v: &Value) {
        self.saw_result = true;
        let is_error = v["is_error"].as_bool().unwrap_or(false);
        let subtype = v["subtype"].as_str().unwrap_or("").to_string();
        let text = v["result"].as_str().map(str::to_string);
        let u = &v["usage"];
        let usage = u.is_object().then(|| Usage {
            input_tokens: u["input_tokens"].as_u64().unwrap_or(0),
            output_tokens: u["output_tokens"].as_u64().unwrap_or(0),
            cache_read_tokens: u["cache_read_input_tokens"].as_u64(),
            cache_creation_tokens: u["cache_creation_input_tokens"].as_u64(),
        });
        let error = (is_error || subtype != "success").then(|| {
            let status = v["api_error_status"]
                .as_u64()
                .and_then(|s| u16::try_from(s).ok());
            RunError {
                code: if status.is_some() {
                    HarnessErrorCode::ApiError
                } else {
                    HarnessErrorCode::HarnessFailed
                },
                message: text.clone().unwrap_or_else(|| format!("claude: {subtype}")),
                status,
            }
        });
        self.result = Some(RunResult {
            success: error.is_none(),
            final_output: text.or_else(|| self.last_text.clone()),
            tool_calls: Vec::new(),
            stop_reason: Some(subtype),
            usage,
            cost_usd: v["total_cost_usd"].as_f64(),
            error,
        });
    }
}
