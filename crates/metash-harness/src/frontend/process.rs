//! The turn of every process frontend: materialize, refuse an unresumable key, build the argv,
//! run the program confined, and read its output with the frontend's parser.

use std::path::PathBuf;

use metash_protocol::{HarnessErrorCode, HarnessEvent, RunError, RunResult};

use super::spec::build_invocation_with;
use super::{not_a_process, Frontend, FrontendInfo, Turn, TurnParser};
use crate::error::{HarnessError, Result};
use crate::programs::Programs;
use crate::request::{env_value, RunTurnNonInteractiveRequest};
use crate::request::{BuildProcessInvocationSpecRequest, Materialized};
use crate::runner::{run_piped_confined, PipedOutcome};

/// One headless turn of `frontend`'s program (the default [`Frontend::run_turn`]).
///
/// # Errors
/// Preflight failures (`continuation_not_found`, `program_not_found`, ...) and spawn failures;
/// a program that fails its turn is an `Ok` result with `error` set.
pub async fn run_process_turn<F: Frontend + ?Sized>(
    frontend: &F,
    turn: Turn<'_, '_>,
) -> Result<RunResult> {
    let Turn {
        programs,
        req,
        timeout,
        cancel,
        em,
        ..
    } = turn;
    let mut parser = frontend
        .parser()
        .ok_or_else(|| not_a_process(frontend.info().id))?;
    let mut inv = req.invocation_request();
    if !req.attachments.is_empty() {
        // Checked before anything is materialized or started; the CLIs' prompts are text.
        let files = crate::attachments::load(&req.cwd, &req.attachments)?;
        inv.prompt = Some(crate::attachments::inline_into_prompt(&req.prompt, &files)?);
    }
    let m = super::spec::materialize_with(frontend, &inv)?;
    if let Some(key) = req.continuation.as_ref().and_then(|c| c.key.as_deref()) {
        frontend.check_resumable(req, &m, key)?;
    }
    let spec = build_invocation_with(frontend, &inv, &m, programs)?.spec;
    em.emit(HarnessEvent::TurnStarted {
        frontend: req.frontend,
        model: req.model.clone(),
    });
    let outcome = run_piped_confined(&spec, req.confiner.get(), timeout, cancel, &mut |line| {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            parser.line(&v, em);
        }
    })
    .await?;
    Ok(parser.finish(&outcome))
}

/// Signature of a process frontend's materialization ([`Frontend::materialize`]).
pub type MaterializeFn = fn(&BuildProcessInvocationSpecRequest) -> Result<Materialized>;
/// Signature of a process frontend's argv builder ([`Frontend::argv`]).
pub type ArgvFn = fn(
    &BuildProcessInvocationSpecRequest,
    &Materialized,
    &Programs,
    &mut Vec<String>,
) -> Result<Vec<String>>;
/// Signature of a resume check ([`Frontend::check_resumable`]).
pub type ResumeCheckFn = fn(&RunTurnNonInteractiveRequest, &Materialized, &str) -> Result<()>;

/// A frontend that spawns a program, as a table of its module's functions: the built-in CLIs
/// are each one `static` of this.
pub struct ProcessFrontend {
    pub info: FrontendInfo,
    pub materialize: MaterializeFn,
    pub argv: ArgvFn,
    pub check_resumable: ResumeCheckFn,
    pub parser: fn() -> Box<dyn TurnParser>,
}

impl Frontend for ProcessFrontend {
    fn info(&self) -> &FrontendInfo {
        &self.info
    }

    fn materialize(&self, req: &BuildProcessInvocationSpecRequest) -> Result<Materialized> {
        (self.materialize)(req)
    }

    fn argv(
        &self,
        req: &BuildProcessInvocationSpecRequest,
        materialized: &Materialized,
        programs: &Programs,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<String>> {
        (self.argv)(req, materialized, programs, warnings)
    }

    fn check_resumable(
        &self,
        req: &RunTurnNonInteractiveRequest,
        materialized: &Materialized,
        key: &str,
    ) -> Result<()> {
        (self.check_resumable)(req, materialized, key)
    }

    fn parser(&self) -> Option<Box<dyn TurnParser>> {
        Some((self.parser)())
    }
}

/// For programs that check a resumed key themselves (when argv is built).
pub fn resumes_any(_: &RunTurnNonInteractiveRequest, _: &Materialized, _: &str) -> Result<()> {
    Ok(())
}

/// Where a program keeps its state for this turn: `var` if set (in the request, the
/// materialized environment, or ours), else `$HOME/<dot_dir>`.
///
/// # Errors
/// `ContinuationNotFound` when neither is known (a resume could not be checked).
pub fn state_home(
    req: &RunTurnNonInteractiveRequest,
    m: &Materialized,
    var: &str,
    dot_dir: &str,
) -> Result<PathBuf> {
    env_value(&req.env, &m.env, var)
        .map(PathBuf::from)
        .or_else(|| env_value(&req.env, &m.env, "HOME").map(|h| PathBuf::from(h).join(dot_dir)))
        .ok_or_else(|| HarnessError::ContinuationNotFound(format!("neither {var} nor HOME is set")))
}

/// The error of a program that exited before its output said the turn ended.
pub fn exited_early(program: &str, outcome: &PipedOutcome, what: &str) -> RunError {
    RunError {
        code: HarnessErrorCode::HarnessFailed,
        message: format!(
            "{program} exited with {}{what}: {}",
            outcome.status,
            outcome.stderr_tail.trim()
        ),
        status: None,
    }
}

/// A process turn's result from what its parser collected.
pub fn turn_result(
    final_output: Option<String>,
    stop_reason: Option<String>,
    usage: Option<metash_protocol::Usage>,
    error: Option<RunError>,
) -> RunResult {
    RunResult {
        success: error.is_none(),
        final_output,
        tool_calls: Vec::new(),
        stop_reason,
        usage,
        cost_usd: None,
        error,
    }
}
