//! `codex-cli` run headless (`codex exec --json`): `thread.started` (the key), `item.*`
//! (`agent_message`, `command_execution`, a non-fatal `error` item), `turn.completed` with usage,
//! or `error` + `turn.failed`.

use std::path::Path;

use metash_protocol::{HarnessErrorCode, HarnessEvent, RunError, RunResult, ToolCall, Usage};
use serde_json::Value;

use super::invocation::codex_rollout_file;
use crate::error::{HarnessError, Result};
use crate::events::Emitter;
use crate::frontend::process::{exited_early, turn_result};
use crate::frontend::TurnParser;
use crate::runner::PipedOutcome;

/// Codex resumes a thread only when its rollout exists under this CODEX_HOME and was recorded
/// with the same provider (else `modelProviderNotConfigured` or a silent fresh start).
pub(super) fn check_resumable(codex_home: &Path, key: &str, provider: &str) -> Result<()> {
    let file = codex_rollout_file(codex_home, key).ok_or_else(|| {
        HarnessError::ContinuationNotFound(format!(
            "no Codex thread {key} under {}",
            codex_home.display()
        ))
    })?;
    let first = std::fs::read_to_string(&file)
        .ok()
        .and_then(|s| s.lines().next().map(str::to_string));
    let recorded = first
        .and_then(|l| serde_json::from_str::<Value>(&l).ok())
        .and_then(|v| v["payload"]["model_provider"].as_str().map(str::to_string));
    match recorded {
        Some(p) if p != provider => Err(HarnessError::ContinuationNotFound(format!(
            "Codex thread {key} was recorded with provider {p:?}; resuming needs that provider definition, not {provider:?}"
        ))),
        _ => Ok(()),
    }
}

#[derive(Default)]
pub(super) struct CodexParser {
    completed: bool,
    failure: Option<RunError>,
    last_message: Option<String>,
    usage: Option<Usage>,
}

impl TurnParser for CodexParser {
    fn finish(mut self: Box<Self>, outcome: &PipedOutcome) -> RunResult {
        // Codex reports stream reconnects as `error` events too; a turn that completed succeeded.
        let error = if self.completed {
            None
        } else {
            self.failure.take()
        };
        let error = error.or_else(|| {
            (!self.completed)
                .then(|| exited_early("codex", outcome, " without completing the turn"))
        });
        let stop = if self.completed {
            "completed"
        } else {
            "failed"
        };
        turn_result(self.last_message, Some(stop.into()), self.usage, error)
    }

    fn line(&mut self, v: &Value, em: &mut Emitter<'_>) {
        match v["type"].as_str().unwrap_or("") {
            "thread.started" => {
                if let Some(id) = v["thread_id"].as_str() {
                    em.observe_key(id);
                }
            }
            "item.started" => {
                let item = &v["item"];
                if item["type"] == "command_execution" {
                    em.emit(HarnessEvent::ToolCall {
                        call: ToolCall {
                            id: item["id"].as_str().unwrap_or("").into(),
                            name: "shell".into(),
                            input: serde_json::json!({ "command": item["command"] }),
                        },
                    });
                }
            }
            "item.completed" => {
                let item = &v["item"];
                match item["type"].as_str() {
                    Some("agent_message") => {
                        let text = item["text"].as_str().unwrap_or("").to_string();
                        self.last_message = Some(text.clone());
                        em.emit(HarnessEvent::Message {
                            role: "assistant".into(),
                            text,
                        });
                    }
                    Some("command_execution") => em.emit(HarnessEvent::ToolResult {
                        id: item["id"].as_str().unwrap_or("").into(),
                        output: item["aggregated_output"].as_str().unwrap_or("").into(),
                        is_error: item["exit_code"].as_i64().is_some_and(|c| c != 0),
                    }),
                    _ => {}
                }
            }
            "turn.completed" => {
                self.completed = true;
                let u = &v["usage"];
                self.usage = Some(Usage {
                    input_tokens: u["input_tokens"].as_u64().unwrap_or(0),
                    output_tokens: u["output_tokens"].as_u64().unwrap_or(0),
                    cache_read_tokens: u["cached_input_tokens"].as_u64(),
                    cache_creation_tokens: None,
                });
            }
            "error" | "turn.failed" => {
                let msg = v["message"]
                    .as_str()
                    .or(v["error"]["message"].as_str())
                    .unwrap_or("codex turn failed")
                    .to_string();
                if self.failure.is_none() {
                    self.failure = Some(RunError {
                        code: HarnessErrorCode::ApiError,
                        message: msg,
                        status: None,
                    });
                }
            }
            _ => {}
        }
    }
}
