//! One prompt in `turn` mode (the default): the prompt's text becomes one task of the session's
//! current phase (`turn-N`, titled with the prompt; `metash_orchestrator::turn::add_turn`), and
//! `metash run --max-phases 1` runs it as the loop runs any task: the project's executor role in
//! a fresh task worktree, the verifier, the merge queue, a commit on the project's branch. No
//! planner turn: the phase has its task. What streams (plan, progress, spawns, merges, findings,
//! consent questions, checkpoints) is what run mode streams, through the same follower.
//!
//! A checkpoint that already waits is asked first, and what it holds up finished, before the
//! task is added ([`answer_waiting`]).
//!
//! Stop reasons: `end_turn` once the task merged (or a checkpoint was left for later);
//! `refusal` when the run halted (the verifier rejected it past the retries, its executor
//! failed); `cancelled` after `session/cancel`. A turn that did not land is withdrawn (`withdraw_turn`: its worktree and
//! branch removed, the task out of the plan), so the next prompt starts clean.
//!
//! Each turn's executor starts a new conversation: a new task, as every task's executor does; no
//! continuation key is carried from one prompt to the next. Follow-ups see the earlier turns as
//! completed tasks in the plan their prompt lists, and their work in the project's files.

use std::sync::Arc;

use anyhow::Result;
use metash_harness::acp::wire::StopReason;
use metash_orchestrator::turn::{add_turn, withdraw_turn};
use metash_orchestrator::OrchestratorError;
use metash_store::Store;
use serde_json::Value;

use super::conn::{Config, Conn, Session};
use super::follow::Follower;
use super::prompt::{self, say, Drove};

/// The run of a turn: the phase that holds the task, no further.
const MAX_ONE_PHASE: &[&str] = &["--max-phases", "1"];

/// Runs the prompt as one task: added, run until it lands or stops, withdrawn if it did not land.
pub(super) fn run(
    conn: &Arc<Conn>,
    config: &Config,
    session: &Session,
    params: &Value,
) -> Result<StopReason> {
    session.cancel.reset();
    let goal = goal_of(params)
        .ok_or_else(|| anyhow::anyhow!("the prompt holds no text to make a task of"))?;
    super::follow::use_linked_context(conn, session, params);
    let store = Store::open(&session.cwd)?;
    let follower = Follower::start(Arc::clone(conn), session)?;
    // Before the task is added: a session halted for a reason a retry addresses is retried.
    let mut retry = prompt::halted(session);
    if store.state()?.pending_checkpoint.is_some() {
        let first = answer_waiting(conn, config, session, &follower, retry);
        if !matches!(first, Ok(None)) {
            follower.stop();
            return first.map(|stop| stop.unwrap_or(StopReason::EndTurn));
        }
        retry = false;
    }
    let task = match add_turn(&store, &goal) {
        Ok(t) => t,
        Err(OrchestratorError::Refused(why)) => {
            follower.stop();
            say(conn, session, &format!("No turn: {why}\n"));
            return Ok(StopReason::Refusal);
        }
        Err(e) => {
            follower.stop();
            return Err(e.into());
        }
    };
    let drove = prompt::drive(conn, config, session, &follower, MAX_ONE_PHASE, retry);
    follower.catch_up();
    let stop = match drove {
        Ok(Drove::Later) => StopReason::EndTurn,
        Ok(Drove::Cancelled) => {
            withdraw(conn, session, &store, &task.id);
            StopReason::Cancelled
        }
        Ok(Drove::Outcome(outcome)) => ended(conn, session, &store, &task.id, &outcome),
        Err(e) => {
            // The run did not start (or its answer was unreadable): the task is not left behind.
            withdraw(conn, session, &store, &task.id);
            follower.stop();
            return Err(e);
        }
    };
    follower.stop();
    Ok(stop)
}

/// A checkpoint waits (an earlier turn's, left for later, or a `run`-mode one): its answer
/// belongs to the agent that asked, so it is asked first and what it holds up is finished
/// (`--max-phases 1`) before this prompt's task is added. `None` when that landed and the turn
/// goes on; else how the prompt stops (left for later again, cancelled, halted).
fn answer_waiting(
    conn: &Conn,
    config: &Config,
    session: &Session,
    follower: &Follower,
    retry: bool,
) -> Result<Option<StopReason>> {
    say(
        conn,
        session,
        "A checkpoint waits: it is asked first, and what it holds up lands before this prompt's \
         task.\n",
    );
    let drove = prompt::drive(conn, config, session, follower, MAX_ONE_PHASE, retry)?;
    follower.catch_up();
    Ok(match drove {
        Drove::Later => Some(StopReason::EndTurn),
        Drove::Cancelled => Some(StopReason::Cancelled),
        Drove::Outcome(o) if o.get("outcome").and_then(Value::as_str) == Some("halted") => {
            say(conn, session, &prompt::halt_text(&o));
            Some(StopReason::Refusal)
        }
        Drove::Outcome(_) => None,
    })
}

/// The stop reason of a run that ended without a checkpoint: the task merged, or it did not.
fn ended(conn: &Conn, session: &Session, store: &Store, id: &str, outcome: &Value) -> StopReason {
    let merged = metash_orchestrator::report(store)
        .ok()
        .and_then(|r| r.tasks.into_iter().find(|t| t.id == id))
        .filter(|t| t.merged);
    if let Some(t) = merged {
        let commit: String = t
            .commits
            .last()
            .map_or("", String::as_str)
            .chars()
            .take(10)
            .collect();
        say(
            conn,
            session,
            &format!("Task {id} landed: verified and merged ({commit}).\n"),
        );
        return StopReason::EndTurn;
    }
    if outcome.get("outcome").and_then(Value::as_str) == Some("halted") {
        say(conn, session, &prompt::halt_text(outcome));
    } else {
        say(conn, session, &format!("Task {id} did not land.\n"));
    }
    withdraw(conn, session, store, id);
    StopReason::Refusal
}

/// Takes a task that did not land out of the session, saying what became of it.
fn withdraw(conn: &Conn, session: &Session, store: &Store, id: &str) {
    let text = match withdraw_turn(store, id) {
        Ok(true) => format!("Task {id} was withdrawn: its work is discarded.\n"),
        Ok(false) => format!("Task {id} stays: the next run lands it.\n"),
        Err(e) => format!("Task {id} could not be withdrawn: {e}\n"),
    };
    say(conn, session, &text);
}

/// The task's title: the prompt's text blocks, then the resources it links or embeds, by URI
/// (their contents are the project's files, which the executor reads in its worktree). `None`
/// when that is empty.
fn goal_of(params: &Value) -> Option<String> {
    let blocks = params.get("prompt")?.as_array()?;
    let mut lines = Vec::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => lines.extend(b.get("text").and_then(Value::as_str)),
            Some("resource_link") => lines.extend(b.get("uri").and_then(Value::as_str)),
            Some("resource") => lines.extend(b.pointer("/resource/uri").and_then(Value::as_str)),
            _ => {}
        }
    }
    let goal = lines.join("\n").trim().to_string();
    (!goal.is_empty()).then_some(goal)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn the_goal_is_the_prompt_s_text_and_links() {
        let p = json!({"prompt": [
            {"type": "text", "text": "Add a farewell."},
            {"type": "resource_link", "name": "a", "uri": "file:///p/a.txt"},
            {"type": "image", "data": ""}
        ]});
        assert_eq!(
            super::goal_of(&p).as_deref(),
            Some("Add a farewell.\nfile:///p/a.txt")
        );
        assert_eq!(
            super::goal_of(&json!({"prompt": [{"type": "text", "text": " "}]})),
            None
        );
    }
}
