//! `runTurnNonInteractive` (seed 003 section 3.2): one turn, its events in the `BaseEvent`
//! envelope, and the continuation observed. Checks that could only fail later (provider, model,
//! the CLIs' resume rules, a missing transcript) run before any process starts or request is sent,
//! so a resume never silently starts a fresh conversation.

use std::time::Duration;

use metash_protocol::{HarnessEvent, RunResult, RunTurnNonInteractiveResponse};
use tokio_util::sync::CancellationToken;

use crate::api::RetryPolicy;
use crate::error::{HarnessError, Result};
use crate::events::{Emitter, EventSink};
use crate::frontend::registry::{check_continuation, check_model_of};
use crate::frontend::{Registry, Turn};
use crate::programs::Programs;
use crate::request::{BuildProcessInvocationSpecRequest, RunTurnNonInteractiveRequest};

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
        let materialized = crate::frontend::spec::materialize_with(frontend, req)?;
        crate::frontend::spec::build_invocation_with(frontend, req, &materialized, &self.programs)
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
                programs: &self.programs,
                http: &self.http,
                retry: self.retry,
                idle_timeout: self.idle_timeout,
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
                error: Some(e.run_error()),
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
