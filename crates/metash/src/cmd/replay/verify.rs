//! `metash replay --verify` (issue 36, docs/replay.md): after the executor's turn replays to the
//! identical tree, the verifier's recorded turn of that attempt is replayed against it, and its
//! verdict compared with the one the orchestrator recorded.
//!
//! Which turn and which verdict come from the log, in order: after the executor's `tape` record,
//! the verifier's `tape` records for the task up to the first state update after one of them that
//! sets the task's `verified` entry (the orchestrator's verdict: `variables.metash.verified.<task>`, with its
//! `findings`). The last verifier turn before the verdict is the one the verdict came from (the
//! orchestrator asks again when a verifier errors).

use anyhow::{bail, Context, Result};
use metash_orchestrator::Verdict;
use metash_protocol::{sanitize_line, LogKind, LogRecord};
use metash_store::tape::{Tape, Tapes};
use metash_store::Store;
use serde_json::Value;

/// The verifier's recorded turn for an executor tape, and the verdict recorded after it.
pub(super) struct RecordedCheck {
    pub tape: Tape,
    pub verdict: Verdict,
}

/// The verifier's recorded turn after executor tape `executor_tape` of `task`, and the verdict
/// the orchestrator recorded from it.
///
/// # Errors
/// No verifier turn was recorded for that attempt (not run, recording off, its tape removed), or
/// no verdict followed it.
pub(super) fn recorded_check(
    store: &Store,
    task: &str,
    verifier: &str,
    executor_tape: &str,
) -> Result<RecordedCheck> {
    let records = store.log().read_all()?;
    let start = records
        .iter()
        .position(|r| is_tape(r, executor_tape))
        .with_context(|| {
            format!(
                "the log has no `tape` record for {}: cannot tell which verifier turn followed it",
                sanitize_line(executor_tape)
            )
        })?;
    let mut turn: Option<String> = None;
    let mut verdict = None;
    for r in &records[start + 1..] {
        if r.kind == LogKind::Tape && r.data["task"].as_str() == Some(task) {
            if r.agent.as_deref() == Some(verifier) {
                turn = r.data["id"].as_str().map(str::to_string);
            } else if r.data["id"].as_str().is_some() && turn.is_none() {
                // Another turn of the task (the next attempt's executor) before any verifier.
                break;
            }
        }
        // Only after a verifier's turn: the task's completion resets the entry to false first.
        if let Some(v) = turn.as_ref().and_then(|_| verdict_in(r, task)) {
            verdict = Some(v);
            break;
        }
    }
    let which = format!("task {task} after {}", sanitize_line(executor_tape));
    let Some(id) = turn else {
        bail!(
            "no recorded turn of the verifier `{}` for {which} (the verifier did not run, or its \
             turn was not recorded): nothing to replay with --verify",
            sanitize_line(verifier)
        );
    };
    let tape = Tapes::new(store).get(&id).with_context(|| {
        format!(
            "the verifier's tape {} for {which} cannot be read (removed by `metash gc`?)",
            sanitize_line(&id)
        )
    })?;
    let verdict = verdict.with_context(|| {
        format!("no verdict was recorded after the verifier's turn for {which}")
    })?;
    if tape.spawn.is_none() {
        bail!(
            "the verifier's tape {} was recorded before tapes kept the turn's prompt",
            sanitize_line(&id)
        );
    }
    Ok(RecordedCheck { tape, verdict })
}

fn is_tape(r: &LogRecord, id: &str) -> bool {
    r.kind == LogKind::Tape && r.data["id"].as_str() == Some(id)
}

/// The verdict a state update records for `task`: its `verified` entry and `findings`.
fn verdict_in(r: &LogRecord, task: &str) -> Option<Verdict> {
    if r.kind != LogKind::StateUpdate {
        return None;
    }
    let updates: Vec<(&str, &Value)> = match r.data.get("updates").and_then(Value::as_array) {
        Some(many) => many
            .iter()
            .filter_map(|u| Some((u["key"].as_str()?, &u["value"])))
            .collect(),
        None => vec![(r.data["key"].as_str()?, &r.data["value"])],
    };
    let value = |entry: &str| {
        let key = format!(
            "{}.{task}",
            metash_orchestrator::book::key(entry_of(entry)?)
        );
        updates.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    };
    let pass = value("verified")?.as_bool()?;
    let findings = match value("findings") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_string))
            .collect(),
        _ => Vec::new(),
    };
    Some(Verdict { pass, findings })
}

fn entry_of(name: &str) -> Option<metash_orchestrator::book::Entry> {
    use metash_orchestrator::book::Entry;
    match name {
        "verified" => Some(Entry::Verified),
        "findings" => Some(Entry::Findings),
        _ => None,
    }
}

/// Whether the replayed verdict is the recorded one: the same pass, and on a failure the same
/// findings (a pass records none).
pub(super) fn same_verdict(recorded: &Verdict, replayed: &Verdict) -> bool {
    recorded.pass == replayed.pass && (recorded.pass || recorded.findings == replayed.findings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn update(data: Value) -> LogRecord {
        serde_json::from_value(
            json!({"seq": 1, "ts": "", "kind": "state_update", "data": data,
                                      "prev": "", "hash": ""}),
        )
        .expect("record")
    }

    #[test]
    fn a_pass_and_a_gap_are_read_from_state_updates() {
        let pass = update(json!({"updates": [
            {"key": "variables.metash.verified.a", "value": true},
            {"key": "variables.metash.findings.a", "value": null}]}));
        assert_eq!(
            verdict_in(&pass, "a"),
            Some(Verdict {
                pass: true,
                findings: vec![]
            })
        );
        assert_eq!(verdict_in(&pass, "b"), None);
        let gap = update(json!({"updates": [
            {"key": "variables.metash.verified.a", "value": false},
            {"key": "variables.metash.findings.a", "value": ["no test"]}]}));
        let v = verdict_in(&gap, "a").expect("a verdict");
        assert!(!v.pass);
        assert_eq!(v.findings, vec!["no test".to_string()]);
        let one = update(json!({"key": "variables.metash.verified.a", "value": true}));
        assert!(verdict_in(&one, "a").is_some_and(|v| v.pass));
    }
}
