//! `codex-cli` run headless (`codex exec --json`): `thread.started` (the key), `item.*`
//! (`agent_message`, `command_execution`, a non-fatal `error` item), `turn.completed` with usage,
//! or `error` + `turn.failed`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use metash_protocol::{HarnessErrorCode, HarnessEvent, RunError, RunResult, ToolCall, Usage};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{env_value, Harness, RunTurnNonInteractiveRequest};
use crate::error::{HarnessError, Result};
use crate::events::Emitter;
use crate::invocation::{build_invocation, codex_rollout_file, materialize};
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
        let codex_home = env_value(&req.env, &m.env, "CODEX_HOME")
            .map(PathBuf::from)
            .or_else(|| {
                env_value(&req.env, &m.env, "HOME").map(|h| PathBuf::from(h).join(".codex"))
            })
            .ok_or_else(|| {
                HarnessError::ContinuationNotFound("no CODEX_HOME to find threads in".into())
            })?;
        let expected = req
            .options
            .endpoint
            .as_ref()
            .map(|e| e.name().to_string())
            .unwrap_or_else(|| "openai".into());
        check_resumable(&codex_home, key, &expected)?;
    }
    let spec = build_invocation(&inv, &m, &h.programs)?.spec;
    em.emit(HarnessEvent::TurnStarted {
        frontend: req.frontend,
        model: req.model.clone(),
    });
    let mut p = CodexParser::default();
    let outcome = run_piped_confined(&spec, req.confiner.get(), timeout, cancel, &mut |line| {
        p.line(line, em)
    })
    .await?;
    // Codex reports stream reconnects as `error` events too; a turn that completed succeeded.
    let error = if p.completed { None } else { p.failure.take() };
    let error = error.or_else(|| {
        (!p.completed).then(|| RunError {
            code: HarnessErrorCode::HarnessFailed,
            message: format!(
                "codex exited with {} without completing the turn: {}",
                outcome.status,
                outcome.stderr_tail.trim()
            ),
            status: None,
        })
    });
    Ok(RunResult {
        success: error.is_none(),
        final_output: p.last_message,
        tool_calls: Vec::new(),
        stop_reason: Some(if p.completed { "completed" } else { "failed" }.into()),
        usage: p.usage,
        cost_usd: None,
        error,
    })
}

/// Codex resumes a thread only when its rollout exists under this CODEX_HOME and was recorded
/// with the same provider (else `modelProviderNotConfigured` or a silent fresh start).
fn check_resumable(codex_home: &Path, key: &str, provider: &str) -> Result<()> {
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
struct CodexParser {
    completed: bool,
    failure: Option<RunError>,
    last_message: Option<String>,
    usage: Option<Usage>,
}

impl CodexParser {
    fn line(&mut self, line: &str, em: &mut Emitter<'_>) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            return;
        };
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
