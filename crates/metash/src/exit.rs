//! Exit codes, fixed so scripts can branch on them (documented in the README).

/// A command failed (bad input, I/O error, unknown agent, ...).
pub const FAILURE: u8 = 1;
/// The agent ran and failed (`AgentResponse.status = "error"`).
pub const AGENT_ERROR: u8 = 3;
/// The agent was stopped at its deadline (`status = "timeout"`).
pub const TIMEOUT: u8 = 4;
/// A checkpoint waits for a person: answer with `metash resume --answer VALUE`.
pub const CHECKPOINT: u8 = 5;
