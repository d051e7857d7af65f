//! Seed 002 section 4: the event protocol v0.1 agents and the host exchange, and seed 003's
//! `BaseEvent` envelope that correlates events with a CP session and run.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::continuation::HarnessContinuationRef;
use crate::host::CheckpointReason;

/// The only event-protocol version this build speaks; messages carrying another are rejected.
pub const EVENT_PROTOCOL_VERSION: &str = "0.1";

/// One event of the agent protocol, tagged by `type` with the seed's snake_case names and fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentEvent {
    Input {
        agent_id: String,
        prompt: String,
        #[serde(default)]
        context_refs: Vec<String>,
    },
    Output {
        agent_id: String,
        chunk_id: String,
        content_type: String,
        data: String,
    },
    Artifact {
        id: String,
        kind: String,
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        preview_hint: Option<String>,
    },
    ConsentRequest {
        capability: String,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_s: Option<u64>,
    },
    ConsentGrant {
        capability: String,
        /// RFC 3339; absent for a grant that lasts one action.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<String>,
    },
    ConsentRevoke {
        capability: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<String>,
    },
    Error {
        code: String,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hint: Option<String>,
    },
    StateUpdate {
        key: String,
        value: Value,
        /// `session` (the default), `agent` (the agent's KV namespace) or `scratchpad`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
    },
    /// Agent to host: read back what was stored (seed 002 §7). `key` in the scope (`agent`, the
    /// default, or `scratchpad`: both need `memory`; `session`: `variables.*` only); an empty
    /// `key` reads the whole namespace as one object (the list of what is stored). Answered by
    /// one `state_value`, or an `error` with code `state_denied`.
    StateGet {
        key: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
    },
    /// Host to agent: the answer to `state_get`; `value` is `null` and `found` false when nothing
    /// is stored under `key`.
    StateValue {
        key: String,
        value: Value,
        found: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
    },
    /// Host to agent, first line of every session: the `start(ctx)` hook's context. Native agents get
    /// it once per process, WASM agents once per invocation (each invocation is a fresh instance).
    Start {
        agent_id: String,
        /// The workspace path as the agent sees it (`/workspace` inside WASM, the real path natively).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workspace: Option<String>,
        #[serde(default)]
        config: Value,
        #[serde(default)]
        capabilities: Vec<String>,
    },
    /// Agent to host: the current invocation is finished. Ends the `invoke(input)` stream; without
    /// it the host waits until the timeout.
    Done {
        /// `success` (the default) or `error`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<String>,
    },
    /// Agent to host: seed 000's checkpoint signal, field for field, so a line of seed-000 JSON plus
    /// `schema_version` is a valid message. Ends the invocation like `done`.
    Checkpoint {
        reason: CheckpointReason,
        message: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        options: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume_id: Option<String>,
    },
    /// Host to agent: `shutdown()`: flush state and exit; stdin closes right after. The host kills
    /// the agent when `grace_ms` has passed.
    Shutdown {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grace_ms: Option<u64>,
    },
}

impl AgentEvent {
    /// Whether only the host may send this event. An agent that emits one is trying to speak for
    /// the host (grant itself a capability in the audit trail, start or stop a session): the
    /// runtime rejects it as a protocol violation instead of passing it on.
    pub fn is_host_only(&self) -> bool {
        matches!(
            self,
            Self::Input { .. }
                | Self::StateValue { .. }
                | Self::ConsentGrant { .. }
                | Self::ConsentRevoke { .. }
                | Self::Start { .. }
                | Self::Shutdown { .. }
        )
    }

    /// The protocol `type` of the event, as on the wire.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Input { .. } => "input",
            Self::Output { .. } => "output",
            Self::Artifact { .. } => "artifact",
            Self::ConsentRequest { .. } => "consent_request",
            Self::ConsentGrant { .. } => "consent_grant",
            Self::ConsentRevoke { .. } => "consent_revoke",
            Self::Error { .. } => "error",
            Self::StateUpdate { .. } => "state_update",
            Self::StateGet { .. } => "state_get",
            Self::StateValue { .. } => "state_value",
            Self::Start { .. } => "start",
            Self::Done { .. } => "done",
            Self::Checkpoint { .. } => "checkpoint",
            Self::Shutdown { .. } => "shutdown",
        }
    }
}

/// An event as it travels over an agent's stdio: the version first, then the event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProtocolMessage {
    pub schema_version: String,
    #[serde(flatten)]
    pub event: AgentEvent,
}

impl ProtocolMessage {
    pub fn new(event: AgentEvent) -> Self {
        Self {
            schema_version: EVENT_PROTOCOL_VERSION.to_string(),
            event,
        }
    }
}

/// Seed 003's envelope. `continuation` is absent until the harness first reports a key and present
/// on every event after that.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BaseEvent<P> {
    pub ts: String,
    pub seq: u64,
    pub cp_session_id: String,
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation: Option<HarnessContinuationRef>,
    /// (A missing `Option` already reads as `None`; `default` here would demand `P: Default`.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<P>,
}

/// The agent protocol inside the seed 003 envelope, kept as a published schema
/// (`metash schema event-envelope`) for clients that want one shape for both protocols. Nothing in
/// metash emits it today: the host streams log records (`LogRecord`: JSON-RPC `event`
/// notifications, `metash log tail`, the UI's live stream), and the harness streams
/// `HarnessEventEnvelope`.
pub type EventEnvelope = BaseEvent<AgentEvent>;
