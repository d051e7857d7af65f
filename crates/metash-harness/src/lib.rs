//! The harness layer (seed 003): how metash drives the coding agents people already use and the
//! model APIs directly.
//!
//! - Provider typing and capabilities: [`get_harness_capabilities`], [`check_continuation`].
//! - CLI process preparation: [`build_process_invocation_spec`] = [`materialize`] (files under
//!   `aspHome`, deterministic) + [`build_invocation`] (argv/env/cwd only).
//! - Non-interactive turns: [`Harness::run_turn_non_interactive`] for `agent-sdk` (Claude Code
//!   stream-json), `pi-sdk` (pi JSON mode), the CLIs run headless, and metash's own streaming
//!   clients (`anthropic-api`, `openai-responses`, `openai-chat`).
//! - Spawning a spec exactly as given: [`runner`]; opening it in tmux: [`tmux`].
//!
//! Errors carry stable wire codes ([`HarnessError::code`]).

pub mod acp;
pub mod api;
pub mod attachments;
pub mod confine;
mod error;
pub mod events;
pub mod frontend;
pub mod fsutil;
pub mod invocation;
pub mod observe;
pub mod programs;
pub mod quote;
pub mod request;
pub mod runner;
pub mod tmux;
mod turn;

pub use confine::{ConfineGuard, Confiner, ConfinerHandle};
pub use error::{HarnessError, Result};
pub use events::{Emitter, EventSink};
/// The registry's old path.
pub use frontend::registry;
pub use frontend::registry::{check_continuation, check_model, get_harness_capabilities};
pub use frontend::{Frontend, FrontendInfo, KeyHeader, Registry, Turn, TurnParser};
pub use invocation::{
    build_invocation, build_invocation_with, build_process_invocation_spec, materialize,
    materialize_with, BuildProcessInvocationSpecRequest, BuildProcessInvocationSpecResponse,
    Endpoint, HarnessOptions, Materialized,
};
pub use programs::{program_version, Program, Programs};
pub use request::{RunTurnNonInteractiveRequest, SignInOptions};
pub use tokio_util::sync::CancellationToken;
pub use turn::Harness;
