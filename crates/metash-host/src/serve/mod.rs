//! The host for other processes: JSON-RPC 2.0 over NDJSON ([`rpc`]) so a control plane in any
//! language can drive it, and MCP ([`mcp`]) so an LLM harness (Claude Code, Codex) can orchestrate
//! through metash. Both are thin transports over one [`Service`], which validates parameters the
//! same way for both and calls the same `Host` and `Spawner` methods the CLI calls.

pub mod mcp;
pub mod params;
pub mod rpc;
mod service;

pub use mcp::McpServer;
pub use params::ParamError;
pub use rpc::RpcServer;
pub use service::{CallError, Service};
