//! The JSON Schemas of every top-level type, by the name `metash schema NAME` takes. The files in
//! `schemas/` are generated from this list and a test fails when they drift.

use schemars::{schema_for, Schema};

use crate::{
    AgentResponse, CheckpointSignal, EventEnvelope, HarnessCapabilities, HarnessContinuationRef,
    HarnessEventEnvelope, LogRecord, Manifest, ProcessInvocationSpec, ProtocolMessage,
    ProviderDomain, ResumeData, RunTurnNonInteractiveResponse, SessionState, SpawnOptions,
};

/// Every schema name, in the order `metash schema --list` prints them.
pub const NAMES: &[&str] = &[
    "agent-response",
    "spawn-options",
    "checkpoint",
    "resume-data",
    "session",
    "log-record",
    "manifest",
    "agent-message",
    "event-envelope",
    "provider-domain",
    "continuation-ref",
    "process-invocation-spec",
    "harness-capabilities",
    "run-turn-response",
    "harness-event",
];

/// The schema for `name`, or `None` if there is no such schema.
pub fn schema(name: &str) -> Option<Schema> {
    Some(match name {
        "agent-response" => schema_for!(AgentResponse),
        "spawn-options" => schema_for!(SpawnOptions),
        "checkpoint" => schema_for!(CheckpointSignal),
        "resume-data" => schema_for!(ResumeData),
        "session" => schema_for!(SessionState),
        "log-record" => schema_for!(LogRecord),
        "manifest" => schema_for!(Manifest),
        "agent-message" => schema_for!(ProtocolMessage),
        "event-envelope" => schema_for!(EventEnvelope),
        "provider-domain" => schema_for!(ProviderDomain),
        "continuation-ref" => schema_for!(HarnessContinuationRef),
        "process-invocation-spec" => schema_for!(ProcessInvocationSpec),
        "harness-capabilities" => schema_for!(HarnessCapabilities),
        "run-turn-response" => schema_for!(RunTurnNonInteractiveResponse),
        "harness-event" => schema_for!(HarnessEventEnvelope),
        _ => return None,
    })
}

/// The schema as the pretty JSON checked into `schemas/NAME.json` (with a trailing newline).
pub fn schema_json(name: &str) -> Option<String> {
    let schema = schema(name)?;
    serde_json::to_string_pretty(&schema).ok().map(|s| s + "\n")
}
