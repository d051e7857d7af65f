//! The API frontends' turn: load the transcript the key names (or start one), append this turn's
//! input, stream the response, and persist the transcript atomically only when the turn succeeded,
//! so a failed turn never leaves half a conversation behind.

use std::time::Duration;

use metash_protocol::{HarnessEvent, HarnessFrontend, RunResult};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{env_value, run_error, Harness, RunTurnNonInteractiveRequest};
use crate::api::http::StreamLimits;
use crate::api::transcript::{self, Transcript, TRANSCRIPT_VERSION};
use crate::api::{anthropic, chat, openai, ApiCall};
use crate::error::{HarnessError, Result};
use crate::events::Emitter;

fn defaults(
    frontend: HarnessFrontend,
) -> Result<(&'static str, &'static str, Option<&'static str>)> {
    Ok(match frontend {
        HarnessFrontend::AnthropicApi => (
            anthropic::DEFAULT_BASE_URL,
            anthropic::DEFAULT_KEY_ENV,
            Some("claude-sonnet-4-5"),
        ),
        HarnessFrontend::OpenaiResponses => (
            openai::DEFAULT_BASE_URL,
            openai::DEFAULT_KEY_ENV,
            Some("gpt-5.1"),
        ),
        HarnessFrontend::OpenaiChat => (chat::DEFAULT_BASE_URL, chat::DEFAULT_KEY_ENV, None),
        other => {
            return Err(HarnessError::UnsupportedFrontend(
                other.as_str().to_string(),
            ))
        }
    })
}

pub(super) async fn run(
    h: &Harness,
    req: &RunTurnNonInteractiveRequest,
    timeout: Option<Duration>,
    cancel: &CancellationToken,
    em: &mut Emitter<'_>,
) -> Result<RunResult> {
    let (default_base, default_key_env, default_model) = defaults(req.frontend)?;
    let ep = req.options.endpoint.as_ref();
    let base_url = ep
        .map(|e| e.base_url.clone())
        .unwrap_or_else(|| default_base.to_string());
    let key_env = ep
        .and_then(|e| e.api_key_env.clone())
        .unwrap_or_else(|| default_key_env.to_string());
    let api_key = env_value(&req.env, &Default::default(), &key_env);
    let model = req
        .model
        .clone()
        .or_else(|| default_model.map(str::to_string))
        .ok_or_else(|| {
            HarnessError::InvalidRequest(format!("{} needs a model", req.frontend.as_str()))
        })?;
    let (mut t, resumed) = match req.key() {
        Some(key) => (transcript::load(&req.asp_home, key, req.frontend)?, true),
        None => (
            Transcript {
                version: TRANSCRIPT_VERSION,
                key: uuid::Uuid::new_v4().to_string(),
                frontend: req.frontend,
                model: Some(model.clone()),
                messages: Vec::new(),
            },
            false,
        ),
    };
    em.emit(HarnessEvent::TurnStarted {
        frontend: req.frontend,
        model: Some(model.clone()),
    });
    if resumed {
        em.observe_key(&t.key);
    }
    match req.frontend {
        HarnessFrontend::AnthropicApi => t
            .messages
            .push(anthropic::user_message(&req.prompt, &req.tool_results)),
        HarnessFrontend::OpenaiResponses => t
            .messages
            .extend(openai::user_items(&req.prompt, &req.tool_results)),
        _ => t
            .messages
            .extend(chat::user_messages(&req.prompt, &req.tool_results)),
    }
    let system = match (
        &req.options.system_prompt,
        &req.options.append_system_prompt,
    ) {
        (Some(a), Some(b)) => Some(format!("{a}\n\n{b}")),
        (Some(a), None) | (None, Some(a)) => Some(a.clone()),
        (None, None) => None,
    };
    let call = ApiCall {
        base_url: &base_url,
        api_key: api_key.as_deref(),
        model: &model,
        system: system.as_deref(),
        max_tokens: req.max_tokens,
        tools: &req.tools,
        messages: &t.messages,
        idle_timeout: h.idle_timeout,
    };
    let limits = StreamLimits {
        deadline: timeout.map(|t| Instant::now() + t),
        idle: call.idle_timeout,
        cancel,
        retry: h.retry,
    };
    let mut on = |e: HarnessEvent| em.emit(e);
    let out = match req.frontend {
        HarnessFrontend::AnthropicApi => anthropic::stream(&h.http, &call, &limits, &mut on).await,
        HarnessFrontend::OpenaiResponses => openai::stream(&h.http, &call, &limits, &mut on).await,
        _ => chat::stream(&h.http, &call, &limits, &mut on).await,
    };
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            return Ok(RunResult {
                success: false,
                error: Some(run_error(&e)),
                ..RunResult::default()
            });
        }
    };
    if !out.text.is_empty() {
        em.emit(HarnessEvent::Message {
            role: "assistant".into(),
            text: out.text.clone(),
        });
    }
    t.messages.extend(out.transcript_items);
    t.model = Some(model);
    transcript::save(&req.asp_home, &t)?;
    em.observe_key(&t.key);
    Ok(RunResult {
        success: true,
        final_output: Some(out.text),
        tool_calls: out.tool_calls,
        stop_reason: out.stop_reason,
        usage: out.usage,
        cost_usd: None,
        error: None,
    })
}
