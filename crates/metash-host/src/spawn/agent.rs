//! Running a registered WASM or native agent for one spawn: a fresh instance each time (so it has
//! no memory of any earlier conversation), granted only what it declared and the user allowed.

use metash_protocol::LogKind;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_policy::{Authorization, CapabilityRequest, Category, Decision};
use metash_protocol::{AgentEvent, AgentStatus, CheckpointSignal, ResumeData, SandboxKind};
use metash_runtime::{AgentSpec, Gate, InvocationStatus, NetworkAccess, PathAccess};
use metash_store::NewEvent;
use serde_json::json;

use super::gate::PolicyGate;
use super::Ran;
use crate::error::Result;
use crate::host::Host;
use crate::spawner::SpawnRequest;

pub(crate) fn run(
    host: &Host,
    registry: &metash_policy::Registry,
    req: &SpawnRequest,
    timeout: Duration,
    resume: Option<&ResumeData>,
) -> Result<Ran> {
    let Some(agent) = registry.get(&req.agent_name).cloned() else {
        return Ok(Ran::error(format!(
            "`{}` is not registered",
            req.agent_name
        )));
    };
    let agent = &agent;
    let gate = Arc::new(PolicyGate {
        policy: Arc::new(host.policy_with(registry.clone())?),
        prompter: Arc::new(Mutex::new(host.prompter())),
    });
    let workspace = req.workdir.clone().unwrap_or_else(|| host.workspace());

    // Native execution is opt-in per agent.
    let allow_native = agent.manifest.sandbox == SandboxKind::Native;
    if allow_native {
        let ask = CapabilityRequest::native_exec(format!("run `{}` natively", agent.id));
        match gate.authorize(&agent.id, &ask) {
            Authorization::Allowed { .. } => {}
            Authorization::Denied { message, hint, .. } => {
                return Ok(Ran::error(format!(
                    "native execution of `{}` is not allowed: {message}{}",
                    agent.id,
                    hint.map(|h| format!(" ({h})")).unwrap_or_default()
                )));
            }
        }
    }

    // Grant what was declared and is allowed now; everything else stays denied.
    let mut granted = Vec::new();
    let mut domains = Vec::new();
    let mut unrestricted = false;
    let mut paths = Vec::new();
    for cap in &agent.declared {
        if matches!(cap.category, Category::Native | Category::Oauth) {
            continue;
        }
        // Starting processes is decided per program, when it happens (the exec gate).
        if cap.category == Category::ProcessSpawn {
            continue;
        }
        let reason = format!("spawn of `{}`", agent.id);
        // A scoped file grant is one path; outside the workspace, writing is sensitive (asked at
        // every spawn unless a sensitive grant covers it).
        let scoped_path = match (&cap.category, &cap.scope) {
            (Category::FilesRead | Category::FilesWrite, Some(scope)) => {
                let p = Path::new(scope);
                Some(if p.is_absolute() {
                    p.to_path_buf()
                } else {
                    workspace.join(p)
                })
            }
            _ => None,
        };
        if let Some(p) = scoped_path.as_deref().filter(|p| host.is_hidden(p)) {
            let _ = host.record_later(NewEvent::new(
                LogKind::SandboxDenied,
                Some(&agent.id),
                json!({"what": "files", "capability": cap.to_string(), "path": p,
                       "reason": "inside metash's state directory (.meta), which no grant reaches"}),
            ));
            continue;
        }
        let ask = match (&cap.category, &scoped_path) {
            (Category::FilesWrite, Some(p)) => {
                CapabilityRequest::files_write(&workspace, p, reason)
            }
            (Category::FilesRead, Some(p)) => CapabilityRequest::files_read(&workspace, p, reason),
            _ => CapabilityRequest::new(cap.clone(), reason),
        };
        let allowed = match gate.policy.check(&agent.id, &ask)? {
            Decision::Allow { .. } => true,
            Decision::Ask => gate.authorize(&agent.id, &ask).is_allowed(),
            _ => false,
        };
        if !allowed {
            continue;
        }
        if let Some(path) = scoped_path {
            paths.push(PathAccess {
                path,
                write: cap.category == Category::FilesWrite,
            });
            granted.push(cap.to_string());
            continue;
        }
        let name = cap.category.as_str().to_string();
        if cap.category == Category::Network {
            match &cap.scope {
                Some(domain) => domains.push(domain.clone()),
                None => unrestricted = true,
            }
        }
        if !granted.contains(&name) {
            granted.push(name);
        }
    }

    let mut spec = AgentSpec::new(
        agent.id.clone(),
        agent.manifest.clone(),
        agent.entry_path.clone(),
        workspace,
    );
    spec.granted = granted;
    spec.paths = paths;
    // Every connection goes through the host's proxy, which asks the gate per connection (writes
    // are sensitive, so they are asked per action); "unrestricted" is the proxy with every host.
    spec.network = if unrestricted {
        NetworkAccess::Allowlist(vec!["*".into()])
    } else if domains.is_empty() {
        NetworkAccess::None
    } else {
        NetworkAccess::Allowlist(domains)
    };
    spec.allow_native = allow_native;
    spec.fuel = host.config().host.wasm_fuel;
    // metash's own state is never in an agent's view, whatever it was granted.
    spec.hidden = host.hidden_dirs();
    spec.gate = Gate(Some(gate.clone()));
    spec.timeout = timeout;
    spec.config = json!({
        "system_prompt": req.system_prompt,
        "resume_data": resume,
        "task_id": req.task_id,
        "options": req.options,
    });

    let runtime = host.runtime()?;
    let mut running = runtime.register(spec)?;
    if let Err(e) = running.start() {
        return Ok(Ran::error(format!("`{}` could not start: {e}", agent.id)));
    }
    let mut output = String::new();
    let mut failure: Option<String> = None;
    let replier = running.replier();
    // The runtime has already logged each event once (`agent_event`, host-only kinds rejected as
    // `protocol_violation`); here the host only acts on them.
    let outcome = running.invoke(
        &req.user_message,
        &[],
        &mut |event: &AgentEvent| match event {
            AgentEvent::ConsentRequest { .. } => {
                if let Some(req) = CapabilityRequest::from_agent_event(event) {
                    let _ = host.flush_events();
                    replier.send(answer_consent(&gate, &agent.id, req));
                }
            }
            AgentEvent::Output { data, .. } => output.push_str(data),
            AgentEvent::StateUpdate { key, value, scope } => {
                if let Err(e) = host.agent_state_update(&agent.id, key, value, scope.as_deref()) {
                    let _ = host.record_later(NewEvent::new(
                        LogKind::Denied,
                        Some(&agent.id),
                        json!({"what": "state_update", "key": key, "reason": e.to_string()}),
                    ));
                }
            }
            AgentEvent::Error { code, message, .. } => {
                failure.get_or_insert_with(|| format!("{code}: {message}"));
            }
            _ => {}
        },
    );
    if running.state() != metash_runtime::LifecycleState::Terminated {
        let _ = running.shutdown();
    }
    let outcome = outcome?;
    let status = outcome.status.agent_status();
    let (data, checkpoint) = match outcome.status {
        InvocationStatus::Checkpoint { signal } => (String::new(), Some(signal)),
        InvocationStatus::Done { summary, .. } if status == AgentStatus::Error => (
            summary.or(failure).unwrap_or_else(|| "the agent reported an error".into()),
            None,
        ),
        InvocationStatus::Done { .. } | InvocationStatus::Timeout => (output, None),
        InvocationStatus::Exited { code, signal } => (
            failure.unwrap_or_else(|| {
                format!(
                    "`{}` exited before finishing (code {code:?}, signal {signal:?}); output: {output}",
                    agent.id
                )
            }),
            None,
        ),
        InvocationStatus::LimitExceeded { limit } => {
            (format!("`{}` exceeded its {limit} limit", agent.id), None)
        }
        InvocationStatus::Killed { reason } => (format!("`{}` was killed: {reason}", agent.id), None),
    };
    Ok(Ran {
        status,
        data,
        tokens_used: 0,
        cost_usd: None,
        checkpoint: checkpoint.map(|s: CheckpointSignal| s),
    })
}

/// The agent's own mid-run `consent_request`, answered now: `consent_grant` or an `error` with code
/// and hint. Undeclared capabilities are refused without asking (the policy's rule). A grant is
/// persisted; what the runtime gates live (proxied network, process starts) uses it at once, what
/// the sandbox fixes at start (the workspace preopen, Landlock paths) from the agent's next start.
fn answer_consent(
    gate: &PolicyGate,
    agent: &str,
    req: metash_policy::Result<CapabilityRequest>,
) -> AgentEvent {
    match req {
        Ok(req) => gate.authorize(agent, &req).to_event(&req.capability),
        Err(e) => AgentEvent::Error {
            code: "invalid_capability".into(),
            message: e.to_string(),
            hint: Some(
                "name a capability like `network:api.github.com` or `files.write:out/`".into(),
            ),
        },
    }
}
