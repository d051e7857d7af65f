//! The merge queue on the run page (issue 33): each verified task's place in it (waiting,
//! updating, resolving, re-verifying, waiting on a person, landed), and for a conflict its files,
//! the tasks it conflicts with and the failed resolutions. Read from the orchestrator's
//! bookkeeping (`variables.metash.queue`); everything shown is escaped.

use std::fmt::Write as _;
use std::path::Path;

use metash_orchestrator::book::{Book, QueueEntry, QueueState};
use metash_protocol::SessionState;

use crate::html::esc;

/// The "Merge queue" section of `run`'s page.
pub fn of(run: &crate::model::Run) -> String {
    section(&run.state, &run.root.join(".meta"))
}

/// The "Merge queue" section of the run page for the project whose `.meta` is `meta`; empty while
/// no task is queued. The step a live `metash run` is at (updating, re-verifying) shows over the
/// recorded state.
pub fn section(state: &SessionState, meta: &Path) -> String {
    let book = Book::of(state);
    let live = metash_orchestrator::settle::live_step(meta);
    let rows: Vec<(&str, QueueEntry)> = state
        .tasks()
        .iter()
        .filter_map(|t| {
            let mut q = book.queued(&t.id)?.clone();
            if let Some(step) = live.as_ref().filter(|s| s.task == t.id) {
                if book.merged_at(&t.id).is_none() {
                    q.state = step.state;
                }
            }
            Some((t.id.as_str(), q))
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut b = String::from(
        "<h2>Merge queue</h2><table class=\"queue\"><tr><th>task</th><th>state</th>\
         <th>conflict</th></tr>",
    );
    for (id, q) in rows {
        let conflict = if matches!(q.state, QueueState::Resolving | QueueState::WaitingOnPerson)
            || !q.files.is_empty()
        {
            format!(
                "{}{}; {} failed resolution(s){}",
                esc(&q.files.join(", ")),
                if q.with.is_empty() {
                    String::new()
                } else {
                    format!(" with {}", esc(&q.with.join(", ")))
                },
                q.attempts,
                q.why
                    .last()
                    .map(|w| format!(": {}", esc(w)))
                    .unwrap_or_default()
            )
        } else {
            String::new()
        };
        let _ = write!(
            b,
            "<tr class=\"queue-{cls}\" data-task=\"{id}\"><td>{id}</td><td>{state}</td>\
             <td>{conflict}</td></tr>",
            cls = q.state.as_str().replace(' ', "-"),
            id = esc(id),
            state = esc(q.state.as_str()),
        );
    }
    b.push_str("</table>");
    b
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn shows_each_state_and_escapes_the_conflict() {
        let mut state = SessionState::new("s");
        state.plan = Some(
            serde_json::from_value(serde_json::json!({"tasks": [
                {"id": "x", "title": "X", "status": "complete", "dependencies": []},
                {"id": "y", "title": "Y", "status": "complete", "dependencies": []}
            ], "currentTaskIdx": 2}))
            .unwrap(),
        );
        let meta = Path::new("/nonexistent/.meta");
        assert_eq!(section(&state, meta), "");
        state.variables.insert(
            "metash".into(),
            serde_json::json!({"queue": {
                "x": {"state": "landed"},
                "y": {"state": "resolving", "files": ["<a>.txt"], "with": ["x"], "attempts": 1,
                      "why": ["markers left"]}
            }}),
        );
        let html = section(&state, meta);
        assert!(html.contains("<td>landed</td>"), "{html}");
        assert!(html.contains("<td>resolving</td>"), "{html}");
        assert!(
            html.contains("&lt;a&gt;.txt with x; 1 failed resolution(s): markers left"),
            "{html}"
        );
        assert!(!html.contains("<a>"), "{html}");
    }
}
