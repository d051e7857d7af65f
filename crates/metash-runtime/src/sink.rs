//! Where the runtime reports what happened: lifecycle transitions, denials, limits, and every event
//! an agent emits. The host adapts this to the store's append-only log
//! (`metash_store::Store::append(kind, agent, data)` has the same shape), so the runtime does not
//! depend on the store.

use std::sync::Mutex;

use serde_json::Value;

/// Event kinds the runtime records. Stable strings: the log and the ledger view match on them.
pub mod kinds {
    /// An instance entered the Registered state (not to be confused with the policy layer's
    /// `agent_registered`, logged once per new or changed manifest).
    pub const REGISTERED: &str = "agent_instance_registered";
    pub const STARTED: &str = "agent_started";
    pub const ACTIVE: &str = "agent_active";
    pub const SUSPENDED: &str = "agent_suspended";
    pub const RESUMED: &str = "agent_resumed";
    pub const TERMINATED: &str = "agent_terminated";
    pub const INVOKED: &str = "agent_invoked";
    pub const INVOCATION_END: &str = "agent_invocation_end";
    /// An event the agent emitted (its `type` is in the data).
    pub const AGENT_EVENT: &str = "agent_event";
    /// The sandbox refused something the agent tried (network, import, path...).
    pub const DENIED: &str = "sandbox_denied";
    /// A quota was hit (memory, processes, output, time).
    pub const LIMIT: &str = "limit_exceeded";
    pub const TIMEOUT: &str = "agent_timeout";
    /// The agent was killed because it did not stop when asked.
    pub const KILLED: &str = "agent_killed";
    pub const PROTOCOL_ERROR: &str = "protocol_error";
    /// The token bucket delayed the agent (reported once per invocation).
    pub const THROTTLED: &str = "agent_throttled";
    /// A compiled-code cache entry failed authentication: deleted, never deserialized, and the
    /// module compiled anew (`{file, reason, source, action}`).
    pub const CACHE_REJECTED: &str = "cache_rejected";
}

/// Receives the runtime's events. Implementations must be cheap and must not call back into the
/// agent (they run on the runtime's reader threads).
pub trait EventSink: Send + Sync {
    fn record(&self, kind: &str, agent: Option<&str>, data: Value);
}

/// One recorded event (for [`MemorySink`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub kind: String,
    pub agent: Option<String>,
    pub data: Value,
}

/// An in-memory sink for tests and tools.
#[derive(Debug, Default)]
pub struct MemorySink {
    events: Mutex<Vec<Recorded>>,
}

impl MemorySink {
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of everything recorded so far.
    pub fn events(&self) -> Vec<Recorded> {
        match self.events.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Recorded events of one kind.
    pub fn of_kind(&self, kind: &str) -> Vec<Recorded> {
        self.events()
            .into_iter()
            .filter(|e| e.kind == kind)
            .collect()
    }
}

impl EventSink for MemorySink {
    fn record(&self, kind: &str, agent: Option<&str>, data: Value) {
        let rec = Recorded {
            kind: kind.to_string(),
            agent: agent.map(str::to_string),
            data,
        };
        match self.events.lock() {
            Ok(mut g) => g.push(rec),
            Err(p) => p.into_inner().push(rec),
        }
    }
}

/// A sink that drops everything (benchmarks).
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl EventSink for NullSink {
    fn record(&self, _: &str, _: Option<&str>, _: Value) {}
}
