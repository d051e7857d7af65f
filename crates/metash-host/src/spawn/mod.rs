//! `spawn_agent`: resolve the name, check the budget, hand over any checkpoint answer, run the agent
//! (runtime or harness), persist a checkpoint before returning it, charge the budget (not for a
//! replayed turn, which spends nothing).

mod acp;
mod acp_fs;
mod agent;
mod artifact;
pub(crate) mod confine;
mod context_refs;
mod gate;
pub(crate) mod key_proxy;
mod model;
pub(crate) mod permission;
pub(crate) mod tape;
mod tool_events;
pub(crate) mod usage_tap;
mod watch;

use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_protocol::{
    AgentResponse, AgentStatus, CheckpointReason, CheckpointSignal, ResponseMetadata,
};
use metash_store::NewEvent;
use serde_json::json;

use crate::budget;
use crate::error::{HostError, Result};
use crate::host::{Host, Target};
use crate::spawner::{SpawnRequest, Spawner};

/// When neither the spawn nor the config gives a timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// What one run of an agent produced, before the host's bookkeeping.
pub(crate) struct Ran {
    pub status: AgentStatus,
    pub data: String,
    pub tokens_used: u64,
    pub cost_usd: Option<f64>,
    pub checkpoint: Option<CheckpointSignal>,
}

impl Ran {
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            status: AgentStatus::Error,
            data: message.into(),
            tokens_used: 0,
            cost_usd: None,
            checkpoint: None,
        }
    }
}

impl Spawner for Host {
    fn spawn_agent(&self, req: &SpawnRequest) -> Result<AgentResponse> {
        let started = Instant::now();
        if req.agent_name.trim().is_empty() {
            return Err(HostError::InvalidRequest("agent_name is empty".into()));
        }
        if let Some(t) = req.options.timeout_seconds {
            if metash_protocol::timeout_from_secs(t).is_none() {
                return Err(HostError::InvalidRequest(format!(
                    "timeout_seconds must be a positive number, at most {} (30 days), not {}",
                    metash_protocol::MAX_TIMEOUT_SECONDS,
                    metash_protocol::show_seconds(t)
                )));
            }
        }
        // Paused: nothing runs until the person has answered.
        if let Some(p) = self.pending_checkpoint()? {
            return Err(HostError::CheckpointPending {
                id: p.id,
                message: p.signal.message,
            });
        }
        let target = self.resolve(&req.agent_name)?;
        let timeout = self.spawn_timeout(req, &target);
        // A replayed turn is answered from its tape (`Host::replay_from`, docs/replay.md): no model
        // runs and nothing is spent, so it neither asks about the budget nor is charged to it.
        let replayed = self.replaying().is_some();
        // Ask before spending past the run budget.
        if !replayed {
            if let Some(signal) = self.over_budget(req, &target)? {
                return self.checkpoint_response("host", signal, started, 0);
            }
        }
        // The answer to the last checkpoint goes to this spawn, and to no other.
        let resume = self.take_resume(&req.agent_name)?;
        self.record_later(NewEvent::new(
            LogKind::Spawn,
            Some(&req.agent_name),
            json!({"task_id": req.task_id, "options": req.options,
                   "workdir": req.workdir, "resume_data": resume}),
        ))?;
        let ran = match &target {
            Target::Agent(registry) => agent::run(self, registry, req, timeout, resume.as_ref()),
            Target::Role(role) if role.acp => acp::run(self, role, req, timeout, resume.as_ref()),
            Target::Role(role) => model::run(self, role, req, timeout, resume.as_ref()),
        };
        let ran = match ran {
            Ok(r) => r,
            Err(e @ HostError::ConsentRefused { .. }) => {
                return self.refused_spawn(req, started, e)
            }
            Err(e) => Ran::error(e.to_string()),
        };
        // A replay's usage is the recorded turn's, already charged when that turn ran: it is
        // reported (the response, `spawn_end` with `replayed`) but not added to the run's total.
        if !replayed && (ran.tokens_used > 0 || ran.cost_usd.is_some()) {
            budget::charge(self.store(), &req.agent_name, ran.tokens_used, ran.cost_usd)?;
        }
        // Every spawn ends with one `spawn_end`, a checkpoint's included (status `checkpoint`).
        let response = match ran.checkpoint {
            Some(signal) => {
                self.checkpoint_response(&req.agent_name, signal, started, ran.tokens_used)?
            }
            None => AgentResponse {
                status: ran.status,
                data: ran.data,
                metadata: ResponseMetadata {
                    tokens_used: ran.tokens_used,
                    duration_ms: started.elapsed().as_millis() as u64,
                },
            },
        };
        self.end_spawn(&req.agent_name, &response, replayed)?;
        Ok(response)
    }
}

impl Host {
    /// Logs the spawn's one `spawn_end` and flushes the log. A replayed turn's carries
    /// `replayed: true`: its `tokens_used` are the recorded turn's, with no `budget_charge`.
    fn end_spawn(&self, agent: &str, response: &AgentResponse, replayed: bool) -> Result<()> {
        let meta = &response.metadata;
        let mut end = json!({"status": response.status, "tokens_used": meta.tokens_used,
                             "duration_ms": meta.duration_ms, "data_bytes": response.data.len()});
        if replayed {
            end["replayed"] = json!(true);
        }
        self.record_later(NewEvent::new(LogKind::SpawnEnd, Some(agent), end))?;
        self.flush_events()
    }

    /// A spawn its consent refused: it ends (`spawn_end` with `refused`: the capability), and the
    /// refusal is the caller's error, not an agent's failure to retry.
    fn refused_spawn(
        &self,
        req: &SpawnRequest,
        started: Instant,
        e: HostError,
    ) -> Result<AgentResponse> {
        let capability = match &e {
            HostError::ConsentRefused { capability, .. } => Some(capability.as_str()),
            _ => None,
        };
        self.record_later(NewEvent::new(
            LogKind::SpawnEnd,
            Some(&req.agent_name),
            json!({"status": AgentStatus::Error, "tokens_used": 0,
                   "duration_ms": started.elapsed().as_millis() as u64, "data_bytes": 0,
                   "refused": capability}),
        ))?;
        self.flush_events()?;
        Err(e)
    }

    /// The spawn's bound: the request's, else the role's, else the host's default.
    fn spawn_timeout(&self, req: &SpawnRequest, target: &Target) -> Duration {
        let role_timeout = match target {
            Target::Role(role) => role.timeout_seconds,
            Target::Agent(_) => None,
        };
        req.options
            .timeout_seconds
            .or(role_timeout)
            .or(self.config().host.default_timeout_seconds)
            .and_then(metash_protocol::timeout_from_secs)
            .unwrap_or(DEFAULT_TIMEOUT)
    }

    /// The checkpoint to raise when this spawn would take the run past its budget (unless the
    /// person already said to continue).
    fn over_budget(&self, req: &SpawnRequest, target: &Target) -> Result<Option<CheckpointSignal>> {
        let reserve = match target {
            Target::Role(role) => req.options.max_tokens.or(role.max_tokens).unwrap_or(4096),
            Target::Agent(_) => 0,
        };
        let used = budget::used(self.store())?;
        let Some(why) = budget::would_exceed(&self.config().budget, &used, reserve) else {
            return Ok(None);
        };
        if self.take_budget_continue()? {
            return Ok(None);
        }
        Ok(Some(CheckpointSignal {
            kind: Default::default(),
            reason: CheckpointReason::DecisionRequired,
            message: format!(
                "Spawning `{}` would exceed the run budget: {why}. Continue anyway \
                 (raise [budget] in .meta/config.toml to stop being asked)?",
                req.agent_name
            ),
            options: vec!["continue".into(), "stop".into()],
            resume_id: Some(crate::checkpoint::BUDGET_CHECKPOINT.into()),
        }))
    }

    /// Persists the checkpoint (before anyone is shown it), then answers with it.
    fn checkpoint_response(
        &self,
        agent: &str,
        signal: CheckpointSignal,
        started: Instant,
        tokens_used: u64,
    ) -> Result<AgentResponse> {
        let pending = self.raise_checkpoint(agent, &signal)?;
        let mut signal = pending.signal;
        signal.resume_id = Some(pending.id);
        Ok(AgentResponse {
            status: AgentStatus::Checkpoint,
            data: serde_json::to_string(&signal).map_err(|e| HostError::Other(e.to_string()))?,
            metadata: ResponseMetadata {
                tokens_used,
                duration_ms: started.elapsed().as_millis() as u64,
            },
        })
    }
}
