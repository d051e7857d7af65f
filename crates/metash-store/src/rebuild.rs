//! Recreating session.json from the log alone: fold `state_update` events over `session_init`.

use std::path::Path;

use metash_protocol::LogKind;

use metash_protocol::{LogRecord, SessionState};
use serde_json::Value;

use crate::error::{Result, StoreError};
use crate::keypath;
use crate::log::EventLog;

/// Applies one state event to the session document.
pub fn fold(doc: &mut Value, rec: &LogRecord, log: &Path) -> Result<()> {
    let broken = |reason: String| StoreError::BrokenLog {
        path: log.to_path_buf(),
        seq: rec.seq,
        reason,
    };
    match rec.kind {
        LogKind::SessionInit => *doc = rec.data.clone(),
        LogKind::StateUpdate => {
            if let Some(updates) = rec.data.get("updates").and_then(Value::as_array) {
                for u in updates {
                    apply_one(doc, u).map_err(broken)?;
                }
            } else {
                apply_one(doc, &rec.data).map_err(broken)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// One `{key, value}` of a state_update event.
fn apply_one(doc: &mut Value, update: &Value) -> std::result::Result<(), String> {
    let key = update
        .get("key")
        .and_then(Value::as_str)
        .ok_or("state_update without a key")?;
    let value = update.get("value").cloned().unwrap_or(Value::Null);
    keypath::apply(doc, key, value).map_err(|e| e.to_string())
}

/// Folds every state event with `seq <= until`.
pub fn from_log(log: &EventLog, until: u64) -> Result<SessionState> {
    let mut doc = Value::Null;
    let mut revision = 0;
    log.for_each(|rec| {
        if rec.seq <= until
            && (rec.kind == LogKind::SessionInit || rec.kind == LogKind::StateUpdate)
        {
            fold(&mut doc, &rec, log.path())?;
            revision = rec.seq;
        }
        Ok(())
    })?;
    if doc.is_null() {
        return Err(StoreError::BrokenLog {
            path: log.path().to_path_buf(),
            seq: 1,
            reason: "the log has no session_init event".into(),
        });
    }
    let mut state: SessionState =
        serde_json::from_value(doc).map_err(|e| StoreError::BrokenLog {
            path: log.path().to_path_buf(),
            seq: revision,
            reason: format!("folded state does not match the schema: {e}"),
        })?;
    state.revision = revision;
    Ok(state)
}
