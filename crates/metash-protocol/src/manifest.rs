//! Seed 002 section 1: `manifest.toml`, schema v0.1. These are the plain data types; parsing with
//! line/column diagnostics lives in `metash-policy`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Manifest schema versions this build accepts.
pub const MANIFEST_SCHEMA_VERSIONS: &[&str] = &["0.1"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxKind {
    Wasm,
    Native,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// Kubernetes-style CPU quantity, e.g. `"500m"` or `"2"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Kubernetes-style memory quantity, e.g. `"512Mi"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UiHints {
    #[serde(default)]
    pub hints: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub schema_version: String,
    pub name: String,
    pub version: String,
    pub entry: String,
    pub sandbox: SandboxKind,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub oauth_scopes: Vec<String>,
    #[serde(default)]
    pub resources: Resources,
    #[serde(default)]
    pub ui: UiHints,
}
