//! serde's error messages in the words a caller of metash reads: `must be a string, got number 5`
//! rather than ``invalid type: integer `5`, expected a string``. serde's messages are a small,
//! stable set (`serde::de::Error`'s provided methods); anything else, such as our own
//! `must not be empty`, passes through as it is.

use serde_json::Value;

use super::ParamError;

/// The error for a decode failure at `path` (serde_path_to_error's dotted path, `.` for the
/// top level) with serde's `message`; `root` is the whole request, to show the value refused.
pub(super) fn param_error(root: &Value, path: &str, message: &str) -> ParamError {
    let path = if path == "." { "" } else { path };
    let at = |name: &str| join(path, name);
    if let Some(rest) = message.strip_prefix("missing field ") {
        return ParamError::new(at(first_ticked(rest)), "is required");
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let mut names = ticked(rest).into_iter();
        let field = names.next().unwrap_or_default();
        let known: Vec<&str> = names.collect();
        // serde_path_to_error's path may already end at the unknown key (inside a nested
        // object it does); name it once.
        let already = path == field || path.ends_with(&format!(".{field}"));
        return ParamError::new(
            if already { path.to_string() } else { at(field) },
            format!(
                "is not a known parameter (expected one of: {})",
                known.join(", ")
            ),
        );
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let mut names = ticked(rest).into_iter();
        let got = names.next().unwrap_or_default();
        let choices: Vec<String> = names.map(|n| format!("\"{n}\"")).collect();
        return ParamError::new(
            field_or_params(path),
            format!("must be one of {}, got \"{got}\"", choices.join(", ")),
        );
    }
    let invalid = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "));
    if let Some((unexpected, expected)) = invalid.and_then(|r| r.rsplit_once(", expected ")) {
        let got = lookup(root, path).map_or_else(|| unexpected.to_string(), describe);
        return ParamError::new(
            field_or_params(path),
            format!("must be {}, got {got}", expectation(expected)),
        );
    }
    ParamError::new(field_or_params(path), message)
}

/// serde's name for what it wanted, as the protocol's docs say it.
fn expectation(expected: &str) -> &str {
    match expected {
        // The host's only floating-point parameters are durations and amounts: never negative.
        "f64" | "f32" => "a number >= 0",
        "u64" | "u32" | "usize" => "a non-negative integer",
        e if e.starts_with("struct ") || e == "a map" => "an object",
        e => e,
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn field_or_params(path: &str) -> &str {
    if path.is_empty() {
        "params"
    } else {
        path
    }
}

/// The names serde quotes in backticks, in order.
fn ticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

fn first_ticked(text: &str) -> &str {
    ticked(text).first().copied().unwrap_or(text)
}

/// The value at a dotted path of the request, to show what was refused.
fn lookup<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .filter(|s| !s.is_empty())
        .try_fold(root, |v, key| v.get(key))
}

/// A short description of a JSON value for error messages: its type and, when small, itself.
pub(super) fn describe(v: &Value) -> String {
    let kind = match v {
        Value::Null => return "null".into(),
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => return "an array".into(),
        Value::Object(_) => return "an object".into(),
    };
    let text = v.to_string();
    if text.len() <= 40 {
        format!("{kind} {text}")
    } else {
        kind.to_string()
    }
}
