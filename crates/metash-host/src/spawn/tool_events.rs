//! A model turn's tool calls as people read them in the log: one `tool_call` line per call (the
//! tool and a short summary of its arguments) and one `tool_result` line per result (its status
//! and size), in place of the raw harness events, whose arguments and outputs can be megabytes.

use metash_protocol::HarnessEvent;
use metash_protocol::LogKind;
use serde_json::{json, Value};

/// How much of a call's arguments or a result's output the log keeps.
const SUMMARY_CHARS: usize = 200;

/// The log kind and data for a tool event; `None` for every other event.
pub fn summarize(event: &HarnessEvent) -> Option<(LogKind, Value)> {
    match event {
        HarnessEvent::ToolCall { call } => Some((
            LogKind::ToolCall,
            json!({"id": call.id, "tool": call.name, "args": clip(&call.input.to_string())}),
        )),
        HarnessEvent::ToolResult {
            id,
            output,
            is_error,
        } => Some((
            LogKind::ToolResult,
            json!({"id": id, "status": if *is_error { "error" } else { "ok" },
                   "output_bytes": output.len(), "output": clip(output)}),
        )),
        _ => None,
    }
}

pub(super) fn clip(s: &str) -> String {
    match s.char_indices().nth(SUMMARY_CHARS) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use metash_protocol::ToolCall;

    #[test]
    fn calls_and_results_are_summarized() {
        let call = HarnessEvent::ToolCall {
            call: ToolCall {
                id: "t1".into(),
                name: "Bash".into(),
                input: json!({"command": "é".repeat(500)}),
            },
        };
        let (kind, data) = summarize(&call).unwrap();
        assert_eq!(kind, "tool_call");
        assert_eq!(data["tool"], "Bash");
        assert_eq!(
            data["args"].as_str().unwrap().chars().count(),
            SUMMARY_CHARS + 1
        );
        let res = HarnessEvent::ToolResult {
            id: "t1".into(),
            output: "denied".into(),
            is_error: true,
        };
        let (kind, data) = summarize(&res).unwrap();
        assert_eq!(
            (kind, data["status"].as_str()),
            (LogKind::ToolResult, Some("error"))
        );
        assert_eq!(data["output_bytes"], 6);
        assert!(summarize(&HarnessEvent::TextDelta { text: "x".into() }).is_none());
    }
}
