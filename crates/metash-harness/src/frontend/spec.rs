//! Building a `ProcessInvocationSpec` with a given frontend: validation (provider, model, absolute
//! paths), then the frontend's materialization and argv, then the environment and continuation
//! every spec gets the same way.

use metash_protocol::{
    HarnessContinuationRef, InteractionMode, IoMode, ProcessInvocationSpec, ProviderDomain,
};

use super::registry::{check_continuation, check_model_of};
use super::Frontend;
use crate::error::{HarnessError, Result};
use crate::programs::Programs;
use crate::quote::display_command;
use crate::request::{
    BuildProcessInvocationSpecRequest, BuildProcessInvocationSpecResponse, Materialized,
};
use crate::runner::is_terminal_var;

fn validate<F: Frontend + ?Sized>(
    frontend: &F,
    req: &BuildProcessInvocationSpecRequest,
) -> Result<()> {
    check_continuation(req.frontend, req.continuation.as_ref())?;
    if let Some(p) = req.provider {
        if p != req.frontend.provider() {
            return Err(HarnessError::ProviderMismatch {
                continuation: p,
                frontend: req.frontend,
            });
        }
    }
    check_model_of(frontend.info(), req.model.as_deref())?;
    if !req.cwd.is_absolute() {
        return Err(HarnessError::InvalidRequest(format!(
            "cwd must be absolute: {}",
            req.cwd.display()
        )));
    }
    if !req.asp_home.is_absolute() {
        return Err(HarnessError::InvalidRequest(format!(
            "aspHome must be absolute: {}",
            req.asp_home.display()
        )));
    }
    Ok(())
}

/// [`crate::materialize`] by a given frontend (a registry's, which may not be the built-in).
///
/// # Errors
/// As [`crate::materialize`].
pub fn materialize_with<F: Frontend + ?Sized>(
    frontend: &F,
    req: &BuildProcessInvocationSpecRequest,
) -> Result<Materialized> {
    validate(frontend, req)?;
    let space = space_json(req)?;
    if let Some(dir) = &req.artifact_dir {
        if !dir.is_absolute() {
            return Err(HarnessError::InvalidRequest(format!(
                "artifactDir must be absolute, not {}",
                dir.display()
            )));
        }
    }
    let mut m = frontend.materialize(req)?;
    if let Some(bytes) = space {
        let path = req
            .asp_home
            .join("spaces")
            .join(crate::request::safe_name(&req.cp_session_id))
            .join("space.json");
        crate::fsutil::write_atomic(&path, &bytes)?;
        m.env
            .insert("ASP_SPACE_SPEC".into(), path.to_string_lossy().into_owned());
    }
    if let Some(dir) = &req.artifact_dir {
        crate::fsutil::ensure_dir(dir)?;
        m.env.insert(
            "ASP_ARTIFACT_DIR".into(),
            dir.to_string_lossy().into_owned(),
        );
    }
    Ok(m)
}

/// The request's `SpaceSpec` as it is materialized; refused unless it is a JSON object.
fn space_json(req: &BuildProcessInvocationSpecRequest) -> Result<Option<Vec<u8>>> {
    match &req.spec {
        None => Ok(None),
        Some(v @ serde_json::Value::Object(_)) => serde_json::to_vec_pretty(v)
            .map(Some)
            .map_err(|e| HarnessError::InvalidRequest(format!("spec: {e}"))),
        Some(other) => Err(HarnessError::InvalidRequest(format!(
            "spec (SpaceSpec) must be a JSON object, not {other}"
        ))),
    }
}

/// [`crate::build_invocation`] by a given frontend.
///
/// # Errors
/// As [`crate::build_invocation`].
pub fn build_invocation_with<F: Frontend + ?Sized>(
    frontend: &F,
    req: &BuildProcessInvocationSpecRequest,
    materialized: &Materialized,
    programs: &Programs,
) -> Result<BuildProcessInvocationSpecResponse> {
    validate(frontend, req)?;
    if req.interaction_mode != InteractionMode::Interactive && req.prompt.is_none() {
        return Err(HarnessError::InvalidRequest(
            "a headless run needs a prompt".to_string(),
        ));
    }
    let mut warnings = Vec::new();
    let argv = frontend.argv(req, materialized, programs, &mut warnings)?;
    if req.interaction_mode == InteractionMode::Interactive && req.io_mode == IoMode::Pipes {
        warnings.push(
            "an interactive harness over pipes has no terminal; use pty or inherit".to_string(),
        );
    }
    let mut env = materialized.env.clone();
    env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    // Seed 003 section 6.2: terminal multiplexer variables belong to the control plane.
    env.retain(|k, _| !is_terminal_var(k));
    let cwd = req.cwd.to_string_lossy().into_owned();
    let display = display_command(&cwd, &env, &argv);
    let response = BuildProcessInvocationSpecResponse {
        spec: ProcessInvocationSpec {
            provider: req.frontend.provider(),
            frontend: req.frontend,
            argv,
            cwd,
            env,
            interaction_mode: req.interaction_mode,
            io_mode: req.io_mode,
            continuation: spec_continuation(req),
            display_command: Some(display),
        },
        warnings,
    };
    if let Some(dir) = &req.artifact_dir {
        // What CP spawned, next to what it emits: the record a UI or a person reads back.
        let bytes = serde_json::to_vec_pretty(&response)
            .map_err(|e| HarnessError::InvalidRequest(e.to_string()))?;
        crate::fsutil::write_atomic(&dir.join("invocation.json"), &bytes)?;
    }
    Ok(response)
}

/// The continuation the spec carries: the request's, or the session id fixed up front
/// (Anthropic only: Claude takes `--session-id`).
fn spec_continuation(req: &BuildProcessInvocationSpecRequest) -> Option<HarnessContinuationRef> {
    req.continuation.clone().or_else(|| {
        req.options
            .session_id
            .clone()
            .filter(|_| req.frontend.provider() == ProviderDomain::Anthropic)
            .map(|key| HarnessContinuationRef {
                provider: ProviderDomain::Anthropic,
                key: Some(key),
            })
    })
}
