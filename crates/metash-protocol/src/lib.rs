//! The types every metash layer shares: the host protocol (seed 000), the session state (seed 001),
//! the agent manifest and event protocol (seed 002) and the harness types (seed 003).
//!
//! This crate does no I/O on purpose: it is the one crate every other crate (and every agent, through
//! `metash-agent`) links, so it must stay small, fast to build and free of policy. Field names on the
//! wire follow the seeds exactly: camelCase for seeds 001 and 003, snake_case for 000's checkpoint and
//! 002's events.

pub mod capability;
pub mod continuation;
pub mod events;
pub mod harness;
pub mod host;
pub mod log;
pub mod manifest;
pub mod schema;
pub mod session;
pub mod terminal;

pub use events::{AgentEvent, BaseEvent, EventEnvelope, ProtocolMessage, EVENT_PROTOCOL_VERSION};
pub use harness::{
    FrontendCapability, FrontendKind, HarnessCapabilities, HarnessContinuationKey,
    HarnessContinuationRef, HarnessErrorCode, HarnessEvent, HarnessEventEnvelope, HarnessFrontend,
    InteractionMode, IoMode, ProcessInvocationSpec, ProviderCapabilities, ProviderDomain, RunError,
    RunResult, RunTurnNonInteractiveResponse, ToolCall, Usage,
};
pub use host::{
    show_seconds, timeout_from_secs, AgentResponse, AgentStatus, CheckpointReason,
    CheckpointSignal, LogLevel, ModelHint, ResponseMetadata, ResumeData, SpawnOptions,
    MAX_TIMEOUT_SECONDS,
};
pub use log::{LogKind, LogRecord, LOG_SCHEMA_VERSION};
pub use manifest::{Hook, Manifest, SandboxKind, MANIFEST_SCHEMA_VERSIONS};
pub use session::{
    PendingCheckpoint, Plan, SessionState, SessionStatus, Task, TaskStatus, SESSION_SCHEMA_VERSION,
};
pub use terminal::{sanitize_for_terminal, sanitize_line};
