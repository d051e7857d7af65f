//! The loop: `status` planning -> executing -> verifying -> (merge) -> the next phase, or halted.
//! Every transition is an `update_state` (usually `update_many`, one event for a transition and
//! its bookkeeping), so the log tells the story and a killed run continues where the state says.

use std::path::{Path, PathBuf};

use metash_host::{Host, SpawnRequest, Spawner, WorkspaceAccess};
use metash_protocol::{
    AgentResponse, AgentStatus, CheckpointReason, CheckpointSignal, LogLevel, PendingCheckpoint,
    SessionState, SessionStatus, SpawnOptions, TaskStatus,
};
use metash_store::Store;
use serde_json::{json, Value};

use crate::book::{self, Book, Decision, Entry, Halt, HaltReason, ResumeFor};
use crate::config::OrchestratorConfig;
use crate::error::{OrchestratorError, Result};
use crate::git::Git;
use crate::plan::TaskNode;
use crate::prompts::{self, Focus, Role};

/// What `metash run` was asked to do beyond the defaults of `[orchestrator]`.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Parallel tasks (overrides `jobs` in config).
    pub jobs: Option<usize>,
    /// Stop after this many phases complete in this run.
    pub max_phases: Option<u32>,
    /// Answer the pending checkpoint with this before continuing.
    pub answer: Option<String>,
    /// Continue a halted session: reset gapCount and the attempt counters, retry failed tasks.
    pub retry: bool,
    /// Executor turns are run by `metash worker`s through the store's server.
    pub workers: bool,
}

/// Why a run stopped.
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    /// The planner found nothing left to do.
    Complete {
        phases_completed: u32,
    },
    /// `max_phases` phases completed.
    PhaseLimit {
        phases_completed: u32,
    },
    /// Someone must answer (`metash run --answer VALUE`).
    Checkpoint(PendingCheckpoint),
    Halted(Halt),
}

/// One step of the loop.
pub(crate) enum Step {
    Continue,
    PhaseDone,
    Stop(RunOutcome),
}

/// The orchestrator of one project: the host for state, progress and checkpoints, a spawner for
/// the roles (the host itself in `metash run`; scripted agents in tests and benchmarks).
pub struct Orchestrator<'a> {
    pub(crate) host: &'a Host,
    pub(crate) spawner: &'a dyn Spawner,
    pub(crate) config: OrchestratorConfig,
    pub(crate) git: Git,
    pub(crate) jobs: usize,
    /// Executor turns go to workers ([`RunOptions::workers`]).
    pub(crate) remote: bool,
}

/// Tasks a coordinator keeps queued at once for workers, unless `--jobs` says otherwise.
const WORKER_JOBS: usize = 32;

/// Who raises the orchestrator's own checkpoints (merge conflicts).
pub const ORCHESTRATOR_AGENT: &str = "orchestrator";

/// The branch of a task.
pub fn branch_of(id: &str) -> String {
    format!("metash/task/{id}")
}

/// The worktree of a task.
pub fn worktree_of(workspace: &Path, id: &str) -> PathBuf {
    workspace.join(".meta").join("worktrees").join(id)
}

impl<'a> Orchestrator<'a> {
    /// # Errors
    /// `.meta/config.toml` does not parse.
    pub fn new(host: &'a Host, spawner: &'a dyn Spawner) -> Result<Self> {
        let workspace = host.workspace();
        let config = OrchestratorConfig::load(&workspace)?;
        Ok(Self {
            host,
            spawner,
            jobs: config.jobs,
            config,
            git: Git::new(&workspace),
            remote: false,
        })
    }

    /// Replaces the config read from the project (tests, benchmarks).
    pub fn with_config(mut self, config: OrchestratorConfig) -> Self {
        self.jobs = config.jobs;
        self.config = config;
        self
    }

    pub fn config(&self) -> &OrchestratorConfig {
        &self.config
    }

    pub(crate) fn store(&self) -> &Store {
        self.host.store()
    }

    pub(crate) fn workspace(&self) -> PathBuf {
        self.host.workspace()
    }

    pub(crate) fn progress(&self, message: &str, level: LogLevel) {
        let _ = self.host.log_progress(message, level);
    }

    pub(crate) fn update(&self, updates: Vec<(String, Value)>) -> Result<u64> {
        Ok(self
            .store()
            .update_many(Some(ORCHESTRATOR_AGENT), updates, None)?)
    }

    /// Refuses before anything is spent when a role is unknown or a model-backed role lacks its
    /// key or program.
    ///
    /// # Errors
    /// [`OrchestratorError::Host`] naming the role and what is missing.
    pub fn preflight(&self) -> Result<()> {
        for name in [
            &self.config.planner,
            &self.config.executor,
            &self.config.verifier,
        ] {
            if let Some(role) = self.host.config().roles.get(name.as_str()) {
                self.host.preflight_role(name, role)?;
            }
        }
        Ok(())
    }

    /// Refuses when a role names neither a registered agent nor a model-backed role (for runs
    /// where the host itself is the spawner, as in `metash run`).
    ///
    /// # Errors
    /// [`OrchestratorError::Refused`] naming the role, the name and what is known.
    pub fn check_roles_resolve(&self) -> Result<()> {
        let registry = self.host.registry();
        let roles = &self.host.config().roles;
        for (role, name) in [
            ("planner", &self.config.planner),
            ("executor", &self.config.executor),
            ("verifier", &self.config.verifier),
        ] {
            if roles.contains_key(name.as_str()) || registry.get(name).is_some() {
                continue;
            }
            let mut known: Vec<String> = registry.agents().map(|a| a.id.clone()).collect();
            known.extend(roles.keys().cloned());
            return Err(OrchestratorError::Refused(format!(
                "[orchestrator] {role} = \"{name}\" names no agent in .meta/agents/ and no model-backed \
                 role in [roles] of .meta/config.toml (known: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            )));
        }
        Ok(())
    }

    /// Runs the loop until the project is complete, a checkpoint needs a person, the session
    /// halts, or `max_phases` phases are done.
    ///
    /// # Errors
    /// Store, git or host failures; another run in progress; `--answer` with nothing pending;
    /// the repository's executable git configuration changed
    /// ([`OrchestratorError::GitConfigChanged`], also logged as a `git_trust` event).
    pub fn run(&mut self, options: &RunOptions) -> Result<RunOutcome> {
        let outcome = self.run_trusted(options);
        self.trust_logged(outcome)
    }

    fn run_trusted(&mut self, options: &RunOptions) -> Result<RunOutcome> {
        if let Some(j) = options.jobs {
            self.jobs = j.max(1);
        }
        if options.workers {
            self.server()?;
            self.remote = true;
            // The workers' slots bound the work; the coordinator only keeps them fed.
            if options.jobs.is_none() {
                self.jobs = self.jobs.max(WORKER_JOBS);
            }
        }
        let run = crate::run_lock(self.store())?;
        let _handed = self.git.handing_down(&run);
        // Before any git command: the executable git configuration is the one a person accepted.
        self.check_git_trust()?;
        self.git.ensure_repo()?;
        for lock in self.git.clear_stale_locks() {
            self.progress(
                &format!("removed {}, left by a run that was killed", lock.display()),
                metash_protocol::LogLevel::Warn,
            );
        }
        if let Some(answer) = &options.answer {
            self.answer(answer)?;
        }
        self.adopt_answer()?;
        if let Some(p) = self.host.pending_checkpoint()? {
            return Ok(RunOutcome::Checkpoint(p));
        }
        self.preflight()?;
        self.recover()?;
        // A halt for a refused consent is taken up again by the next run (whose grants may now
        // be there): nothing else about it needs a person's `--retry`.
        if options.retry || self.halted_for(HaltReason::ConsentRefused)? {
            self.retry_halted()?;
        }
        let mut phases = 0u32;
        loop {
            let state = self.store().state()?;
            let step = match state.status {
                SessionStatus::Halted => {
                    let halt = Book::of(&state).halt.unwrap_or_else(|| Halt {
                        reason: HaltReason::Halted,
                        phase: state.current_phase,
                        failed: vec![],
                        message: "the session is halted".into(),
                    });
                    if halt.reason == HaltReason::Complete {
                        Step::Stop(RunOutcome::Complete {
                            phases_completed: phases,
                        })
                    } else {
                        Step::Stop(RunOutcome::Halted(halt))
                    }
                }
                SessionStatus::Planning => self.consent_halts(self.plan_phase(&state), &state)?,
                SessionStatus::Executing => {
                    self.consent_halts(self.execute_phase(&state), &state)?
                }
                SessionStatus::Verifying => {
                    self.consent_halts(self.verify_phase(&state), &state)?
                }
            };
            match step {
                Step::Continue => {}
                Step::PhaseDone => {
                    phases += 1;
                    if options.max_phases.is_some_and(|m| phases >= m) {
                        return Ok(RunOutcome::PhaseLimit {
                            phases_completed: phases,
                        });
                    }
                }
                Step::Stop(outcome) => return Ok(outcome),
            }
        }
    }

    /// Answers the pending checkpoint through the host (which hands the answer to the next spawn
    /// as `resume_data`) and records it as a decision every later prompt shows.
    fn answer(&self, value: &str) -> Result<()> {
        let Some(pending) = self.host.pending_checkpoint()? else {
            return Err(OrchestratorError::Refused(
                "no checkpoint is pending; `metash run` without --answer continues".into(),
            ));
        };
        let resume = self.host.answer_checkpoint(None, value)?;
        self.progress(
            &format!(
                "checkpoint `{}` answered: {}",
                resume.checkpoint_id, resume.user_input
            ),
            LogLevel::Info,
        );
        if pending.agent == "host" {
            return Ok(());
        }
        self.record_answer(&asked(&pending), &resume.user_input)
    }

    /// Where an answer goes: for the orchestrator's own question (a merge conflict) the answer it
    /// reads, taken so no agent receives it; otherwise a decision every later prompt shows.
    fn record_answer(&self, asked: &crate::book::Asked, answer: &str) -> Result<()> {
        if asked.agent == ORCHESTRATOR_AGENT {
            metash_host::checkpoint::take_resume(self.store(), ORCHESTRATOR_AGENT)?;
            self.update(vec![book::set(Entry::LastAnswer, json!(answer))])?;
            return Ok(());
        }
        let decision = Decision {
            id: asked.id.clone(),
            question: asked.question.clone(),
            answer: answer.to_string(),
        };
        self.store().transact(Some(ORCHESTRATOR_AGENT), |state| {
            let mut decisions = Book::of(state).decisions;
            decisions.retain(|d| d.id != decision.id);
            decisions.push(decision.clone());
            Ok(vec![book::set(Entry::Decisions, json!(decisions))])
        })?;
        Ok(())
    }

    /// A checkpoint answered by another client since the last run (`metash ui`, `metash resume
    /// --answer`, JSON-RPC's `answerCheckpoint`): recorded as `--answer` records it, a decision
    /// every later prompt shows, or, for the orchestrator's own question, the answer it reads.
    fn adopt_answer(&self) -> Result<()> {
        let state = self.store().state()?;
        let book = Book::of(&state);
        let (Some(resume), Some(asked)) = (
            state.resume_data.as_ref(),
            book.resume_for.as_ref().and_then(|r| r.asked.as_ref()),
        ) else {
            return Ok(());
        };
        if state.pending_checkpoint.is_some()
            || resume.checkpoint_id != asked.id
            || book.decisions.iter().any(|d| d.id == asked.id)
        {
            return Ok(());
        }
        self.progress(
            &format!(
                "checkpoint `{}` was answered elsewhere: {}",
                asked.id, resume.user_input
            ),
            LogLevel::Info,
        );
        self.record_answer(asked, &resume.user_input)
    }

    /// A run killed mid-task left `running` markers: those tasks failed (retryable, the attempt
    /// not counted) and their worktrees go back to where the attempt started.
    fn recover(&self) -> Result<()> {
        let state = self.store().state()?;
        let book = Book::of(&state);
        for (id, running) in book.running() {
            let wt = worktree_of(&self.workspace(), id);
            // The attempt is recorded before its worktree is made: a run killed while adding it
            // leaves a half-made one (no usable admin directory), which the next attempt clears
            // and makes again (`ensure_worktree`); there is nothing in it to reset.
            if self.git.is_worktree(&wt) {
                self.git.reset_to(&wt, &running.head)?;
            }
            self.update(vec![
                book::task_set(id, "status", json!(TaskStatus::Failed)),
                book::set_for(Entry::Running, id, book::null()),
                book::set_for(Entry::Attempts, id, json!(running.attempt.saturating_sub(1))),
                book::set_for(
                    Entry::Errors, id,
                    json!("the run stopped while this task was running; its partial work was discarded"),
                ),
            ])?;
            self.progress(
                &format!("task {id} was running when the last run stopped; it will be retried"),
                LogLevel::Warn,
            );
        }
        // A merge into the project that a crash interrupted (not one a person is resolving).
        let root = self.workspace();
        let resolving = book.resume_for.as_ref().is_some_and(|r| r.role == "merge");
        if !resolving && self.git.merge_in_progress(&root)? {
            self.git.run(&root, &["merge", "--abort"])?;
        }
        Ok(())
    }

    /// Whether the session is halted for `reason`.
    fn halted_for(&self, reason: HaltReason) -> Result<bool> {
        let state = self.store().state()?;
        Ok(state.status == SessionStatus::Halted
            && Book::of(&state).halt.is_some_and(|h| h.reason == reason))
    }

    /// A phase a refused consent stopped halts the session at once (`consent_refused`, saying
    /// what grants it): a retry could not change the answer.
    fn consent_halts(&self, step: Result<Step>, state: &SessionState) -> Result<Step> {
        match step {
            Err(OrchestratorError::Host(metash_host::HostError::ConsentRefused {
                message,
                ..
            })) => self.halt(Halt {
                reason: HaltReason::ConsentRefused,
                phase: state.current_phase,
                failed: vec![],
                message,
            }),
            other => other,
        }
    }

    fn retry_halted(&self) -> Result<()> {
        let state = self.store().state()?;
        if state.status != SessionStatus::Halted {
            return Ok(());
        }
        if Book::of(&state)
            .halt
            .is_some_and(|h| h.reason == HaltReason::Complete)
        {
            return Ok(());
        }
        self.update(vec![
            ("status".into(), json!(SessionStatus::Planning)),
            ("gapCount".into(), json!(0)),
            book::set(Entry::Halt, book::null()),
            book::set(Entry::Attempts, json!({})),
            book::set(Entry::PlanAttempts, json!(0)),
        ])?;
        self.progress("retrying the halted session", LogLevel::Info);
        Ok(())
    }

    /// Halts the session with `halt` as its report.
    pub(crate) fn halt(&self, halt: Halt) -> Result<Step> {
        let level = if halt.reason == HaltReason::Complete {
            LogLevel::Info
        } else {
            LogLevel::Error
        };
        self.progress(&halt.message, level);
        self.update(vec![
            ("status".into(), json!(SessionStatus::Halted)),
            book::set(
                Entry::Halt,
                serde_json::to_value(&halt).unwrap_or(Value::Null),
            ),
        ])?;
        Ok(if halt.reason == HaltReason::Complete {
            Step::Continue
        } else {
            Step::Stop(RunOutcome::Halted(halt))
        })
    }

    /// Every planned task with its phase.
    pub(crate) fn nodes(state: &SessionState) -> Vec<TaskNode> {
        let book = Book::of(state);
        state
            .plan
            .as_ref()
            .map(|p| {
                p.tasks
                    .iter()
                    .map(|t| TaskNode {
                        id: t.id.clone(),
                        title: t.title.clone(),
                        dependencies: t.dependencies.clone(),
                        phase: book.phase_of(&t.id, state.current_phase),
                        expects_change: !book.expects_no_change(&t.id),
                        labels: book.labels_of(&t.id),
                        paths: book.paths_of(&t.id),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Spawns `role` with prompts built from the current state.
    pub(crate) fn spawn(
        &self,
        role: Role,
        focus: &Focus<'_>,
        workdir: Option<PathBuf>,
    ) -> Result<AgentResponse> {
        let state = self.store().state()?;
        let book = Book::of(&state);
        let context = self.store().context()?;
        let workspace = self.workspace();
        let agent = match role {
            Role::Planner => &self.config.planner,
            Role::Executor => &self.config.executor,
            Role::Verifier => &self.config.verifier,
        };
        let mut user_message = prompts::user_message(role, &state, &book, &context, focus);
        let context_sha = if role == Role::Planner {
            let (note, sha) = self.context_note(&book, &context)?;
            user_message.push_str(&note);
            Some(sha).filter(|s| book.context_seen.as_deref() != Some(s.as_str()))
        } else {
            None
        };
        let request = SpawnRequest {
            agent_name: agent.clone(),
            system_prompt: prompts::system_prompt(&workspace, role),
            user_message,
            options: SpawnOptions {
                model_hint: self.config.model_hint,
                timeout_seconds: self.config.timeout_seconds,
                max_tokens: self.config.max_tokens,
                ..SpawnOptions::default()
            },
            workdir,
            task_id: focus.task.map(str::to_string),
            // The planner works on the project root, the user's checkout: it reads, never writes
            // (a write there, `.git/` above all, would be acted on by metash's own git). An
            // executor writes its task worktree; a verifier's writes there are never committed.
            access: match role {
                Role::Planner => WorkspaceAccess::ReadOnly,
                Role::Executor | Role::Verifier => WorkspaceAccess::ReadWrite,
            },
        };
        let spawned = self.spawner.spawn_agent(&request);
        if let (Ok(_), Some(sha)) = (&spawned, context_sha) {
            // The planner has seen this context: the next change is news again.
            self.update(vec![book::set(Entry::ContextSeen, serde_json::json!(sha))])?;
        }
        match spawned {
            Ok(r) => Ok(r),
            // Refused consent: not the role failing. Retrying cannot change it; the run halts.
            Err(e @ metash_host::HostError::ConsentRefused { .. }) => Err(e.into()),
            // The host could not serve the request at all: as the role failing, so the loop's
            // bounds (attempts, gapCount) apply and the reason reaches the report.
            Err(e) => Ok(AgentResponse {
                status: AgentStatus::Error,
                data: format!("the host could not spawn `{agent}`: {e}"),
                metadata: Default::default(),
            }),
        }
    }

    /// A role answered with a checkpoint: make sure it is pending (the host persists it; a
    /// spawner that does not is covered here), remember who must get the answer, stop.
    pub(crate) fn on_checkpoint(
        &self,
        agent: &str,
        response: &AgentResponse,
        mut resume_for: ResumeFor,
    ) -> Result<PendingCheckpoint> {
        let pending = match self.host.pending_checkpoint()? {
            Some(p) => p,
            None => {
                let signal = serde_json::from_str::<CheckpointSignal>(&response.data)
                    .unwrap_or_else(|_| CheckpointSignal {
                        kind: Default::default(),
                        reason: CheckpointReason::HumanAction,
                        message: response.data.clone(),
                        options: vec![],
                        resume_id: None,
                    });
                self.host.raise_checkpoint(agent, &signal)?
            }
        };
        resume_for.asked = Some(asked(&pending));
        self.update(vec![book::set(
            Entry::ResumeFor,
            serde_json::to_value(&resume_for).unwrap_or(Value::Null),
        )])?;
        self.progress(
            &format!(
                "checkpoint `{}` from {agent}: {} (answer with: metash run --answer VALUE)",
                pending.id, pending.signal.message
            ),
            LogLevel::Warn,
        );
        Ok(pending)
    }

    /// The orchestrator's own checkpoint (a merge that needs a person).
    pub(crate) fn raise_own(
        &self,
        message: String,
        options: Vec<String>,
        mut resume_for: ResumeFor,
    ) -> Result<Step> {
        let signal = CheckpointSignal {
            kind: Default::default(),
            reason: CheckpointReason::HumanAction,
            message,
            options,
            resume_id: None,
        };
        let pending = self.host.raise_checkpoint(ORCHESTRATOR_AGENT, &signal)?;
        resume_for.asked = Some(asked(&pending));
        self.update(vec![book::set(
            Entry::ResumeFor,
            serde_json::to_value(&resume_for).unwrap_or(Value::Null),
        )])?;
        self.progress(&pending.signal.message, LogLevel::Warn);
        Ok(Step::Stop(RunOutcome::Checkpoint(pending)))
    }
}

/// What a checkpoint asked, kept with who must get the answer.
fn asked(p: &PendingCheckpoint) -> crate::book::Asked {
    crate::book::Asked {
        id: p.id.clone(),
        agent: p.agent.clone(),
        question: p.signal.message.clone(),
    }
}
