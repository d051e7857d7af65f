//! A role whose frontend is `acp`: any Agent Client Protocol agent, run as a CLI role is (the
//! native sandbox with the worktree writable, its own HOME, the environment cleared, the
//! credential proxy with a placeholder key and the base URL, the role's quotas, the user's
//! consent to run natively) and driven as an ACP client ([`metash_harness::acp`]). Its
//! permission questions become metash consent requests ([`capability_for`], docs/acp.md), its
//! file requests are held to the worktree ([`super::acp_fs`]), and its usage is charged from the
//! credential proxy's tap as a CLI's is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_harness::acp::{self, AcpEvent, AcpHost, AcpOutcome, AcpTurn, End, StopReason};
use metash_harness::acp::{Subject, ToolKind};
use metash_harness::CancellationToken;
use metash_policy::{Authorization, CapabilityRequest};
use metash_protocol::{
    HarnessContinuationRef, HarnessErrorCode, InteractionMode, IoMode, LogKind,
    ProcessInvocationSpec, ProviderDomain, ResumeData, RunError, RunResult,
};
use metash_store::NewEvent;
use serde_json::json;

use super::acp_fs::Files;
use super::model::{outcome, over_write_quota, prompt_with_resume, Charge};
use super::Ran;
use crate::config::{Permissions, Role};
use crate::error::Result;
use crate::host::Host;
use crate::pricing::TurnMeter;
use crate::spawner::{SpawnRequest, WorkspaceAccess};

/// What Claude Code's SDK is told so that it reaches nothing but its model (the harness sets
/// the same for Claude Code roles).
const CLAUDE_QUIET: &[&str] = &[
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
    "DISABLE_TELEMETRY",
    "DISABLE_AUTOUPDATER",
    "DISABLE_ERROR_REPORTING",
    "DISABLE_INSTALLATION_CHECKS",
    "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL",
];

/// The variable holding the base URL the agent must use (as `metash sandbox` sets it).
const BASE_URL_VAR: &str = "METASH_MODEL_BASE_URL";
/// Replaced by that base URL in the role's `command` and `env`.
const BASE_URL_TOKEN: &str = "${METASH_MODEL_BASE_URL}";

mod continuity;

/// One spawn of an ACP role.
///
/// # Errors
/// The key or sign-in cannot be met, the user refuses native execution, the store fails. A turn
/// that ran and failed is a [`Ran`] with an error status.
pub(crate) fn run(
    host: &Host,
    role: &Role,
    req: &SpawnRequest,
    timeout: Duration,
    resume: Option<&ResumeData>,
) -> Result<Ran> {
    let agent = req.agent_name.as_str();
    super::key_proxy::preflight(host, agent, role)?;
    let workdir = req.workdir.clone().unwrap_or_else(|| host.workspace());
    let workdir = match host.check_workdir(&workdir) {
        Ok(w) => w,
        Err(e) => return Ok(Ran::error(format!("`{agent}` was not started: {e}"))),
    };
    // Kept across the role's spawns on this task: its HOME (the agent's sessions) and its key.
    let kept = continuity::SpawnDir::open(host, agent, req.task_id.as_deref())?;
    // Recorded as a CLI role's turn is (docs/replay.md).
    let tape = super::tape::TurnTape::new(host, req, role);
    let dirs = (workdir.as_path(), kept.path());
    let mut p = Prepared::new(host, role, req, timeout, dirs, tape.as_ref())?;
    p.keep_session = matches!(kept, continuity::SpawnDir::Kept(_));
    let cwd = p.spec.cwd.clone();
    let not_continued = match kept.continuation(p.spec.provider, &cwd) {
        Ok(key) => {
            p.spec.continuation = key;
            None
        }
        Err(why) => Some(why),
    };
    let prompt = prompt_text(req, resume);
    let (ran, key) = p.turn(host, agent, &prompt, timeout, not_continued);
    if let Err(e) = kept.keep(key, &cwd) {
        let why = json!({"frontend": crate::config::acp::NAME,
                         "payload": {"type": "session_not_kept", "error": e.to_string()}});
        let _ = host.record_later(NewEvent::new(LogKind::HarnessEvent, Some(agent), why));
    }
    let hit = p.write_hit.get();
    // Stopping the proxy ends every exchange before the turn is charged.
    drop(p.proxy);
    super::tape::save(tape, host);
    over_write_quota(ran, hit, agent, || kept.keep_for_inspection())
}

/// Everything a turn needs, made before the agent starts: its meter and the credential proxy
/// charging it, the user's consent to run it natively, its sandbox, command and answers.
struct Prepared {
    cancel: CancellationToken,
    charge: Charge,
    max_tokens: Option<u64>,
    proxy: Option<super::key_proxy::Started>,
    confiner: super::confine::RoleConfiner,
    write_hit: metash_runtime::limits::WriteHit,
    spec: ProcessInvocationSpec,
    side: Arc<Side>,
    /// The session is kept for the role's next spawn on the task (its spawn directory is).
    keep_session: bool,
}

impl Prepared {
    fn new(
        host: &Host,
        role: &Role,
        req: &SpawnRequest,
        timeout: Duration,
        (workdir, spawn_dir): (&Path, &Path),
        tape: Option<&super::tape::TurnTape>,
    ) -> Result<Self> {
        let agent = req.agent_name.as_str();
        let cancel = CancellationToken::new();
        let max_tokens = req.options.max_tokens.or(role.max_tokens);
        let model = role.model(req.options.model_hint);
        let charge = charge(host, max_tokens, model.as_deref(), &cancel)?;
        let tap = {
            let charge = charge.clone();
            super::usage_tap::WireUsage::new(move |u| charge.observe(u))
        };
        let hooks = super::key_proxy::Hooks {
            tap: Some(Arc::new(tap)),
            recorder: tape.map(super::tape::TurnTape::recorder),
        };
        let proxy = super::key_proxy::start_recorded(host, agent, role, hooks)?;
        super::confine::native_consent(host, agent)?;
        let port = match &proxy {
            Some(started) => Some(started.proxy.addr().port()),
            None => role.base_url.as_deref().and_then(super::confine::url_port),
        };
        let read_only = req.access == WorkspaceAccess::ReadOnly;
        let mut confiner = confiner(host, role, agent, spawn_dir, timeout, port, read_only);
        let write_hit = metash_runtime::limits::WriteHit::default();
        confiner.fence.write.hit = write_hit.clone();
        let spec = spec(role, workdir, proxy.as_ref(), model.as_deref());
        let side = Arc::new(Side {
            gate: super::gate::PolicyGate::new(host, host.policy()?),
            agent: agent.to_string(),
            ask: role.permissions == Permissions::Ask,
            files: Files {
                root: workdir.to_path_buf(),
                read_only,
                hidden: host.hidden_dirs(),
            },
        });
        Ok(Self {
            cancel,
            charge,
            max_tokens,
            proxy,
            confiner,
            write_hit,
            spec,
            side,
            keep_session: false,
        })
    }

    /// The turn, registered for suspend and resume while it runs, every event to the log (the
    /// session's with `not_continued`: why the last key was not given to the agent); with the
    /// continuation key it leaves, when the agent can load sessions.
    fn turn(
        &self,
        host: &Host,
        agent: &str,
        prompt: &str,
        timeout: Duration,
        not_continued: Option<String>,
    ) -> (Result<Ran>, Option<HarnessContinuationRef>) {
        let _leave = host.running().leave_on_drop(agent);
        let _watch = super::watch::RunWatch::start(
            host.store().clone(),
            agent,
            None,
            Arc::clone(host.running()),
        );
        let home = self.confiner.spawn_dir.join("home");
        // The session's event also says why the last key was not given, and where HOME is kept.
        let mut sink = |ev: AcpEvent| match ev {
            AcpEvent::Session {
                id,
                loaded,
                fallback,
            } => {
                let fallback = fallback.or_else(|| not_continued.clone());
                let mut data = harness_event(AcpEvent::Session {
                    id,
                    loaded,
                    fallback,
                });
                data["payload"]["home"] = json!(home);
                let _ = host.record_later(NewEvent::new(LogKind::HarnessEvent, Some(agent), data));
            }
            other => record(host, agent, other),
        };
        let turn = AcpTurn {
            spec: &self.spec,
            confiner: Some(&self.confiner),
            prompt,
            mcp_servers: Vec::new(),
            timeout: Some(timeout),
            cancel: &self.cancel,
            host: Arc::clone(&self.side) as Arc<dyn AcpHost>,
            keep_session: self.keep_session,
        };
        let ran = host.tokio().map(|rt| {
            rt.block_on(async {
                // The client bounds the turn itself; this guards against one that does not
                // return.
                let bound = timeout + Duration::from_secs(10);
                match tokio::time::timeout(bound, acp::run_turn(turn, &mut sink)).await {
                    Ok(r) => r,
                    Err(_) => {
                        self.cancel.cancel();
                        Err(metash_harness::HarnessError::Timeout(
                            "the ACP client did not return after its deadline".into(),
                        ))
                    }
                }
            })
        });
        match ran {
            Ok(Ok(out)) => {
                let charged = outcome(
                    &run_result(&out),
                    &self.charge,
                    &Mutex::default(),
                    self.max_tokens,
                );
                (charged, out.continuation)
            }
            Ok(Err(e)) => (Ok(Ran::error(format!("{}: {e}", e.code().as_str()))), None),
            Err(e) => (Err(e), None),
        }
    }
}

/// The turn's meter, as a CLI role's: its token cap, what is left of the cost budget, the
/// model's price.
fn charge(
    host: &Host,
    max_tokens: Option<u64>,
    model: Option<&str>,
    cancel: &CancellationToken,
) -> Result<Charge> {
    let config = host.config();
    let cost_budget = match config.budget.max_cost_usd {
        Some(max) => Some((max, crate::budget::used(host.store())?.cost_usd)),
        None => None,
    };
    let price = config.prices.price(model.unwrap_or_default());
    Ok(Charge {
        meter: Arc::new(Mutex::new(TurnMeter::new(max_tokens, cost_budget, price))),
        stopped: Arc::new(Mutex::new(None)),
        cancel: cancel.clone(),
    })
}

/// The sandbox of a CLI role, for the agent's process tree: what [`super::confine`] gives every
/// CLI, the proxy's port the only one it may reach, `frontend: acp` in its start report.
fn confiner(
    host: &Host,
    role: &Role,
    agent: &str,
    spawn_dir: &Path,
    timeout: Duration,
    port: Option<u16>,
    read_only: bool,
) -> super::confine::RoleConfiner {
    let mut c = super::confine::RoleConfiner::new(
        agent,
        role,
        spawn_dir,
        timeout,
        |k| host.env_var(k),
        host.event_sink(),
    );
    c.frontend = crate::config::acp::NAME;
    c.fence.hidden = host.hidden_dirs();
    c.fence.protected = host.protected_dirs();
    c.fence.workspace_read_only = read_only;
    c.project = Some(host.workspace());
    c.fence.connect_ports = port.into_iter().collect();
    let (running, sink, name) = (
        Arc::clone(host.running()),
        host.event_sink(),
        agent.to_string(),
    );
    c.on_spawn = Some(Arc::new(move |pid: u32| {
        if let Ok(pgid) = i32::try_from(pid) {
            let pauser = metash_runtime::Pauser::for_group(&name, pgid, Arc::clone(&sink));
            running.insert(&name, pauser);
        }
    }));
    c
}

/// The agent's command, in the worktree, with the base URL and placeholders of the proxy, the
/// role's model and `env`.
fn spec(
    role: &Role,
    workdir: &Path,
    proxy: Option<&super::key_proxy::Started>,
    model: Option<&str>,
) -> ProcessInvocationSpec {
    let info = metash_harness::frontend::info(role.frontend);
    let provider = role.provider.unwrap_or(ProviderDomain::Anthropic);
    let mut env = BTreeMap::new();
    if provider == ProviderDomain::Anthropic {
        for k in CLAUDE_QUIET {
            env.insert(k.to_string(), "1".to_string());
        }
        if let Some(m) = model {
            env.insert("ANTHROPIC_MODEL".to_string(), m.to_string());
        }
    }
    let base_url = match proxy {
        Some(started) => {
            for var in &started.placeholders {
                env.insert(var.clone(), super::key_proxy::PLACEHOLDER.to_string());
            }
            // With a key, the provider's usual key variable too (an agent reads that one).
            if started.sign_in.is_none() {
                env.insert(
                    info.key_env.to_string(),
                    super::key_proxy::PLACEHOLDER.to_string(),
                );
            }
            Some(started.endpoint.base_url.clone())
        }
        None => role.base_url.clone(),
    };
    if let Some(url) = &base_url {
        env.insert(info.base_url_env.to_string(), url.clone());
        env.insert(BASE_URL_VAR.to_string(), url.clone());
    }
    // `${METASH_MODEL_BASE_URL}` in the command or `env` is the base URL (an agent that reads
    // its endpoint only from its own config, such as codex-acp's `-c`, is told it so).
    let expand = |v: &str| match &base_url {
        Some(url) => v.replace(BASE_URL_TOKEN, url),
        None => v.to_string(),
    };
    for (k, v) in &role.env {
        env.insert(k.clone(), expand(v));
    }
    let argv = role.command.iter().map(|a| expand(a)).collect();
    ProcessInvocationSpec {
        provider,
        frontend: role.frontend,
        argv,
        cwd: workdir.display().to_string(),
        env,
        interaction_mode: InteractionMode::Headless,
        io_mode: IoMode::Pipes,
        continuation: None,
        display_command: None,
    }
}

/// ACP has no system prompt: the role's goes before the message (and the answer to the last
/// checkpoint after it, as for every model role).
fn prompt_text(req: &SpawnRequest, resume: Option<&ResumeData>) -> String {
    let message = prompt_with_resume(&req.user_message, resume);
    if req.system_prompt.trim().is_empty() {
        message
    } else {
        format!("{}\n\n{message}", req.system_prompt)
    }
}

/// What metash answers the agent's requests with.
struct Side {
    gate: super::gate::PolicyGate,
    agent: String,
    /// `permissions = "ask"`: each question goes to consent; otherwise (the default, as for
    /// every CLI role) each is allowed, metash's sandbox being the boundary.
    ask: bool,
    files: Files,
}

impl AcpHost for Side {
    fn permission(&self, subject: &Subject) -> bool {
        if !self.ask {
            return true;
        }
        match capability_for(&self.files.root, subject) {
            None => true,
            Some(req) => matches!(
                self.gate.authorize_asked(&self.agent, &req),
                Authorization::Allowed { .. }
            ),
        }
    }

    fn read_text_file(&self, path: &str) -> std::result::Result<String, String> {
        self.files.read(path)
    }

    fn write_text_file(&self, path: &str, content: &str) -> std::result::Result<(), String> {
        self.files.write(path, content)
    }
}

/// The capability an ACP tool use needs, by its kind (the table in docs/acp.md). `None`: it
/// touches nothing outside the agent (`think`, `switch_mode`) and is allowed without asking.
pub(crate) fn capability_for(workspace: &Path, s: &Subject) -> Option<CapabilityRequest> {
    let path = || match s.path.as_deref() {
        Some(p) if Path::new(p).is_absolute() => PathBuf::from(p),
        Some(p) => workspace.join(p),
        None => workspace.to_path_buf(),
    };
    let reason = |what: &str| {
        format!("{what}: {}", s.title)
            .chars()
            .take(200)
            .collect::<String>()
    };
    Some(match s.kind {
        ToolKind::Read | ToolKind::Search => {
            CapabilityRequest::files_read(workspace, &path(), reason(s.kind.as_str()))
        }
        ToolKind::Edit | ToolKind::Delete | ToolKind::Move => {
            CapabilityRequest::files_write(workspace, &path(), reason(s.kind.as_str()))
        }
        ToolKind::Execute => {
            let command = s.command.clone().unwrap_or_else(|| s.title.clone());
            let program = command
                .split_whitespace()
                .next()
                .unwrap_or("sh")
                .to_string();
            CapabilityRequest::process_spawn(&program, reason("execute"))
        }
        ToolKind::Fetch => {
            let url = s.url.clone().unwrap_or_default();
            let host = url
                .split("://")
                .nth(1)
                .and_then(|r| r.split(['/', ':', '?']).next())
                .unwrap_or("")
                .to_string();
            CapabilityRequest::network(&host, false, reason("fetch"))
        }
        ToolKind::Think | ToolKind::SwitchMode => return None,
        ToolKind::Other => {
            let name = if s.title.trim().is_empty() {
                "tool"
            } else {
                s.title.as_str()
            };
            CapabilityRequest::process_spawn(name, reason("other"))
        }
    })
}

/// One event in the log: a tool call and its result as one line each (kind, title, status),
/// text, the plan, permission answers and the stop as harness events.
fn record(host: &Host, agent: &str, ev: AcpEvent) {
    let clip = super::tool_events::clip;
    let (kind, data) = match ev {
        AcpEvent::ToolCall {
            id,
            kind,
            title,
            input,
        } => (
            LogKind::ToolCall,
            json!({"id": id, "tool": title, "kind": kind.as_str(), "title": title,
                   "args": clip(&input.to_string())}),
        ),
        AcpEvent::ToolResult {
            id,
            kind,
            title,
            status,
            output,
        } => (
            LogKind::ToolResult,
            json!({"id": id, "kind": kind.as_str(), "title": title,
                   "status": if status.is_final() && status != acp::ToolStatus::Failed
                       { "ok" } else { "error" },
                   "acp_status": status.as_str(), "output_bytes": output.len(),
                   "output": clip(&output)}),
        ),
        other => (LogKind::HarnessEvent, harness_event(other)),
    };
    let _ = host.record_later(NewEvent::new(kind, Some(agent), data));
}

fn harness_event(ev: AcpEvent) -> serde_json::Value {
    let payload = match ev {
        AcpEvent::Text { text } => json!({"type": "text_delta", "text": text}),
        AcpEvent::Thought { text } => json!({"type": "thought_delta", "text": text}),
        AcpEvent::Plan { entries } => json!({"type": "plan", "entries": entries}),
        AcpEvent::Permission {
            tool_call_id,
            kind,
            title,
            allowed,
            option_id,
        } => json!({"type": "permission", "toolCallId": tool_call_id, "kind": kind.as_str(),
                    "title": title, "allowed": allowed, "optionId": option_id}),
        AcpEvent::Session {
            id,
            loaded,
            fallback,
        } => json!({"type": "session", "sessionId": id, "loaded": loaded, "fallback": fallback}),
        AcpEvent::Stopped { reason } => json!({"type": "stopped", "stopReason": reason.as_str()}),
        AcpEvent::ToolCall { .. } | AcpEvent::ToolResult { .. } => serde_json::Value::Null,
    };
    json!({"frontend": crate::config::acp::NAME, "payload": payload})
}

/// The turn's result as the host reads every model turn's.
fn run_result(out: &AcpOutcome) -> RunResult {
    let failed = |code: HarnessErrorCode, message: String| RunResult {
        success: false,
        final_output: Some(out.text.clone()),
        tool_calls: Vec::new(),
        stop_reason: None,
        usage: None,
        cost_usd: None,
        error: Some(RunError {
            code,
            message,
            status: None,
        }),
    };
    let stopped = |reason: StopReason| RunResult {
        success: true,
        final_output: Some(out.text.clone()),
        tool_calls: Vec::new(),
        stop_reason: Some(reason.as_str().to_string()),
        usage: None,
        cost_usd: None,
        error: None,
    };
    match &out.end {
        End::Stopped(r @ (StopReason::EndTurn | StopReason::MaxTokens)) => stopped(*r),
        End::Stopped(StopReason::Refusal) => failed(
            HarnessErrorCode::HarnessFailed,
            "the agent refused the prompt (stop reason refusal)".into(),
        ),
        End::Stopped(StopReason::MaxTurnRequests) => failed(
            HarnessErrorCode::HarnessFailed,
            "the agent stopped at its own limit of model requests (max_turn_requests)".into(),
        ),
        End::Stopped(StopReason::Cancelled) | End::Cancelled => {
            failed(HarnessErrorCode::Cancelled, "the turn was cancelled".into())
        }
        End::TimedOut => failed(
            HarnessErrorCode::Timeout,
            "the turn ran past its deadline (session/cancel sent)".into(),
        ),
        End::Failed(why) => failed(
            HarnessErrorCode::HarnessFailed,
            format!("{why}: {}", out.stderr_tail.trim()),
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn subject(kind: ToolKind) -> Subject {
        Subject {
            tool_call_id: "t".into(),
            kind,
            title: "T".into(),
            path: Some("/w/src/a.rs".into()),
            command: Some("cargo test".into()),
            url: Some("https://example.com/x".into()),
        }
    }

    #[test]
    fn kinds_map_to_capabilities() {
        let w = Path::new("/w");
        let cap = |k| capability_for(w, &subject(k)).map(|r| r.capability.to_string());
        assert_eq!(cap(ToolKind::Read).as_deref(), Some("files.read:src/a.rs"));
        assert_eq!(
            cap(ToolKind::Search).as_deref(),
            Some("files.read:src/a.rs")
        );
        for k in [ToolKind::Edit, ToolKind::Delete, ToolKind::Move] {
            assert_eq!(cap(k).as_deref(), Some("files.write:src/a.rs"));
        }
        assert_eq!(
            cap(ToolKind::Execute).as_deref(),
            Some("process.spawn:cargo")
        );
        assert_eq!(cap(ToolKind::Fetch).as_deref(), Some("network:example.com"));
        assert_eq!(cap(ToolKind::Think), None);
        assert_eq!(cap(ToolKind::Other).as_deref(), Some("process.spawn:T"));
    }
}
