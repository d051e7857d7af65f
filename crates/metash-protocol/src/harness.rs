//! Seed 003: provider-typed continuity and process invocation specs.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::events::BaseEvent;

pub use crate::continuation::{HarnessContinuationKey, HarnessContinuationRef, ProviderDomain};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum InteractionMode {
    Interactive,
    Headless,
    NonInteractive,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IoMode {
    Pty,
    Pipes,
    Inherit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum HarnessFrontend {
    AgentSdk,
    PiSdk,
    ClaudeCode,
    CodexCli,
    /// metash's own streaming client for the Anthropic Messages API (no coding CLI).
    AnthropicApi,
    /// metash's own streaming client for the OpenAI Responses API.
    OpenaiResponses,
    /// metash's own streaming client for OpenAI-compatible chat completions (Ollama, vLLM,
    /// llama.cpp servers); typed `openai` since that is the wire protocol it speaks.
    OpenaiChat,
}

impl HarnessFrontend {
    pub const ALL: [HarnessFrontend; 7] = [
        Self::AgentSdk,
        Self::PiSdk,
        Self::ClaudeCode,
        Self::CodexCli,
        Self::AnthropicApi,
        Self::OpenaiResponses,
        Self::OpenaiChat,
    ];

    /// The seed's typing (section 5.1): this is what makes a continuation key provider-scoped.
    pub fn provider(self) -> ProviderDomain {
        match self {
            Self::AgentSdk | Self::ClaudeCode | Self::AnthropicApi => ProviderDomain::Anthropic,
            Self::PiSdk | Self::CodexCli | Self::OpenaiResponses | Self::OpenaiChat => {
                ProviderDomain::Openai
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AgentSdk => "agent-sdk",
            Self::PiSdk => "pi-sdk",
            Self::ClaudeCode => "claude-code",
            Self::CodexCli => "codex-cli",
            Self::AnthropicApi => "anthropic-api",
            Self::OpenaiResponses => "openai-responses",
            Self::OpenaiChat => "openai-chat",
        }
    }

    /// Parses the wire name (`claude-code`, ...).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.as_str() == name)
    }

    /// True for the frontends whose process a control plane spawns from a `ProcessInvocationSpec`.
    pub fn is_cli(self) -> bool {
        matches!(self, Self::ClaudeCode | Self::CodexCli)
    }
}

/// Everything a control plane needs to spawn a CLI harness without parsing a shell string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInvocationSpec {
    pub provider: ProviderDomain,
    pub frontend: HarnessFrontend,
    /// Authoritative; never shell-parsed.
    pub argv: Vec<String>,
    /// Absolute.
    pub cwd: String,
    /// Only the delta the harness needs; sorted so the same input gives the same bytes.
    pub env: BTreeMap<String, String>,
    pub interaction_mode: InteractionMode,
    pub io_mode: IoMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation: Option<HarnessContinuationRef>,
    /// For copy and paste only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_command: Option<String>,
}

/// Stable, deterministic error codes of the harness layer (seed 003 names the first four). A
/// control plane matches on these strings, so they never change once shipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HarnessErrorCode {
    /// A continuation of one provider was used with a frontend of the other.
    ProviderMismatch,
    /// The key names no conversation this harness can resume from here (wrong cwd for Claude, an
    /// unknown thread for Codex, no transcript for the API clients).
    ContinuationNotFound,
    ModelNotSupported,
    UnsupportedFrontend,
    /// The frontend's program is not installed.
    ProgramNotFound,
    /// The provider answered with an error (status and message in the event).
    ApiError,
    /// The harness process failed or its output could not be understood.
    HarnessFailed,
    Timeout,
    Cancelled,
    InvalidRequest,
    Io,
}

impl HarnessErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProviderMismatch => "provider_mismatch",
            Self::ContinuationNotFound => "continuation_not_found",
            Self::ModelNotSupported => "model_not_supported",
            Self::UnsupportedFrontend => "unsupported_frontend",
            Self::ProgramNotFound => "program_not_found",
            Self::ApiError => "api_error",
            Self::HarnessFailed => "harness_failed",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::InvalidRequest => "invalid_request",
            Self::Io => "io",
        }
    }
}

/// How a frontend runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FrontendKind {
    /// A CLI a control plane spawns from a `ProcessInvocationSpec`.
    Cli,
    /// A CLI driven headless by the harness.
    Sdk,
    /// metash's own HTTP client.
    Api,
}

impl FrontendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cli => "cli",
            Self::Sdk => "sdk",
            Self::Api => "api",
        }
    }
}

/// One frontend in `getHarnessCapabilities()`: its typing and whether it can run here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FrontendCapability {
    pub frontend: HarnessFrontend,
    pub kind: FrontendKind,
    pub installed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Seed 003 section 7 (ASP-2): `{provider, frontends, models}` for one provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderCapabilities {
    pub provider: ProviderDomain,
    pub frontends: Vec<FrontendCapability>,
    /// Known model names; other names are passed through unless the frontend restricts them.
    pub models: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HarnessCapabilities {
    pub providers: Vec<ProviderCapabilities>,
}

/// Token counts as the provider reported them (Codex's are cumulative across resumed turns).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation_tokens: Option<u64>,
}

/// A tool call the model asked for (the API clients return it; they do not execute tools).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub input: serde_json::Value,
}

/// What a turn produced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    pub success: bool,
    /// The final assistant text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_output: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunError {
    pub code: HarnessErrorCode,
    pub message: String,
    /// The provider's HTTP status, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

/// Seed 003 section 3.2's response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunTurnNonInteractiveResponse {
    /// Set once a key was observed (also when it is the key the turn resumed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation: Option<HarnessContinuationRef>,
    pub provider: ProviderDomain,
    pub frontend: HarnessFrontend,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub result: RunResult,
}

/// The payload of a harness event inside seed 003's `BaseEvent` envelope: the harness's own events
/// (Claude stream-json, Codex/pi JSON lines, SSE) mapped to one vocabulary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum HarnessEvent {
    TurnStarted {
        frontend: HarnessFrontend,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    /// The continuation key was observed for the first time in this turn.
    ContinuationObserved {
        key: String,
    },
    TextDelta {
        text: String,
    },
    /// A complete assistant message.
    Message {
        role: String,
        text: String,
    },
    ToolCall {
        call: ToolCall,
    },
    ToolResult {
        id: String,
        output: String,
        #[serde(default)]
        is_error: bool,
    },
    Usage {
        usage: Usage,
    },
    /// A retry of the provider request after a 429/5xx.
    Retry {
        attempt: u32,
        delay_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
    },
    Error {
        code: HarnessErrorCode,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
    },
    TurnCompleted {
        result: RunResult,
    },
}

/// What the harness streams for a turn.
pub type HarnessEventEnvelope = BaseEvent<HarnessEvent>;
