//! `runTurnNonInteractive` (seed 003 section 3.2): one turn, its events in the `BaseEvent`
//! envelope, and the continuation observed. Checks that could only fail later (provider, model,
//! the CLIs' resume rules, a missing transcript) run before any process starts or request is sent,
//! so a resume never silently starts a fresh conversation.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use metash_protocol::{
    HarnessContinuationRef, HarnessEvent, HarnessFrontend, InteractionMode, IoMode, RunError,
    RunResult, RunTurnNonInteractiveResponse,
};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::api::{RetryPolicy, ToolResultInput, ToolSpec};
use crate::confine::ConfinerHandle;
use crate::error::{HarnessError, Result};
use crate::events::{Emitter, EventSink};
use crate::frontend::registry::{check_continuation, check_model_of};
use crate::frontend::{Registry, Turn};
use crate::invocation::{BuildProcessInvocationSpecRequest, HarnessOptions};
use crate::programs::Programs;

/// Seed 003 section 3.2's request, plus what the API frontends need (`maxTokens`, tools, tool
/// results) and a timeout. Callbacks are the `sink` argument of [`Harness::run_turn_non_interactive`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunTurnNonInteractiveRequest {
    pub cp_session_id: String,
    pub run_id: String,
    pub asp_home: PathBuf,
    pub frontend: HarnessFrontend,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation: Option<HarnessContinuationRef>,
    pub cwd: PathBuf,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub prompt: String,
    /// System prompt, endpoint, permissions, isolated home... (as for invocation specs).
    #[serde(default)]
    pub options: HarnessOptions,
    /// API frontends: the response's token cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// API frontends: tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    /// API frontends: results of the previous turn's tool calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_results: Vec<ToolResultInput>,
    /// The whole turn's bound; past it the process group is killed / the request dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// CLI frontends: confines the process (the host's native sandbox). None: a plain process
    /// with the caller's rights.
    #[serde(skip)]
    pub confiner: ConfinerHandle,
}

impl RunTurnNonInteractiveRequest {
    pub fn new(
        frontend: HarnessFrontend,
        asp_home: impl Into<PathBuf>,
        cwd: impl Into<PathBuf>,
        prompt: impl Into<String>,
    ) -> Self {
        Self {
            cp_session_id: "default".into(),
            run_id: uuid::Uuid::new_v4().to_string(),
            asp_home: asp_home.into(),
            frontend,
            model: None,
            continuation: None,
            cwd: cwd.into(),
            env: BTreeMap::new(),
            prompt: prompt.into(),
            options: HarnessOptions::default(),
            max_tokens: None,
            tools: Vec::new(),
            tool_results: Vec::new(),
            timeout_ms: None,
            confiner: ConfinerHandle::default(),
        }
    }

    /// The headless invocation a CLI-driven frontend runs for this turn: what a control plane
    /// would spawn itself to get the same turn.
    pub fn invocation_request(&self) -> BuildProcessInvocationSpecRequest {
        BuildProcessInvocationSpecRequest {
            cp_session_id: self.cp_session_id.clone(),
            asp_home: self.asp_home.clone(),
            provider: None,
            frontend: self.frontend,
            model: self.model.clone(),
            interaction_mode: InteractionMode::Headless,
            io_mode: IoMode::Pipes,
            continuation: self.continuation.clone(),
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            prompt: Some(self.prompt.clone()),
            options: self.options.clone(),
            artifact_dir: None,
        }
    }
}

/// The harness layer's entry point: programs found once, one HTTP client reused.
#[derive(Debug, Clone)]
pub struct Harness {
    pub programs: Programs,
    pub retry: RetryPolicy,
    /// Longest silence allowed inside a provider stream.
    pub idle_timeout: Duration,
    /// The frontends it runs: the built-ins unless replaced.
    pub registry: Registry,
    pub(crate) http: reqwest::Client,
}

impl Harness {
    /// # Errors
    /// `InvalidRequest` when the HTTP client cannot be built (no TLS provider).
    pub fn new(programs: Programs) -> Result<Self> {
        // Real providers are https; tests use loopback http. Installing the ring provider is
        // idempotent (an already installed provider is kept).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| HarnessError::InvalidRequest(format!("HTTP client: {e}")))?;
        Ok(Self {
            programs,
            retry: RetryPolicy::default(),
            idle_timeout: Duration::from_secs(300),
            registry: Registry::builtin(),
            http,
        })
    }

    /// `getHarnessCapabilities()`.
    pub fn capabilities(&self) -> metash_protocol::HarnessCapabilities {
        self.registry.capabilities(&self.programs)
    }

    /// `buildProcessInvocationSpec()`.
    ///
    /// # Errors
    /// See [`crate::build_process_invocation_spec`].
    pub fn build_process_invocation_spec(
        &self,
        req: &BuildProcessInvocationSpecRequest,
    ) -> Result<crate::BuildProcessInvocationSpecResponse> {
        let frontend = self.registry.get(req.frontend);
        let materialized = crate::invocation::materialize_with(frontend, req)?;
        crate::invocation::build_invocation_with(frontend, req, &materialized, &self.programs)
    }

    /// `runTurnNonInteractive()`: runs one turn, streaming events to `sink`.
    ///
    /// Failures the caller must fix before anything runs (`provider_mismatch`,
    /// `continuation_not_found`, `model_not_supported`, `unsupported_frontend`,
    /// `program_not_found`) are returned as `Err`. Failures of the turn itself (an API error, a
    /// harness exiting non-zero, a timeout or cancellation) come back as `Ok` with
    /// `result.success == false`, `result.error` set and an `error` event, so the caller still
    /// gets the continuation observed before the failure.
    ///
    /// # Errors
    /// As above.
    pub async fn run_turn_non_interactive(
        &self,
        req: &RunTurnNonInteractiveRequest,
        cancel: &CancellationToken,
        sink: EventSink<'_>,
    ) -> Result<RunTurnNonInteractiveResponse> {
        let frontend = self.registry.get(req.frontend);
        check_continuation(req.frontend, req.continuation.as_ref())?;
        check_model_of(frontend.info(), req.model.as_deref())?;
        if !req.cwd.is_absolute() || !req.asp_home.is_absolute() {
            return Err(HarnessError::InvalidRequest(
                "cwd and aspHome must be absolute".into(),
            ));
        }
        let timeout = req.timeout_ms.map(Duration::from_millis);
        let mut em = Emitter::new(
            &req.cp_session_id,
            &req.run_id,
            req.frontend.provider(),
            sink,
        );
        let outcome = frontend
            .run_turn(Turn {
                harness: self,
                req,
                timeout,
                cancel,
                em: &mut em,
            })
            .await;
        let mut result = match outcome {
            Ok(r) => r,
            Err(e) if is_preflight(&e) => return Err(e),
            Err(e) => RunResult {
                success: false,
                error: Some(run_error(&e)),
                ..RunResult::default()
            },
        };
        if let Some(err) = &result.error {
            em.emit(HarnessEvent::Error {
                code: err.code,
                message: err.message.clone(),
                status: err.status,
            });
        }
        if let Some(u) = &result.usage {
            em.emit(HarnessEvent::Usage { usage: u.clone() });
        }
        result.success = result.error.is_none() && result.success;
        em.emit(HarnessEvent::TurnCompleted {
            result: result.clone(),
        });
        Ok(RunTurnNonInteractiveResponse {
            continuation: em.continuation(),
            provider: req.frontend.provider(),
            frontend: req.frontend,
            model: req.model.clone(),
            result,
        })
    }
}

fn is_preflight(e: &HarnessError) -> bool {
    matches!(
        e,
        HarnessError::ProviderMismatch { .. }
            | HarnessError::ContinuationNotFound(_)
            | HarnessError::ModelNotSupported(_)
            | HarnessError::UnsupportedFrontend(_)
            | HarnessError::ProgramNotFound(_)
            | HarnessError::InvalidRequest(_)
    )
}

pub(crate) fn run_error(e: &HarnessError) -> RunError {
    RunError {
        code: e.code(),
        message: e.to_string(),
        status: match e {
            HarnessError::Api { status, .. } => *status,
            _ => None,
        },
    }
}

/// The environment value a harness will see for `var`: the request's delta, else ours.
pub(crate) fn env_value(
    req_env: &BTreeMap<String, String>,
    materialized: &BTreeMap<String, String>,
    var: &str,
) -> Option<String> {
    req_env
        .get(var)
        .or_else(|| materialized.get(var))
        .cloned()
        .or_else(|| std::env::var(var).ok())
}
