//! Seed 000: the host protocol an orchestrator calls (`spawn_agent`, `log_progress`, checkpoints).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which class of model a model-backed role should use; the host maps it to a concrete model in
/// `.meta/config.toml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ModelHint {
    Fast,
    Smart,
}

/// The longest deadline a spawn may be given: 30 days. Anything longer is a mistake, and a
/// number that large (`1e300`) cannot even become a `Duration`.
pub const MAX_TIMEOUT_SECONDS: f64 = 30.0 * 86_400.0;

/// A spawn timeout in seconds (from the wire or a config file) as a `Duration`, or `None` when
/// it is not a finite number above zero and at most [`MAX_TIMEOUT_SECONDS`]. Every conversion of
/// an outside timeout goes through here, so NaN, a negative or `1e300` is refused, never a panic.
pub fn timeout_from_secs(seconds: f64) -> Option<std::time::Duration> {
    let ok = seconds.is_finite() && seconds > 0.0 && seconds <= MAX_TIMEOUT_SECONDS;
    ok.then(|| std::time::Duration::from_secs_f64(seconds))
}

/// A number of seconds for an error message: `1e300`, not three hundred digits.
pub fn show_seconds(seconds: f64) -> String {
    if seconds.is_finite() && seconds.abs() >= 1e16 {
        format!("{seconds:e}")
    } else {
        format!("{seconds}")
    }
}

/// The `options` argument of `spawn_agent`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_hint: Option<ModelHint>,
    /// Seconds; fractional values are allowed so tests can use short deadlines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// What the agent should look at (seed 002's `input.context_refs`; not in seed 000):
    /// `file:PATH`, `artifact:ID`, `kv:KEY`, `scratchpad:KEY`. The host checks each resolves
    /// before the agent starts and refuses the spawn naming one that does not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context_refs: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatus {
    Success,
    Timeout,
    Error,
    Checkpoint,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ResponseMetadata {
    pub tokens_used: u64,
    pub duration_ms: u64,
}

/// What `spawn_agent` returns. `data` is the raw output, the error message, or (for `checkpoint`)
/// a serialized [`CheckpointSignal`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AgentResponse {
    pub status: AgentStatus,
    pub data: String,
    pub metadata: ResponseMetadata,
}

/// Why an agent stopped for a human. The seed names the first two; `human_verify` is the third case
/// users ask for (look at a result and confirm it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointReason {
    DecisionRequired,
    HumanAction,
    HumanVerify,
}

/// The literal `"checkpoint"` tag the seed puts in `type`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointTag {
    #[default]
    Checkpoint,
}

/// The JSON an agent emits to pause for a human (seed 000 section 2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSignal {
    #[serde(rename = "type")]
    pub kind: CheckpointTag,
    pub reason: CheckpointReason,
    pub message: String,
    /// Empty means free-text input.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_id: Option<String>,
}

/// The answer to a checkpoint, passed to the next spawn exactly once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeData {
    pub checkpoint_id: String,
    pub user_input: String,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    Info,
    Warn,
    Error,
}

#[cfg(test)]
mod timeout_tests {
    use super::*;

    #[test]
    fn hostile_timeouts_are_refused_not_converted() {
        for bad in [
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            1e300,
            MAX_TIMEOUT_SECONDS * 2.0,
        ] {
            assert_eq!(timeout_from_secs(bad), None, "{bad}");
        }
        assert_eq!(
            timeout_from_secs(1.5),
            Some(std::time::Duration::from_millis(1500))
        );
        assert!(timeout_from_secs(MAX_TIMEOUT_SECONDS).is_some());
    }
}
