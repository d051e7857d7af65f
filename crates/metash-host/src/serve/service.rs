//! What both servers serve: each method takes its JSON parameters, validates them, calls the host
//! and returns JSON. Blocking on purpose: the transports decide which thread waits.

use std::sync::Arc;

use metash_protocol::LogLevel;
use serde::Serialize;
use serde_json::{json, Value};

use super::params::{
    decode, AgentParams, AnswerCheckpointParams, AnswerConsentParams, GetStateParams,
    LogProgressParams, ParamError, Params, SpawnAgentParams, UpdateStateParams,
};
use crate::{Host, HostError, SpawnRequest, Spawner};

/// Why a call failed: the caller's parameters, or the host refusing or failing.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("invalid params: {0}")]
    Params(#[from] ParamError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("internal error: {0}")]
    Internal(String),
}

/// The host as a set of JSON methods. `spawner` is usually the host itself; tests and embedders
/// may put another in front of it.
#[derive(Clone)]
pub struct Service {
    host: Arc<Host>,
    spawner: Arc<dyn Spawner>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("workspace", &self.host.workspace())
            .finish_non_exhaustive()
    }
}

type CallResult = Result<Value, CallError>;

impl Service {
    pub fn new(host: Arc<Host>, spawner: Arc<dyn Spawner>) -> Self {
        Self { host, spawner }
    }

    pub fn host(&self) -> &Arc<Host> {
        &self.host
    }

    /// seed 000's `spawn_agent`; the result is the `AgentResponse`. A failed, timed-out or
    /// checkpointed agent is a result, not an error.
    pub fn spawn_agent(&self, p: SpawnAgentParams) -> CallResult {
        let mut req = SpawnRequest::new(
            &p.agent_name,
            p.system_prompt.as_deref().unwrap_or(""),
            &p.user_message,
        );
        req.options = p.options.unwrap_or_default();
        to_json(&self.spawner.spawn_agent(&req)?)
    }

    /// `{revision}` of the session after the update.
    pub fn update_state(&self, p: UpdateStateParams) -> CallResult {
        let revision = self.host.update_state(None, &p.key, p.value)?;
        Ok(json!({ "revision": revision }))
    }

    /// The whole state, or the value at `key`.
    pub fn get_state(&self, p: GetStateParams) -> CallResult {
        Ok(self.host.get_state(p.key.as_deref().unwrap_or(""))?)
    }

    /// `{seq}` of the `progress` event in the log.
    pub fn log_progress(&self, p: LogProgressParams) -> CallResult {
        let seq = self
            .host
            .log_progress(&p.message, p.level.unwrap_or(LogLevel::Info))?;
        Ok(json!({ "seq": seq }))
    }

    /// The `ResumeData` the next spawn will receive.
    pub fn answer_checkpoint(&self, p: AnswerCheckpointParams) -> CallResult {
        to_json(
            &self
                .host
                .answer_checkpoint(p.checkpoint_id.as_deref(), &p.answer)?,
        )
    }

    /// Suspends or resumes a running agent: `{agent, want, applied: here|requested, changed?,
    /// seq?}` (`requested`: another process runs it and applies the request within 100 ms).
    pub fn control_agent(&self, p: AgentParams, want: crate::control::Want) -> CallResult {
        Ok(match self.host.control_agent(&p.agent, want)? {
            crate::control::Applied::Here { changed } => {
                json!({"agent": p.agent, "want": want.as_str(), "applied": "here", "changed": changed})
            }
            crate::control::Applied::Requested { seq } => {
                json!({"agent": p.agent, "want": want.as_str(), "applied": "requested", "seq": seq})
            }
        })
    }

    /// Answers a consent question waiting for any client: `{id, answer}`. Refused when another
    /// client answered first or the deadline passed (the message says which).
    pub fn answer_consent(&self, p: AnswerConsentParams) -> CallResult {
        crate::asks::reply(self.host.store(), &p.id, p.answer(), "json-rpc")?;
        Ok(json!({"id": p.id, "answer": p.answer}))
    }

    /// The consent questions waiting for any client, oldest first.
    pub fn pending_consent(&self) -> CallResult {
        to_json(&crate::asks::pending(self.host.store())?)
    }

    /// The pending checkpoint, or `null`.
    pub fn pending_checkpoint(&self) -> CallResult {
        to_json(&self.host.pending_checkpoint()?)
    }

    /// Dispatches a method by its JSON-RPC name with named parameters (an object). `None` when
    /// there is no such method.
    pub fn call(&self, method: &str, params: &Value) -> Option<CallResult> {
        Some(match method {
            "spawnAgent" => parse(params).and_then(|p| self.spawn_agent(p)),
            "updateState" => parse(params).and_then(|p| self.update_state(p)),
            "getState" => parse(params).and_then(|p| self.get_state(p)),
            "logProgress" => parse(params).and_then(|p| self.log_progress(p)),
            "answerCheckpoint" => parse(params).and_then(|p| self.answer_checkpoint(p)),
            "pendingCheckpoint" => no_params(params).and_then(|()| self.pending_checkpoint()),
            "answerConsent" => parse(params).and_then(|p| self.answer_consent(p)),
            "pendingConsent" => no_params(params).and_then(|()| self.pending_consent()),
            "suspendAgent" => {
                parse(params).and_then(|p| self.control_agent(p, crate::control::Want::Suspended))
            }
            "resumeAgent" => {
                parse(params).and_then(|p| self.control_agent(p, crate::control::Want::Active))
            }
            _ => return None,
        })
    }
}

/// The JSON-RPC method names, for "method not found" messages and docs.
pub const METHODS: &[&str] = &[
    "spawnAgent",
    "updateState",
    "getState",
    "logProgress",
    "answerCheckpoint",
    "pendingCheckpoint",
    "answerConsent",
    "pendingConsent",
    "suspendAgent",
    "resumeAgent",
];

/// The parameter names of a method in positional order.
pub fn positional_names(method: &str) -> Option<&'static [&'static str]> {
    Some(match method {
        "spawnAgent" => SpawnAgentParams::NAMES,
        "updateState" => UpdateStateParams::NAMES,
        "getState" => GetStateParams::NAMES,
        "logProgress" => LogProgressParams::NAMES,
        "answerCheckpoint" => AnswerCheckpointParams::NAMES,
        "pendingCheckpoint" | "pendingConsent" => &[],
        "answerConsent" => AnswerConsentParams::NAMES,
        "suspendAgent" | "resumeAgent" => AgentParams::NAMES,
        _ => return None,
    })
}

fn parse<P: Params>(params: &Value) -> Result<P, CallError> {
    Ok(decode(params)?)
}

fn no_params(params: &Value) -> Result<(), CallError> {
    match params {
        Value::Object(m) if m.is_empty() => Ok(()),
        _ => Err(ParamError {
            field: "params".into(),
            problem: "must be empty: the method takes no parameters".into(),
        }
        .into()),
    }
}

fn to_json<T: Serialize>(v: &T) -> CallResult {
    serde_json::to_value(v).map_err(|e| CallError::Internal(e.to_string()))
}
