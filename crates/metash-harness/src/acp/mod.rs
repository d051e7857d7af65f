//! The Agent Client Protocol, client side: any ACP agent (claude-code-acp, codex-acp, goose,
//! Gemini CLI...) runs as a metash role (`frontend = "acp"` in `[roles.X]`, docs/acp.md).
//!
//! - [`wire`]: the JSON-RPC framing and the ACP messages metash uses (no I/O).
//! - [`map`]: `session/update`s as metash events, and what a permission request is about
//!   (no I/O).
//! - [`client`]: the process and the conversation of one prompt turn; the caller confines the
//!   process ([`crate::Confiner`]) and answers the agent's requests ([`client::AcpHost`]).
//!
//! An ACP agent is not one of seed 003's provider-typed frontends (its provider is whatever the
//! agent wraps), so it is not in `HarnessFrontend`: the host runs it from the role's own
//! `command`, with the credential proxy of the provider the role names.

pub mod client;
pub mod map;
pub mod wire;

pub use client::{run_turn, AcpHost, AcpOutcome, AcpTurn, End};
pub use map::{AcpEvent, Mapper, Subject};
pub use wire::{PlanEntry, StopReason, ToolKind, ToolStatus};
