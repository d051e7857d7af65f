//! Running a model-backed role for one spawn: a fresh conversation (no continuation key), the
//! role's frontend and model, `max_tokens` passed to the API and counted as the turn streams, the
//! deadline enforced by cancelling the request (or killing the CLI's process group).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_protocol::LogKind;

use metash_harness::{CancellationToken, Endpoint, RunTurnNonInteractiveRequest};
use metash_protocol::{
    AgentStatus, CheckpointSignal, HarnessErrorCode, HarnessEvent, HarnessEventEnvelope,
    ResumeData, RunResult,
};
use metash_store::NewEvent;
use serde_json::{json, Value};

use super::permission::PermissionServer;
use super::Ran;
use crate::config::{Permissions, Role};
use crate::error::{HostError, Result};
use crate::host::Host;
use crate::pricing::{Stop, TurnMeter};
use crate::spawner::{SpawnRequest, WorkspaceAccess};

/// One spawn of a model role, as its steps see it.
struct RoleSpawn<'a> {
    host: &'a Host,
    role: &'a Role,
    req: &'a SpawnRequest,
    workdir: PathBuf,
    timeout: Duration,
}

/// What a turn keeps alive while it runs: the spawn's home, the credential proxy, the
/// permission server. Dropped when the turn returns.
struct Running {
    key_proxy: Option<super::key_proxy::Started>,
    permission_server: Option<PermissionServer>,
    /// Set when the CLI's tree passed its disk or file quota (and was killed).
    write_hit: metash_runtime::limits::WriteHit,
}

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
    let workdir = match host.check_workdir(&workdir) {
        Ok(w) => w,
        Err(e) => {
            return Ok(Ran::error(format!(
                "`{}` was not started: {e}",
                req.agent_name
            )))
        }
    };
    let s = RoleSpawn {
        host,
        role,
        req,
        workdir,
        timeout,
    };
    // Each spawn gets its own aspHome: a CLI harness's config and history start empty, so the
    // sub-agent cannot see the orchestrator's (or any earlier spawn's) conversation.
    let spawn_dir = tempfile::Builder::new()
        .prefix("metash-spawn-")
        .tempdir_in(host.spawn_root()?)
        .map_err(|e| HostError::Other(format!("creating the spawn directory: {e}")))?;
    let mut turn = s.turn_request(spawn_dir.path(), resume)?;
    let cancel = CancellationToken::new();
    let charge = s.charge(&turn, &cancel)?;
    let tape = super::tape::TurnTape::new(host, req, role);
    let mut running = Running {
        key_proxy: s.key(&mut turn, &charge, tape.as_ref())?,
        permission_server: None,
        write_hit: Default::default(),
    };
    if role.runs_cli() {
        super::confine::native_consent(host, &req.agent_name)?;
        running.permission_server = s.confine(&mut turn, spawn_dir.path(), &running)?;
    }
    let partial = Arc::new(Mutex::new(String::new()));
    let mut sink = event_sink(host, &req.agent_name, &charge, &partial);
    // A CLI registers its process group when it starts (RoleConfiner::spawned); suspend and
    // resume reach it from this host or, through the store, from any other process.
    let _leave = host.running().leave_on_drop(&req.agent_name);
    let _watch = super::watch::RunWatch::start(
        host.store().clone(),
        &req.agent_name,
        None,
        Arc::clone(host.running()),
    );
    let response = host.tokio()?.block_on(async {
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
    let hit = running.write_hit.get();
    drop(running);
    super::tape::save(tape, host);
    let ran = match response {
        Ok(r) => outcome(&r.result, &charge, &partial, s.max_tokens()),
        Err(e) => Ok(Ran::error(format!("{}: {e}", e.code().as_str()))),
    };
    over_write_quota(ran, hit, &req.agent_name, || spawn_dir.keep())
}

/// A turn stopped at its disk or file quota ends as an error saying so, and the spawn's
/// directory (its HOME and TMPDIR) is kept for inspection (`keep_spawn_dir`), as its worktree is.
/// Otherwise the directory's owner decides: a CLI turn's is removed, an ACP role's kept one stays
/// for its next spawn.
pub(super) fn over_write_quota(
    ran: Result<Ran>,
    hit: Option<metash_runtime::limits::QuotaHit>,
    agent: &str,
    keep_spawn_dir: impl FnOnce() -> std::path::PathBuf,
) -> Result<Ran> {
    let Some(hit) = hit else {
        return ran;
    };
    let mut ran = ran?;
    let kept = keep_spawn_dir();
    ran.status = AgentStatus::Error;
    ran.checkpoint = None;
    ran.data = format!(
        "`{agent}` exceeded {}; its HOME and TMPDIR are kept in {}",
        hit.explain(),
        kept.display()
    );
    Ok(ran)
}

impl RoleSpawn<'_> {
    fn max_tokens(&self) -> Option<u64> {
        self.req.options.max_tokens.or(self.role.max_tokens)
    }

    /// A fresh conversation for the role's frontend and model, with the spawn's limits.
    fn turn_request(
        &self,
        asp_home: &Path,
        resume: Option<&ResumeData>,
    ) -> Result<RunTurnNonInteractiveRequest> {
        let (req, role) = (self.req, self.role);
        let mut turn = RunTurnNonInteractiveRequest::new(
            role.frontend,
            asp_home,
            absolute(&self.workdir),
            prompt_with_resume(&req.user_message, resume),
        );
        turn.cp_session_id = self.host.session_id()?;
        turn.model = role.model(req.options.model_hint);
        turn.max_tokens = self
            .max_tokens()
            .map(|m| u32::try_from(m).unwrap_or(u32::MAX));
        turn.timeout_ms = Some(self.timeout.as_millis() as u64);
        turn.options.system_prompt =
            (!req.system_prompt.is_empty()).then(|| req.system_prompt.clone());
        turn.options.isolated_home = role.isolated_home;
        // A replay pins the recorded conversation id where the CLI lets it (Claude Code).
        turn.options.session_id = self.host.replaying().and_then(|c| c.pinned_session());
        Ok(turn)
    }

    /// The turn's meter: its token cap, what is left of the cost budget, the model's price.
    fn charge(
        &self,
        turn: &RunTurnNonInteractiveRequest,
        cancel: &CancellationToken,
    ) -> Result<Charge> {
        let config = self.host.config();
        let cost_budget = match config.budget.max_cost_usd {
            Some(max) => Some((max, crate::budget::used(self.host.store())?.cost_usd)),
            None => None,
        };
        let price = config
            .prices
            .price(turn.model.as_deref().unwrap_or_default());
        let meter = TurnMeter::new(self.max_tokens(), cost_budget, price);
        Ok(Charge {
            meter: Arc::new(Mutex::new(meter)),
            stopped: Arc::new(Mutex::new(None)),
            cancel: cancel.clone(),
        })
    }

    /// How the turn reaches the model: a CLI gets a placeholder key and the credential proxy's
    /// URL (usage read on the wire as each response streams). An in-process API client is sent
    /// through the proxy the same way when its turn is recorded or replayed (docs/replay.md,
    /// "API roles"): the proxy is where exchanges are taped and answered from, and the key then
    /// stays in the proxy. Otherwise the API client holds the key itself.
    fn key(
        &self,
        turn: &mut RunTurnNonInteractiveRequest,
        charge: &Charge,
        tape: Option<&super::tape::TurnTape>,
    ) -> Result<Option<super::key_proxy::Started>> {
        let (host, role) = (self.host, self.role);
        let cli = role.runs_cli();
        if cli || tape.is_some() || host.replaying().is_some() {
            // An API client reports its usage in its own events (`event_sink`): tapping the
            // wire too would charge it twice.
            let tap = cli.then(|| {
                let charge = charge.clone();
                Arc::new(super::usage_tap::WireUsage::new(move |u| charge.observe(u)))
                    as Arc<dyn metash_runtime::credential::UsageTap>
            });
            let hooks = super::key_proxy::Hooks {
                tap,
                recorder: tape.map(super::tape::TurnTape::recorder),
            };
            let proxy = super::key_proxy::start_recorded(host, &self.req.agent_name, role, hooks)?;
            if let Some(started) = &proxy {
                turn.options.endpoint = Some(started.endpoint.clone());
                turn.options.sign_in = started.sign_in.clone();
                for var in &started.placeholders {
                    turn.env
                        .insert(var.clone(), super::key_proxy::PLACEHOLDER.to_string());
                }
            }
            // An API role with no key (a local server) passes no proxy and is not recorded.
            if cli || proxy.is_some() {
                return Ok(proxy);
            }
        }
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
        Ok(None)
    }

    /// A CLI runs in the native sandbox, reaching only the proxy (and, with `permissions =
    /// "ask"`, metash's approve tool).
    fn confine(
        &self,
        turn: &mut RunTurnNonInteractiveRequest,
        home: &Path,
        running: &Running,
    ) -> Result<Option<PermissionServer>> {
        let (host, role, agent) = (self.host, self.role, &self.req.agent_name);
        let port = match &running.key_proxy {
            Some(started) => Some(started.proxy.addr().port()),
            None => role.base_url.as_deref().and_then(super::confine::url_port),
        };
        let mut confiner = super::confine::RoleConfiner::new(
            agent,
            role,
            home,
            self.timeout,
            |k| host.env_var(k),
            host.event_sink(),
        );
        confiner.fence.hidden = host.hidden_dirs();
        confiner.fence.protected = host.protected_dirs();
        // A planner (any spawn that is not a task's executor) reads the project, never writes it.
        confiner.fence.workspace_read_only = self.req.access == WorkspaceAccess::ReadOnly;
        confiner.project = Some(host.workspace());
        confiner.fence.connect_ports = port.into_iter().collect();
        confiner.fence.write.hit = running.write_hit.clone();
        let (running_agents, sink, name) = (
            Arc::clone(host.running()),
            host.event_sink(),
            agent.to_string(),
        );
        confiner.on_spawn = Some(Arc::new(move |pid: u32| {
            if let Ok(pgid) = i32::try_from(pid) {
                let pauser = metash_runtime::Pauser::for_group(&name, pgid, Arc::clone(&sink));
                running_agents.insert(&name, pauser);
            }
        }));
        let mut server = None;
        if role.permissions == Permissions::Ask {
            let s = super::permission::start_for(host, agent, &self.workdir)?;
            confiner.fence.connect_ports.push(s.port());
            turn.options.mcp_servers = Some(s.mcp_servers());
            turn.options.permission_prompt_tool = Some(super::permission::TOOL.into());
            server = Some(s);
        } else {
            // Its own prompts and sandbox off: metash's sandbox is the boundary.
            turn.options.skip_permissions = true;
        }
        turn.confiner = metash_harness::ConfinerHandle::new(Arc::new(confiner));
        Ok(server)
    }
}

/// Where the turn's events go: text deltas kept for a partial answer, usage charged, every event
/// to the log (tool calls summarized).
fn event_sink<'a>(
    host: &'a Host,
    agent: &str,
    charge: &Charge,
    partial: &Arc<Mutex<String>>,
) -> impl FnMut(HarnessEventEnvelope) + Send + 'a {
    let agent = agent.to_string();
    let charge = charge.clone();
    let partial = Arc::clone(partial);
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
                LogKind::HarnessEvent,
                Some(&agent),
                serde_json::to_value(&ev).unwrap_or(Value::Null),
            ),
        };
        let _ = host.record_later(line);
    }
}

/// The spawn's answer from the turn's result: a stop by the meter, a cut-off answer, a timeout,
/// an error, or success (possibly a checkpoint).
pub(super) fn outcome(
    result: &RunResult,
    charge: &Charge,
    partial: &Mutex<String>,
    max_tokens: Option<u64>,
) -> Result<Ran> {
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
pub(super) struct Charge {
    pub(super) meter: Arc<Mutex<TurnMeter>>,
    pub(super) stopped: Arc<Mutex<Option<Stop>>>,
    pub(super) cancel: CancellationToken,
}

impl Charge {
    pub(super) fn observe(&self, usage: &metash_protocol::Usage) {
        let stop = self.meter.lock().ok().and_then(|mut m| m.observe(usage));
        if let Some(stop) = stop {
            if let Ok(mut s) = self.stopped.lock() {
                s.get_or_insert(stop);
            }
            self.cancel.cancel();
        }
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The user's answer to the last checkpoint travels with the message, marked so the model knows
/// what it is.
pub(super) fn prompt_with_resume(message: &str, resume: Option<&ResumeData>) -> String {
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
