//! An interactive CLI session of a role (`metash session start|resume`): the role's CLI on a
//! terminal, confined exactly as the role's headless spawns are (native consent, the sandbox, the
//! credential proxy holding the key, the quotas), with a directory metash owns for the session
//! (`home`: the CLI's HOME, its config and its conversations) that outlives the process, so the
//! conversation can be resumed through its continuation key (seed 003).
//!
//! The caller (the process in the session's terminal) runs [`Interactive::run`]; the CLI gets a
//! pty of its own in its private `devpts`, relayed to that terminal, never the terminal itself.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_harness::{BuildProcessInvocationSpecRequest, Endpoint, Programs};
use metash_protocol::{
    HarnessContinuationRef, HarnessFrontend, InteractionMode, IoMode, LogKind,
    ProcessInvocationSpec, ProviderDomain, Usage,
};

use crate::config::{Permissions, Role};
use crate::error::{HostError, Result};
use crate::host::Host;
use crate::spawn::confine::{native_consent, RoleConfiner};
use crate::spawn::key_proxy;
use crate::spawn::tape::TurnTape;

/// How long a session's CLI may run before the sandbox stops it: sessions are meant to last.
const SESSION_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);

/// What to start.
#[derive(Debug, Clone)]
pub struct Launch {
    pub role: String,
    pub cp_session_id: String,
    pub workdir: PathBuf,
    /// The session's own directory (outside `.meta/`): the sandbox's writable spawn directory
    /// and the harness's `aspHome`, kept between runs.
    pub home: PathBuf,
    /// Resume: the recorded conversation, typed by the provider it was recorded with.
    pub continuation: Option<HarnessContinuationRef>,
    /// First run of a Claude Code session: its key, fixed up front (`--session-id`).
    pub fixed_key: Option<String>,
}

/// A CLI ready to run confined on a relayed pty, and what must outlive it.
pub struct Interactive {
    command: Command,
    /// The invocation spec it was built from (placeholders only, never a key).
    pub spec: ProcessInvocationSpec,
    /// What the sandbox allows (also logged as `agent_started`).
    pub report: serde_json::Value,
    _confinement: metash_runtime::native::confine::Confinement,
    relay: Option<Relay>,
    proxy: Option<metash_runtime::credential::CredentialProxy>,
    meter: Meter,
    /// The session's exchanges, one tape per run of its CLI (docs/replay.md): saved when the
    /// CLI ends and the proxy stopped.
    tape: Option<TurnTape>,
}

#[cfg(target_os = "linux")]
type Relay = metash_runtime::native::tty::Relay;
#[cfg(not(target_os = "linux"))]
type Relay = std::convert::Infallible;

impl Interactive {
    /// Runs the CLI to its end; `on_start` gets its pid as soon as it runs.
    ///
    /// # Errors
    /// It could not start, or the relay failed.
    pub fn run(mut self, on_start: impl FnOnce(u32)) -> Result<ExitStatus> {
        let run = |e: std::io::Error| HostError::Other(format!("running the session's CLI: {e}"));
        if self.relay.is_some() {
            self.command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
        }
        let mut child = self.command.spawn().map_err(run)?;
        on_start(child.id());
        let charging = self.meter.charge_while_running();
        let status = match self.relay.take() {
            #[cfg(target_os = "linux")]
            Some(relay) => relay.run(&mut child).map_err(run),
            #[cfg(not(target_os = "linux"))]
            Some(relay) => match relay {},
            None => child.wait().map_err(run),
        };
        charging.stop();
        // Stopping the proxy delivers every exchange it recorded; then the tape is whole.
        drop(self.proxy.take());
        if let Some(tape) = self.tape.take() {
            tape.save_in(&self.meter.store);
        }
        status
    }
}

/// The session's model usage as the credential proxy reads it on the wire, charged to the run's
/// budget (`.meta/budget.json`, a `budget_charge` event naming the session) as it grows: every
/// [`CHARGE_EVERY`] while the CLI runs, and once more at its end. The session is not stopped
/// at a limit: a person is at its terminal.
#[derive(Clone)]
struct Meter {
    seen: Arc<Mutex<Usage>>,
    charged: Arc<Mutex<(u64, f64)>>,
    store: metash_store::Store,
    role: String,
    cp_session_id: String,
    price: Option<crate::pricing::Price>,
}

/// How often a running session's new usage is charged (nothing is written when there is none):
/// what a killed window's launcher had not charged yet is lost, so this is short.
const CHARGE_EVERY: Duration = Duration::from_millis(250);

/// The charging thread of a running session; [`Charging::stop`] charges what is left.
struct Charging {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
    meter: Meter,
}

impl Charging {
    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        self.meter.charge();
    }
}

impl Meter {
    /// What the proxy calls with the session's running total.
    fn tap(&self) -> Arc<dyn metash_runtime::credential::UsageTap> {
        let seen = Arc::clone(&self.seen);
        Arc::new(crate::spawn::usage_tap::WireUsage::new(move |u: &Usage| {
            if let Ok(mut s) = seen.lock() {
                *s = u.clone();
            }
        }))
    }

    fn charge_while_running(&self) -> Charging {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, meter) = (Arc::clone(&stop), self.clone());
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(CHARGE_EVERY);
                meter.charge();
            }
        });
        Charging {
            stop,
            thread,
            meter: self.clone(),
        }
    }

    /// Charges what was used since the last charge, if anything.
    fn charge(&self) {
        let Ok(total) = self.seen.lock().map(|u| u.clone()) else {
            return;
        };
        let tokens = total.input_tokens + total.output_tokens;
        let cost = self.price.map_or(0.0, |p| p.cost(&total));
        let Ok(mut charged) = self.charged.lock() else {
            return;
        };
        let (dt, dc) = (
            tokens.saturating_sub(charged.0),
            (cost - charged.1).max(0.0),
        );
        if dt == 0 && dc == 0.0 {
            return;
        }
        let cost_usd = self.price.map(|_| dc);
        if charge_budget(&self.store, &self.role, &self.cp_session_id, dt, cost_usd).is_ok() {
            *charged = (tokens, cost);
        }
    }
}

/// Adds a session's usage to the run's budget (not counted as a spawn).
fn charge_budget(
    store: &metash_store::Store,
    role: &str,
    cp_session_id: &str,
    tokens: u64,
    cost_usd: Option<f64>,
) -> Result<()> {
    use metash_store::StoreError;
    store.update_doc("budget", |doc| {
        let mut used: crate::budget::BudgetUsed = if doc.is_null() {
            Default::default()
        } else {
            serde_json::from_value(doc.clone())
                .map_err(|e| StoreError::Rejected(format!("budget.json: {e}")))?
        };
        used.tokens_used += tokens;
        used.cost_usd += cost_usd.unwrap_or(0.0);
        *doc = serde_json::to_value(&used).map_err(|e| StoreError::Rejected(e.to_string()))?;
        Ok(metash_store::NewEvent::new(
            LogKind::BudgetCharge,
            Some(role),
            serde_json::json!({"tokens": tokens, "cost_usd": cost_usd,
                "total_tokens": used.tokens_used, "total_cost_usd": used.cost_usd,
                "cp_session_id": cp_session_id}),
        ))
    })?;
    Ok(())
}

/// The frontend a role's CLI runs as interactively: Claude Code for `agent-sdk` (the same
/// program), the role's own for the others.
///
/// # Errors
/// [`HostError::Config`] for a role that runs no CLI (a model API role has no terminal UI).
pub fn interactive_frontend(name: &str, role: &Role) -> Result<HarnessFrontend> {
    match role.frontend {
        HarnessFrontend::AgentSdk | HarnessFrontend::ClaudeCode => Ok(HarnessFrontend::ClaudeCode),
        f if role.runs_cli() => Ok(f),
        f => Err(HostError::Config(format!(
            "role `{name}` runs `{}`, a model API client with no interactive terminal UI; \
             an interactive session needs a CLI role (claude-code, agent-sdk, codex-cli, pi-sdk)",
            f.as_str()
        ))),
    }
}

impl Host {
    /// A role of `.meta/config.toml` that runs a CLI, with the frontend its session runs.
    ///
    /// # Errors
    /// No such role, or not a CLI role.
    pub fn session_role(&self, name: &str) -> Result<(&Role, HarnessFrontend)> {
        let role = self.config().roles.get(name).ok_or_else(|| {
            let known: Vec<&str> = self.config().roles.keys().map(String::as_str).collect();
            HostError::Config(format!(
                "no role `{name}` in .meta/config.toml (known: {})",
                known.join(", ")
            ))
        })?;
        Ok((role, interactive_frontend(name, role)?))
    }

    /// The role's native consent (asked at the terminal, or from `--yes-to native`, a grant or
    /// the policy file), before anything is opened.
    ///
    /// # Errors
    /// [`HostError::ConsentRefused`].
    pub fn session_consent(&self, role: &str) -> Result<()> {
        native_consent(self, role)
    }

    /// Prepares the role's CLI for an interactive session (consent, credential proxy, invocation
    /// spec with the continuation, confinement); nothing runs until [`Interactive::run`].
    ///
    /// # Errors
    /// No such role, consent refused, a continuation of the other provider (`provider_mismatch`)
    /// or one the CLI cannot find (`continuation_not_found`), or a sandbox that cannot be made.
    pub fn interactive_session(&self, launch: &Launch) -> Result<Interactive> {
        let (role, frontend) = self.session_role(&launch.role)?;
        native_consent(self, &launch.role)?;
        let workdir = self.check_workdir(&launch.workdir)?;
        let meter = Meter {
            seen: Arc::default(),
            charged: Arc::default(),
            store: self.store().clone(),
            role: launch.role.clone(),
            cp_session_id: launch.cp_session_id.clone(),
            price: role
                .model(None)
                .and_then(|m| self.config().prices.price(&m)),
        };
        let (proxy, tape) = self.session_proxy(launch, role, frontend, &meter)?;
        let req = self.session_request(launch, role, frontend, &workdir, proxy.as_ref());
        let programs = Programs::discover(Some(&self.workspace()));
        let spec = metash_harness::build_process_invocation_spec(&req, &programs)?.spec;
        let port = match &proxy {
            Some(started) => Some(started.proxy.addr().port()),
            None => role
                .base_url
                .as_deref()
                .and_then(crate::spawn::confine::url_port),
        };
        let mut confiner = RoleConfiner::new(
            &launch.role,
            role,
            &launch.home,
            SESSION_TIMEOUT,
            |k| self.env_var(k),
            self.event_sink(),
        );
        confiner.fence.hidden = self.hidden_dirs();
        confiner.fence.protected = self.protected_dirs();
        confiner.project = Some(self.workspace());
        confiner.fence.connect_ports = port.into_iter().collect();
        let (argv0, rest) = spec
            .argv
            .split_first()
            .ok_or_else(|| HostError::Other("the invocation spec has no argv".into()))?;
        let mut confinement = confiner
            .prepare(argv0, &workdir, &spec.env)
            .map_err(HostError::Other)?;
        let relay = crate::sandbox::interactive(&mut confinement)?;
        let program = confinement.report["program"]
            .as_str()
            .map_or_else(|| PathBuf::from(argv0), PathBuf::from);
        let mut command = Command::new(program);
        command.args(rest).current_dir(&workdir);
        confinement.apply(&mut command);
        let report = confinement.report.clone();
        self.event_sink().record(
            LogKind::AgentStarted,
            Some(&launch.role),
            serde_json::json!({"cp_session_id": launch.cp_session_id,
                "frontend": frontend, "report": report}),
        );
        Ok(Interactive {
            command,
            spec,
            report,
            _confinement: confinement,
            relay,
            proxy: proxy.map(|s| s.proxy),
            meter,
            tape,
        })
    }

    /// The session's credential proxy, charging `meter` and recording the session's exchanges
    /// as a CLI turn's are (tagged with the session's id instead of a task).
    fn session_proxy(
        &self,
        launch: &Launch,
        role: &Role,
        frontend: HarnessFrontend,
        meter: &Meter,
    ) -> Result<(Option<key_proxy::Started>, Option<TurnTape>)> {
        let tape =
            TurnTape::for_session(self, &launch.role, frontend.as_str(), &launch.cp_session_id);
        let hooks = key_proxy::Hooks {
            tap: Some(meter.tap()),
            recorder: tape.as_ref().map(TurnTape::recorder),
        };
        let proxy = key_proxy::start_recorded(self, &launch.role, role, hooks)?;
        Ok((proxy, tape))
    }

    /// The seed 003 request for the session's CLI: interactive on a pty, its own HOME under the
    /// session's directory with the first-run questions pre-answered, the proxy as its endpoint
    /// and the placeholder as its key, its own prompts off unless the role asks (`permissions =
    /// "ask"`: the person at the terminal answers them).
    fn session_request(
        &self,
        launch: &Launch,
        role: &Role,
        frontend: HarnessFrontend,
        workdir: &Path,
        proxy: Option<&key_proxy::Started>,
    ) -> BuildProcessInvocationSpecRequest {
        let mut req = BuildProcessInvocationSpecRequest::new(frontend, &launch.home, workdir);
        req.cp_session_id = launch.cp_session_id.clone();
        req.interaction_mode = InteractionMode::Interactive;
        req.io_mode = IoMode::Pty;
        req.model = role.model(None);
        req.continuation = launch.continuation.clone();
        req.provider = launch.continuation.as_ref().map(|c| c.provider);
        let o = &mut req.options;
        o.isolated_home = true;
        o.trust_cwd = true;
        o.skip_permissions = role.permissions != Permissions::Ask;
        if launch.continuation.is_none() && frontend.provider() == ProviderDomain::Anthropic {
            o.session_id = launch.fixed_key.clone();
        }
        match proxy {
            Some(started) => {
                o.endpoint = Some(started.endpoint.clone());
                o.sign_in = started.sign_in.clone();
                for var in &started.placeholders {
                    req.env
                        .insert(var.clone(), key_proxy::PLACEHOLDER.to_string());
                }
            }
            None => {
                o.endpoint = role.base_url.as_ref().map(|base_url| Endpoint {
                    base_url: base_url.clone(),
                    api_key_env: None,
                    provider_name: None,
                });
            }
        }
        req
    }
}
