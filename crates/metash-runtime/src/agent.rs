//! The runtime's front door: [`Runtime::register`] an [`AgentSpec`], then drive the [`Agent`]
//! through the lifecycle. This is the only layer that knows both sandboxes; it enforces the state
//! machine and records every transition in the sink.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_protocol::{AgentEvent, Hook, SandboxKind};
use serde_json::{json, Value};

use crate::codec;
use crate::error::{Result, RuntimeError};
use crate::invocation::{InvocationStatus, Outcome};
use crate::lifecycle::{Action, LifecycleState};
use crate::limits::{parse_mem, Applied, AppliedLimits};
use crate::native::NativeProcess;
use crate::reply::Replier;
use crate::sink::EventSink;
use crate::spec::{AgentSpec, Category};
use crate::wasm::{Kind, WasmAgent, WasmEngine, GUEST_WORKSPACE};

/// Default WASM memory when the manifest sets none.
const DEFAULT_WASM_MEM: u64 = 256 * 1024 * 1024;

/// How much of a dead native agent's stderr its invocation's outcome carries.
const STDERR_REPORTED: usize = 4096;

/// The last `max` bytes of `text`, cut at a character boundary.
fn last_bytes(text: &str, max: usize) -> String {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

/// Runtime-wide settings.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where compiled WASM modules are cached (e.g. `.meta/cache/wasm`).
    pub cache_dir: PathBuf,
    /// Authenticates the cache's entries (`CacheKey::for_user()` for a host; an ephemeral key
    /// for tests). Kept outside every project, so no agent can forge an entry.
    pub cache_key: crate::wasm::cache::CacheKey,
}

/// Shared state for all agents: the sink and the WASM engine.
pub struct Runtime {
    sink: Arc<dyn EventSink>,
    wasm: Arc<WasmEngine>,
}

impl Runtime {
    /// # Errors
    /// The WASM engine cannot be created.
    pub fn new(config: RuntimeConfig, sink: Arc<dyn EventSink>) -> Result<Self> {
        let wasm = WasmEngine::new(config.cache_dir, config.cache_key, Some(Arc::clone(&sink)))?;
        Ok(Self { sink, wasm })
    }

    pub fn wasm_engine(&self) -> &Arc<WasmEngine> {
        &self.wasm
    }

    /// Register an agent (lifecycle state `registered`). A native agent without consent is refused
    /// here, and the refusal is logged.
    ///
    /// # Errors
    /// [`RuntimeError::NativeNotAllowed`], or an unsupported manifest version.
    pub fn register(&self, spec: AgentSpec) -> Result<Agent> {
        if !metash_protocol::MANIFEST_SCHEMA_VERSIONS
            .contains(&spec.manifest.schema_version.as_str())
        {
            return Err(RuntimeError::UnsupportedVersion {
                found: spec.manifest.schema_version.clone(),
                supported: metash_protocol::MANIFEST_SCHEMA_VERSIONS.join(", "),
            });
        }
        if spec.manifest.sandbox == SandboxKind::Native && !spec.allow_native {
            self.sink.record(
                LogKind::SandboxDenied,
                Some(&spec.id),
                json!({"what": "native_execution", "reason": "no consent to run natively"}),
            );
            return Err(RuntimeError::NativeNotAllowed(spec.id.clone()));
        }
        self.sink.record(
            LogKind::AgentInstanceRegistered,
            Some(&spec.id),
            json!({"name": spec.manifest.name, "version": spec.manifest.version,
                   "sandbox": spec.manifest.sandbox, "granted": spec.granted}),
        );
        Ok(Agent {
            spec,
            sink: Arc::clone(&self.sink),
            wasm_engine: Arc::clone(&self.wasm),
            state: LifecycleState::Registered,
            backend: Backend::None,
            interrupt: Arc::new(AtomicBool::new(false)),
            paused: Arc::new(AtomicBool::new(false)),
            start_line: Vec::new(),
            replier: Replier::default(),
        })
    }
}

enum Backend {
    None,
    Wasm(WasmAgent),
    Native(Box<NativeProcess>),
}

/// Stops a running invocation from another thread (the host's "stop" button, or shutdown while an
/// invocation is in flight). The invocation ends as `killed` within the shutdown grace.
#[derive(Clone)]
pub struct Interrupter(Arc<AtomicBool>);

impl Interrupter {
    pub fn interrupt(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Pauses a running agent from another thread, mid-invocation (`metash agent suspend`, the
/// host's JSON-RPC `suspendAgent`): a native agent's process group gets SIGSTOP (SIGCONT to go
/// on); a WASM guest blocks at its next epoch check (within 5 ms) until resumed. State in memory,
/// files and pipes stays as it was. The spawn's deadline keeps running while paused: it is the
/// caller's wall-clock bound (seed 000), and a paused agent past it is stopped like any other.
#[derive(Clone)]
pub struct Pauser {
    agent: String,
    paused: Arc<AtomicBool>,
    /// The native agent's process group, when it runs natively.
    pgid: Option<i32>,
    sink: Arc<dyn EventSink>,
}

impl Pauser {
    /// A pauser for a process group metash confined itself (a coding CLI run as a role): SIGSTOP
    /// and SIGCONT to group `pgid`, logged under `agent`.
    pub fn for_group(agent: &str, pgid: i32, sink: Arc<dyn EventSink>) -> Self {
        Self {
            agent: agent.to_string(),
            paused: Arc::new(AtomicBool::new(false)),
            pgid: Some(pgid),
            sink,
        }
    }

    /// Pauses the agent; false when it already was.
    pub fn pause(&self) -> bool {
        if self.paused.swap(true, Ordering::SeqCst) {
            return false;
        }
        let how = self.signal(true);
        self.sink.record(
            LogKind::AgentSuspended,
            Some(&self.agent),
            json!({"how": how, "pgid": self.pgid, "during": "invocation", "from": "active",
                   "to": "suspended"}),
        );
        true
    }

    /// Lets it go on; false when it was not paused.
    pub fn resume(&self) -> bool {
        if !self.paused.swap(false, Ordering::SeqCst) {
            return false;
        }
        self.signal(false);
        self.sink.record(
            LogKind::AgentResumed,
            Some(&self.agent),
            json!({"during": "invocation", "from": "suspended", "to": "active"}),
        );
        true
    }

    #[cfg(unix)]
    fn signal(&self, stop: bool) -> &'static str {
        match self.pgid {
            Some(pgid) => {
                let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
                // SAFETY: kill(2) on the process group of our own child.
                unsafe {
                    libc::kill(-pgid, sig);
                }
                "SIGSTOP to the process group"
            }
            None => "the WASM guest waits at its next epoch check",
        }
    }

    /// No native agents run here (they are refused), so there is no group to signal.
    #[cfg(not(unix))]
    fn signal(&self, _stop: bool) -> &'static str {
        debug_assert!(self.pgid.is_none());
        "the WASM guest waits at its next epoch check"
    }
}

/// One agent and its lifecycle.
pub struct Agent {
    spec: AgentSpec,
    sink: Arc<dyn EventSink>,
    wasm_engine: Arc<WasmEngine>,
    state: LifecycleState,
    backend: Backend,
    interrupt: Arc<AtomicBool>,
    /// Set while a [`Pauser`] holds the agent.
    paused: Arc<AtomicBool>,
    start_line: Vec<u8>,
    replier: Replier,
}

/// How `shutdown()` went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownKind {
    /// It exited within the grace period.
    Graceful,
    /// It had to be killed.
    Forced,
}

impl Agent {
    pub fn id(&self) -> &str {
        &self.spec.id
    }

    pub fn state(&self) -> LifecycleState {
        self.state
    }

    pub fn spec(&self) -> &AgentSpec {
        &self.spec
    }

    /// The native agent's pid (its process group), when running natively.
    pub fn pid(&self) -> Option<i32> {
        match &self.backend {
            Backend::Native(p) => Some(p.pid()),
            _ => None,
        }
    }

    /// Writes events on the agent's stdin during a run: the answer to a `consent_request`, an
    /// `error`. Clone it into the `invoke` callback.
    pub fn replier(&self) -> Replier {
        self.replier.clone()
    }

    pub fn interrupter(&self) -> Interrupter {
        Interrupter(Arc::clone(&self.interrupt))
    }

    /// Pauses and resumes the agent from another thread while it runs (see [`Pauser`]). Take it
    /// after `start`, so a native agent's process group is known.
    pub fn pauser(&self) -> Pauser {
        Pauser {
            agent: self.spec.id.clone(),
            paused: Arc::clone(&self.paused),
            pgid: self.pid(),
            sink: Arc::clone(&self.sink),
        }
    }

    /// Takes file grants back from the agent while it runs (see [`crate::Withdrawer`]). Take it
    /// after `start`; `None` when the agent has no file grants, or they cannot be withdrawn here
    /// (its start report's `paths_revocable` says so).
    pub fn withdrawer(&self) -> Option<crate::Withdrawer> {
        match &self.backend {
            Backend::Wasm(w) => w.withdrawer(&self.spec),
            #[cfg(target_os = "linux")]
            Backend::Native(p) => p
                .mount_ns()
                .map(|ns| crate::Withdrawer::native(ns, &self.spec)),
            _ => None,
        }
    }

    fn transition(&mut self, action: Action, kind: LogKind, data: Value) -> Result<()> {
        let to = self.state.check(&self.spec.id, action)?;
        let from = self.state;
        self.state = to;
        let mut data = data;
        if let Value::Object(m) = &mut data {
            m.insert("from".into(), json!(from));
            m.insert("to".into(), json!(to));
        }
        self.sink.record(kind, Some(&self.spec.id), data);
        Ok(())
    }

    /// `start(ctx)`: prepare the sandbox (WASM: load, cache, link; native: spawn under every
    /// restriction) and hand the agent its context. Logs `agent_started` with the limits applied.
    ///
    /// # Errors
    /// Illegal transition, sandbox setup failure (fail-closed), load errors.
    pub fn start(&mut self) -> Result<Value> {
        self.state.check(&self.spec.id, Action::Start)?;
        let workspace = match self.spec.manifest.sandbox {
            SandboxKind::Wasm => GUEST_WORKSPACE.to_string(),
            SandboxKind::Native => self.spec.workspace.display().to_string(),
        };
        let has_fs = self.spec.has_files();
        self.start_line = codec::encode(AgentEvent::Start {
            agent_id: self.spec.id.clone(),
            workspace: has_fs.then_some(workspace),
            config: self.spec.config.clone(),
            capabilities: self.spec.granted.clone(),
        })?;
        let report = match self.spec.manifest.sandbox {
            SandboxKind::Wasm => self.start_wasm()?,
            SandboxKind::Native => self.start_native()?,
        };
        self.transition(Action::Start, LogKind::AgentStarted, report.clone())?;
        Ok(report)
    }

    /// Loads the module or component (from the cache when it can) and reports the limits the
    /// WASM sandbox applies.
    fn start_wasm(&mut self) -> Result<Value> {
        let mem = match self.spec.manifest.resources.mem.as_deref() {
            Some(m) => parse_mem(m)?,
            None => DEFAULT_WASM_MEM,
        };
        let t0 = Instant::now();
        let wasm = WasmAgent::prepare(
            Arc::clone(&self.wasm_engine),
            &self.spec,
            usize::try_from(mem).unwrap_or(usize::MAX),
            &self.sink,
            &self.replier,
        )?;
        let limits = AppliedLimits {
            memory_bytes: Some(Applied::new(mem, "wasm-store-limits")),
            cpu_millis: self.spec.manifest.resources.cpu.as_ref().map(|_| {
                Applied::new(0, "none")
                    .with_note("no CPU share for WASM; time is bounded by the epoch deadline")
            }),
            pids: None,
            timeout_ms: Some(Applied::new(
                self.spec.timeout.as_millis() as u64,
                "wasm-epoch",
            )),
            output_bytes: Some(Applied::new(self.spec.output_cap, "memory-pipe")),
            events_per_s: Some(Applied::new(self.spec.throttle.rate as u64, "token-bucket")),
            fuel: self.spec.fuel.map(|f| Applied::new(f, "wasm-fuel")),
        };
        let report = json!({
            "sandbox": "wasm",
            "limits": wasm.limits_report(&limits),
            "kind": match wasm.kind() {
                Kind::Module => "wasi-p1 module",
                Kind::Component => "wasi-p2 component",
            },
            "module_cache": format!("{:?}", wasm.cache).to_lowercase(),
            "load_ms": t0.elapsed().as_secs_f64() * 1000.0,
            "preopen": if self.spec.has(Category::FilesWrite) { "read-write" }
                else if self.spec.has(Category::FilesRead) { "read-only" } else { "none" },
            "paths": crate::spec::paths_report(&self.spec, Some(GUEST_WORKSPACE)),
            "paths_revocable": if self.spec.has_files() { wasm.paths_revocable() } else { Value::Null },
            "protected": wasm.protected_report(),
            "network": wasm.network_report(),
            "env": self.spec.env.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        });
        self.backend = Backend::Wasm(wasm);
        Ok(report)
    }

    /// Spawns the process under every restriction (refused without native consent); a setup
    /// failure is logged as a denial.
    fn start_native(&mut self) -> Result<Value> {
        if !self.spec.allow_native {
            return Err(RuntimeError::NativeNotAllowed(self.spec.id.clone()));
        }
        let p = match NativeProcess::spawn(
            &self.spec,
            &self.sink,
            self.start_line.clone(),
            &self.replier,
        ) {
            Ok(p) => p,
            Err(e) => {
                self.sink.record(
                    LogKind::SandboxDenied,
                    Some(&self.spec.id),
                    json!({"what": "start", "code": e.code(), "reason": e.to_string()}),
                );
                return Err(e);
            }
        };
        let report = p.report.clone();
        self.backend = Backend::Native(Box::new(p));
        Ok(report)
    }

    /// `invoke(input)`: stream the agent's events to `on_event` until it sends `done` (or a
    /// checkpoint), exits, hits a limit or the deadline. A slow `on_event` slows the agent.
    ///
    /// # Errors
    /// Illegal transition (not started, suspended, terminated).
    pub fn invoke(
        &mut self,
        prompt: &str,
        context_refs: &[String],
        on_event: &mut dyn FnMut(&AgentEvent),
    ) -> Result<Outcome> {
        self.state.check(&self.spec.id, Action::Invoke)?;
        if self.state == LifecycleState::Initialized {
            self.transition(Action::Invoke, LogKind::AgentActive, json!({}))?;
        }
        self.interrupt.store(false, Ordering::SeqCst);
        let input = AgentEvent::Input {
            agent_id: self.spec.id.clone(),
            prompt: prompt.to_string(),
            context_refs: context_refs.to_vec(),
        };
        self.sink.record(
            LogKind::AgentInvoked,
            Some(&self.spec.id),
            json!({"prompt_bytes": prompt.len(), "context_refs": context_refs}),
        );
        let mut outcome = match &mut self.backend {
            Backend::Wasm(w) => w.invoke(
                &self.spec,
                &self.sink,
                &self.start_line,
                input,
                &super::wasm::Stops {
                    interrupt: Arc::clone(&self.interrupt),
                    paused: Arc::clone(&self.paused),
                },
                &self.replier,
                on_event,
            )?,
            Backend::Native(p) => {
                p.invoke(&self.spec, &self.sink, input, &self.interrupt, on_event)?
            }
            Backend::None => return Err(RuntimeError::NotRunning(self.spec.id.clone())),
        };
        if let (Backend::Native(p), InvocationStatus::Exited { .. }) =
            (&self.backend, &outcome.status)
        {
            let tail = p.stderr_after_exit(Duration::from_millis(100));
            outcome.stderr = Some(last_bytes(&tail, STDERR_REPORTED)).filter(|t| !t.is_empty());
        }
        if outcome.throttled_ms > 0 {
            self.sink.record(
                LogKind::AgentThrottled,
                Some(&self.spec.id),
                json!({"throttled_ms": outcome.throttled_ms, "rate": self.spec.throttle.rate,
                       "burst": self.spec.throttle.burst}),
            );
        }
        self.sink.record(
            LogKind::AgentInvocationEnd,
            Some(&self.spec.id),
            serde_json::to_value(&outcome).unwrap_or_default(),
        );
        // A native agent that is gone cannot take another input: the lifecycle says so.
        let dead = matches!(self.backend, Backend::Native(_))
            && matches!(
                outcome.status,
                InvocationStatus::Timeout
                    | InvocationStatus::Exited { .. }
                    | InvocationStatus::LimitExceeded { .. }
                    | InvocationStatus::Killed { .. }
            );
        if dead {
            self.backend = Backend::None;
            self.transition(
                Action::Shutdown,
                LogKind::AgentTerminated,
                json!({"reason": outcome.status}),
            )?;
        }
        Ok(outcome)
    }

    /// Pause the agent. Native: SIGSTOP to its process group. WASM: instances only exist during an
    /// invocation, so suspension refuses further invocations until `resume`.
    ///
    /// # Errors
    /// Illegal transition.
    pub fn suspend(&mut self) -> Result<()> {
        self.state.check(&self.spec.id, Action::Suspend)?;
        let how = match &self.backend {
            Backend::Native(p) => {
                p.suspend();
                "SIGSTOP to the process group"
            }
            _ => "invocations refused until resume",
        };
        self.transition(
            Action::Suspend,
            LogKind::AgentSuspended,
            json!({"how": how}),
        )
    }

    /// # Errors
    /// Illegal transition.
    pub fn resume(&mut self) -> Result<()> {
        self.state.check(&self.spec.id, Action::Resume)?;
        if let Backend::Native(p) = &self.backend {
            p.resume();
        }
        self.transition(Action::Resume, LogKind::AgentResumed, json!({}))
    }

    /// `shutdown()`: ask politely (`shutdown` message, stdin closed), wait the grace period, then
    /// kill the whole process group. Logs `agent_killed` when force was needed.
    ///
    /// # Errors
    /// Illegal transition (already terminated).
    pub fn shutdown(&mut self) -> Result<ShutdownKind> {
        self.shutdown_with(&mut |_| {})
    }

    /// [`Agent::shutdown`], with the events of a WASM agent's `shutdown()` run (a manifest with
    /// `hooks = ["shutdown"]`) given to `on_event`, so the host can act on the state it flushes.
    ///
    /// # Errors
    /// Illegal transition (already terminated).
    pub fn shutdown_with(&mut self, on_event: &mut dyn FnMut(&AgentEvent)) -> Result<ShutdownKind> {
        self.state.check(&self.spec.id, Action::Shutdown)?;
        let grace = self.spec.shutdown_grace;
        let kind = match std::mem::replace(&mut self.backend, Backend::None) {
            Backend::Native(mut p) => {
                if p.shutdown(grace) {
                    self.sink.record(
                        LogKind::AgentKilled,
                        Some(&self.spec.id),
                        json!({"reason": "still running after the shutdown grace period",
                               "grace_ms": grace.as_millis() as u64}),
                    );
                    ShutdownKind::Forced
                } else {
                    ShutdownKind::Graceful
                }
            }
            Backend::Wasm(w) if self.spec.manifest.hooks.contains(&Hook::Shutdown) => {
                self.wasm_shutdown(&w, on_event)
            }
            _ => ShutdownKind::Graceful,
        };
        self.transition(
            Action::Shutdown,
            LogKind::AgentTerminated,
            json!({"how": match kind { ShutdownKind::Graceful => "graceful", ShutdownKind::Forced => "forced" }}),
        )?;
        Ok(kind)
    }

    /// A WASM agent's `shutdown()`: its instances live for one invocation, so the module runs
    /// once more, given `start` and then `shutdown`, within the shutdown grace. Only for agents
    /// that declared the hook: one that ignores its input would redo its last work.
    fn wasm_shutdown(&self, w: &WasmAgent, on_event: &mut dyn FnMut(&AgentEvent)) -> ShutdownKind {
        let grace = self.spec.shutdown_grace.max(Duration::from_millis(100));
        let mut spec = self.spec.clone();
        spec.timeout = grace;
        let stops = super::wasm::Stops {
            interrupt: Arc::new(AtomicBool::new(false)),
            paused: Arc::new(AtomicBool::new(false)),
        };
        let event = AgentEvent::Shutdown {
            grace_ms: Some(grace.as_millis() as u64),
        };
        let ran = w.invoke(
            &spec,
            &self.sink,
            &self.start_line,
            event,
            &stops,
            &self.replier,
            on_event,
        );
        let status = ran.as_ref().map(|o| o.status.clone()).ok();
        self.sink.record(
            LogKind::AgentShutdownRun,
            Some(&self.spec.id),
            json!({"status": status, "error": ran.err().map(|e| e.to_string())}),
        );
        match status {
            Some(InvocationStatus::Timeout) | None => ShutdownKind::Forced,
            Some(_) => ShutdownKind::Graceful,
        }
    }

    /// The shutdown grace, for callers that want to bound their own waits.
    pub fn grace(&self) -> Duration {
        self.spec.shutdown_grace
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // A dropped native agent is killed (NativeProcess::drop); log it if it was still live.
        if matches!(self.backend, Backend::Native(_)) && self.state != LifecycleState::Terminated {
            self.sink.record(
                LogKind::AgentTerminated,
                Some(&self.spec.id),
                json!({"how": "dropped", "from": self.state}),
            );
        }
    }
}
