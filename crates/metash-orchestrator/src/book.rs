//! The orchestrator's own bookkeeping, kept in the session under `variables.metash` so it goes
//! through `update_state` like everything else (one log, one truth, crash-safe):
//!
//! | key | meaning |
//! |---|---|
//! | `phases.<id>` | the task's phase (the session's `Task` has no phase field) |
//! | `noChange.<id>` | `true`: the planner said the task expects no change (else a task whose executor changed nothing fails verification) |
//! | `running.<id>` | `{attempt, head, since}` while an executor works on the task; found at startup it means the run was killed mid-task: the task is failed and retryable, its worktree reset to `head` |
//! | `attempts.<id>` | executor attempts so far (errors and timeouts count against `max_task_attempts`) |
//! | `findings.<id>` | the verifier's last findings, sent with the next executor prompt |
//! | `errors.<id>` | why the last executor attempt failed (error, timeout), for the next prompt |
//! | `verified.<id>` | the verifier passed the task's current commits |
//! | `summaries.<id>` | the executor's last summary, for the verifier |
//! | `merged.<id>` | the commit the task's branch was merged into the project at |
//! | `decisions[]` | checkpoint answers `{id, question, answer}`, shown to every later prompt |
//! | `planAttempts`, `lastRejection` | plans rejected in this phase, and why the last one was |
//! | `resumeFor` | `{role, task}` whose checkpoint was answered: spawned first, alone, so the host's `resume_data` reaches it |
//! | `halt` | why the session is halted: `{reason, phase, failed[], message}` |
//!
//! A `null` entry means absent (key paths cannot delete).

use std::collections::BTreeMap;

use metash_protocol::SessionState;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Our namespace inside `variables`.
pub const NS: &str = "metash";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Book {
    pub phases: BTreeMap<String, u32>,
    pub no_change: BTreeMap<String, bool>,
    pub running: BTreeMap<String, Option<Running>>,
    pub attempts: BTreeMap<String, u32>,
    pub findings: BTreeMap<String, Option<Vec<String>>>,
    /// Why the last executor attempt failed (error, timeout, interrupted run).
    pub errors: BTreeMap<String, Option<String>>,
    pub verified: BTreeMap<String, bool>,
    pub merged: BTreeMap<String, Option<String>>,
    /// The executor's last summary, shown to the verifier.
    pub summaries: BTreeMap<String, Option<String>>,
    pub decisions: Vec<Decision>,
    pub plan_attempts: u32,
    pub last_rejection: Option<String>,
    pub resume_for: Option<ResumeFor>,
    pub halt: Option<Halt>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Running {
    pub attempt: u32,
    /// The task branch's commit when the attempt started: what a crashed attempt is reset to.
    pub head: String,
    pub since: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub id: String,
    pub question: String,
    pub answer: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeFor {
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Halt {
    /// `complete` (nothing left to plan), `gap_limit`, `plan_rejected`, `task_failed`, `blocked`,
    /// `merge_aborted`.
    pub reason: String,
    pub phase: u32,
    #[serde(default)]
    pub failed: Vec<FailedTask>,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedTask {
    pub id: String,
    pub title: String,
    pub why: Vec<String>,
}

impl Book {
    /// The bookkeeping in `state` (default when absent or unreadable: it is ours, and a value we
    /// cannot read is treated as empty rather than blocking the run).
    pub fn of(state: &SessionState) -> Self {
        state
            .variables
            .get(NS)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }

    /// The planner said this task may rightly change nothing.
    pub fn expects_no_change(&self, id: &str) -> bool {
        self.no_change.get(id).copied().unwrap_or(false)
    }

    pub fn phase_of(&self, id: &str, default: u32) -> u32 {
        self.phases.get(id).copied().unwrap_or(default)
    }

    pub fn running(&self) -> impl Iterator<Item = (&String, &Running)> {
        self.running
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|r| (k, r)))
    }

    pub fn findings(&self, id: &str) -> &[String] {
        self.findings
            .get(id)
            .and_then(Option::as_deref)
            .unwrap_or(&[])
    }

    pub fn last_error(&self, id: &str) -> Option<&str> {
        self.errors.get(id).and_then(Option::as_deref)
    }

    pub fn is_verified(&self, id: &str) -> bool {
        self.verified.get(id).copied().unwrap_or(false)
    }

    pub fn merged_at(&self, id: &str) -> Option<&str> {
        self.merged.get(id).and_then(Option::as_deref)
    }
}

/// The key path of a bookkeeping entry: `key(&["running", "02"])` = `variables.metash.running.02`.
pub fn key(parts: &[&str]) -> String {
    let mut k = format!("variables.{NS}");
    for p in parts {
        k.push('.');
        k.push_str(p);
    }
    k
}

/// One `(key, value)` update of a bookkeeping entry.
pub fn set(parts: &[&str], value: Value) -> (String, Value) {
    (key(parts), value)
}

/// A task field update: `task_set("02", "status", json!("complete"))`.
pub fn task_set(id: &str, field: &str, value: Value) -> (String, Value) {
    (format!("plan.tasks.{id}.{field}"), value)
}

pub fn null() -> Value {
    json!(null)
}
