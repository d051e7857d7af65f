//! The Agent Client Protocol's messages as metash's client reads and writes them: JSON-RPC 2.0
//! framing and the ACP methods of protocol version 1 (`initialize`, `session/new`,
//! `session/prompt`, `session/cancel`, `session/update`, `session/request_permission`,
//! `fs/read_text_file`, `fs/write_text_file`). No I/O here: [`super::client`] does it.
//!
//! Only the fields metash acts on are typed; everything else an agent sends is kept as JSON or
//! ignored (unknown fields pass), so a newer agent still talks to this client.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The ACP protocol version this client speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// Method names (agent side and client side).
pub mod method {
    pub const INITIALIZE: &str = "initialize";
    pub const SESSION_NEW: &str = "session/new";
    pub const SESSION_PROMPT: &str = "session/prompt";
    pub const SESSION_CANCEL: &str = "session/cancel";
    pub const SESSION_UPDATE: &str = "session/update";
    pub const REQUEST_PERMISSION: &str = "session/request_permission";
    pub const READ_TEXT_FILE: &str = "fs/read_text_file";
    pub const WRITE_TEXT_FILE: &str = "fs/write_text_file";
}

/// JSON-RPC's "method not found": what a client answers for a method it does not offer
/// (`terminal/*`, declined in `initialize`).
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC's "invalid params".
pub const INVALID_PARAMS: i64 = -32602;
/// JSON-RPC's "internal error": metash refused or failed the request (the message says why).
pub const INTERNAL_ERROR: i64 = -32603;

/// One line of the stream, classified.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// The agent asks the client something and waits for an answer.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// The agent tells the client something (no answer).
    Notification { method: String, params: Value },
    /// The answer to one of the client's requests.
    Response {
        id: Value,
        result: Result<Value, RpcError>,
    },
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (JSON-RPC {})", self.message, self.code)
    }
}

/// Classifies one JSON line; `None` for anything that is not JSON-RPC 2.0 (a stray log line an
/// agent printed on stdout is skipped, never fatal).
pub fn classify(line: &str) -> Option<Incoming> {
    let v: Value = serde_json::from_str(line).ok()?;
    let obj = v.as_object()?;
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return None;
    }
    let params = obj.get("params").cloned().unwrap_or(Value::Null);
    match (obj.get("method").and_then(Value::as_str), obj.get("id")) {
        (Some(m), Some(id)) if !id.is_null() => Some(Incoming::Request {
            id: id.clone(),
            method: m.to_string(),
            params,
        }),
        (Some(m), _) => Some(Incoming::Notification {
            method: m.to_string(),
            params,
        }),
        (None, Some(id)) => {
            let result = match obj.get("error") {
                Some(e) => Err(serde_json::from_value(e.clone()).unwrap_or(RpcError {
                    code: INTERNAL_ERROR,
                    message: e.to_string(),
                    data: None,
                })),
                None => Ok(obj.get("result").cloned().unwrap_or(Value::Null)),
            };
            Some(Incoming::Response {
                id: id.clone(),
                result,
            })
        }
        (None, None) => None,
    }
}

/// A request line.
pub fn request(id: u64, method: &str, params: &Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

/// A notification line.
pub fn notification(method: &str, params: &Value) -> String {
    json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string()
}

/// A successful answer to the agent's request `id`.
pub fn result(id: &Value, result: &Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
}

/// An error answer to the agent's request `id`.
pub fn error(id: &Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

/// `initialize`'s parameters: the file methods metash offers, and no terminal (an agent then
/// runs commands with its own tools, inside the sandbox).
pub fn initialize_params() -> Value {
    json!({
        "protocolVersion": PROTOCOL_VERSION,
        "clientCapabilities": {
            "fs": {"readTextFile": true, "writeTextFile": true},
            "terminal": false,
        },
        "clientInfo": {"name": "metash", "version": env!("CARGO_PKG_VERSION")},
    })
}

/// `session/new`'s parameters: the worktree as `cwd` and the MCP servers metash passes.
pub fn new_session_params(cwd: &str, mcp_servers: &[Value]) -> Value {
    json!({"cwd": cwd, "mcpServers": mcp_servers})
}

/// `session/prompt`'s parameters: the prompt as one text block.
pub fn prompt_params(session_id: &str, text: &str) -> Value {
    json!({"sessionId": session_id, "prompt": [{"type": "text", "text": text}]})
}

/// `session/cancel`'s parameters.
pub fn cancel_params(session_id: &str) -> Value {
    json!({"sessionId": session_id})
}

/// Why the agent ended a prompt turn (`session/prompt`'s `stopReason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    MaxTurnRequests,
    Refusal,
    Cancelled,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EndTurn => "end_turn",
            Self::MaxTokens => "max_tokens",
            Self::MaxTurnRequests => "max_turn_requests",
            Self::Refusal => "refusal",
            Self::Cancelled => "cancelled",
        }
    }
}

/// `session/new`'s answer (only the id is used).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSessionResponse {
    pub session_id: String,
}

/// `session/prompt`'s answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptResponse {
    pub stop_reason: StopReason,
}

/// What a tool does, as the agent classifies it: the key of metash's permission mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    Read,
    Edit,
    Delete,
    Move,
    Search,
    Execute,
    Think,
    Fetch,
    SwitchMode,
    #[serde(other)]
    Other,
}

impl ToolKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Edit => "edit",
            Self::Delete => "delete",
            Self::Move => "move",
            Self::Search => "search",
            Self::Execute => "execute",
            Self::Think => "think",
            Self::Fetch => "fetch",
            Self::SwitchMode => "switch_mode",
            Self::Other => "other",
        }
    }
}

/// A tool call's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    Pending,
    InProgress,
    Completed,
    Failed,
}

impl ToolStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::Failed => "failed",
        }
    }

    /// The call is over (its result is known).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed)
    }
}

/// A `tool_call` or `tool_call_update` (and the `toolCall` of a permission request): every
/// field but the id is optional in an update.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallFields {
    pub tool_call_id: String,
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub kind: Option<ToolKind>,
    #[serde(default)]
    pub status: Option<ToolStatus>,
    #[serde(default)]
    pub raw_input: Option<Value>,
    #[serde(default)]
    pub raw_output: Option<Value>,
    #[serde(default)]
    pub content: Option<Vec<Value>>,
    #[serde(default)]
    pub locations: Option<Vec<Location>>,
}

/// A file a tool call touches.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Location {
    pub path: String,
    #[serde(default)]
    pub line: Option<u64>,
}

/// One entry of the agent's plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanEntry {
    pub content: String,
    #[serde(default)]
    pub priority: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
}

/// `session/update`'s `update`, by `sessionUpdate`. Kinds metash does not act on (the user's
/// own message echoed, available commands, mode changes, kinds newer than this client) are
/// [`SessionUpdate::Other`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "sessionUpdate", rename_all = "snake_case")]
pub enum SessionUpdate {
    AgentMessageChunk {
        content: Value,
    },
    AgentThoughtChunk {
        content: Value,
    },
    ToolCall(ToolCallFields),
    ToolCallUpdate(ToolCallFields),
    Plan {
        entries: Vec<PlanEntry>,
    },
    #[serde(other)]
    Other,
}

/// `session/update`'s parameters.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionNotification {
    pub session_id: String,
    pub update: SessionUpdate,
}

/// How a permission option answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionOptionKind {
    AllowOnce,
    AllowAlways,
    RejectOnce,
    RejectAlways,
    #[serde(other)]
    Unknown,
}

/// One option the agent offers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionOption {
    pub option_id: String,
    #[serde(default)]
    pub name: String,
    pub kind: PermissionOptionKind,
}

/// `session/request_permission`'s parameters.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestPermission {
    pub session_id: String,
    pub tool_call: ToolCallFields,
    pub options: Vec<PermissionOption>,
}

impl RequestPermission {
    /// The option that says metash's answer for this one use: `allow_once` (else
    /// `allow_always`) when allowed, `reject_once` (else `reject_always`) when not. metash's
    /// grants decide the next use, so a "once" option is preferred: the agent must ask again.
    pub fn option_for(&self, allowed: bool) -> Option<&PermissionOption> {
        let order: [PermissionOptionKind; 2] = if allowed {
            [
                PermissionOptionKind::AllowOnce,
                PermissionOptionKind::AllowAlways,
            ]
        } else {
            [
                PermissionOptionKind::RejectOnce,
                PermissionOptionKind::RejectAlways,
            ]
        };
        order
            .iter()
            .find_map(|k| self.options.iter().find(|o| o.kind == *k))
    }
}

/// The answer to a permission request: the option chosen, or `cancelled` (the turn is being
/// cancelled, or the agent offered no option that says metash's answer).
pub fn permission_outcome(option_id: Option<&str>) -> Value {
    match option_id {
        Some(id) => json!({"outcome": {"outcome": "selected", "optionId": id}}),
        None => json!({"outcome": {"outcome": "cancelled"}}),
    }
}

/// `fs/read_text_file`'s parameters.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadTextFile {
    pub session_id: String,
    pub path: String,
    /// 1-based first line.
    #[serde(default)]
    pub line: Option<u64>,
    #[serde(default)]
    pub limit: Option<u64>,
}

/// `fs/write_text_file`'s parameters.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteTextFile {
    pub session_id: String,
    pub path: String,
    pub content: String,
}

/// `line`/`limit` applied to a file's text (1-based line; a limit of lines).
pub fn slice_lines(text: &str, line: Option<u64>, limit: Option<u64>) -> String {
    if line.is_none() && limit.is_none() {
        return text.to_string();
    }
    let skip = line.map_or(0, |l| l.saturating_sub(1)) as usize;
    let take = limit.map_or(usize::MAX, |l| l as usize);
    text.split_inclusive('\n').skip(skip).take(take).collect()
}

/// The agent side: what `metash acp` answers and sends an editor (the ACP client). Field names
/// as ACP v1's schema writes them; the editor's SDK checks them, so a wrong name is a failed
/// request, not a silent gap.
pub mod agent {
    use serde_json::{json, Value};

    use super::{PlanEntryStatus, StopReason, ToolKind, ToolStatus, PROTOCOL_VERSION};

    /// Methods an editor calls on the agent besides the client side's ones.
    pub const SESSION_SET_MODE: &str = "session/set_mode";
    pub const SESSION_LOAD: &str = "session/load";
    pub const AUTHENTICATE: &str = "authenticate";

    /// `initialize`'s answer: protocol version 1, no `session/load`, text prompts with embedded
    /// context and resource links, no authentication (metash's keys are its own business).
    pub fn initialize_result(name: &str, version: &str) -> Value {
        json!({
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": false,
                "promptCapabilities": {"image": false, "audio": false, "embeddedContext": true},
                "mcpCapabilities": {"http": false, "sse": false},
            },
            "authMethods": [],
            "agentInfo": {"name": name, "version": version},
        })
    }

    /// A session mode the editor can pick (`SessionMode`).
    #[derive(Debug, Clone, Copy)]
    pub struct Mode {
        pub id: &'static str,
        pub name: &'static str,
        pub description: &'static str,
    }

    /// `session/new`'s answer: the session and its modes (`SessionModeState`).
    pub fn new_session_result(session_id: &str, current: &str, modes: &[Mode]) -> Value {
        let available: Vec<Value> = modes
            .iter()
            .map(|m| json!({"id": m.id, "name": m.name, "description": m.description}))
            .collect();
        json!({"sessionId": session_id,
               "modes": {"currentModeId": current, "availableModes": available}})
    }

    /// `session/prompt`'s answer.
    pub fn prompt_result(stop: StopReason) -> Value {
        json!({"stopReason": stop.as_str()})
    }

    /// `session/update`'s parameters around one update.
    pub fn update(session_id: &str, update: Value) -> Value {
        json!({"sessionId": session_id, "update": update})
    }

    /// Agent text (`agent_message_chunk` with one text block).
    pub fn text_chunk(text: &str) -> Value {
        json!({"sessionUpdate": "agent_message_chunk",
               "content": {"type": "text", "text": text}})
    }

    /// The whole plan (`plan`: each update replaces the editor's plan), every entry at
    /// `medium` priority (metash's DAG has no priorities; its order is the plan's).
    pub fn plan(entries: &[(String, PlanEntryStatus)]) -> Value {
        let entries: Vec<Value> = entries
            .iter()
            .map(|(content, status)| {
                json!({"content": content, "priority": "medium", "status": status.as_str()})
            })
            .collect();
        json!({"sessionUpdate": "plan", "entries": entries})
    }

    /// A new tool call (`tool_call`; `title` is required).
    pub fn tool_call(id: &str, title: &str, kind: ToolKind, status: ToolStatus) -> Value {
        json!({"sessionUpdate": "tool_call", "toolCallId": id, "title": title,
               "kind": kind.as_str(), "status": status.as_str()})
    }

    /// A tool call's new status (`tool_call_update`), with text content when given.
    pub fn tool_call_update(id: &str, status: ToolStatus, text: Option<&str>) -> Value {
        let mut v = json!({"sessionUpdate": "tool_call_update", "toolCallId": id,
                           "status": status.as_str()});
        if let Some(t) = text {
            v["content"] = json!([{"type": "content", "content": {"type": "text", "text": t}}]);
        }
        v
    }

    /// The mode the session is in now (`current_mode_update`).
    pub fn current_mode(id: &str) -> Value {
        json!({"sessionUpdate": "current_mode_update", "currentModeId": id})
    }

    /// One option of a permission request (`PermissionOption`).
    pub fn option(id: &str, name: &str, kind: &str) -> Value {
        json!({"optionId": id, "name": name, "kind": kind})
    }

    /// `session/request_permission`'s parameters: the tool call it is about and the options.
    pub fn permission_request(
        session_id: &str,
        tool_call_id: &str,
        title: &str,
        kind: ToolKind,
        options: Vec<Value>,
    ) -> Value {
        json!({"sessionId": session_id,
               "toolCall": {"toolCallId": tool_call_id, "title": title,
                            "kind": kind.as_str(), "status": "pending"},
               "options": options})
    }

    /// The option the editor chose, or `None` when it answered `cancelled` (or garbage).
    pub fn chosen_option(result: &Value) -> Option<String> {
        let outcome = result.get("outcome")?;
        (outcome.get("outcome")?.as_str()? == "selected")
            .then(|| outcome.get("optionId")?.as_str().map(str::to_string))
            .flatten()
    }

    /// `fs/read_text_file`'s parameters (metash asks the editor, which has unsaved buffers).
    pub fn read_text_file(session_id: &str, path: &str) -> Value {
        json!({"sessionId": session_id, "path": path})
    }
}

/// A plan entry's status as ACP knows it (pending, in progress, completed: no "failed").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanEntryStatus {
    Pending,
    InProgress,
    Completed,
}

impl PlanEntryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn lines_are_classified() {
        let r = classify(r#"{"jsonrpc":"2.0","id":3,"method":"fs/read_text_file","params":{}}"#);
        assert!(
            matches!(r, Some(Incoming::Request { method, .. }) if method == "fs/read_text_file")
        );
        let n = classify(r#"{"jsonrpc":"2.0","method":"session/update","params":{"a":1}}"#);
        assert!(matches!(n, Some(Incoming::Notification { .. })));
        let e = classify(r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"no"}}"#);
        assert!(matches!(
            e,
            Some(Incoming::Response {
                result: Err(RpcError { code: -32000, .. }),
                ..
            })
        ));
        assert_eq!(classify("npm WARN something"), None);
        assert_eq!(classify(r#"{"id":1,"result":{}}"#), None);
    }

    #[test]
    fn updates_parse_and_unknown_kinds_are_other() {
        let u: SessionUpdate = serde_json::from_value(json!({
            "sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Edit a.txt",
            "kind": "edit", "status": "pending", "locations": [{"path": "/w/a.txt"}]
        }))
        .unwrap();
        let SessionUpdate::ToolCall(f) = u else {
            panic!("{u:?}")
        };
        assert_eq!(f.kind, Some(ToolKind::Edit));
        let u: SessionUpdate =
            serde_json::from_value(json!({"sessionUpdate": "usage_update", "used": 1})).unwrap();
        assert_eq!(u, SessionUpdate::Other);
        let k: ToolKind = serde_json::from_value(json!("teleport")).unwrap();
        assert_eq!(k, ToolKind::Other);
    }

    #[test]
    fn a_once_option_is_preferred() {
        let p: RequestPermission = serde_json::from_value(json!({
            "sessionId": "s", "toolCall": {"toolCallId": "t"},
            "options": [
                {"optionId": "always", "name": "Always", "kind": "allow_always"},
                {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                {"optionId": "reject", "name": "Reject", "kind": "reject_once"}
            ]
        }))
        .unwrap();
        assert_eq!(
            p.option_for(true).map(|o| o.option_id.as_str()),
            Some("allow")
        );
        assert_eq!(
            p.option_for(false).map(|o| o.option_id.as_str()),
            Some("reject")
        );
    }

    #[test]
    fn agent_side_messages_use_the_schema_names() {
        let plan = agent::plan(&[("a: A".into(), PlanEntryStatus::InProgress)]);
        assert_eq!(
            plan,
            json!({"sessionUpdate": "plan", "entries": [
                {"content": "a: A", "priority": "medium", "status": "in_progress"}]})
        );
        let modes = agent::new_session_result(
            "s",
            "run",
            &[agent::Mode {
                id: "run",
                name: "Run",
                description: "d",
            }],
        );
        assert_eq!(modes["modes"]["currentModeId"], "run");
        assert_eq!(modes["modes"]["availableModes"][0]["id"], "run");
        assert_eq!(
            agent::prompt_result(StopReason::Cancelled),
            json!({"stopReason": "cancelled"})
        );
        let picked = json!({"outcome": {"outcome": "selected", "optionId": "deny"}});
        assert_eq!(agent::chosen_option(&picked).as_deref(), Some("deny"));
        let cancelled = json!({"outcome": {"outcome": "cancelled"}});
        assert_eq!(agent::chosen_option(&cancelled), None);
    }

    #[test]
    fn lines_slice() {
        assert_eq!(slice_lines("a\nb\nc\n", Some(2), Some(1)), "b\n");
        assert_eq!(slice_lines("a\nb\nc", None, None), "a\nb\nc");
        assert_eq!(slice_lines("a\nb\nc", Some(9), None), "");
    }
}
