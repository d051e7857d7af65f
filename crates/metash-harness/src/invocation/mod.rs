//! `buildProcessInvocationSpec` (seed 003 sections 3.3 and 6) with materialization split from
//! invocation (section 5.2): [`materialize`] writes files under `aspHome`, deterministically;
//! [`build_invocation`] only computes `{argv, cwd, env}` from the request and those paths.

use std::collections::BTreeMap;
use std::path::PathBuf;

use metash_protocol::{
    HarnessContinuationRef, HarnessFrontend, InteractionMode, IoMode, ProcessInvocationSpec,
    ProviderDomain,
};
use serde::{Deserialize, Serialize};

use crate::error::{HarnessError, Result};
use crate::frontend::registry::{check_continuation, check_model_of};
use crate::frontend::{builtin, Frontend};
use crate::programs::Programs;
use crate::quote::display_command;

pub use crate::frontend::claude::{claude_project_dir, claude_session_file};
pub use crate::frontend::codex::codex_rollout_file;
pub use crate::frontend::pi::pi_session_file;

/// Where a harness sends its model requests. Absent: the harness's own default (the real
/// provider). Tests point this at a loopback server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// For Claude without `/v1`; for Codex, pi and the OpenAI clients with `/v1`.
    pub base_url: String,
    /// The environment variable holding the key (the key itself never goes into a spec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// The provider name written into Codex's and pi's config (default `metash`). Keep it stable:
    /// Codex resumes a thread only under the same provider definition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_name: Option<String>,
}

impl Endpoint {
    pub(crate) fn name(&self) -> &str {
        self.provider_name.as_deref().unwrap_or("metash")
    }
}

/// The knobs seed 003 asks to pass through to the CLIs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HarnessOptions {
    /// Claude: `--permission-mode` value; Codex: a sandbox mode (`read-only`, `workspace-write`,
    /// `danger-full-access`).
    pub permission_mode: Option<String>,
    /// Claude `--dangerously-skip-permissions` (sets `IS_SANDBOX=1` so it runs as root), Codex
    /// `--dangerously-bypass-approvals-and-sandbox`.
    pub skip_permissions: bool,
    /// Replaces the harness's system prompt.
    pub system_prompt: Option<String>,
    /// Appended to the harness's system prompt.
    pub append_system_prompt: Option<String>,
    pub extra_dirs: Vec<PathBuf>,
    /// Claude `--max-budget-usd`.
    pub max_budget_usd: Option<f64>,
    /// Claude `--max-turns`.
    pub max_turns: Option<u32>,
    pub allowed_tools: Vec<String>,
    pub disallowed_tools: Vec<String>,
    /// MCP servers as Claude's `mcpServers` object: `{name: {command, args, env}}` or
    /// `{name: {type: "http", url}}`.
    pub mcp_servers: Option<serde_json::Value>,
    /// Claude `--permission-prompt-tool`: the MCP tool (`mcp__SERVER__TOOL`) that answers its
    /// permission prompts in headless runs (ignored with `skip_permissions`).
    pub permission_prompt_tool: Option<String>,
    pub endpoint: Option<Endpoint>,
    /// Give the harness its own HOME (and CODEX_HOME / pi agent dir) under `aspHome`, so nothing
    /// of the user's configuration leaks in. Tests and CI use it; people keep their login with
    /// `false`.
    pub isolated_home: bool,
    /// Claude: fix the new conversation's id up front (`--session-id`), so a control plane knows
    /// the key of an interactive session it cannot parse.
    pub session_id: Option<String>,
    /// Claude headless: stream partial messages (text deltas).
    pub include_partial_messages: bool,
    /// Pre-answer the CLI's "do you trust this folder?" question for `cwd` (interactive runs ask
    /// it; headless runs do not). Only with `isolatedHome`: the user's own trust list is theirs.
    pub trust_cwd: bool,
}

/// Seed 003 section 3.3's request (the `spec: SpaceSpec` is the caller's business; what the
/// harness needs from it comes through [`HarnessOptions`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildProcessInvocationSpecRequest {
    pub cp_session_id: String,
    pub asp_home: PathBuf,
    /// When given, it must be the frontend's provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderDomain>,
    pub frontend: HarnessFrontend,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub interaction_mode: InteractionMode,
    pub io_mode: IoMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation: Option<HarnessContinuationRef>,
    pub cwd: PathBuf,
    /// Extra environment the caller wants in the delta (e.g. the API key variable).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The first (headless: the only) prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(default)]
    pub options: HarnessOptions,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_dir: Option<PathBuf>,
}

impl BuildProcessInvocationSpecRequest {
    /// A request with the defaults: headless over pipes, no continuation.
    pub fn new(
        frontend: HarnessFrontend,
        asp_home: impl Into<PathBuf>,
        cwd: impl Into<PathBuf>,
    ) -> Self {
        Self {
            cp_session_id: "default".to_string(),
            asp_home: asp_home.into(),
            provider: None,
            frontend,
            model: None,
            interaction_mode: InteractionMode::Headless,
            io_mode: IoMode::Pipes,
            continuation: None,
            cwd: cwd.into(),
            env: BTreeMap::new(),
            prompt: None,
            options: HarnessOptions::default(),
            artifact_dir: None,
        }
    }

    /// The continuation key, if the request resumes.
    pub fn continuation_key(&self) -> Option<&str> {
        self.continuation.as_ref().and_then(|c| c.key.as_deref())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildProcessInvocationSpecResponse {
    pub spec: ProcessInvocationSpec,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// What [`materialize`] wrote and the environment it implies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Materialized {
    /// HOME for the harness (isolated mode only).
    pub home: Option<PathBuf>,
    pub mcp_config: Option<PathBuf>,
    pub system_prompt_file: Option<PathBuf>,
    /// Codex's config.toml or pi's models.json.
    pub provider_config: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
}

/// A file name safe for any cpSessionId.
pub(crate) fn safe_name(s: &str) -> String {
    let cleaned: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.is_empty() || cleaned.starts_with('.') {
        format!("_{cleaned}")
    } else {
        cleaned
    }
}

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

/// Writes what the harness needs under `aspHome`: its home (isolated mode), MCP config, system
/// prompt file, provider config. The same request writes the same bytes to the same paths.
///
/// # Errors
/// `ProviderMismatch` / `ModelNotSupported` / `InvalidRequest` / `UnsupportedFrontend` before
/// anything is written; `Io` when a file cannot be written.
pub fn materialize(req: &BuildProcessInvocationSpecRequest) -> Result<Materialized> {
    materialize_with(builtin(req.frontend), req)
}

/// [`materialize`] by a given frontend (a registry's, which may not be the built-in).
///
/// # Errors
/// As [`materialize`].
pub fn materialize_with<F: Frontend + ?Sized>(
    frontend: &F,
    req: &BuildProcessInvocationSpecRequest,
) -> Result<Materialized> {
    validate(frontend, req)?;
    frontend.materialize(req)
}

/// Builds argv/env/cwd from the request and what [`materialize`] returned. Writes nothing.
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

/// [`build_invocation`] by a given frontend.
///
/// # Errors
/// As [`build_invocation`].
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
    Ok(BuildProcessInvocationSpecResponse {
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
    })
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

pub(crate) fn is_terminal_var(k: &str) -> bool {
    k.starts_with("TMUX")
        || k.starts_with("GHOSTTY")
        || k == "TERM_PROGRAM"
        || k == "TERM_PROGRAM_VERSION"
        || k == "STY"
}
