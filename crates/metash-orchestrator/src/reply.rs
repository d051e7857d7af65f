//! Reading the JSON an agent put in `AgentResponse.data`. Models wrap JSON in prose or in a
//! ```` ```json ```` fence more often than not, so this accepts, in order: the whole text, the last
//! fenced block, the outermost `{...}` (or `[...]`) span.

use serde_json::Value;

/// The JSON value in `data`, or why there is none.
///
/// # Errors
/// A message quoting the start of `data`, for the agent's next prompt.
pub fn extract_json(data: &str) -> Result<Value, String> {
    let text = data.trim();
    if let Ok(v) = serde_json::from_str(text) {
        return Ok(v);
    }
    if let Some(v) = last_fence(text).and_then(|f| serde_json::from_str(f.trim()).ok()) {
        return Ok(v);
    }
    for (open, close) in [('{', '}'), ('[', ']')] {
        if let (Some(start), Some(end)) = (text.find(open), text.rfind(close)) {
            if start < end {
                if let Ok(v) = serde_json::from_str(&text[start..=end]) {
                    return Ok(v);
                }
            }
        }
    }
    let preview: String = text.chars().take(120).collect();
    Err(format!(
        "the reply holds no JSON (it starts with {preview:?})"
    ))
}

/// The body of the last ```` ``` ```` fenced block (any info string).
fn last_fence(text: &str) -> Option<&str> {
    let start = text.rfind("```")?;
    let before = &text[..start];
    let open = before.rfind("```")?;
    let body = &text[open + 3..start];
    // Drop the info string (`json`, `JSON`, ...) on the opening line.
    let body = match body.find('\n') {
        Some(nl) if !body[..nl].trim_start().starts_with(['{', '[']) => &body[nl + 1..],
        _ => body,
    };
    Some(body)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn plain_fenced_and_embedded() {
        assert_eq!(extract_json(r#"{"a":1}"#).unwrap()["a"], 1);
        assert_eq!(
            extract_json("Here is the plan:\n```json\n{\"a\":2}\n```\nDone.").unwrap()["a"],
            2
        );
        assert_eq!(
            extract_json("sure! {\"a\":3} hope it helps").unwrap()["a"],
            3
        );
        assert!(extract_json("no json here").is_err());
    }
}
