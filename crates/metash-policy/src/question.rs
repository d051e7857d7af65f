//! What a consent request asks and what the answer can be: plain data, below the policy, the
//! prompters and the policy file, which all speak it.

use serde::Serialize;

use crate::capability::Capability;

/// High-risk actions that the seed says ask per action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sensitive {
    NetworkWrite,
    ProcessSpawn,
    WriteOutsideWorkspace,
    NativeExec,
}

impl Sensitive {
    pub fn as_str(self) -> &'static str {
        match self {
            Sensitive::NetworkWrite => "network_write",
            Sensitive::ProcessSpawn => "process_spawn",
            Sensitive::WriteOutsideWorkspace => "write_outside_workspace",
            Sensitive::NativeExec => "native_exec",
        }
    }
}

/// The question put to the person (or rule set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsentQuestion {
    pub agent: String,
    /// The manifest's human name.
    pub agent_name: String,
    pub capability: Capability,
    pub reason: String,
    pub sensitive: Option<Sensitive>,
    /// The grant length the agent suggested.
    pub duration_s: Option<u64>,
}

impl ConsentQuestion {
    /// A question from `agent` (its id doubles as its name) for `capability`, not sensitive.
    pub fn new(agent: &str, capability: Capability, reason: &str, duration_s: Option<u64>) -> Self {
        Self {
            agent: agent.to_string(),
            agent_name: agent.to_string(),
            capability,
            reason: reason.to_string(),
            sensitive: None,
            duration_s,
        }
    }
}

/// The answers users expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    AllowOnce,
    /// Allow for this many seconds (records a grant).
    AllowFor(u64),
    Deny,
}
