//! The record format of the store's append-only, hash-chained event log (`.meta/events.jsonl`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Every kind of record metash writes, once. A new kind is one line here; a typo does not compile.
macro_rules! log_kinds {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal,)*) => {
        /// What a log record is about. Serialized as its snake_case name. A name this version
        /// does not know (a log written by a newer metash) reads as [`LogKind::Unknown`] and is
        /// written back byte for byte, so the hash chain still verifies.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum LogKind {
            $($(#[doc = $doc])* $variant,)*
            /// A kind this version does not know, kept verbatim. metash never writes one itself.
            Unknown(String),
        }

        impl LogKind {
            /// The kinds this version writes.
            pub const KNOWN: &'static [LogKind] = &[$(LogKind::$variant,)*];

            /// The wire name.
            pub fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $name,)*
                    Self::Unknown(s) => s,
                }
            }

            /// The kind with this wire name (an unknown name is [`LogKind::Unknown`]).
            pub fn parse(name: &str) -> Self {
                match name {
                    $($name => Self::$variant,)*
                    other => Self::Unknown(other.to_string()),
                }
            }
        }
    };
}

log_kinds! {
    /// First event of every log: `data` is the whole initial `SessionState`.
    SessionInit => "session_init",
    /// `data` is `{key, value, scope}`; folding these over `session_init` rebuilds session.json.
    StateUpdate => "state_update",
    /// The project's owner changed `.meta/context.md` (`metash context edit|set`): `{old_sha256,
    /// new_sha256, diff}`.
    ContextChanged => "context_changed",
    /// A per-agent KV write: `data` is `{namespace, key, value}` (value `null` deletes).
    KvSet => "kv_set",
    /// A progress line for people: `data` is `{message, level}`.
    Progress => "progress",
    /// An agent sent something only the host may say (a `consent_grant`, `consent_revoke`,
    /// `input`, `start` or `shutdown` event): `data` is `{code: "host_only_event", type, message,
    /// event}`. Written by the runtime under the agent's id; the ledger shows it as a violation,
    /// never as what the agent claimed.
    ProtocolViolation => "protocol_violation",
    /// An artifact an agent announced was saved (`{name, path, bytes}`).
    Artifact => "artifact",
    /// Artifacts removed by retention (`{removed, kept}`).
    Gc => "gc",
    /// A new or changed manifest was validated: `{id, name, version, sandbox, source, manifest,
    /// entry, sha256, capabilities}`.
    AgentRegistered => "agent_registered",
    /// Someone was asked: `{request_id, capability, reason, duration_s, sensitive, prompter}`.
    ConsentRequest => "consent_request",
    /// Their answer: `{request_id, capability, answer: allow_once|allow_for|deny, duration_s, by}`.
    ConsentAnswer => "consent_answer",
    /// A question no rule answered waits for any client (`metash ui`, JSON-RPC, `metash consent
    /// answer`): `{id, capability, reason, duration_s, deadline}`.
    ConsentPending => "consent_pending",
    /// A client answered a waiting question, first and only: `{id, answer, duration_s, by}`; the
    /// question's `consent_answer` follows.
    ConsentReplied => "consent_replied",
    /// A person's comment on a line of a task's diff (`metash ui`): `{id, task, file, line, text,
    /// by}`; it reaches the task's next executor attempt as a finding.
    ReviewComment => "review_comment",
    /// Review comments handed to a task's executor (or its verification), once: `{task, ids,
    /// to}`.
    ReviewDelivered => "review_delivered",
    /// An OAuth handle given to an agent for a spawn: `{provider, handle, capability, base_url}`
    /// (never a token).
    OauthHandle => "oauth_handle",
    /// A request through an OAuth handle: `{provider, handle, capability, refreshed}` when the
    /// token was added (`refreshed`: the broker renewed it first), `{..., refused}` when not.
    OauthUse => "oauth_use",
    /// A plan's tasks queued for workers (PostgreSQL store).
    TasksEnqueued => "tasks_enqueued",
    /// A leased task's completion, recorded once with its fencing token.
    TaskCompleted => "task_completed",
    /// A completion whose lease token was stale: refused.
    TaskCompletionRefused => "task_completion_refused",
    /// Expired leases returned to ready by the reaper.
    LeasesExpired => "leases_expired",
    /// Queued tasks withdrawn by the coordinator (their task is queued again).
    TasksCancelled => "tasks_cancelled",
    /// A grant, by the host only: `{capability, expires_at, duration_s, sensitive, source}`.
    ConsentGrant => "consent_grant",
    /// A revocation, by the host only: `{capability, revoked: [{capability, expires_at}], source}`.
    ConsentRevoke => "consent_revoke",
    /// A running agent was told at once that a grant ended: `{capability, expires_at, why:
    /// revoked|expired}` (the `consent_revoke` event on its stdin).
    ConsentRevokeSent => "consent_revoke_sent",
    /// A refusal sent to the agent: `{code, message, hint, capability, sensitive}`.
    Error => "error",
    /// An action the host mediated: `{capability, detail}`.
    AgentAction => "agent_action",
    /// The project's redaction salt was created: `{}` (the salt itself is never logged).
    RedactionSaltCreated => "redaction_salt_created",
    /// An instance entered the Registered state (not the policy layer's `agent_registered`,
    /// logged once per new or changed manifest).
    AgentInstanceRegistered => "agent_instance_registered",
    AgentStarted => "agent_started",
    AgentActive => "agent_active",
    AgentSuspended => "agent_suspended",
    /// Someone asked for an agent to be suspended or resumed (`{want: suspended|active}`): the
    /// process that runs it applies it (`agent_suspended` / `agent_resumed`).
    AgentControl => "agent_control",
    AgentResumed => "agent_resumed",
    AgentTerminated => "agent_terminated",
    /// A WASM agent's `shutdown()` run (manifest `hooks = ["shutdown"]`): `{status, error}`.
    AgentShutdownRun => "agent_shutdown_run",
    AgentInvoked => "agent_invoked",
    AgentInvocationEnd => "agent_invocation_end",
    /// An event the agent emitted (its `type` is in the data).
    AgentEvent => "agent_event",
    /// The sandbox refused something the agent tried (network, import, path...).
    SandboxDenied => "sandbox_denied",
    /// A quota was hit (memory, processes, output, time).
    LimitExceeded => "limit_exceeded",
    AgentTimeout => "agent_timeout",
    /// The agent was killed because it did not stop when asked.
    AgentKilled => "agent_killed",
    /// The agent broke the event protocol (a bad line, a bad version).
    ProtocolError => "protocol_error",
    /// The token bucket delayed the agent (reported once per invocation).
    AgentThrottled => "agent_throttled",
    /// A compiled-code cache entry failed authentication: deleted, never deserialized, and the
    /// module compiled anew (`{file, reason, source, action}`).
    CacheRejected => "cache_rejected",
    /// The host gave up events it could not write (the store failed for longer than the journal's
    /// give-up time): `{events, by_agent}`. Never silent: also counted in `.meta/journal.json`.
    EventsLost => "events_lost",
    /// A WASM agent trapped.
    AgentTrap => "agent_trap",
    /// A connection a WASM agent opened under its network grant.
    NetworkConnect => "network_connect",
    /// `spawn_agent` started a role or agent.
    Spawn => "spawn",
    /// `spawn_agent` returned (`AgentResponse` summary).
    SpawnEnd => "spawn_end",
    /// A spawn was refused before it ran (consent, policy).
    Denied => "denied",
    /// Tokens and cost charged to the budget.
    BudgetCharge => "budget_charge",
    /// A model turn's event (seed 003 envelope), other than tool calls and results.
    HarnessEvent => "harness_event",
    /// A model role's tool call (summarized).
    ToolCall => "tool_call",
    /// A model role's tool result (summarized).
    ToolResult => "tool_result",
    /// The repository's executable git configuration (`.meta/git-trust.json`): `{action:
    /// recorded|refused|accepted, file, changes: [{kind, file, key, old, new}], by}`.
    GitTrust => "git_trust",
    /// An interactive CLI session the control plane runs (`metash session`, `metash attach`):
    /// `{id, event: start|attach|detach|exit|resume|end|observed, status, ...}` (docs/harness.md).
    CpSession => "cp_session",
    /// A turn's model exchanges were recorded (`.meta/tapes/<id>.json`, docs/replay.md): `{id,
    /// agent, task, attempt, exchanges, bytes}`.
    Tape => "tape",
    /// This log was forked from another session's (`metash fork --at SEQ`, docs/replay.md): the
    /// records before it are that log's, byte for byte; `{origin: {workspace, session_id, seq,
    /// hash}, session_id, main, main_from, branches, tapes, context_sha256}`.
    Fork => "fork",
}

impl std::fmt::Display for LogKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for LogKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for LogKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for LogKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for LogKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(Self::parse(&name))
    }
}

impl JsonSchema for LogKind {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LogKind".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: Vec<&str> = Self::KNOWN.iter().map(LogKind::as_str).collect();
        schemars::json_schema!({
            "description": "What the record is about: one of the kinds this version writes (a newer metash may write others).",
            "type": "string",
            "examples": names,
        })
    }
}

/// The log record format this build writes and reads.
pub const LOG_SCHEMA_VERSION: u32 = 1;

fn first_log_version() -> u32 {
    1
}

/// One line of the event log. `hash` is the SHA-256 of the line's bytes before `,"hash":…` and
/// `prev` is the previous record's hash, so editing or dropping any record breaks the chain at that
/// record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogRecord {
    /// The record format's version. Lines written before records carried it have the same
    /// format and read as 1; a newer version is refused, naming the file and the record.
    #[serde(default = "first_log_version")]
    pub schema_version: u32,
    /// Gapless, starting at 1.
    pub seq: u64,
    /// RFC 3339 UTC timestamp with microseconds.
    pub ts: String,
    pub kind: LogKind,
    /// The agent the event concerns, when there is one (for ledger filtering).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    pub data: Value,
    /// Hex SHA-256 of the previous record; 64 zeros for the first.
    pub prev: String,
    pub hash: String,
}
