//! Seed 003 section 5.1: a continuation key is typed by its provider. Below both the agent event
//! envelope (which carries the continuation) and the harness types (which produce it).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProviderDomain {
    Anthropic,
    Openai,
}

impl ProviderDomain {
    /// Parses the wire name (`anthropic` or `openai`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "anthropic" => Some(Self::Anthropic),
            "openai" => Some(Self::Openai),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::Openai => "openai",
        }
    }
}

/// Provider-native opaque string; only meaningful within its provider.
pub type HarnessContinuationKey = String;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HarnessContinuationRef {
    pub provider: ProviderDomain,
    /// Absent until the first successful provider turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<HarnessContinuationKey>,
}
