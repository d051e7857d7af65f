//! An ACP agent's `session/update`s as metash's events, and what a permission request is about.
//! No I/O: [`Mapper`] keeps the tool calls it has seen so each becomes exactly one `tool_call`
//! event and one `tool_result` event, however many updates the agent sends for it.

use std::collections::HashMap;

use serde_json::Value;

use super::wire::{PlanEntry, RequestPermission, SessionUpdate, ToolCallFields, ToolKind};
use super::wire::{StopReason, ToolStatus};

/// What an ACP turn streams to metash (a closed set; the host writes each to its log).
#[derive(Debug, Clone, PartialEq)]
pub enum AcpEvent {
    /// The agent's answer, a chunk at a time.
    Text { text: String },
    /// The agent's reasoning, a chunk at a time (not part of the answer).
    Thought { text: String },
    /// A tool call started (its first update).
    ToolCall {
        id: String,
        kind: ToolKind,
        title: String,
        input: Value,
    },
    /// A tool call ended (`completed` or `failed`), with what it produced as text.
    ToolResult {
        id: String,
        kind: ToolKind,
        title: String,
        status: ToolStatus,
        output: String,
    },
    /// The agent's plan, whole (each update replaces the last).
    Plan { entries: Vec<PlanEntry> },
    /// A permission request and metash's answer.
    Permission {
        tool_call_id: String,
        kind: ToolKind,
        title: String,
        allowed: bool,
        option_id: Option<String>,
    },
    /// The turn's ACP session is open: `loaded` when it is the one the continuation key named
    /// (`session/load`), else new; `fallback` says why a key given was not continued (the agent
    /// cannot load sessions, refused the load, or the key is another provider's).
    Session {
        id: String,
        loaded: bool,
        fallback: Option<String>,
    },
    /// The prompt turn ended.
    Stopped { reason: StopReason },
}

/// The tool calls of one session as far as the updates told.
#[derive(Debug, Default)]
pub struct Mapper {
    calls: HashMap<String, Call>,
}

#[derive(Debug, Default)]
struct Call {
    kind: Option<ToolKind>,
    title: Option<String>,
    input: Option<Value>,
    started: bool,
    ended: bool,
}

impl Call {
    fn merge(&mut self, f: &ToolCallFields) {
        if f.kind.is_some() {
            self.kind = f.kind;
        }
        if let Some(t) = &f.title {
            self.title = Some(t.clone());
        }
        if let Some(i) = &f.raw_input {
            self.input = Some(i.clone());
        }
    }

    fn kind(&self) -> ToolKind {
        self.kind
            .or_else(|| self.input.as_ref().map(infer_kind))
            .unwrap_or(ToolKind::Other)
    }

    fn title(&self) -> String {
        self.title.clone().unwrap_or_default()
    }
}

impl Mapper {
    /// The events one update makes.
    pub fn update(&mut self, update: SessionUpdate) -> Vec<AcpEvent> {
        match update {
            SessionUpdate::AgentMessageChunk { content } => text_of(&content)
                .map(|text| vec![AcpEvent::Text { text }])
                .unwrap_or_default(),
            SessionUpdate::AgentThoughtChunk { content } => text_of(&content)
                .map(|text| vec![AcpEvent::Thought { text }])
                .unwrap_or_default(),
            SessionUpdate::ToolCall(f) | SessionUpdate::ToolCallUpdate(f) => self.tool(&f),
            SessionUpdate::Plan { entries } => vec![AcpEvent::Plan { entries }],
            SessionUpdate::Other => Vec::new(),
        }
    }

    fn tool(&mut self, f: &ToolCallFields) -> Vec<AcpEvent> {
        let call = self.calls.entry(f.tool_call_id.clone()).or_default();
        call.merge(f);
        let mut out = Vec::new();
        // An agent may announce a call before its input is known (a streamed tool use starts
        // empty): the line waits for the input, the call running, or its end.
        let known = call.input.as_ref().is_some_and(|i| {
            !(i.is_null() || i.as_object().is_some_and(serde_json::Map::is_empty))
        }) || f.status.is_some_and(|s| s != ToolStatus::Pending);
        if !call.started && known {
            call.started = true;
            out.push(AcpEvent::ToolCall {
                id: f.tool_call_id.clone(),
                kind: call.kind(),
                title: call.title(),
                input: call.input.clone().unwrap_or(Value::Null),
            });
        }
        if let Some(status) = f.status.filter(|s| s.is_final()) {
            if !call.ended {
                call.ended = true;
                out.push(AcpEvent::ToolResult {
                    id: f.tool_call_id.clone(),
                    kind: call.kind(),
                    title: call.title(),
                    status,
                    output: output_text(f),
                });
            }
        }
        out
    }

    /// What a permission request is about: its tool call merged with what earlier updates said
    /// of the same call (an agent may send the kind only in the `tool_call` update).
    pub fn subject(&self, req: &RequestPermission) -> Subject {
        let mut call = Call::default();
        if let Some(known) = self.calls.get(&req.tool_call.tool_call_id) {
            call.kind = known.kind;
            call.title.clone_from(&known.title);
            call.input.clone_from(&known.input);
        }
        call.merge(&req.tool_call);
        let input = call.input.clone().unwrap_or(Value::Null);
        let s = |k: &str| input[k].as_str().map(str::to_string);
        let path = req
            .tool_call
            .locations
            .as_ref()
            .and_then(|l| l.first())
            .map(|l| l.path.clone())
            .or_else(|| s("file_path"))
            .or_else(|| s("path"))
            .or_else(|| s("notebook_path"));
        Subject {
            tool_call_id: req.tool_call.tool_call_id.clone(),
            kind: call.kind(),
            title: call.title(),
            path,
            command: s("command").or_else(|| s("cmd")),
            url: s("url"),
        }
    }
}

/// What a permission request asks to do, for the host to turn into a capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub tool_call_id: String,
    pub kind: ToolKind,
    pub title: String,
    /// The file it touches (its first location, else the input's `file_path`/`path`).
    pub path: Option<String>,
    /// The command it runs (`command`/`cmd` of its input).
    pub command: Option<String>,
    /// The URL it fetches.
    pub url: Option<String>,
}

/// A kind for a call the agent did not classify, from its input's shape: a command runs, a
/// URL fetches, a file with new text edits, a file alone reads; anything else is `other`.
pub fn infer_kind(input: &Value) -> ToolKind {
    let has = |k: &str| input.get(k).is_some_and(|v| !v.is_null());
    if has("command") || has("cmd") {
        ToolKind::Execute
    } else if has("url") {
        ToolKind::Fetch
    } else if (has("file_path") || has("path"))
        && (has("content") || has("new_string") || has("edits"))
    {
        ToolKind::Edit
    } else if has("file_path") {
        ToolKind::Read
    } else if has("pattern") || has("query") {
        ToolKind::Search
    } else {
        ToolKind::Other
    }
}

/// A content block's text (`{"type": "text", "text": …}`); other blocks carry none.
fn text_of(content: &Value) -> Option<String> {
    (content["type"] == "text")
        .then(|| content["text"].as_str().map(str::to_string))
        .flatten()
}

/// A finished call's output as text: its content blocks' text (a diff's path), else its raw
/// output.
fn output_text(f: &ToolCallFields) -> String {
    let mut parts = Vec::new();
    for c in f.content.iter().flatten() {
        match c["type"].as_str() {
            Some("content") => parts.extend(text_of(&c["content"])),
            Some("diff") => parts.extend(c["path"].as_str().map(|p| format!("diff {p}"))),
            _ => {}
        }
    }
    if parts.is_empty() {
        return match &f.raw_output {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => String::new(),
        };
    }
    parts.join("\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn up(v: Value) -> SessionUpdate {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_call_is_one_call_and_one_result_however_many_updates() {
        let mut m = Mapper::default();
        let early = m.update(up(json!({"sessionUpdate": "tool_call", "toolCallId": "t1",
            "title": "Terminal", "kind": "execute", "status": "pending", "rawInput": {}})));
        assert!(early.is_empty(), "{early:?}");
        let a = m.update(up(
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1",
            "title": "Run ls", "rawInput": {"command": "ls"}}),
        ));
        assert!(
            matches!(&a[..], [AcpEvent::ToolCall { kind: ToolKind::Execute, title, .. }] if title == "Run ls")
        );
        let b = m.update(up(
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "in_progress"}),
        ));
        assert!(b.is_empty());
        let c = m.update(up(
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1",
            "status": "completed",
            "content": [{"type": "content", "content": {"type": "text", "text": "a b"}}]}),
        ));
        assert!(
            matches!(&c[..], [AcpEvent::ToolResult { status: ToolStatus::Completed, output, .. }] if output == "a b")
        );
        let d = m.update(up(
            json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "failed"}),
        ));
        assert!(d.is_empty(), "{d:?}");
    }

    #[test]
    fn text_and_plan_map() {
        let mut m = Mapper::default();
        let t = m.update(up(json!({"sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "hi"}})));
        assert_eq!(t, vec![AcpEvent::Text { text: "hi".into() }]);
        let p = m.update(up(json!({"sessionUpdate": "plan",
            "entries": [{"content": "a", "priority": "high", "status": "pending"}]})));
        assert!(matches!(&p[..], [AcpEvent::Plan { entries }] if entries.len() == 1));
    }

    #[test]
    fn a_permission_subject_takes_the_kind_from_the_call() {
        let mut m = Mapper::default();
        m.update(up(json!({"sessionUpdate": "tool_call", "toolCallId": "t9",
            "title": "Write x", "kind": "edit"})));
        let req: RequestPermission = serde_json::from_value(json!({"sessionId": "s",
            "toolCall": {"toolCallId": "t9", "rawInput": {"file_path": "/w/x", "content": "1"}},
            "options": []}))
        .unwrap();
        let s = m.subject(&req);
        assert_eq!((s.kind, s.path.as_deref()), (ToolKind::Edit, Some("/w/x")));
        let unknown: RequestPermission = serde_json::from_value(json!({"sessionId": "s",
            "toolCall": {"toolCallId": "u", "rawInput": {"command": "cat /etc/passwd"}},
            "options": []}))
        .unwrap();
        let s = m.subject(&unknown);
        assert_eq!(s.kind, ToolKind::Execute);
        assert_eq!(s.command.as_deref(), Some("cat /etc/passwd"));
    }
}
