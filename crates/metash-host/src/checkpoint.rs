//! Checkpoints (seed 000 section 2): persisted before they are shown, answered once, delivered to
//! the next spawn exactly once.

use metash_protocol::{CheckpointSignal, PendingCheckpoint, ResumeData};
use metash_store::{Store, StoreError};
use serde_json::{json, Value};

use crate::error::{HostError, Result};

/// The id of the host's own budget checkpoint. Its answer is not an agent's business: `continue`
/// sets `variables.metash.budget_continue`, which lets exactly one spawn past the budget, and any
/// agent answer still waiting in `resumeData` is left alone.
pub const BUDGET_CHECKPOINT: &str = "metash-budget";

/// Where the budget answer waits for the spawn it lets through.
pub const BUDGET_CONTINUE_KEY: &str = "variables.metash.budget_continue";

/// Records `signal` as the pending checkpoint. It is durable when this returns, so a host killed
/// while waiting for the answer finds it again.
///
/// # Errors
/// Another checkpoint is already pending (it must be answered first), or the store failed.
pub fn raise(store: &Store, agent: &str, signal: &CheckpointSignal) -> Result<PendingCheckpoint> {
    let mut raised = None;
    store.transact(Some(agent), |state| {
        if let Some(p) = &state.pending_checkpoint {
            return Err(StoreError::Rejected(format!(
                "checkpoint `{}` is still pending; answer it first (metash resume --answer ...)",
                p.id
            )));
        }
        let id = signal
            .resume_id
            .clone()
            .unwrap_or_else(|| format!("cp-{}-{}", state.revision + 1, &uuid_fragment()));
        let pending = PendingCheckpoint {
            id,
            agent: agent.to_string(),
            raised_at: chrono_now(),
            signal: signal.clone(),
        };
        let value =
            serde_json::to_value(&pending).map_err(|e| StoreError::Rejected(e.to_string()))?;
        raised = Some(pending);
        Ok(vec![("pendingCheckpoint".to_string(), value)])
    })?;
    raised.ok_or_else(|| HostError::Other("checkpoint was not recorded".into()))
}

/// Answers the pending checkpoint (`id` must match it when given). With options, the answer must be
/// one of them (case-insensitive) or its 1-based number; without, any non-empty text.
///
/// # Errors
/// No checkpoint pending, a different one pending, or an answer that is not an option.
pub fn answer(store: &Store, id: Option<&str>, input: &str) -> Result<ResumeData> {
    let mut delivered = None;
    store.transact(Some("user"), |state| {
        let Some(pending) = &state.pending_checkpoint else {
            return Err(StoreError::Rejected(match id {
                Some(id) => format!("checkpoint `{id}` is not pending (no checkpoint is pending)"),
                None => "no checkpoint is pending".to_string(),
            }));
        };
        if let Some(id) = id {
            if id != pending.id {
                return Err(StoreError::Rejected(format!(
                    "checkpoint `{id}` is not pending (the pending one is `{}`)",
                    pending.id
                )));
            }
        }
        let user_input = resolve_option(&pending.signal, input).map_err(StoreError::Rejected)?;
        let data = ResumeData {
            checkpoint_id: pending.id.clone(),
            user_input,
        };
        let value = serde_json::to_value(&data).map_err(|e| StoreError::Rejected(e.to_string()))?;
        let handoff = if pending.id == BUDGET_CHECKPOINT {
            (
                BUDGET_CONTINUE_KEY.to_string(),
                Value::Bool(data.user_input == "continue"),
            )
        } else {
            ("resumeData".to_string(), value)
        };
        delivered = Some(data);
        Ok(vec![
            ("pendingCheckpoint".to_string(), Value::Null),
            handoff,
        ])
    })?;
    delivered.ok_or_else(|| HostError::Other("answer was not recorded".into()))
}

/// Takes the answered checkpoint for the spawn about to start, clearing it in the same update so
/// no later spawn sees it again.
pub fn take_resume(store: &Store, agent: &str) -> Result<Option<ResumeData>> {
    // Nearly always nothing waits: a plain read avoids taking the lock for nothing.
    if store.state()?.resume_data.is_none() {
        return Ok(None);
    }
    let mut taken = None;
    store.transact(Some(agent), |state| match &state.resume_data {
        Some(r) => {
            taken = Some(r.clone());
            Ok(vec![("resumeData".to_string(), Value::Null)])
        }
        None => Ok(vec![]),
    })?;
    Ok(taken)
}

fn resolve_option(signal: &CheckpointSignal, input: &str) -> std::result::Result<String, String> {
    let input = input.trim();
    if signal.options.is_empty() {
        if input.is_empty() {
            return Err("the answer is empty".into());
        }
        return Ok(input.to_string());
    }
    if let Some(o) = signal
        .options
        .iter()
        .find(|o| o.eq_ignore_ascii_case(input))
    {
        return Ok(o.clone());
    }
    if let Ok(n) = input.parse::<usize>() {
        if let Some(o) = n.checked_sub(1).and_then(|i| signal.options.get(i)) {
            return Ok(o.clone());
        }
    }
    Err(format!(
        "`{input}` is not one of the options: {}",
        json!(signal.options)
    ))
}

fn chrono_now() -> String {
    metash_store::log::now()
}

fn uuid_fragment() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_string()
}

/// Consumes a `continue` answer to the budget checkpoint, if one is waiting.
pub fn take_budget_continue(store: &Store) -> Result<bool> {
    let waiting = |state: &metash_protocol::SessionState| {
        state
            .variables
            .get("metash")
            .and_then(|m| m.get("budget_continue"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    if !waiting(&store.state()?) {
        return Ok(false);
    }
    let mut allowed = false;
    store.transact(Some("host"), |state| {
        if waiting(state) {
            allowed = true;
            Ok(vec![(BUDGET_CONTINUE_KEY.to_string(), Value::Bool(false))])
        } else {
            Ok(vec![])
        }
    })?;
    Ok(allowed)
}
