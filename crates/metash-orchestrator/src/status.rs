//! What `metash status` shows: phase, tasks, gaps, the pending checkpoint, the halt report and the
//! budget used (the host keeps it in `.meta/budget.json`), as one serializable value so the table
//! and `--json` show the same data.

use metash_protocol::{PendingCheckpoint, SessionStatus, TaskStatus};
use metash_store::Store;
use serde::Serialize;
use serde_json::Value;

use crate::book::{Book, Halt, QueueEntry, QueueState};
use crate::config::OrchestratorConfig;
use crate::error::Result;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    pub session_id: String,
    pub status: SessionStatus,
    pub current_phase: u32,
    pub gap_count: u32,
    pub max_gap_retries: u32,
    pub tasks: Vec<TaskRow>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_checkpoint: Option<PendingCheckpoint>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub halt: Option<Halt>,
    /// `.meta/budget.json` as the host wrote it (`{"tokens_used", "cost_usd"}`), when present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<Value>,
    /// Events the host gave up because the log could not be written (`.meta/journal.json`);
    /// absent when none were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events_lost: Option<u64>,
    pub revision: u64,
    /// With the store on PostgreSQL: the workers about, the leases held, the queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<metash_store::pg::lease::Fleet>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRow {
    pub id: String,
    pub title: String,
    pub phase: u32,
    pub status: TaskStatus,
    pub dependencies: Vec<String>,
    pub commits: Vec<String>,
    pub verified: bool,
    pub merged: bool,
    pub running: bool,
    pub attempts: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Where the task is in the merge queue (waiting, updating, resolving, re-verifying,
    /// waiting on a person, landed), with the conflict it resolves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueEntry>,
}

impl TaskRow {
    /// The task's state in a word or two, for a table: running, its place in the merge queue,
    /// merged, verified, or with findings.
    pub fn state_word(&self) -> String {
        let queued = self.queue.as_ref().map(|q| q.state);
        if self.running {
            "running".into()
        } else if let Some(q) = queued.filter(|q| *q != QueueState::Landed && !self.merged) {
            format!("queue: {}", q.as_str())
        } else if self.merged {
            "verified, landed".into()
        } else if self.verified {
            "verified".into()
        } else if !self.findings.is_empty() {
            "findings".into()
        } else {
            "-".into()
        }
    }

    /// The conflict the task's executor (or a person) is resolving, as a line.
    pub fn conflict_line(&self) -> Option<String> {
        let q = self.queue.as_ref()?;
        if !matches!(q.state, QueueState::Resolving | QueueState::WaitingOnPerson) {
            return None;
        }
        let with = if q.with.is_empty() {
            String::new()
        } else {
            format!(" with {}", q.with.join(", "))
        };
        Some(format!(
            "conflict in {}{with}; {} failed resolution(s)",
            q.files.join(", "),
            q.attempts
        ))
    }
}

/// The report for the project of `store`.
///
/// # Errors
/// The session does not load.
pub fn report(store: &Store) -> Result<StatusReport> {
    let state = store.state()?;
    let book = Book::of(&state);
    let config = OrchestratorConfig::load(store.workspace()).unwrap_or_default();
    let live = crate::settle::live_step(store.meta_dir());
    let tasks = state
        .tasks()
        .iter()
        .map(|t| TaskRow {
            id: t.id.clone(),
            title: t.title.clone(),
            phase: book.phase_of(&t.id, state.current_phase),
            status: t.status,
            dependencies: t.dependencies.clone(),
            commits: t.commits.clone().unwrap_or_default(),
            verified: book.is_verified(&t.id),
            merged: book.merged_at(&t.id).is_some(),
            running: book.running.get(&t.id).is_some_and(Option::is_some),
            attempts: book.attempts.get(&t.id).copied().unwrap_or(0),
            findings: book.findings(&t.id).to_vec(),
            last_error: book.last_error(&t.id).map(str::to_string),
            queue: book.queued(&t.id).cloned(),
        })
        .map(|mut row: TaskRow| {
            // The step a live run is at (updating, re-verifying, landing) shows over the record.
            if let (Some(step), Some(q)) = (&live, row.queue.as_mut()) {
                if step.task == row.id && !row.merged {
                    q.state = step.state;
                }
            }
            row
        })
        .collect();
    let budget = match store.read_doc("budget") {
        Ok(Value::Null) | Err(_) => None,
        Ok(v) => Some(v),
    };
    let events_lost = store
        .read_doc(metash_host::JOURNAL_DOC)
        .ok()
        .and_then(|d| d["events_lost"].as_u64())
        .filter(|n| *n > 0);
    Ok(StatusReport {
        session_id: state.session_id.clone(),
        status: state.status,
        current_phase: state.current_phase,
        gap_count: state.gap_count,
        max_gap_retries: config.max_gap_retries,
        tasks,
        pending_checkpoint: state.pending_checkpoint.clone(),
        halt: book.halt,
        budget,
        events_lost,
        revision: state.revision,
        fleet: store.server().and_then(|s| {
            s.db(|db| metash_store::pg::lease::fleet(db, s.project()))
                .ok()
        }),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn row(queue: Option<serde_json::Value>, merged: bool) -> TaskRow {
        TaskRow {
            id: "y".into(),
            title: "Y".into(),
            phase: 1,
            status: TaskStatus::Complete,
            dependencies: vec![],
            commits: vec![],
            verified: true,
            merged,
            running: false,
            attempts: 0,
            findings: vec![],
            last_error: None,
            queue: queue.map(|q| serde_json::from_value(q).unwrap()),
        }
    }

    /// Each queue state is shown until the task lands; a conflict gets its own line.
    #[test]
    fn the_queue_state_and_its_conflict_are_shown() {
        for (state, word) in [
            ("waiting", "queue: waiting"),
            ("updating", "queue: updating"),
            ("resolving", "queue: resolving"),
            ("reverifying", "queue: re-verifying"),
            ("waiting_on_person", "queue: waiting on a person"),
        ] {
            let r = row(Some(serde_json::json!({"state": state})), false);
            assert_eq!(r.state_word(), word);
        }
        let landed = row(Some(serde_json::json!({"state": "landed"})), true);
        assert_eq!(landed.state_word(), "verified, landed");
        assert_eq!(landed.conflict_line(), None);
        let r = row(
            Some(
                serde_json::json!({"state": "resolving", "files": ["a.txt"], "with": ["x"],
                                    "attempts": 1}),
            ),
            false,
        );
        assert_eq!(
            r.conflict_line().as_deref(),
            Some("conflict in a.txt with x; 1 failed resolution(s)")
        );
        assert_eq!(row(None, false).state_word(), "verified");
    }
}
