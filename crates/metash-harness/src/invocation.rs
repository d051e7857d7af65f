//! `buildProcessInvocationSpec` (seed 003 sections 3.3 and 6) with materialization split from
//! invocation (section 5.2): [`materialize`] writes files under `aspHome`, deterministically;
//! [`build_invocation`] only computes `{argv, cwd, env}` from the request and those paths. These
//! use the built-in frontends; a [`crate::Harness`] uses its registry's.

use crate::error::Result;
use crate::frontend::builtin;
use crate::programs::Programs;

pub use crate::frontend::claude::{claude_project_dir, claude_session_file};
pub use crate::frontend::codex::codex_rollout_file;
pub use crate::frontend::pi::pi_session_file;
pub use crate::frontend::spec::{build_invocation_with, materialize_with};
pub use crate::request::{
    BuildProcessInvocationSpecRequest, BuildProcessInvocationSpecResponse, Endpoint,
    HarnessOptions, Materialized,
};

/// Writes what the harness needs under `aspHome`: its home (isolated mode), MCP config, system
/// prompt file, provider config. The same request writes the same bytes to the same paths.
///
/// # Errors
/// `ProviderMismatch` / `ModelNotSupported` / `InvalidRequest` / `UnsupportedFrontend` before
/// anything is written; `Io` when a file cannot be written.
pub fn materialize(req: &BuildProcessInvocationSpecRequest) -> Result<Materialized> {
    materialize_with(builtin(req.frontend), req)
}

/// Builds argv/env/cwd from the request and what [`materialize`] returned. Writes nothing but
/// the record of the built spec in `artifactDir`, when the request names one.
///
/// # Errors
/// As [`materialize`]'s validation; `InvalidRequest` when a headless run has no prompt.
pub fn build_invocation(
    req: &BuildProcessInvocationSpecRequest,
    materialized: &Materialized,
    programs: &Programs,
) -> Result<BuildProcessInvocationSpecResponse> {
    build_invocation_with(builtin(req.frontend), req, materialized, programs)
}

/// `buildProcessInvocationSpec`: validate, materialize, build. A provider mismatch is refused
/// before anything is written.
///
/// # Errors
/// See [`materialize`] and [`build_invocation`].
pub fn build_process_invocation_spec(
    req: &BuildProcessInvocationSpecRequest,
    programs: &Programs,
) -> Result<BuildProcessInvocationSpecResponse> {
    let materialized = materialize(req)?;
    build_invocation(req, &materialized, programs)
}
