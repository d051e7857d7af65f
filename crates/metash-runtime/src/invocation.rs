//! One `invoke(input)`: how it ended and the bookkeeping that decides it (end events, output cap,
//! throttle time). Both sandboxes feed [`Tracker`] the same messages.

use std::time::{Duration, Instant};

use metash_protocol::host::CheckpointTag;
use metash_protocol::{AgentEvent, AgentStatus, CheckpointSignal};
use serde::Serialize;

use crate::pump::Msg;

/// How an invocation ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum InvocationStatus {
    /// The agent sent `done`.
    Done {
        #[serde(skip_serializing_if = "Option::is_none")]
        agent_status: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        summary: Option<String>,
    },
    /// The agent paused for a human.
    Checkpoint { signal: CheckpointSignal },
    /// The deadline passed; the agent was stopped.
    Timeout,
    /// The agent exited (or closed stdout) without ending the invocation.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// A quota was hit (`memory`, `output_bytes`, `pids`); the agent was stopped.
    LimitExceeded { limit: String },
    /// The host interrupted it (shutdown while running) and it had to be killed.
    Killed { reason: String },
}

impl InvocationStatus {
    /// The seed-000 status a host response carries.
    pub fn agent_status(&self) -> AgentStatus {
        match self {
            Self::Done { agent_status, .. } if agent_status.as_deref() != Some("error") => {
                AgentStatus::Success
            }
            Self::Checkpoint { .. } => AgentStatus::Checkpoint,
            Self::Timeout => AgentStatus::Timeout,
            _ => AgentStatus::Error,
        }
    }
}

/// The result of one invocation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub status: InvocationStatus,
    pub events: u64,
    pub output_bytes: u64,
    pub protocol_errors: u64,
    pub duration_ms: u64,
    /// Total time the token bucket held the agent's events.
    pub throttled_ms: u64,
    /// The end of a native agent's stderr when it exited before ending the invocation: why it
    /// died is usually there (a missing module, a file the sandbox refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
}

/// Counts an invocation's messages and says when it is over.
pub(crate) struct Tracker {
    pub started: Instant,
    pub events: u64,
    pub bytes: u64,
    pub bad: u64,
    pub throttled: Duration,
    pub cap: u64,
}

/// What the tracker decided about one message.
pub(crate) enum Step {
    Continue,
    End(InvocationStatus),
    Eof,
    OverCap,
}

impl Tracker {
    pub fn new(cap: u64) -> Self {
        Self {
            started: Instant::now(),
            events: 0,
            bytes: 0,
            bad: 0,
            throttled: Duration::ZERO,
            cap,
        }
    }

    /// Account for one message, passing events to `on_event`.
    pub fn step(&mut self, msg: Msg, on_event: &mut dyn FnMut(&AgentEvent)) -> Step {
        match msg {
            Msg::Event(event, len, waited) => {
                self.events += 1;
                self.bytes += len as u64;
                self.throttled += waited;
                on_event(&event);
                if self.bytes > self.cap {
                    return Step::OverCap;
                }
                match event {
                    AgentEvent::Done { status, summary } => Step::End(InvocationStatus::Done {
                        agent_status: status,
                        summary,
                    }),
                    AgentEvent::Checkpoint {
                        reason,
                        message,
                        options,
                        resume_id,
                    } => Step::End(InvocationStatus::Checkpoint {
                        signal: CheckpointSignal {
                            kind: CheckpointTag::Checkpoint,
                            reason,
                            message,
                            options,
                            resume_id,
                        },
                    }),
                    _ => Step::Continue,
                }
            }
            Msg::Bad => {
                self.bad += 1;
                Step::Continue
            }
            Msg::Eof => Step::Eof,
        }
    }

    pub fn finish(&self, status: InvocationStatus) -> Outcome {
        Outcome {
            status,
            events: self.events,
            output_bytes: self.bytes,
            protocol_errors: self.bad,
            duration_ms: self.started.elapsed().as_millis() as u64,
            throttled_ms: self.throttled.as_millis() as u64,
            stderr: None,
        }
    }
}

impl crate::limits::QuotaHit {
    /// How the invocation it ended ends: `limit_exceeded` naming `disk` or `files`. Here, not in
    /// `limits`, so that the limits stay below the invocation (no import circle).
    pub fn status(&self) -> InvocationStatus {
        InvocationStatus::LimitExceeded {
            limit: self.limit.as_str().to_string(),
        }
    }
}
