//! `update_state`'s dotted key paths (`variables.retry_count`, `plan.tasks.02.status`) applied to
//! the session as JSON, then validated as a whole against the session schema.
//!
//! Segments address object fields, except right after `plan.tasks`, where a segment is a task
//! `id` (as the seed writes `plan.tasks.02.status`), and inside other arrays, where it is an index.
//! Below `variables` any key may be created; elsewhere only fields the schema knows.

use std::collections::HashSet;

use metash_protocol::SessionState;
use serde_json::{Map, Value};

use crate::error::{Result, StoreError};

/// Fields `update_state` may not touch: they belong to the store.
const RESERVED: &[&str] = &["schema_version", "revision", "sessionId"];

/// Optional fields that may be created although absent: (parent path, field).
const OPTIONAL: &[(&str, &str)] = &[
    ("", "plan"),
    ("", "pendingCheckpoint"),
    ("", "resumeData"),
    ("plan.tasks.*", "commits"),
];

/// The key's segments, refused when one is empty or the first names a field the store keeps.
fn segments(key: &str) -> std::result::Result<Vec<&str>, String> {
    let segs: Vec<&str> = key.split('.').collect();
    if key.is_empty() || segs.iter().any(|s| s.is_empty()) {
        return Err("empty segment".into());
    }
    if RESERVED.contains(&segs[0]) {
        return Err("this field is maintained by the store".into());
    }
    Ok(segs)
}

/// Where `seg` points in a list: a task's position by its id under `plan.tasks`, else a number.
fn list_index(items: &[Value], seg: &str, tasks: bool) -> std::result::Result<usize, String> {
    if tasks {
        items
            .iter()
            .position(|t| t.get("id").and_then(Value::as_str) == Some(seg))
            .ok_or_else(|| format!("no task with id `{seg}`"))
    } else {
        seg.parse()
            .map_err(|_| format!("`{seg}` is not an index into a list"))
    }
}

/// Sets `key` to `value` in `state` (a session as JSON). Does not validate the result.
pub fn apply(state: &mut Value, key: &str, value: Value) -> Result<()> {
    let unknown = |reason: String| StoreError::UnknownKey {
        key: key.to_string(),
        reason,
    };
    let segs = segments(key).map_err(unknown)?;
    let in_variables = segs[0] == "variables";
    let mut node = state;
    let mut shape = String::new(); // path with task ids replaced by `*`, for OPTIONAL
    let last = segs.len() - 1;
    for (i, seg) in segs.iter().enumerate() {
        let parent_is_tasks = shape == "plan.tasks";
        match node {
            Value::Object(map) => {
                if i == last {
                    if !in_variables
                        && !map.contains_key(*seg)
                        && !OPTIONAL.contains(&(&shape, seg))
                    {
                        return Err(unknown(format!("`{seg}` is not a field here")));
                    }
                    map.insert((*seg).to_string(), value);
                    return Ok(());
                }
                if !map.contains_key(*seg) {
                    if in_variables {
                        map.insert((*seg).to_string(), Value::Object(Map::new()));
                    } else {
                        return Err(unknown(format!("`{seg}` is not set")));
                    }
                }
                node = map
                    .get_mut(*seg)
                    .ok_or_else(|| unknown(format!("`{seg}` is not set")))?;
            }
            Value::Array(items) => {
                let idx = list_index(items, seg, parent_is_tasks).map_err(unknown)?;
                if i == last && !parent_is_tasks && idx == items.len() {
                    items.push(value);
                    return Ok(());
                }
                let slot = items
                    .get_mut(idx)
                    .ok_or_else(|| unknown(format!("index {idx} is past the end of the list")))?;
                if i == last {
                    *slot = value;
                    return Ok(());
                }
                node = slot;
                if parent_is_tasks {
                    shape.push_str(".*");
                    continue;
                }
            }
            _ => {
                return Err(unknown(format!(
                    "`{}` is not an object or a list",
                    segs[..i].join(".")
                )))
            }
        }
        if !shape.is_empty() {
            shape.push('.');
        }
        shape.push_str(seg);
    }
    Err(unknown("empty path".into()))
}

/// Deserialises and checks what the schema alone cannot: unique task ids, known dependencies,
/// ids usable in key paths.
pub fn validate(value: Value, key: &str) -> Result<SessionState> {
    let invalid = |reason: String| StoreError::InvalidValue {
        key: key.to_string(),
        reason,
    };
    let state: SessionState = serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
    check_plan(&state).map_err(invalid)?;
    Ok(state)
}

/// The plan's own rules, shared by `update_state` and the loader.
pub fn check_plan(state: &SessionState) -> std::result::Result<(), String> {
    let Some(plan) = &state.plan else {
        return Ok(());
    };
    let mut ids = HashSet::new();
    for t in &plan.tasks {
        if t.id.is_empty() || t.id.contains('.') {
            return Err(format!(
                "task id `{}` must be non-empty and contain no `.`",
                t.id
            ));
        }
        if !ids.insert(t.id.as_str()) {
            return Err(format!("duplicate task id `{}`", t.id));
        }
    }
    for t in &plan.tasks {
        if let Some(d) = t.dependencies.iter().find(|d| !ids.contains(d.as_str())) {
            return Err(format!("task `{}` depends on missing task `{d}`", t.id));
        }
    }
    if plan.current_task_idx as usize > plan.tasks.len() {
        return Err(format!(
            "currentTaskIdx {} is past the {} tasks",
            plan.current_task_idx,
            plan.tasks.len()
        ));
    }
    Ok(())
}

/// Reads a key path with the same addressing as [`apply`].
pub fn get<'a>(state: &'a Value, key: &str) -> Option<&'a Value> {
    let mut node = state;
    let mut prev_is_tasks = false;
    let mut path = String::new();
    for seg in key.split('.') {
        node = match node {
            Value::Object(m) => m.get(seg)?,
            Value::Array(items) if prev_is_tasks => items
                .iter()
                .find(|t| t.get("id").and_then(Value::as_str) == Some(seg))?,
            Value::Array(items) => items.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(seg);
        prev_is_tasks = path == "plan.tasks";
    }
    Some(node)
}
