//! The harness's requests and what materialization returns: plain data, below every module that
//! acts on them (the frontends, the invocation builder, the turn runner).

use std::collections::BTreeMap;
use std::path::PathBuf;

use metash_protocol::{
    HarnessContinuationRef, HarnessFrontend, InteractionMode, IoMode, ProcessInvocationSpec,
    ProviderDomain,
};
use serde::{Deserialize, Serialize};

use crate::api::{ToolResultInput, ToolSpec};
use crate::confine::ConfinerHandle;

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
    pub fn name(&self) -> &str {
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
    /// The CLI signs in with the provider's subscription instead of a key (Claude Code, Codex):
    /// it is given a placeholder sign-in of its own, and `endpoint` (metash's credential proxy)
    /// adds the real one. See [`SignInOptions`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sign_in: Option<SignInOptions>,
}

/// A placeholder subscription sign-in for the CLI: Claude Code gets `CLAUDE_CODE_OAUTH_TOKEN`;
/// Codex gets a ChatGPT-mode `auth.json` in its own `CODEX_HOME` (always under `aspHome`, never
/// the user's) and a provider that uses it (`requires_openai_auth`). No real token is written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignInOptions {
    /// What stands in for every token and the account id (the proxy replaces them).
    pub placeholder: String,
    /// Codex: the ChatGPT plan the placeholder names (`plus`, `pro`...). Not a secret; Codex
    /// picks its models and features by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// Codex: its `chatgpt_base_url` (account and plugin requests). metash points it at the proxy,
    /// which serves no such path: those requests are refused there and never leave the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chatgpt_base_url: Option<String>,
}

/// Seed 003 section 3.3's request. `spec` (the seed's `SpaceSpec`) is agent-spaces' description
/// of a space; metash does not compose spaces, so it takes any JSON object, materializes it for
/// the harness process (`ASP_SPACE_SPEC`) and reads nothing from it: what metash itself needs
/// comes through [`HarnessOptions`].
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
    /// Absolute; when given, the built spec is recorded there (`invocation.json`) and the
    /// harness process gets it as `ASP_ARTIFACT_DIR` for what it emits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_dir: Option<PathBuf>,
    /// The seed's `SpaceSpec`: a JSON object, materialized as `space.json` (see above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<serde_json::Value>,
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
            spec: None,
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
pub fn safe_name(s: &str) -> String {
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
    /// The seed's `SpaceSpec`, delivered to CLI-driven frontends as for invocation specs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<serde_json::Value>,
    /// Files that go with the prompt (seed 003): relative to `cwd` or absolute; images to the
    /// API frontends, text to every frontend (see [`crate::attachments`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<String>,
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
            spec: None,
            attachments: Vec::new(),
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
            spec: self.spec.clone(),
        }
    }
}

/// The environment value a harness will see for `var`: the request's delta, else ours.
pub fn env_value(
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
