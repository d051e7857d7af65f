//! The host served to other processes: JSON-RPC over stdio (driven from Rust and from a Python
//! client) and MCP (driven in-process, and by the real Claude Code CLI when it is installed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "serve/mod.rs"]
mod serve;
