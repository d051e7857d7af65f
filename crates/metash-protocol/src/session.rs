//! Seed 001: `.meta/session.json`, the mutable runtime state of a project.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::host::{CheckpointSignal, ResumeData};

/// Bumped when the file layout changes incompatibly; the store refuses files of other versions.
pub const SESSION_SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    Planning,
    Executing,
    Verifying,
    Halted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Pending,
    Complete,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Task {
    pub id: String,
    pub title: String,
    pub status: TaskStatus,
    #[serde(default)]
    pub dependencies: Vec<String>,
    /// Absent and empty differ in the seed's example, so both round-trip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commits: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Plan {
    pub tasks: Vec<Task>,
    pub current_task_idx: u32,
}

/// The version of a session file that does not say: seed 001's format, which is version 1.
fn seed_schema_version() -> u32 {
    1
}

/// The session file. Unknown fields are rejected so a typo never silently becomes state; new
/// fields must come with `#[serde(default)]` so files written by older builds still load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SessionState {
    /// Absent in seed 001's own example: such a file is read as version 1, and the next write
    /// adds the field.
    #[serde(rename = "schema_version", default = "seed_schema_version")]
    pub schema_version: u32,
    /// The `seq` of the last log event folded into this state. It is the fencing version: a write
    /// is accepted only on top of the revision it was computed from.
    #[serde(default)]
    pub revision: u64,
    pub session_id: String,
    pub status: SessionStatus,
    pub current_phase: u32,
    pub gap_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
    #[serde(default)]
    pub variables: Map<String, Value>,
    /// A checkpoint waiting for a person. Written before it is shown, so a host killed while
    /// waiting finds it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_checkpoint: Option<PendingCheckpoint>,
    /// An answered checkpoint not yet delivered: the next spawn receives it, exactly once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_data: Option<ResumeData>,
}

/// A raised, unanswered checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PendingCheckpoint {
    /// The signal's `resume_id`, or one the host generated.
    pub id: String,
    /// The agent (or `orchestrator`) that raised it.
    pub agent: String,
    pub raised_at: String,
    pub signal: CheckpointSignal,
}

impl SessionState {
    /// The plan's tasks; none before there is a plan.
    pub fn tasks(&self) -> &[Task] {
        self.plan
            .as_ref()
            .map(|p| p.tasks.as_slice())
            .unwrap_or(&[])
    }

    /// The planned task `id`, if there is one.
    pub fn task(&self, id: &str) -> Option<&Task> {
        self.tasks().iter().find(|t| t.id == id)
    }

    /// A fresh session: planning phase 1, nothing done yet.
    pub fn new(session_id: impl Into<String>) -> Self {
        Self {
            schema_version: SESSION_SCHEMA_VERSION,
            revision: 0,
            session_id: session_id.into(),
            status: SessionStatus::Planning,
            current_phase: 1,
            gap_count: 0,
            plan: None,
            variables: Map::new(),
            pending_checkpoint: None,
            resume_data: None,
        }
    }
}
