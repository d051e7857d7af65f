//! Exit codes, one set for every command, so scripts can branch on them (documented in the README).

/// A command failed or its request was refused (bad input, unknown agent, I/O error, ...).
pub const FAILURE: u8 = 1;
/// The agent ran and failed (`AgentResponse.status = "error"`).
pub const AGENT_ERROR: u8 = 3;
/// A checkpoint waits for a person: `metash run --answer VALUE` or `metash resume --answer VALUE`.
pub const CHECKPOINT: u8 = 4;
/// `metash run`: the session halted (gap limit, rejected plans, a task that keeps failing).
pub const HALTED: u8 = 5;
/// The agent was stopped at its deadline (`status = "timeout"`).
pub const TIMEOUT: u8 = 6;
