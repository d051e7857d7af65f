//! `agent-sdk` (and `claude-code` run headless): Claude Code's stream-json output mapped to our
//! events. Lines: `system/init` (the key), `assistant` / `user` messages, `stream_event` partials,
//! and a final `result` whose `is_error` decides success (HARNESSES.md: `subtype` alone lies).

use std::path::PathBuf;
use std::time::Duration;

use metash_protocol::{HarnessErrorCode, HarnessEvent, RunError, RunResult, ToolCall, Usage};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{env_value, Harness, RunTurnNonInteractiveRequest};
use crate::error::{HarnessError, Result};
use crate::events::Emitter;
use crate::invocation::{build_invocation, claude_project_dir, claude_session_file, materialize};
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
    if let Some(key) = req.key() {
        let config = env_value(&req.env, &m.env, "CLAUDE_CONFIG_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                env_value(&req.env, &m.env, "HOME").map(|h| PathBuf::from(h).join(".claude"))
            })
            .ok_or_else(|| {
                HarnessError::ContinuationNotFound("no HOME to find Claude's sessions in".into())
            })?;
        check_resumable(&config, &req.cwd, key)?;
    }
    let spec = build_invocation(&inv, &m, &h.programs)?.spec;
    em.emit(HarnessEvent::TurnStarted {
        frontend: req.frontend,
        model: req.model.clone(),
    });
    let mut parser = ClaudeParser::default();
    let outcome = run_piped_confined(&spec, req.confiner.get(), timeout, cancel, &mut |line| {
        parser.line(line, em)
    })
    .await?;
    let mut result = parser.result.take().unwrap_or_default();
    if parser.saw_result {
        return Ok(result);
    }
    result.success = false;
    result.error = Some(RunError {
        code: HarnessErrorCode::HarnessFailed,
        message: format!(
            "claude exited with {} before its result line: {}",
            outcome.status,
            outcome.stderr_tail.trim()
        ),
        status: None,
    });
    Ok(result)
}

/// Claude resumes a session only from the cwd it was started in (HARNESSES.md); say so up front
/// instead of letting it fail or start fresh.
fn check_resumable(config: &std::path::Path, cwd: &std::path::Path, key: &str) -> Result<()> {
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
pub(crate) struct ClaudeParser {
    pub(crate) result: Option<RunResult>,
    pub(crate) saw_result: bool,
    last_text: Option<String>,
}

impl ClaudeParser {
    pub(crate) fn line(&mut self, line: &str, em: &mut Emitter<'_>) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            return;
        };
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
            "result" => {
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
            _ => {}
        }
    }
}
