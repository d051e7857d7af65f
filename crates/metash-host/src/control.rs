//! Suspending and resuming a running agent from any process (seed 002 §3: "Suspended: paused due
//! to resource limits or user action"). The process that runs the agent holds its [`Pauser`];
//! anyone else (`metash agents suspend`, a JSON-RPC client of another `metash serve`) leaves a
//! request in `.meta/control.json`, which the running spawn's watcher applies within 100 ms. The
//! request is an event first (`agent_control`), its log seq orders requests, and a spawn only
//! obeys requests made after it started: a stale "suspend" never freezes a later run.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use metash_protocol::{LogKind, LogRecord};
use metash_runtime::Pauser;
use metash_store::{NewEvent, Store};
use serde_json::{json, Value};

use crate::error::Result;

pub const CONTROL_DOC: &str = "control";

/// What was asked for an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Suspended,
    Active,
}

impl Want {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Suspended => "suspended",
            Self::Active => "active",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "suspended" => Some(Self::Suspended),
            "active" => Some(Self::Active),
            _ => None,
        }
    }
}

/// How a suspend or resume was carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// This process runs the agent: done now (`changed` false when it already was so).
    Here { changed: bool },
    /// Left for the process that runs it; the request's log seq.
    Requested { seq: u64 },
}

/// Records `want` for `agent` for whichever process runs it; returns the request's record (its
/// seq names the request).
///
/// # Errors
/// The store refused the write.
pub fn request(store: &Store, agent: &str, want: Want) -> Result<LogRecord> {
    let rec = store.update_doc(CONTROL_DOC, |doc| {
        if !doc.is_object() {
            *doc = json!({});
        }
        let seq = store.log().tail()?.seq + 1;
        doc[agent] = json!({"want": want.as_str(), "seq": seq});
        Ok(NewEvent::new(
            LogKind::AgentControl,
            Some(agent),
            json!({"want": want.as_str()}),
        ))
    })?;
    Ok(rec)
}

/// The latest request for `agent` made after log seq `after`, if any.
pub fn pending(store: &Store, agent: &str, after: u64) -> Option<(Want, u64)> {
    let doc = store.read_doc(CONTROL_DOC).ok()?;
    let entry = doc.get(agent)?;
    let seq = entry.get("seq").and_then(Value::as_u64)?;
    let want = Want::parse(entry.get("want").and_then(Value::as_str)?)?;
    (seq > after).then_some((want, seq))
}

/// The answer of the process that runs `agent` to request `seq`: whether it changed anything.
/// `None` while nobody has answered.
pub fn answer(store: &Store, agent: &str, seq: u64) -> Option<bool> {
    let mut found = None;
    let _ = store.log().scan_back(|r| {
        if r.seq <= seq {
            return false;
        }
        if r.kind == LogKind::AgentControl
            && r.agent.as_deref() == Some(agent)
            && r.data.get("request").and_then(Value::as_u64) == Some(seq)
        {
            found = r.data.get("changed").and_then(Value::as_bool);
            return false;
        }
        true
    });
    found
}

/// Takes back request `seq` if it is still the agent's latest (nobody ran the agent to obey
/// it), so it cannot apply to a later run.
///
/// # Errors
/// The store refused the write.
pub fn withdraw(store: &Store, agent: &str, seq: u64) -> Result<()> {
    store.update_doc(CONTROL_DOC, |doc| {
        let mine = doc
            .get(agent)
            .and_then(|e| e.get("seq"))
            .and_then(Value::as_u64)
            == Some(seq);
        if mine {
            if let Some(m) = doc.as_object_mut() {
                m.remove(agent);
            }
        }
        Ok(NewEvent::new(
            LogKind::AgentControl,
            Some(agent),
            json!({"withdrawn": seq, "reason": "no running metash answered"}),
        ))
    })?;
    Ok(())
}

/// The agents this process runs now, by id, with their pausers.
#[derive(Default)]
pub struct Running(Mutex<BTreeMap<String, Pauser>>);

impl Running {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Pauser>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `agent` while the returned guard lives.
    pub fn enter(self: &std::sync::Arc<Self>, agent: &str, pauser: Pauser) -> Leave {
        self.insert(agent, pauser);
        self.leave_on_drop(agent)
    }

    pub fn get(&self, agent: &str) -> Option<Pauser> {
        self.map().get(agent).cloned()
    }

    /// Registers `agent` until its [`Leave`] drops (for a process whose pid is known only once
    /// it has started, after the caller set up the guard).
    pub fn insert(&self, agent: &str, pauser: Pauser) {
        self.map().insert(agent.to_string(), pauser);
    }

    /// Unregisters `agent` when the returned guard drops, whether or not it was ever registered.
    pub fn leave_on_drop(self: &std::sync::Arc<Self>, agent: &str) -> Leave {
        Leave {
            running: std::sync::Arc::clone(self),
            agent: agent.to_string(),
        }
    }
}

/// See [`Running::leave_on_drop`].
pub struct Leave {
    running: std::sync::Arc<Running>,
    agent: String,
}

impl Drop for Leave {
    fn drop(&mut self) {
        self.running.map().remove(&self.agent);
    }
}

/// Applies `want` to a pauser; whether anything changed.
pub fn apply(pauser: &Pauser, want: Want) -> bool {
    match want {
        Want::Suspended => pauser.pause(),
        Want::Active => pauser.resume(),
    }
}
