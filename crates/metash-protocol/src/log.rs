//! The record format of the store's append-only, hash-chained event log (`.meta/events.jsonl`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Well-known `kind` values. Other layers add their own (`consent_grant`, `lifecycle`, ...); the log
/// treats `kind` as an open string so a new layer never needs a store change.
pub mod kinds {
    /// First event of every log: `data` is the whole initial `SessionState`.
    pub const SESSION_INIT: &str = "session_init";
    /// `data` is `{key, value, scope}`; folding these over `SESSION_INIT` rebuilds session.json.
    pub const STATE_UPDATE: &str = "state_update";
    /// A per-agent KV write: `data` is `{namespace, key, value}` (value `null` deletes).
    pub const KV_SET: &str = "kv_set";
    /// A progress line for people: `data` is `{message, level}`.
    pub const PROGRESS: &str = "progress";
    /// An agent sent something only the host may say (a `consent_grant`, `consent_revoke`,
    /// `input`, `start` or `shutdown` event): `data` is `{code: "host_only_event", type, message,
    /// event}`. Written by the runtime under the agent's id; the ledger shows it as a violation,
    /// never as what the agent claimed.
    pub const PROTOCOL_VIOLATION: &str = "protocol_violation";
}

/// One line of the event log. `hash` is the SHA-256 of the line's bytes before `,"hash":…` and
/// `prev` is the previous record's hash, so editing or dropping any record breaks the chain at that
/// record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogRecord {
    /// Gapless, starting at 1.
    pub seq: u64,
    /// RFC 3339 UTC timestamp with microseconds.
    pub ts: String,
    pub kind: String,
    /// The agent the event concerns, when there is one (for ledger filtering).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    pub data: Value,
    /// Hex SHA-256 of the previous record; 64 zeros for the first.
    pub prev: String,
    pub hash: String,
}
