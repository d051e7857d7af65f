//! The API frontends' turn: load the transcript the key names (or start one), append this turn's
//! input, stream the response, and persist the transcript atomically only when the turn succeeded,
//! so a failed turn never leaves half a conversation behind.

use metash_protocol::{HarnessEvent, RunResult};
use serde_json::Value;
use tokio::time::Instant;

use super::{FrontendInfo, Turn};
use crate::api::http::StreamLimits;
use crate::api::transcript::{self, Transcript, TRANSCRIPT_VERSION};
use crate::api::{self, anthropic, chat, openai, ApiCall, ApiOutput, OnEvent, ToolResultInput};
use crate::attachments::Attachment;
use crate::error::{HarnessError, Result};
use crate::request::{env_value, RunTurnNonInteractiveRequest};

/// The wire protocol an API client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Responses.
    Responses,
    /// OpenAI-compatible chat completions.
    Chat,
}

impl Wire {
    /// This turn's input as the provider's native messages.
    fn user_input(
        self,
        prompt: &str,
        tool_results: &[ToolResultInput],
        files: &[Attachment],
    ) -> Vec<Value> {
        match self {
            Self::Anthropic => vec![anthropic::user_message(prompt, tool_results, files)],
            Self::Responses => openai::user_items(prompt, tool_results, files),
            Self::Chat => chat::user_messages(prompt, tool_results, files),
        }
    }

    async fn stream(
        self,
        http: &reqwest::Client,
        call: &ApiCall<'_>,
        limits: &StreamLimits<'_>,
        on: OnEvent<'_>,
    ) -> Result<ApiOutput> {
        match self {
            Self::Anthropic => api::stream::<anthropic::Collect>(http, call, limits, on).await,
            Self::Responses => api::stream::<openai::Collect>(http, call, limits, on).await,
            Self::Chat => api::stream::<chat::Collect>(http, call, limits, on).await,
        }
    }
}

/// Where the request goes and as which model: the endpoint's overrides, else the defaults.
struct Target {
    base_url: String,
    api_key: Option<String>,
    model: String,
}

fn target(info: &FrontendInfo, req: &RunTurnNonInteractiveRequest) -> Result<Target> {
    let ep = req.options.endpoint.as_ref();
    let base_url = ep
        .map(|e| e.base_url.clone())
        .unwrap_or_else(|| info.upstream.to_string());
    let key_env = ep
        .and_then(|e| e.api_key_env.clone())
        .unwrap_or_else(|| info.key_env.to_string());
    let model = req
        .model
        .clone()
        .or_else(|| info.default_model.map(str::to_string))
        .ok_or_else(|| {
            HarnessError::InvalidRequest(format!("{} needs a model", req.frontend.as_str()))
        })?;
    Ok(Target {
        api_key: env_value(&req.env, &Default::default(), &key_env),
        base_url,
        model,
    })
}

/// The transcript the key names, or a new one; and whether it was resumed.
fn open_transcript(req: &RunTurnNonInteractiveRequest, model: &str) -> Result<(Transcript, bool)> {
    Ok(
        match req.continuation.as_ref().and_then(|c| c.key.as_deref()) {
            Some(key) => (transcript::load(&req.asp_home, key, req.frontend)?, true),
            None => (
                Transcript {
                    version: TRANSCRIPT_VERSION,
                    key: uuid::Uuid::new_v4().to_string(),
                    frontend: req.frontend,
                    model: Some(model.to_string()),
                    messages: Vec::new(),
                },
                false,
            ),
        },
    )
}

fn system_prompt(req: &RunTurnNonInteractiveRequest) -> Option<String> {
    match (
        &req.options.system_prompt,
        &req.options.append_system_prompt,
    ) {
        (Some(a), Some(b)) => Some(format!("{a}\n\n{b}")),
        (Some(a), None) | (None, Some(a)) => Some(a.clone()),
        (None, None) => None,
    }
}

/// One turn of an API client.
pub(super) async fn run(info: &FrontendInfo, wire: Wire, turn: Turn<'_, '_>) -> Result<RunResult> {
    let Turn {
        http,
        retry,
        idle_timeout,
        req,
        timeout,
        cancel,
        em,
        ..
    } = turn;
    let Target {
        base_url,
        api_key,
        model,
    } = target(info, req)?;
    // Checked before the transcript is touched or a request made.
    let files = crate::attachments::load(&req.cwd, &req.attachments)?;
    let (mut t, resumed) = open_transcript(req, &model)?;
    em.emit(HarnessEvent::TurnStarted {
        frontend: req.frontend,
        model: Some(model.clone()),
    });
    if resumed {
        em.observe_key(&t.key);
    }
    t.messages
        .extend(wire.user_input(&req.prompt, &req.tool_results, &files));
    let system = system_prompt(req);
    let call = ApiCall {
        base_url: &base_url,
        api_key: api_key.as_deref(),
        model: &model,
        system: system.as_deref(),
        max_tokens: req.max_tokens,
        tools: &req.tools,
        messages: &t.messages,
        idle_timeout,
    };
    let limits = StreamLimits {
        deadline: timeout.map(|t| Instant::now() + t),
        idle: call.idle_timeout,
        cancel,
        retry,
    };
    let mut on = |e: HarnessEvent| em.emit(e);
    let out = match wire.stream(http, &call, &limits, &mut on).await {
        Ok(o) => o,
        Err(e) => {
            return Ok(RunResult {
                success: false,
                error: Some(e.run_error()),
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
