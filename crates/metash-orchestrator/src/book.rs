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
//! | `branches.<id>` | `{base, tips}`: the commit the task's branch was made at (recorded before the branch is) and every commit metash put it at since; the branch is used only at one of them (recorded.rs) |
//! | `decisions[]` | checkpoint answers `{id, question, answer}`, shown to every later prompt |
//! | `planAttempts`, `lastRejection` | plans rejected in this phase, and why the last one was |
//! | `resumeFor` | `{role, task}` whose checkpoint was answered: spawned first, alone, so the host's `resume_data` reaches it |
//! | `halt` | why the session is halted: `{reason, phase, failed[], message}` |
//! | `contextSeen` | the sha256 of the context the planner last planned with (context_note.rs) |
//! | `queue.<id>` | where a verified task is in the merge queue (queue.rs): `{state, head, main, attempts, files, with, why}` |
//! | `paths.<id>` | the paths the planner said the task touches: tasks whose paths overlap never run at once |
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
    /// What a worker must offer to run a task (only tasks that ask for something).
    pub labels: BTreeMap<String, Vec<String>>,
    /// The commits metash made each task's branch at and moved it to.
    pub branches: BTreeMap<String, Option<BranchRecord>>,
    /// The sha256 of the context the planner last planned with: a different one now means the
    /// owner changed it since (`metash context edit`), and the planner is told how.
    pub context_seen: Option<String>,
    /// Where each verified task is in the merge queue (queue.rs).
    pub queue: BTreeMap<String, Option<QueueEntry>>,
    /// The paths the planner said each task touches (only tasks that said).
    pub paths: BTreeMap<String, Vec<String>>,
}

/// A task's place in the merge queue: what the main checkout's branch was when the task's
/// branch was brought up to date with it, and where the task's branch was before (what a killed
/// update or a failed resolution is reset to).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntry {
    pub state: QueueState,
    /// The task's recorded tip before the update.
    #[serde(default)]
    pub head: String,
    /// The project's `HEAD` the update brings in.
    #[serde(default)]
    pub main: String,
    /// Failed resolutions of this conflict so far.
    #[serde(default)]
    pub attempts: u32,
    /// The files the update conflicts in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// The landed tasks whose changes it conflicts with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<String>,
    /// Why the last resolution failed (for the next resolution turn and the report).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub why: Vec<String>,
}

/// The merge queue's states, in the order a task goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    /// Verified, behind other tasks in the queue.
    Waiting,
    /// Its branch is being brought up to date with the project's `HEAD` in its worktree.
    Updating,
    /// The update conflicted: the executor is resolving it in the worktree.
    Resolving,
    /// The update (or the resolution) changed the task's tree: the verifier checks it again.
    Reverifying,
    /// The executor's resolutions failed `max_resolve_attempts` times: a person is asked to
    /// resolve in the task's worktree.
    WaitingOnPerson,
    /// Merged into the project.
    Landed,
    /// A state this version does not name.
    #[serde(other)]
    Unknown,
}

impl QueueState {
    pub fn as_str(self) -> &'static str {
        match self {
            QueueState::Waiting => "waiting",
            QueueState::Updating => "updating",
            QueueState::Resolving => "resolving",
            QueueState::Reverifying => "re-verifying",
            QueueState::WaitingOnPerson => "waiting on a person",
            QueueState::Landed => "landed",
            QueueState::Unknown => "unknown",
        }
    }
}

/// What metash recorded of a task's branch: where it made it and every commit it put it at
/// since (the base first, then dependency merges and the executor's commits, in order). A
/// branch that points anywhere else was moved by something that is not metash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchRecord {
    pub base: String,
    pub tips: Vec<String>,
}

impl BranchRecord {
    /// A branch about to be made at `base`.
    pub fn at(base: &str) -> Self {
        Self {
            base: base.to_string(),
            tips: vec![base.to_string()],
        }
    }

    /// Where the branch must be now: the last commit metash put it at.
    pub fn last(&self) -> &str {
        self.tips.last().unwrap_or(&self.base)
    }

    pub fn holds(&self, sha: &str) -> bool {
        self.base == sha || self.tips.iter().any(|t| t == sha)
    }

    /// The record with `sha` as the new tip.
    pub fn moved_to(&self, sha: &str) -> Self {
        let mut r = self.clone();
        if r.last() != sha {
            r.tips.push(sha.to_string());
        }
        r
    }
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
    /// The checkpoint, its asker and its question: an answer given by another client (`metash
    /// ui`, `metash resume`, JSON-RPC) is recorded from them as `--answer` records it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<Asked>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Asked {
    pub id: String,
    pub agent: String,
    pub question: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Halt {
    pub reason: HaltReason,
    pub phase: u32,
    #[serde(default)]
    pub failed: Vec<FailedTask>,
    pub message: String,
}

/// Why a session stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HaltReason {
    /// Nothing left to plan: the project is done.
    Complete,
    /// `gapCount` reached its limit.
    GapLimit,
    /// The planner's plans were rejected too often.
    PlanRejected,
    /// A task kept failing past `max_task_attempts`.
    TaskFailed,
    /// No task can run (dependencies failed).
    Blocked,
    /// A merge conflict was not resolved.
    MergeAborted,
    /// metash refused a task's branch (it points at a commit metash did not record) or a tree
    /// (it would put `.meta/`, `.git/`, a new submodule or a link out into the checkout).
    Refused,
    /// A role's spawn needs a consent nobody gave (native execution, refused without a person
    /// to ask): nothing would change by retrying. The message says how to grant it; the next
    /// run tries again on its own.
    ConsentRefused,
    /// Halted for a reason this version does not name (or none recorded).
    #[serde(other)]
    Halted,
}

impl HaltReason {
    pub fn as_str(self) -> &'static str {
        match self {
            HaltReason::Complete => "complete",
            HaltReason::GapLimit => "gap_limit",
            HaltReason::PlanRejected => "plan_rejected",
            HaltReason::TaskFailed => "task_failed",
            HaltReason::Blocked => "blocked",
            HaltReason::MergeAborted => "merge_aborted",
            HaltReason::Refused => "refused",
            HaltReason::ConsentRefused => "consent_refused",
            HaltReason::Halted => "halted",
        }
    }
}

impl std::fmt::Display for HaltReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for HaltReason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
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

    pub fn labels_of(&self, id: &str) -> Vec<String> {
        self.labels.get(id).cloned().unwrap_or_default()
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

    /// Where the task is in the merge queue, if it entered it.
    pub fn queued(&self, id: &str) -> Option<&QueueEntry> {
        self.queue.get(id).and_then(Option::as_ref)
    }

    /// The paths the planner said the task touches (empty: it did not say).
    pub fn paths_of(&self, id: &str) -> Vec<String> {
        self.paths.get(id).cloned().unwrap_or_default()
    }

    /// What metash recorded of the task's branch, if it made one.
    pub fn branch(&self, id: &str) -> Option<&BranchRecord> {
        self.branches.get(id).and_then(Option::as_ref)
    }
}

/// Every bookkeeping entry, by its key under `variables.metash` (the camelCase names of [`Book`]'s
/// fields, plus `rolledBack` and `lastAnswer`, which it reads as raw JSON). A typo no longer compiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Phases,
    NoChange,
    Running,
    Attempts,
    Findings,
    Errors,
    Verified,
    Summaries,
    Merged,
    Decisions,
    PlanAttempts,
    LastRejection,
    ResumeFor,
    Halt,
    /// What a rollback undid, per task: `{commits, at}`.
    RolledBack,
    /// The answer to the orchestrator's own checkpoint (a merge conflict's).
    LastAnswer,
    Labels,
    Branches,
    ContextSeen,
    Queue,
    Paths,
}

impl Entry {
    pub const ALL: [Entry; 21] = [
        Entry::Phases,
        Entry::NoChange,
        Entry::Running,
        Entry::Attempts,
        Entry::Findings,
        Entry::Errors,
        Entry::Verified,
        Entry::Summaries,
        Entry::Merged,
        Entry::Decisions,
        Entry::PlanAttempts,
        Entry::LastRejection,
        Entry::ResumeFor,
        Entry::Halt,
        Entry::RolledBack,
        Entry::LastAnswer,
        Entry::Labels,
        Entry::Branches,
        Entry::ContextSeen,
        Entry::Queue,
        Entry::Paths,
    ];

    /// The key under `variables.metash`.
    pub fn as_str(self) -> &'static str {
        match self {
            Entry::Phases => "phases",
            Entry::NoChange => "noChange",
            Entry::Running => "running",
            Entry::Attempts => "attempts",
            Entry::Findings => "findings",
            Entry::Errors => "errors",
            Entry::Verified => "verified",
            Entry::Summaries => "summaries",
            Entry::Merged => "merged",
            Entry::Decisions => "decisions",
            Entry::PlanAttempts => "planAttempts",
            Entry::LastRejection => "lastRejection",
            Entry::ResumeFor => "resumeFor",
            Entry::Halt => "halt",
            Entry::RolledBack => "rolledBack",
            Entry::LastAnswer => "lastAnswer",
            Entry::Labels => "labels",
            Entry::Branches => "branches",
            Entry::ContextSeen => "contextSeen",
            Entry::Queue => "queue",
            Entry::Paths => "paths",
        }
    }
}

/// The key path of an entry: `variables.metash.halt`.
pub fn key(entry: Entry) -> String {
    format!("variables.{NS}.{}", entry.as_str())
}

/// One `(key, value)` update of a whole entry.
pub fn set(entry: Entry, value: Value) -> (String, Value) {
    (key(entry), value)
}

/// One `(key, value)` update of a task's entry: `set_for(Entry::Running, "02", v)` sets
/// `variables.metash.running.02`.
pub fn set_for(entry: Entry, task: &str, value: Value) -> (String, Value) {
    (format!("{}.{task}", key(entry)), value)
}

/// A task field update: `task_set("02", "status", json!("complete"))`.
pub fn task_set(id: &str, field: &str, value: Value) -> (String, Value) {
    (format!("plan.tasks.{id}.{field}"), value)
}

pub fn null() -> Value {
    json!(null)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entries are exactly the keys the bookkeeping reads (plus the two read raw).
    #[test]
    fn entries_are_the_book_s_keys() {
        let v = serde_json::to_value(Book::default()).unwrap_or_default();
        let mut keys: Vec<&str> = v
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        keys.extend(["rolledBack", "lastAnswer"]);
        keys.sort_unstable();
        let mut names: Vec<&str> = Entry::ALL.iter().map(|e| e.as_str()).collect();
        names.sort_unstable();
        assert_eq!(keys, names);
        assert_eq!(
            set_for(Entry::NoChange, "02", json!(true)).0,
            "variables.metash.noChange.02"
        );
    }
}
