//! Running a model-backed role for one spawn: a fresh conversation (no continuation key), the
//! role's frontend and model, `max_tokens` passed to the API and counted as the turn streams, the
//! deadline enforced by cancelling the request (or killing the CLI's process group).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_harness::{CancellationToken, Endpoint, RunTurnNonInteractiveRequest};
use metash_protocol::{
    AgentStatus, CheckpointSignal, HarnessErrorCode, HarnessEvent, HarnessEventEnvelope, ResumeData,
};
use metash_store::NewEvent;
use serde_json::{json, Value};

use super::Ran;
use crate::config::{Permissions, Role};
use crate::error::{HostError, Result};
use crate::host::Host;
use crate::pricing::{Stop, TurnMeter};
use crate::spawner::SpawnRequest;

pub(crate) fn run(
    host: &Host,
    role: &Role,
    req: &SpawnRequest,
    timeout: Duration,
    resume: Option<&ResumeData>,
) -> Result<Ran> {
    host.preflight_role(&req.agent_name, role)?;
    let harness = host.harness()?;
    let workdir = req.workdir.clone().unwrap_or_else(|| host.workspace());
    // Each spawn gets its own aspHome: a CLI harness's config and history start empty, so the
    // sub-agent cannot see the orchestrator's (or any earlier spawn's) conversation.
    let spawn_dir = tempfile::Builder::new()
        .prefix("metash-spawn-")
        .tempdir_in(host.spawn_root()?)
        .map_err(|e| HostError::Other(format!("creating the spawn directory: {e}")))?;
    let mut turn = RunTurnNonInteractiveRequest::new(
        role.frontend,
        spawn_dir.path(),
        absolute(&workdir),
        prompt_with_resume(&req.user_message, resume),
    );
    turn.cp_session_id = host.session_id()?;
    turn.model = role.model(req.options.model_hint);
    let max_tokens = req.options.max_tokens.or(role.max_tokens);
    turn.max_tokens = max_tokens.map(|m| u32::try_from(m).unwrap_or(u32::MAX));
    turn.timeout_ms = Some(timeout.as_millis() as u64);
    turn.options.system_prompt = (!req.system_prompt.is_empty()).then(|| req.system_prompt.clone());
    turn.options.isolated_home = role.isolated_home;
    let cancel = CancellationToken::new();
    let model = turn.model.clone().unwrap_or_default();
    let budget = &host.config().budget;
    let cost_budget = match budget.max_cost_usd {
        Some(max) => Some((max, crate::budget::used(host.store())?.cost_usd)),
        None => None,
    };
    let price = host.config().prices.price(&model);
    let charge = Charge {
        meter: Arc::new(Mutex::new(TurnMeter::new(max_tokens, cost_budget, price))),
        stopped: Arc::new(Mutex::new(None)),
        cancel: cancel.clone(),
    };
    // A CLI gets a placeholder key and the credential proxy's URL; only the in-process API
    // clients hold the key itself.
    let is_cli = role.runs_cli();
    let key_proxy = if is_cli {
        // Usage is read on the wire as each response streams, the same way for every CLI.
        let charge = charge.clone();
        let tap = super::usage_tap::WireUsage::new(move |u| charge.observe(u));
        super::key_proxy::start(host, &req.agent_name, role, Some(Arc::new(tap)))?
    } else {
        None
    };
    if let Some((_, endpoint, vars)) = &key_proxy {
        turn.options.endpoint = Some(endpoint.clone());
        for var in vars {
            turn.env
                .insert(var.clone(), super::key_proxy::PLACEHOLDER.to_string());
        }
    } else {
        if let Some(base_url) = &role.base_url {
            turn.options.endpoint = Some(Endpoint {
                base_url: base_url.clone(),
                api_key_env: role.key_env(),
                provider_name: None,
            });
        }
        if let Some(var) = role.key_env() {
            if let Some(v) = host.env_var(&var) {
                turn.env.insert(var, v);
            }
        }
    }
    let mut permission_server = None;
    if is_cli {
        if let Some(refused) = super::confine::native_consent(host, &req.agent_name)? {
            return Ok(refused);
        }
        let port = match &key_proxy {
            Some((proxy, ..)) => Some(proxy.addr().port()),
            None => role.base_url.as_deref().and_then(super::confine::url_port),
        };
        let mut confiner = super::confine::RoleConfiner::new(
            &req.agent_name,
            role,
            spawn_dir.path(),
            timeout,
            |k| host.env_var(k),
            host.event_sink(),
        );
        confiner.hidden = host.hidden_dirs();
        confiner.connect_ports = port.into_iter().collect();
        if role.permissions == Permissions::Ask {
            let server = super::permission::start_for(host, &req.agent_name, &workdir)?;
            confiner.connect_ports.push(server.port());
            turn.options.mcp_servers = Some(server.mcp_servers());
            turn.options.permission_prompt_tool = Some(super::permission::TOOL.into());
            permission_server = Some(server);
        } else {
            // Its own prompts and sandbox off: metash's sandbox is the boundary.
            turn.options.skip_permissions = true;
        }
        turn.confiner = metash_harness::ConfinerHandle::new(Arc::new(confiner));
    }

    let partial = Arc::new(Mutex::new(String::new()));
    let agent = req.agent_name.clone();
    let mut sink = {
        let charge = charge.clone();
        let partial = Arc::clone(&partial);
        move |ev: HarnessEventEnvelope| {
            match &ev.payload {
                Some(HarnessEvent::TextDelta { text }) => {
                    if let Ok(mut p) = partial.lock() {
                        p.push_str(text);
                    }
                }
                Some(HarnessEvent::Usage { usage }) => charge.observe(usage),
                _ => {}
            }
            let line = match ev.payload.as_ref().and_then(super::tool_events::summarize) {
                Some((kind, data)) => NewEvent::new(kind, Some(&agent), data),
                None => NewEvent::new(
                    "harness_event",
                    Some(&agent),
                    serde_json::to_value(&ev).unwrap_or(Value::Null),
                ),
            };
            let _ = host.record_later(line);
        }
    };
    let rt = host.tokio()?;
    let response = rt.block_on(async {
        let fut = harness.run_turn_non_interactive(&turn, &cancel, &mut sink);
        // The harness enforces timeout_ms itself; this outer bound only guards against a harness
        // that does not return, and cancels it so its process or request is torn down.
        match tokio::time::timeout(timeout + Duration::from_secs(5), fut).await {
            Ok(r) => r,
            Err(_) => {
                cancel.cancel();
                Err(metash_harness::HarnessError::InvalidRequest(
                    "the harness did not return after its deadline".into(),
                ))
            }
        }
    });
    drop(spawn_dir);
    drop(key_proxy);
    drop(permission_server);
    let response = match response {
        Ok(r) => r,
        Err(e) => return Ok(Ran::error(format!("{}: {e}", e.code().as_str()))),
    };
    let result = response.result;
    let (usage_tokens, metered_cost) = {
        let mut m = charge
            .meter
            .lock()
            .map_err(|_| HostError::Other("the turn's meter was poisoned".into()))?;
        if let Some(u) = &result.usage {
            m.observe(u);
        }
        (m.total_tokens(), m.cost())
    };
    // The frontend's own figure when it gives one (Claude Code), else the host's pricing.
    let cost_usd = result.cost_usd.or(metered_cost);
    let partial = partial.lock().map(|p| p.clone()).unwrap_or_default();
    let text = result.final_output.clone().unwrap_or(partial);
    if let Some(stop) = charge.stopped.lock().ok().and_then(|s| s.clone()) {
        return Ok(Ran {
            status: AgentStatus::Error,
            data: stop.explain(),
            tokens_used: usage_tokens,
            cost_usd,
            checkpoint: None,
        });
    }
    let (status, data) = match &result.error {
        // The provider stopped at the cap: the answer is cut off, which is a failure to say so.
        None if result.stop_reason.as_deref() == Some("max_tokens") => (
            AgentStatus::Error,
            format!(
                "max_tokens ({}) reached: the answer was cut off. Partial answer: {text}",
                max_tokens.unwrap_or(0)
            ),
        ),
        None if result.success => (AgentStatus::Success, text),
        Some(err) if err.code == HarnessErrorCode::Timeout => (AgentStatus::Timeout, text),
        Some(err) => (
            AgentStatus::Error,
            format!("{}: {}", err.code.as_str(), err.message),
        ),
        None => (AgentStatus::Error, text),
    };
    // A model signals a checkpoint with seed 000's JSON as its whole answer.
    let checkpoint = (status == AgentStatus::Success)
        .then(|| parse_checkpoint(&data))
        .flatten();
    Ok(Ran {
        status,
        data,
        tokens_used: usage_tokens,
        cost_usd,
        checkpoint,
    })
}

/// The turn's meter, shared by the harness's events and the credential proxy's usage tap:
/// charged as usage streams, the turn stops at the first report past a limit.
#[derive(Clone)]
struct Charge {
    meter: Arc<Mutex<TurnMeter>>,
    stopped: Arc<Mutex<Option<Stop>>>,
    cancel: CancellationToken,
}

impl Charge {
    fn observe(&self, usage: &metash_protocol::Usage) {
        let stop = self.meter.lock().ok().and_then(|mut m| m.observe(usage));
        if let Some(stop) = stop {
            if let Ok(mut s) = self.stopped.lock() {
                s.get_or_insert(stop);
            }
            self.cancel.cancel();
        }
    }
}

fn absolute(p: &std::path::Path) -> std::path::PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The user's answer to the last checkpoint travels with the message, marked so the model knows
/// what it is.
fn prompt_with_resume(message: &str, resume: Option<&ResumeData>) -> String {
    match resume {
        Some(r) => format!(
            "{message}\n\n[resume_data] {}",
            json!({"checkpoint_id": r.checkpoint_id, "user_input": r.user_input})
        ),
        None => message.to_string(),
    }
}

/// A reply that is (possibly fenced) seed-000 checkpoint JSON.
fn parse_checkpoint(text: &str) -> Option<CheckpointSignal> {
    let t = text.trim();
    let t = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .map(|r| r.trim_end().trim_end_matches("```").trim())
        .unwrap_or(t);
    if !t.starts_with('{') {
        return None;
    }
    serde_json::from_str::<CheckpointSignal>(t).ok()
}
