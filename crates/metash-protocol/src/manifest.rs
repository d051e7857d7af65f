//! Seed 002 section 1: `manifest.toml`, schema v0.1. These are the plain data types; parsing with
//! line/column diagnostics lives in `metash-policy`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Manifest schema versions this build accepts.
pub const MANIFEST_SCHEMA_VERSIONS: &[&str] = &["0.1"];

/// Execution mode: `wasm` (preferred) or `native` (allowed with explicit user consent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxKind {
    Wasm,
    Native,
}

/// CPU and memory quotas (`resources.cpu`, `resources.mem`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Kubernetes-style CPU quantity, e.g. `"500m"`, `"2"` or `"0.5"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Kubernetes-style memory quantity, e.g. `"512Mi"`, `"1Gi"` or `"1000000"` (bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<String>,
}

/// UI integration hints (`ui.hints`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UiHints {
    /// e.g. `"streaming"`, `"diff"`, `"preview"`.
    #[serde(default)]
    pub hints: Vec<String>,
}

/// An agent's `manifest.toml` (seed 002 section 1). The syntax of capabilities and the other
/// rules the schema cannot say are in `docs/policy.md`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Version of the manifest schema; one of [`MANIFEST_SCHEMA_VERSIONS`].
    pub schema_version: String,
    /// Human name, shown in the UI.
    pub name: String,
    /// The agent's own semantic version, e.g. `"0.1.0"`.
    pub version: String,
    /// Executable or WASM module, relative to the manifest's directory.
    pub entry: String,
    pub sandbox: SandboxKind,
    /// Declared permissions, e.g. `"files.read"`, `"network:api.github.com"`; default deny.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// External API scopes requested, `PROVIDER:SCOPE`, e.g. `"github:repo"`.
    #[serde(default)]
    pub oauth_scopes: Vec<String>,
    #[serde(default)]
    pub resources: Resources,
    #[serde(default)]
    pub ui: UiHints,
    /// Lifecycle hooks the agent implements besides `start` and `invoke` (metash's extension of
    /// seed 002 §1, for §3's `shutdown()`): with `"shutdown"`, a WASM agent is run once more
    /// with a `shutdown` event before it is terminated, to flush its state. Without it nothing
    /// runs again (an agent that ignores its input would redo its last work).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

/// A lifecycle hook a manifest can declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Hook {
    Shutdown,
}

impl Manifest {
    /// A manifest of the current schema declaring nothing: no capabilities, scopes, limits or
    /// hints. Hosts and tests that build agents in code start here and set what they need.
    pub fn new(name: &str, entry: &str, sandbox: SandboxKind) -> Self {
        Self {
            schema_version: MANIFEST_SCHEMA_VERSIONS[MANIFEST_SCHEMA_VERSIONS.len() - 1].into(),
            name: name.into(),
            version: "0.1.0".into(),
            entry: entry.into(),
            sandbox,
            capabilities: Vec::new(),
            oauth_scopes: Vec::new(),
            resources: Resources::default(),
            ui: UiHints::default(),
            hooks: Vec::new(),
        }
    }
}
