//! Where the runtime reports what happened: lifecycle transitions, denials, limits, and every event
//! an agent emits. The host adapts this to the store's append-only log
//! (`metash_store::Store::append(kind, agent, data)` has the same shape), so the runtime does not
//! depend on the store.

use std::sync::Mutex;

use metash_protocol::LogKind;
use serde_json::Value;

/// Receives the runtime's events. Implementations must be cheap and must not call back into the
/// agent (they run on the runtime's reader threads).
pub trait EventSink: Send + Sync {
    fn record(&self, kind: LogKind, agent: Option<&str>, data: Value);
}

/// One recorded event (for [`MemorySink`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub kind: LogKind,
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
    pub fn of_kind(&self, kind: LogKind) -> Vec<Recorded> {
        self.events()
            .into_iter()
            .filter(|e| e.kind == kind)
            .collect()
    }
}

impl EventSink for MemorySink {
    fn record(&self, kind: LogKind, agent: Option<&str>, data: Value) {
        let rec = Recorded {
            kind,
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
    fn record(&self, _: LogKind, _: Option<&str>, _: Value) {}
}
