//! The one call the orchestrator needs from the host, as a trait so the orchestrator depends on the
//! contract, not on how agents are run.

use std::path::PathBuf;

use metash_protocol::{AgentResponse, SpawnOptions};

use crate::error::Result;

/// seed 000's `spawn_agent(agent_name, system_prompt, user_message, options)`, plus where the agent
/// works.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpawnRequest {
    pub agent_name: String,
    pub system_prompt: String,
    pub user_message: String,
    pub options: SpawnOptions,
    /// The directory the agent may work in (its workspace root); the project root when `None`.
    /// The orchestrator passes each task's git worktree here.
    pub workdir: Option<PathBuf>,
    /// Correlates the spawn's events with a plan task, when there is one.
    pub task_id: Option<String>,
    /// Whether the agent may write its workspace. The orchestrator's planner gets `ReadOnly` (it
    /// works on the project root, the user's checkout); a task's executor `ReadWrite` in its
    /// worktree. `metash spawn`, JSON-RPC and MCP keep the agent's own grants (`ReadWrite`).
    pub access: WorkspaceAccess,
}

/// What a spawn may do to its workspace, whatever the agent was granted. Either way `.git` stays
/// read-only and `.meta/` hidden.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WorkspaceAccess {
    /// As granted: a CLI role writes its workspace; a native or WASM agent as its `files.*`
    /// grants say.
    #[default]
    ReadWrite,
    /// Read-only: a CLI role's workspace is read-only in Landlock (its own HOME and TMPDIR stay
    /// writable), an API role writes nothing anyway, and a native or WASM agent's `files.write`
    /// on the workspace (or on any path inside the project) becomes `files.read`.
    ReadOnly,
}

impl SpawnRequest {
    pub fn new(agent_name: &str, system_prompt: &str, user_message: &str) -> Self {
        Self {
            agent_name: agent_name.to_string(),
            system_prompt: system_prompt.to_string(),
            user_message: user_message.to_string(),
            ..Self::default()
        }
    }
}

/// Spawns one sub-agent and waits for its response. Agent failure, timeout and checkpoint are
/// `Ok(AgentResponse)` with that status; `Err` is for requests the host cannot serve (unknown
/// agent, bad config, store failure).
pub trait Spawner: Send + Sync {
    fn spawn_agent(&self, request: &SpawnRequest) -> Result<AgentResponse>;
}
