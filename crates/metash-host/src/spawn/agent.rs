//! Running a registered WASM or native agent for one spawn: a fresh instance each time (so it has
//! no memory of any earlier conversation), granted only what it declared and the user allowed.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use metash_protocol::LogKind;

use metash_policy::{Authorization, CapabilityRequest, Category, Decision};
use metash_protocol::{AgentEvent, AgentStatus, CheckpointSignal, ResumeData, SandboxKind};
use metash_runtime::{AgentSpec, Gate, InvocationStatus, NetworkAccess, PathAccess};
use metash_store::NewEvent;
use serde_json::{json, Value};

use super::gate::PolicyGate;
use super::Ran;
use crate::error::{HostError, Result};
use crate::host::Host;
use crate::spawner::{SpawnRequest, WorkspaceAccess};

/// Runs the registered agent `req` names: checks where it runs and what it may do, builds its
/// spec, then starts it, sends it the message and lets it flush its state. A refusal the caller
/// should see as the agent's answer is `Ok(Ran::error(..))`; a refused native run is an error.
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
    let gate = Arc::new(PolicyGate::new(host, host.policy_with(registry.clone())?));
    let workspace =
        match host.check_workdir(&req.workdir.clone().unwrap_or_else(|| host.workspace())) {
            Ok(w) => w,
            Err(e) => return Ok(Ran::error(format!("`{}` was not started: {e}", agent.id))),
        };
    // Native execution is opt-in per agent.
    if agent.manifest.sandbox == SandboxKind::Native {
        if let Some(refused) = native_refused(&gate, agent) {
            return Err(refused);
        }
    }
    let refs = match super::context_refs::resolve(
        host,
        &agent.id,
        &workspace,
        &req.options.context_refs,
    ) {
        Ok(r) => r,
        Err(e) => return Ok(Ran::error(format!("`{}` was not started: {e}", agent.id))),
    };
    let spawn = Spawn {
        host,
        gate: &gate,
        agent,
        req,
    };
    let spec = spawn.spec(workspace, timeout, resume)?;
    spawn.launch(spec, &refs)
}

/// One spawn of a registered agent, once its workspace and context are settled.
struct Spawn<'a> {
    host: &'a Host,
    gate: &'a Arc<PolicyGate>,
    agent: &'a metash_policy::Agent,
    req: &'a SpawnRequest,
}

impl Spawn<'_> {
    /// What the runtime is given: the agent's grants (asked now if need be), its limits, what
    /// it never sees, and its configuration.
    fn spec(
        &self,
        workspace: std::path::PathBuf,
        timeout: Duration,
        resume: Option<&ResumeData>,
    ) -> Result<AgentSpec> {
        let (host, agent, req) = (self.host, self.agent, self.req);
        let grants =
            Grants::decide(host, self.gate, agent, &workspace)?.access(host, req, &workspace);
        let mut spec = AgentSpec::new(
            agent.id.clone(),
            agent.manifest.clone(),
            agent.entry_path.clone(),
            workspace,
        );
        grants.apply(&mut spec);
        // The agent's own directory, when the entry is inside it (the runtime checks the rest).
        spec.package = agent
            .manifest_path
            .parent()
            .filter(|dir| agent.entry_path.starts_with(dir))
            .map(Path::to_path_buf);
        spec.allow_native = agent.manifest.sandbox == SandboxKind::Native;
        spec.fuel = host.config().host.wasm_fuel;
        spec.write_quota = host.config().host.agent_write_quota();
        // metash's own state is never in an agent's view, and `.git` never writable, whatever it
        // was granted.
        spec.hidden = host.hidden_dirs();
        spec.protected = host.protected_dirs();
        spec.gate = Gate(Some(self.gate.clone()));
        spec.timeout = timeout;
        spec.config = json!({
            "system_prompt": req.system_prompt,
            "resume_data": resume,
            "task_id": req.task_id,
            "options": req.options,
        });
        Ok(spec)
    }

    /// Starts the agent from `spec`, sends it the message with its context `refs`, and lets it
    /// flush its state before it ends.
    fn launch(&self, mut spec: AgentSpec, refs: &[String]) -> Result<Ran> {
        let (host, agent) = (self.host, self.agent);
        // OAuth handles for the agent's live `oauth:` grants: a base URL on a credential proxy
        // (reachable on its port only: Landlock for native agents, the socket check for WASM
        // components), never the token. Served until this spawn ends.
        let _handles = match crate::oauth::start(host, &agent.id, &agent.declared) {
            Ok(Some(h)) => {
                spec.env.extend(h.env());
                spec.connect_ports.push(h.port());
                Some(h)
            }
            Ok(None) => None,
            Err(e) => return Ok(Ran::error(format!("`{}` was not started: {e}", agent.id))),
        };
        let mut running = host.runtime()?.register(spec)?;
        if let Err(e) = running.start() {
            return Ok(Ran::error(format!("`{}` could not start: {e}", agent.id)));
        }
        let mut heard = Heard::default();
        let outcome = invoke(
            host,
            self.gate,
            &mut running,
            &agent.id,
            &self.req.user_message,
            refs,
            &mut heard,
        );
        if running.state() != metash_runtime::LifecycleState::Terminated {
            // A WASM agent with the `shutdown` hook runs once more to flush its state: its
            // writes count like any other.
            let replier = running.replier();
            let _ = running.shutdown_with(&mut |event: &AgentEvent| {
                if let AgentEvent::StateUpdate { key, value, scope } = event {
                    state_update(host, &replier, &agent.id, key, value, scope.as_deref());
                }
            });
        }
        let outcome = outcome?;
        heard.stderr = outcome.stderr;
        Ok(answer(&agent.id, outcome.status, heard))
    }
}

/// `native` must be allowed (asked if need be) before a native agent runs; the refusal if not
/// ([`crate::error::HostError::ConsentRefused`]: the spawn stops, nothing is retried).
fn native_refused(gate: &PolicyGate, agent: &metash_policy::Agent) -> Option<HostError> {
    let ask = CapabilityRequest::native_exec(format!("run `{}` natively", agent.id));
    match gate.authorize(&agent.id, &ask) {
        Authorization::Allowed { .. } => None,
        Authorization::Denied { message, .. } => Some(HostError::consent_refused(
            &agent.id,
            "native",
            &format!("native execution of `{}`", agent.id),
            &message,
        )),
    }
}

/// What the agent is granted for this spawn: what it declared and is allowed now; everything
/// else stays denied.
#[derive(Default)]
struct Grants {
    granted: Vec<String>,
    domains: Vec<String>,
    unrestricted: bool,
    paths: Vec<PathAccess>,
}

impl Grants {
    fn decide(
        host: &Host,
        gate: &PolicyGate,
        agent: &metash_policy::Agent,
        workspace: &Path,
    ) -> Result<Self> {
        let mut g = Grants::default();
        for cap in &agent.declared {
            // Native is the sandbox choice, and starting processes is decided per program when
            // it happens (the exec gate). An `oauth:` capability is asked like the others; its
            // handle is served for a live stored grant (`crate::oauth`).
            if matches!(cap.category, Category::Native | Category::ProcessSpawn) {
                continue;
            }
            g.consider(host, gate, &agent.id, workspace, cap)?;
        }
        Ok(g)
    }

    /// One declared capability: granted if allowed now (asked if the policy says ask).
    fn consider(
        &mut self,
        host: &Host,
        gate: &PolicyGate,
        agent: &str,
        workspace: &Path,
        cap: &metash_policy::Capability,
    ) -> Result<()> {
        let reason = format!("spawn of `{agent}`");
        // A scoped file grant is one path; outside the workspace, writing is sensitive (asked
        // at every spawn unless a sensitive grant covers it).
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
                Some(agent),
                json!({"what": "files", "capability": cap.to_string(), "path": p,
                       "reason": "inside metash's state directory (.meta), which no grant reaches"}),
            ));
            return Ok(());
        }
        let ask = match (&cap.category, &scoped_path) {
            (Category::FilesWrite, Some(p)) => CapabilityRequest::files_write(workspace, p, reason),
            (Category::FilesRead, Some(p)) => CapabilityRequest::files_read(workspace, p, reason),
            _ => CapabilityRequest::new(cap.clone(), reason),
        };
        let allowed = match gate.policy.check(agent, &ask)? {
            Decision::Allow { .. } => true,
            Decision::Ask => gate.authorize(agent, &ask).is_allowed(),
            _ => false,
        };
        if !allowed {
            return Ok(());
        }
        if let Some(path) = scoped_path {
            self.paths.push(PathAccess {
                path,
                write: cap.category == Category::FilesWrite,
            });
            self.granted.push(cap.to_string());
            return Ok(());
        }
        let name = cap.category.as_str().to_string();
        if cap.category == Category::Network {
            match &cap.scope {
                Some(domain) => self.domains.push(domain.clone()),
                None => self.unrestricted = true,
            }
        }
        if !self.granted.contains(&name) {
            self.granted.push(name);
        }
        Ok(())
    }

    /// As the spawn's [`WorkspaceAccess`] allows.
    fn access(mut self, host: &Host, req: &SpawnRequest, workspace: &Path) -> Self {
        if req.access == WorkspaceAccess::ReadOnly {
            self.read_only(&[workspace, host.workspace().as_path()]);
        }
        self
    }

    /// A spawn that must not write the project (a planner): `files.write` on the workspace
    /// becomes `files.read`, and so does a scoped write grant inside any of `roots` (the
    /// workspace, the project) or holding one. Writes elsewhere (`files.write:/tmp/out`) stay as
    /// granted.
    fn read_only(&mut self, roots: &[&Path]) {
        let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        let roots: Vec<std::path::PathBuf> = roots.iter().map(|r| canonical(r)).collect();
        let write = Category::FilesWrite.as_str();
        if self.granted.iter().any(|g| g == write) {
            self.granted.retain(|g| g != write);
            let read = Category::FilesRead.as_str().to_string();
            if !self.granted.contains(&read) {
                self.granted.push(read);
            }
        }
        for p in &mut self.paths {
            // Resolved (`src/../..`, a symlink); one that does not exist is not applied anyway.
            let elsewhere = p
                .path
                .canonicalize()
                .is_ok_and(|c| !roots.iter().any(|r| c.starts_with(r) || r.starts_with(&c)));
            p.write = p.write && elsewhere;
        }
    }

    /// Into the spec. Every connection goes through the host's proxy, which asks the gate per
    /// connection (writes are sensitive, so they are asked per action); "unrestricted" is the
    /// proxy with every host.
    fn apply(self, spec: &mut AgentSpec) {
        spec.granted = self.granted;
        spec.paths = self.paths;
        spec.network = if self.unrestricted {
            NetworkAccess::Allowlist(vec!["*".into()])
        } else if self.domains.is_empty() {
            NetworkAccess::None
        } else {
            NetworkAccess::Allowlist(self.domains)
        };
    }
}

/// What the agent said during its invocation that the answer needs.
#[derive(Default)]
struct Heard {
    output: String,
    failure: Option<String>,
    /// The end of its stderr, when it died before finishing (the runtime's outcome says).
    stderr: Option<String>,
}

/// Runs the invocation, acting on the agent's events. The runtime has already logged each event
/// once (`agent_event`, host-only kinds rejected as `protocol_violation`); here the host only
/// acts on them.
fn invoke(
    host: &Host,
    gate: &PolicyGate,
    running: &mut metash_runtime::Agent,
    agent: &str,
    message: &str,
    refs: &[String],
    heard: &mut Heard,
) -> Result<metash_runtime::Outcome> {
    let replier = running.replier();
    // Grants that end while it runs are pushed to it at once, and suspend/resume requests from
    // other processes applied (both stop when this returns); this process can pause it directly.
    let _entered = host.running().enter(agent, running.pauser());
    let _watch = super::watch::RunWatch::start(
        host.store().clone(),
        agent,
        Some(super::watch::Reach {
            replier: replier.clone(),
            withdrawer: running.withdrawer(),
        }),
        Arc::clone(host.running()),
    );
    let ws = super::artifact::Workspace {
        agent: agent.to_string(),
        root: running.spec().workspace.clone(),
        sandbox: running.spec().manifest.sandbox,
    };
    let outcome = running.invoke(message, refs, &mut |event: &AgentEvent| match event {
        AgentEvent::Artifact { id, path, .. } => {
            if let Some(refusal) = super::artifact::save(host, &ws, id, path) {
                if let AgentEvent::Error { message, .. } = &refusal {
                    let _ = host.record_later(NewEvent::new(
                        LogKind::Denied,
                        Some(agent),
                        json!({"what": "artifact", "id": id, "reason": message}),
                    ));
                }
                replier.send(refusal);
            }
        }
        AgentEvent::ConsentRequest { .. } => {
            if let Some(req) = CapabilityRequest::from_agent_event(event) {
                let _ = host.flush_events();
                replier.send(answer_consent(gate, agent, req));
            }
        }
        AgentEvent::Output { data, .. } => heard.output.push_str(data),
        AgentEvent::StateUpdate { key, value, scope } => {
            state_update(host, &replier, agent, key, value, scope.as_deref());
        }
        AgentEvent::StateGet { key, scope } => {
            let _ = host.flush_events();
            replier.send(state_answer(host, agent, refs, key, scope.as_deref()));
        }
        AgentEvent::Error { code, message, .. } => {
            heard
                .failure
                .get_or_insert_with(|| format!("{code}: {message}"));
        }
        _ => {}
    })?;
    Ok(outcome)
}

/// An agent's `state_update`, during an invocation or its `shutdown()` run; a refused write is
/// logged and the agent told, so it can go on knowing its write did not happen.
fn state_update(
    host: &Host,
    replier: &metash_runtime::Replier,
    agent: &str,
    key: &str,
    value: &Value,
    scope: Option<&str>,
) {
    if let Err(e) = host.agent_state_update(agent, key, value, scope) {
        let _ = host.record_later(NewEvent::new(
            LogKind::Denied,
            Some(agent),
            json!({"what": "state_update", "key": key, "reason": e.to_string()}),
        ));
        replier.send(AgentEvent::Error {
            code: "state_denied".into(),
            message: e.to_string(),
            hint: None,
        });
    }
}

/// The answer to an agent's `state_get`: the value, or an `error` saying why not. Scope
/// `artifact` reads an artifact this spawn was given in its `context_refs`.
fn state_answer(
    host: &Host,
    agent: &str,
    refs: &[String],
    key: &str,
    scope: Option<&str>,
) -> AgentEvent {
    let value = match scope {
        Some("artifact") => super::context_refs::artifact_value(host, refs, key).map(Some),
        _ => host.agent_state_get(agent, key, scope),
    };
    match value {
        Ok(value) => AgentEvent::StateValue {
            key: key.to_string(),
            found: value.is_some(),
            value: value.unwrap_or(Value::Null),
            scope: scope.map(str::to_string),
        },
        Err(e) => AgentEvent::Error {
            code: "state_denied".into(),
            message: e.to_string(),
            hint: Some(
                "declare and be granted `memory` to use the agent and scratchpad scopes".into(),
            ),
        },
    }
}

/// The spawn's answer from how the invocation ended.
fn answer(agent: &str, end: InvocationStatus, heard: Heard) -> Ran {
    let status = end.agent_status();
    let Heard {
        output,
        failure,
        stderr,
    } = heard;
    let (data, checkpoint) = match end {
        InvocationStatus::Checkpoint { signal } => (String::new(), Some(signal)),
        InvocationStatus::Done { summary, .. } if status == AgentStatus::Error => (
            summary
                .or(failure)
                .unwrap_or_else(|| "the agent reported an error".into()),
            None,
        ),
        InvocationStatus::Done { .. } | InvocationStatus::Timeout => (output, None),
        InvocationStatus::Exited { code, signal } => (
            failure.unwrap_or_else(|| {
                let stderr = stderr.map(|e| format!("; stderr: {}", e.trim_end())).unwrap_or_default();
                format!(
                    "`{agent}` exited before finishing (code {code:?}, signal {signal:?}); output: {output}{stderr}"
                )
            }),
            None,
        ),
        InvocationStatus::LimitExceeded { limit } => {
            (format!("`{agent}` exceeded its {limit} limit"), None)
        }
        InvocationStatus::Killed { reason } => (format!("`{agent}` was killed: {reason}"), None),
    };
    Ran {
        status,
        data,
        tokens_used: 0,
        cost_usd: None,
        checkpoint: checkpoint.map(|s: CheckpointSignal| s),
    }
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
        Ok(req) => gate.authorize_asked(agent, &req).to_event(&req.capability),
        Err(e) => AgentEvent::Error {
            code: "invalid_capability".into(),
            message: e.to_string(),
            hint: Some(
                "name a capability like `network:api.github.com` or `files.write:out/`".into(),
            ),
        },
    }
}
