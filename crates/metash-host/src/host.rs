//! The `Host`: one project's store, policy and runners behind the seed-000 calls.

use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, OnceLock};

use metash_protocol::LogKind;

use metash_policy::{
    AgentDirs, Capability, CapabilityRequest, ConsentPrompter, NonInteractive, Policy, PolicyFile,
    Registry, TerminalPrompter,
};
use metash_protocol::{LogLevel, LogRecord, PendingCheckpoint, ResumeData};
use metash_store::{NewEvent, Store};
use serde_json::{json, Value};

use crate::bus::Bus;
use crate::checkpoint;
use crate::config::HostConfig;
use crate::error::{HostError, Result};
use crate::journal::Journal;
use crate::progress::{self, Terminal};

/// Who answers consent questions during spawns.
#[derive(Debug, Clone, Default)]
pub enum ConsentMode {
    /// A person at the terminal (stdin/stderr).
    Interactive,
    /// Scripts, CI and servers: a policy file and `--yes-to` capabilities; anything else is
    /// denied, never waited for.
    #[default]
    NonInteractive,
    /// As [`Self::NonInteractive`], but a question no rule answers waits this long for any
    /// client (an editor through `metash acp`), whatever `[host] consent_wait_seconds` says.
    Clients(std::time::Duration),
}

/// How the host talks to people.
#[derive(Debug, Clone)]
pub struct HostOptions {
    pub terminal: Terminal,
    pub consent: ConsentMode,
    pub policy_file: Option<PathBuf>,
    pub yes_to: Vec<Capability>,
    /// Where agent manifests are discovered besides `.meta/agents` (the user's XDG config home);
    /// `None` looks only in the project.
    pub config_home: Option<PathBuf>,
    /// Variables the host treats as set on top of its own environment (API keys for model roles),
    /// so servers and tests can pass them without changing the process environment.
    pub env: std::collections::BTreeMap<String, String>,
}

impl Default for HostOptions {
    fn default() -> Self {
        Self {
            terminal: Terminal::Stderr,
            consent: ConsentMode::NonInteractive,
            policy_file: None,
            yes_to: Vec::new(),
            config_home: None,
            env: std::collections::BTreeMap::new(),
        }
    }
}

/// Builders for the common cases, so embedders (servers, benches, tests) name only what differs.
impl HostOptions {
    /// Nothing printed, consent never waited for: a host serving a program, not a person.
    pub fn silent() -> Self {
        Self {
            terminal: Terminal::Silent,
            ..Self::default()
        }
    }

    /// Capabilities granted up front, as `--yes-to` does.
    #[must_use]
    pub fn with_yes_to(mut self, capabilities: impl IntoIterator<Item = Capability>) -> Self {
        self.yes_to.extend(capabilities);
        self
    }

    /// One variable set for the host on top of its own environment (an API key, say).
    #[must_use]
    pub fn with_env(mut self, name: &str, value: &str) -> Self {
        self.env.insert(name.to_string(), value.to_string());
        self
    }
}

pub struct Host {
    store: Store,
    options: HostOptions,
    /// `options.policy_file`, read once at open.
    policy_file: Option<PolicyFile>,
    config: HostConfig,
    bus: Arc<Bus>,
    journal: Arc<Journal>,
    runtime: OnceLock<metash_runtime::Runtime>,
    harness: OnceLock<metash_harness::Harness>,
    redactor: OnceLock<metash_policy::Redactor>,
    tokio: OnceLock<tokio::runtime::Runtime>,
    /// The agents this host is running now (suspend and resume reach them directly).
    running: Arc<crate::control::Running>,
    /// Set by `metash replay`: every CLI role's proxy answers from this recorded turn.
    replay: OnceLock<Arc<metash_runtime::credential::Cassette>>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("workspace", &self.store.workspace())
            .finish_non_exhaustive()
    }
}

impl Host {
    /// Opens the project at `workspace` (it must have been `metash init`-ed) and reads
    /// `.meta/config.toml`.
    ///
    /// # Errors
    /// Not a project, changed context.md, a bad config file, a policy file that does not parse
    /// or has an unsupported version (named with its line: a policy the user asked for is never
    /// silently ignored).
    pub fn open(workspace: &Path, options: HostOptions) -> Result<Self> {
        let store = Store::open(workspace)?;
        let config = HostConfig::load(workspace)?;
        let policy_file = options
            .policy_file
            .as_deref()
            .map(PolicyFile::load)
            .transpose()?;
        let bus = Arc::new(Bus::default());
        let journal = Arc::new(Journal::new(store.clone(), Arc::clone(&bus)));
        Journal::keep_flushing(&journal);
        Ok(Self {
            store,
            options,
            policy_file,
            config,
            bus,
            journal,
            runtime: OnceLock::new(),
            harness: OnceLock::new(),
            redactor: OnceLock::new(),
            tokio: OnceLock::new(),
            running: Arc::new(crate::control::Running::default()),
            replay: OnceLock::new(),
        })
    }

    /// Makes this host's CLI-role spawns answer from `cassette` instead of the model
    /// (docs/replay.md): the credential proxy asks for no credential and opens no connection,
    /// and the turn is not recorded again. Once per host; `false` if one was set already.
    pub fn replay_from(&self, cassette: Arc<metash_runtime::credential::Cassette>) -> bool {
        self.replay.set(cassette).is_ok()
    }

    /// The recorded turn this host replays, if any.
    pub fn replaying(&self) -> Option<&Arc<metash_runtime::credential::Cassette>> {
        self.replay.get()
    }

    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// The agents in `.meta/agents` (and the user's config dir), freshly discovered so a manifest
    /// added since the host started is found.
    pub fn registry(&self) -> Registry {
        let dirs = AgentDirs::new(self.store.workspace(), self.options.config_home.as_deref());
        Registry::discover(&dirs)
    }

    pub(crate) fn policy(&self) -> Result<Policy> {
        self.policy_with(self.registry())
    }

    /// A policy over an already discovered registry (registrations are logged once per new or
    /// changed manifest).
    pub(crate) fn policy_with(&self, registry: Registry) -> Result<Policy> {
        let _ = registry.record(&self.store);
        Ok(self
            .config()
            .declare_roles(Policy::new(self.store.clone(), registry)))
    }

    pub(crate) fn prompter(&self) -> Box<dyn ConsentPrompter + Send> {
        match self.options.consent {
            // With a wait configured, the terminal races every other client for the question.
            #[cfg(unix)]
            ConsentMode::Interactive if !self.config.host.consent_wait().is_zero() => {
                Box::new(crate::race::RacingPrompter::new(
                    self.store.clone(),
                    self.config.host.consent_wait(),
                ))
            }
            ConsentMode::Interactive => Box::new(TerminalPrompter::new(
                std::io::BufReader::new(std::io::stdin()),
                std::io::stderr(),
            )),
            ConsentMode::NonInteractive | ConsentMode::Clients(_) => {
                let rules =
                    NonInteractive::new(self.policy_file.clone(), self.options.yes_to.clone());
                let wait = match self.options.consent {
                    ConsentMode::Clients(wait) => wait,
                    _ => self.config.host.consent_wait(),
                };
                if wait.is_zero() {
                    Box::new(rules)
                } else {
                    Box::new(crate::asks::WaitingPrompter::new(
                        rules,
                        self.store.clone(),
                        wait,
                    ))
                }
            }
        }
    }

    /// A name is a role of config.toml first (so a project can replace an agent by a model), then
    /// a registered agent.
    pub(crate) fn resolve(&self, name: &str) -> Result<Target> {
        if let Some(role) = self.config.roles.get(name) {
            return Ok(Target::Role(Box::new(role.clone())));
        }
        let registry = self.registry();
        if registry.get(name).is_some() {
            return Ok(Target::Agent(Box::new(registry)));
        }
        let mut known: Vec<String> = registry.agents().map(|a| a.id.clone()).collect();
        known.extend(self.config.roles.keys().cloned());
        let invalid: Vec<String> = registry
            .invalid()
            .iter()
            .map(|i| format!("{i:?}"))
            .collect();
        let mut hint = if known.is_empty() {
            " (none are configured)".to_string()
        } else {
            format!(" (known: {})", known.join(", "))
        };
        if !invalid.is_empty() {
            hint.push_str(&format!("; invalid manifests: {}", invalid.join("; ")));
        }
        Err(HostError::UnknownAgent {
            name: name.to_string(),
            hint,
        })
    }

    /// The user's config directory (agents of the user, the vault), when known.
    pub fn config_home(&self) -> Option<std::path::PathBuf> {
        self.options.config_home.clone()
    }

    /// A variable from the host's extra env, else its process environment.
    pub fn env_var(&self, name: &str) -> Option<String> {
        self.options
            .env
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
    }

    pub(crate) fn runtime(&self) -> Result<&metash_runtime::Runtime> {
        if let Some(r) = self.runtime.get() {
            return Ok(r);
        }
        let sink: Arc<dyn metash_runtime::EventSink> = self.journal.clone();
        let cache_key = metash_runtime::CacheKey::for_user()
            .map_err(|e| HostError::Other(format!("the WASM cache key: {e}")))?;
        let rt = metash_runtime::Runtime::new(
            metash_runtime::RuntimeConfig {
                cache_dir: self.store.meta_dir().join("cache").join("wasm"),
                cache_key,
            },
            sink,
        )
        .map_err(|e| HostError::Other(format!("starting the agent runtime: {e}")))?;
        Ok(self.runtime.get_or_init(|| rt))
    }

    /// Where runtime components started by the host (a credential proxy) report.
    pub(crate) fn event_sink(&self) -> Arc<dyn metash_runtime::EventSink> {
        self.journal.clone()
    }

    pub(crate) fn harness(&self) -> Result<&metash_harness::Harness> {
        if let Some(h) = self.harness.get() {
            return Ok(h);
        }
        let programs = metash_harness::Programs::discover(Some(self.store.workspace()));
        let h = metash_harness::Harness::new(programs)
            .map_err(|e| HostError::Other(format!("starting the harness layer: {e}")))?;
        Ok(self.harness.get_or_init(|| h))
    }

    pub(crate) fn tokio(&self) -> Result<&tokio::runtime::Runtime> {
        if let Some(t) = self.tokio.get() {
            return Ok(t);
        }
        let t = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| HostError::Other(format!("starting the async runtime: {e}")))?;
        Ok(self.tokio.get_or_init(|| t))
    }

    /// Per-spawn directories (aspHome of model roles) live here and are removed after the spawn.
    /// Where each CLI spawn gets its own directory (HOME, config, TMPDIR). Outside the project:
    /// the spawn's sandbox grants it read-write, and a grant inside `.meta/` would be refused.
    pub(crate) fn spawn_root(&self) -> Result<PathBuf> {
        Ok(std::env::temp_dir())
    }

    /// The directories no agent may see, whatever it is granted: the project's `.meta/`.
    pub fn hidden_dirs(&self) -> Vec<PathBuf> {
        vec![self.store.meta_dir().to_path_buf()]
    }

    /// What no agent may change, whatever it is granted: the project's `.git` (objects, refs,
    /// config, hooks, `info/attributes`, every worktree's admin directory). metash's own git and
    /// the user's read what is there: a planted hook, filter or ref would run or be merged outside
    /// any sandbox. (A task worktree's `.git` file is the executor's to rewrite: nothing metash
    /// does reads it, see [`crate::gitdirs`].)
    pub fn protected_dirs(&self) -> Vec<PathBuf> {
        vec![self.workspace().join(".git")]
    }

    /// Where a spawn may work: anywhere but inside metash's state directory, except a task
    /// worktree metash made (a direct child of `.meta/worktrees/`). The canonical path.
    ///
    /// # Errors
    /// The directory does not exist, or lies in `.meta/` and is not a task worktree.
    pub fn check_workdir(&self, workdir: &Path) -> Result<PathBuf> {
        let dir = workdir
            .canonicalize()
            .map_err(|e| HostError::Other(format!("workdir {}: {e}", workdir.display())))?;
        if !self.is_hidden(&dir) {
            return Ok(dir);
        }
        let worktrees = self.store.meta_dir().join("worktrees").canonicalize().ok();
        if worktrees.is_some() && dir.parent() == worktrees.as_deref() {
            return Ok(dir);
        }
        Err(HostError::InvalidRequest(format!(
            "workdir {} lies inside metash's state directory (.meta), which no agent may work in \
             (only a task worktree under .meta/worktrees/ may)",
            workdir.display()
        )))
    }

    /// Whether `path` (resolved as far as it exists, `..` and symlinks included) is inside
    /// metash's state directory.
    pub fn is_hidden(&self, path: &Path) -> bool {
        metash_policy::in_state_dir(&self.store, path)
    }

    pub(crate) fn session_id(&self) -> Result<String> {
        Ok(self.store.state()?.session_id)
    }

    pub(crate) fn take_budget_continue(&self) -> Result<bool> {
        checkpoint::take_budget_continue(&self.store)
    }

    /// An agent's `state_update` event: `agent`/`memory` scope goes to its own KV namespace and
    /// `scratchpad` to the shared one (both need `memory`); session scope may change only
    /// `variables.*` (the plan and phase are the orchestrator's). Same atomic path as
    /// orchestrators use.
    pub(crate) fn agent_state_update(
        &self,
        agent: &str,
        key: &str,
        value: &Value,
        scope: Option<&str>,
    ) -> Result<()> {
        match scope.unwrap_or("session") {
            "agent" | "memory" | "scratchpad" => {
                let kv = self.agent_kv(agent, scope, &format!("state_update {key}"))?;
                self.journal.flush()?;
                let recs_seq = kv.set_within(key, value.clone(), self.config.host.kv_quota())?;
                self.publish_since(recs_seq);
                Ok(())
            }
            "session" => {
                if !key.starts_with("variables.") {
                    return Err(HostError::InvalidRequest(format!(
                        "agents may set only `variables.*` in the session, not `{key}`"
                    )));
                }
                self.update_state(Some(agent), key, value.clone())?;
                Ok(())
            }
            other => Err(HostError::InvalidRequest(format!(
                "unknown state_update scope `{other}` (session, agent or scratchpad)"
            ))),
        }
    }

    /// The redaction for everything the host shows or sends (see [`crate::redaction`]): the
    /// project's, plus the values of its roles' key variables and of the keys given to the host.
    pub fn redactor(&self) -> &metash_policy::Redactor {
        self.redactor.get_or_init(|| {
            let env = |k: &str| self.env_var(k);
            crate::redaction::output_redactor(
                &self.store,
                &self.config,
                &env,
                self.options.env.values().cloned(),
            )
        })
    }

    /// The KV namespace an agent's state event of `scope` works on (its own, or the shared
    /// scratchpad), once its `memory` capability is authorized.
    fn agent_kv(
        &self,
        agent: &str,
        scope: Option<&str>,
        what: &str,
    ) -> Result<metash_store::Kv<'_>> {
        let req = CapabilityRequest::parse("memory", what.to_string())
            .map_err(|e| HostError::Other(e.to_string()))?;
        // Asked like any capability: a grant, else `--yes-to`, the policy file or the person.
        let mut prompter = self.prompter();
        if !self
            .policy()?
            .authorize(agent, &req, &mut *prompter)?
            .is_allowed()
        {
            return Err(HostError::InvalidRequest(
                "the `memory` capability is not granted".into(),
            ));
        }
        Ok(if scope == Some("scratchpad") {
            self.store.scratchpad()
        } else {
            self.store.kv(agent)?
        })
    }

    /// An agent's `state_get` (seed 002 §7: agents read back what they stored): `key` in its own
    /// KV namespace (`agent`, the default) or the `scratchpad` (both need `memory`), or in the
    /// session's `variables.*`; an empty key reads the whole namespace. `None` when nothing is
    /// stored there.
    pub(crate) fn agent_state_get(
        &self,
        agent: &str,
        key: &str,
        scope: Option<&str>,
    ) -> Result<Option<Value>> {
        match scope.unwrap_or("agent") {
            "agent" | "memory" | "scratchpad" => {
                let kv = self.agent_kv(agent, scope, &format!("state_get {key}"))?;
                if key.is_empty() {
                    return Ok(Some(Value::Object(kv.list()?)));
                }
                Ok(kv.get(key)?)
            }
            "session" => {
                let path = if key.is_empty() { "variables" } else { key };
                if path != "variables" && !path.starts_with("variables.") {
                    return Err(HostError::InvalidRequest(format!(
                        "agents may read only `variables.*` of the session, not `{key}`"
                    )));
                }
                Ok(self.store.get(path).ok())
            }
            other => Err(HostError::InvalidRequest(format!(
                "unknown state_get scope `{other}` (agent, scratchpad or session)"
            ))),
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn workspace(&self) -> PathBuf {
        self.store.workspace().to_path_buf()
    }

    pub(crate) fn running(&self) -> &Arc<crate::control::Running> {
        &self.running
    }

    /// Suspends (`Want::Suspended`) or resumes (`Want::Active`) `agent`: at once when this host
    /// runs it, else as a request for the process that does (see [`crate::control`]).
    ///
    /// # Errors
    /// The request could not be recorded.
    pub fn control_agent(
        &self,
        agent: &str,
        want: crate::control::Want,
    ) -> Result<crate::control::Applied> {
        if let Some(pauser) = self.running.get(agent) {
            let changed = crate::control::apply(&pauser, want);
            self.flush_events()?;
            return Ok(crate::control::Applied::Here { changed });
        }
        self.journal.flush()?;
        let rec = crate::control::request(&self.store, agent, want)?;
        let seq = rec.seq;
        self.bus.publish(&[rec]);
        Ok(crate::control::Applied::Requested { seq })
    }

    /// Every event the host makes durable from now on, for an attached client.
    pub fn subscribe(&self) -> Receiver<LogRecord> {
        self.bus.subscribe()
    }

    /// Appends events to the log now (after anything the journal holds, to keep the order), then
    /// hands them to subscribers.
    pub fn record(&self, events: &[NewEvent]) -> Result<Vec<LogRecord>> {
        self.journal.flush()?;
        let recs = self.store.append_batch(events)?;
        self.bus.publish(&recs);
        Ok(recs)
    }

    /// Buffers an event for the next group commit (see [`crate::journal`]).
    pub(crate) fn record_later(&self, event: NewEvent) -> Result<()> {
        self.journal.push(event)
    }

    /// Makes everything buffered durable.
    pub fn flush_events(&self) -> Result<()> {
        self.journal.flush().map(|_| ())
    }

    /// seed 000's `update_state`, for orchestrators and (with `agent`) for agents' `state_update`
    /// events: the same atomic, validated path either way.
    pub fn update_state(&self, agent: Option<&str>, key: &str, value: Value) -> Result<u64> {
        self.journal.flush()?;
        let rev = self.store.update_state_as(agent, key, value, None)?;
        self.publish_since(rev);
        Ok(rev)
    }

    /// The whole state (`key` empty) or one key path.
    pub fn get_state(&self, key: &str) -> Result<Value> {
        Ok(self.store.get(key)?)
    }

    /// seed 000's `log_progress`: the terminal, the log, every attached client.
    pub fn log_progress(&self, message: &str, level: LogLevel) -> Result<u64> {
        let shown = self.redactor().redact_str(message);
        progress::print(self.options.terminal, &shown, level);
        let recs = self.record(&[NewEvent::new(
            LogKind::Progress,
            None,
            json!({"message": message, "level": progress::level_str(level)}),
        )])?;
        Ok(recs.last().map(|r| r.seq).unwrap_or(0))
    }

    pub fn pending_checkpoint(&self) -> Result<Option<PendingCheckpoint>> {
        Ok(self.store.state()?.pending_checkpoint)
    }

    pub fn raise_checkpoint(
        &self,
        agent: &str,
        signal: &metash_protocol::CheckpointSignal,
    ) -> Result<PendingCheckpoint> {
        self.journal.flush()?;
        let p = checkpoint::raise(&self.store, agent, signal)?;
        self.publish_tail();
        Ok(p)
    }

    pub fn answer_checkpoint(&self, id: Option<&str>, answer: &str) -> Result<ResumeData> {
        let r = checkpoint::answer(&self.store, id, answer)?;
        self.publish_tail();
        Ok(r)
    }

    pub(crate) fn take_resume(&self, agent: &str) -> Result<Option<ResumeData>> {
        checkpoint::take_resume(&self.store, agent)
    }

    fn publish_since(&self, seq: u64) {
        let mut recs = Vec::new();
        let _ = self.store.log().scan_back(|r| {
            let more = r.seq > seq;
            if r.seq >= seq {
                recs.push(r);
            }
            more
        });
        recs.reverse();
        self.bus.publish(&recs);
    }

    fn publish_tail(&self) {
        if let Ok(tail) = self.store.log().tail() {
            self.publish_since(tail.seq);
        }
    }
}

/// What a name resolves to.
pub(crate) enum Target {
    /// The registry it was found in (reused for the policy decisions of the spawn).
    Agent(Box<metash_policy::Registry>),
    Role(Box<crate::config::Role>),
}
