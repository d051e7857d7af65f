//! `executing`: the phase's unfinished tasks in dependency order, up to `jobs` at once, each in its
//! own git worktree on its own branch (`metash/task/<id>`, started from its dependencies' work).
//!
//! One attempt, and what makes it crash-safe:
//! 1. the worktree is made (idempotently) on its branch at the last commit recorded for the task
//!    (a branch metash did not record is refused: `recorded.rs`), cleaned, and the unmerged
//!    dependencies' recorded commits merged in;
//! 2. `running.<id> = {attempt, head}` is recorded (for a new branch, before it is made, with its
//!    base: `branches.<id>`);
//! 3. the executor runs in the worktree;
//! 4. success: the orchestrator commits what changed and records, in **one** update, the task
//!    `complete`, its commits, the branch's new tips, and `running.<id> = null`. Error or timeout: the worktree is reset to
//!    `head` and the task is `failed` (retried up to `max_task_attempts`).
//!
//! A run killed between 2 and 4 leaves `running.<id>`: the next run resets the worktree to `head`
//! (dropping any commit the dead run made but did not record) and retries, so no work is applied
//! twice and a task whose commits are recorded is never redone.

use std::collections::HashSet;
use std::path::Path;
use std::sync::mpsc;

use metash_protocol::{
    AgentStatus, LogLevel, PendingCheckpoint, SessionState, SessionStatus, TaskStatus,
};
use serde_json::{json, Value};

use crate::book::{self, Book, BranchRecord, Entry, FailedTask, Halt, HaltReason, ResumeFor};
use crate::engine::{Orchestrator, RunOutcome, Step};
use crate::error::{OrchestratorError, Result};
use crate::planning::clip;
use crate::prompts::{Focus, Role};
use crate::reply::{apply_files, extract_json};
use crate::schedule::Scheduler;

/// How one attempt ended.
pub(crate) enum Attempt {
    Complete,
    Failed(String),
    Checkpoint(PendingCheckpoint),
    /// The orchestrator itself must stop (a merge needs a person).
    Stop(RunOutcome),
}

/// How a phase's task loop stopped early, if it did.
#[derive(Default)]
struct Ended {
    stop: Option<Step>,
    error: Option<OrchestratorError>,
}

impl Ended {
    fn is_clear(&self) -> bool {
        self.stop.is_none() && self.error.is_none()
    }
}

/// A task's worktree ready for its executor: at `head`, the attempt recorded as running
/// (`recorded.rs` makes it).
pub(crate) struct Ready {
    pub wt: std::path::PathBuf,
    pub head: String,
    pub begun: Begun,
}

/// An attempt recorded as running: the state it started from, its number, and what the
/// executor is told (findings to address, the last attempt's error).
pub(crate) struct Begun {
    pub state: SessionState,
    pub attempt: u32,
    pub findings: Vec<String>,
    pub last_error: Option<String>,
    /// What is recorded of the task's branch as the attempt starts.
    pub record: Option<BranchRecord>,
    /// The dependency merges made for the attempt after `record` (recorded with its completion).
    pub merges: Vec<String>,
}

impl Orchestrator<'_> {
    /// Records attempt N of task `id` as running from `head`, with the review comments waiting
    /// for it joined to its findings, and `record` (a new branch's base) in the same update.
    pub(crate) fn begin_attempt(
        &self,
        id: &str,
        head: &str,
        record: Option<&BranchRecord>,
    ) -> Result<Begun> {
        let state = self.store().state()?;
        let book = Book::of(&state);
        let attempt = book.attempts.get(id).copied().unwrap_or(0) + 1;
        // A person's review comments join the findings before they are marked delivered: a
        // crash between the two hands them over again, never loses them (and never twice: a
        // finding already there is not added again).
        let waiting = crate::review::waiting(self.store(), id)?;
        let mut findings = book.findings(id).to_vec();
        for c in &waiting {
            let f = c.as_finding();
            if !findings.contains(&f) {
                findings.push(f);
            }
        }
        let last_error = book.last_error(id).map(str::to_string);
        let mut updates = Vec::new();
        if !waiting.is_empty() {
            updates.push(book::set_for(Entry::Findings, id, json!(findings)));
        }
        if let Some(r) = record {
            updates.push(book::set_for(Entry::Branches, id, json!(r)));
        }
        self.update(
            vec![
                book::set_for(
                    Entry::Running,
                    id,
                    json!({"attempt": attempt, "head": head, "since": metash_store::log::now()}),
                ),
                book::set_for(Entry::Attempts, id, json!(attempt)),
            ]
            .into_iter()
            .chain(updates)
            .collect(),
        )?;
        if !waiting.is_empty() {
            crate::review::take(self.store(), id, "executor")?;
        }
        Ok(Begun {
            state,
            attempt,
            findings,
            last_error,
            record: record.cloned(),
            merges: Vec::new(),
        })
    }

    /// An attempt recorded as running that stops before its executor runs (a dependency's merge
    /// conflicts, the branch is refused): not running, and not counted.
    pub(crate) fn unbegin(&self, id: &str, begun: &Begun) -> Result<()> {
        self.update(vec![
            book::set_for(Entry::Running, id, book::null()),
            book::set_for(Entry::Attempts, id, json!(begun.attempt - 1)),
        ])
        .map(drop)
    }

    /// The executor's turn at task `id` in its worktree `wt`, told what to address; `on` names
    /// where it runs in the progress line (`" on w1"` on a worker, else empty).
    pub(crate) fn executor_turn(
        &self,
        id: &str,
        attempt: u32,
        findings: &[String],
        last_error: Option<&str>,
        wt: &Path,
        on: &str,
    ) -> Result<metash_protocol::AgentResponse> {
        self.progress(
            &format!("task {id}: executing{on} (attempt {attempt})"),
            LogLevel::Info,
        );
        self.spawn(
            Role::Executor,
            &Focus {
                task: Some(id),
                findings,
                attempt,
                last_error,
                ..Focus::default()
            },
            Some(wt.to_path_buf()),
        )
    }

    pub(crate) fn execute_phase(&self, state: &SessionState) -> Result<Step> {
        let phase = state.current_phase;
        let nodes = Self::nodes(state);
        let tasks = state.tasks();
        let done: HashSet<&str> = tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Complete)
            .map(|t| t.id.as_str())
            .collect();
        let to_run: Vec<_> = nodes
            .iter()
            .filter(|n| n.phase <= phase && !done.contains(n.id.as_str()))
            .collect();
        if to_run.is_empty() {
            self.update(vec![("status".into(), json!(SessionStatus::Verifying))])?;
            return Ok(Step::Continue);
        }
        self.progress(
            &format!(
                "phase {phase}: executing {} task(s), {} at a time",
                to_run.len(),
                self.jobs
            ),
            LogLevel::Info,
        );
        let mut sched = Scheduler::new(&to_run, &done);
        let first = Book::of(state)
            .resume_for
            .filter(|r| r.role == "executor")
            .and_then(|r| r.task);
        let ended = self.run_tasks(state, &mut sched, first.as_deref());
        self.finish_phase(phase, &sched, ended)
    }

    /// Runs the scheduled tasks, up to `jobs` at once, until none is ready or running, or one
    /// stops the phase (a checkpoint, a halt) or fails the host.
    fn run_tasks(&self, state: &SessionState, sched: &mut Scheduler, first: Option<&str>) -> Ended {
        let mut ended = Ended::default();
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel::<(String, Result<Attempt>)>();
            let start = |id: String| {
                let tx = tx.clone();
                scope.spawn(move || {
                    let r = if self.remote {
                        self.attempt_remote(&id)
                    } else {
                        self.attempt(&id)
                    };
                    let _ = tx.send((id, r));
                });
            };
            // The task whose checkpoint was answered runs first and alone, so the answer the host
            // hands to the next spawn reaches it.
            let mut exclusive: Option<String> = first.and_then(|id| sched.take_if_ready(id));
            if let Some(id) = exclusive.clone() {
                start(id);
            }
            loop {
                while exclusive.is_none() && ended.is_clear() && sched.running() < self.jobs {
                    let Some(id) = sched.next_ready() else { break };
                    start(id);
                }
                if sched.running() == 0 {
                    break;
                }
                let Ok((id, result)) = rx.recv() else { break };
                if exclusive.as_deref() == Some(id.as_str()) {
                    exclusive = None;
                }
                self.settle(state, sched, &mut ended, &id, result);
            }
        });
        ended
    }

    /// What one finished attempt means for the schedule and the phase.
    fn settle(
        &self,
        state: &SessionState,
        sched: &mut Scheduler,
        ended: &mut Ended,
        id: &str,
        result: Result<Attempt>,
    ) {
        match result {
            Ok(Attempt::Complete) => sched.complete(id),
            Ok(Attempt::Failed(why)) => {
                if let Some(halt) = self.retry_or_halt(state, sched, id, &why) {
                    ended.stop.get_or_insert(halt);
                }
            }
            Ok(Attempt::Checkpoint(p)) => {
                sched.abandon(id);
                if !matches!(ended.stop, Some(Step::Stop(RunOutcome::Checkpoint(_)))) {
                    ended.stop = Some(Step::Stop(RunOutcome::Checkpoint(p)));
                }
            }
            Ok(Attempt::Stop(outcome)) => {
                sched.abandon(id);
                ended.stop.get_or_insert(Step::Stop(outcome));
            }
            Err(e) => {
                sched.abandon(id);
                ended.error.get_or_insert(e);
            }
        }
    }

    /// A failed attempt is retried while attempts remain; after the last one the phase halts.
    fn retry_or_halt(
        &self,
        state: &SessionState,
        sched: &mut Scheduler,
        id: &str,
        why: &str,
    ) -> Option<Step> {
        let phase = state.current_phase;
        let attempts = self
            .store()
            .state()
            .map(|s| Book::of(&s).attempts.get(id).copied().unwrap_or(0))
            .unwrap_or(u32::MAX);
        if attempts < self.config.max_task_attempts {
            self.progress(
                &format!(
                    "task {id} failed (attempt {attempts}): {}; retrying",
                    clip(why)
                ),
                LogLevel::Warn,
            );
            sched.retry(id);
            return None;
        }
        sched.abandon(id);
        Some(Step::Stop(RunOutcome::Halted(Halt {
            reason: HaltReason::TaskFailed,
            phase,
            failed: vec![FailedTask {
                id: id.to_string(),
                title: title_of(state, id),
                why: vec![why.to_string()],
            }],
            message: format!(
                "phase {phase} halted: task {id} failed {attempts} time(s); last: {}",
                clip(why)
            ),
        })))
    }

    /// After the tasks: a host error, a stop, tasks blocked on failed dependencies, or on to
    /// verification.
    fn finish_phase(&self, phase: u32, sched: &Scheduler, ended: Ended) -> Result<Step> {
        if let Some(e) = ended.error {
            return Err(e);
        }
        match ended.stop {
            Some(Step::Stop(RunOutcome::Halted(h))) => return self.halt(h),
            Some(step) => return Ok(step),
            None => {}
        }
        let blocked = sched.blocked();
        if !blocked.is_empty() {
            return self.halt(Halt {
                reason: HaltReason::Blocked,
                phase,
                failed: vec![],
                message: format!(
                    "phase {phase} halted: tasks {} wait on dependencies nothing will complete",
                    blocked.join(", ")
                ),
            });
        }
        self.update(vec![("status".into(), json!(SessionStatus::Verifying))])?;
        Ok(Step::Continue)
    }

    /// One executor attempt at task `id` (see the module doc for the protocol).
    fn attempt(&self, id: &str) -> Result<Attempt> {
        let Ready { wt, head, begun } = match self.prepare_attempt(id)? {
            Ok(ready) => ready,
            Err(outcome) => return Ok(Attempt::Stop(outcome)),
        };
        let attempt = begun.attempt;
        let last_error = begun.last_error.as_deref();
        let response = self.executor_turn(id, attempt, &begun.findings, last_error, &wt, "")?;
        match response.status {
            AgentStatus::Success => self.complete_attempt(id, &wt, &head, &begun, &response.data),
            AgentStatus::Error | AgentStatus::Timeout => {
                let why = format!(
                    "executor {}: {}",
                    crate::planning::status_word(response.status),
                    clip(&response.data)
                );
                self.fail_attempt(id, &wt, &head, why)
            }
            AgentStatus::Checkpoint => self.attempt_checkpoint(id, &wt, &head, attempt, &response),
        }
    }

    /// The executor succeeded: apply its files, commit what changed in the worktree, and record
    /// the task complete with its commits in one update.
    fn complete_attempt(
        &self,
        id: &str,
        wt: &Path,
        head: &str,
        begun: &Begun,
        data: &str,
    ) -> Result<Attempt> {
        match commit_response(self, id, wt, head, data)? {
            Err(why) => self.fail_attempt(id, wt, head, why),
            Ok(sha) => self.record_complete(id, begun, sha, data),
        }
    }

    /// Records task `id` complete with `sha` (its new commit, if it made one), and the attempt's
    /// dependency merges and `sha` as its branch's new tips.
    pub(crate) fn record_complete(
        &self,
        id: &str,
        begun: &Begun,
        sha: Option<String>,
        data: &str,
    ) -> Result<Attempt> {
        let state = &begun.state;
        let summary = summary_of(data);
        let mut commits: Vec<String> = state
            .task(id)
            .and_then(|t| t.commits.clone())
            .unwrap_or_default();
        commits.extend(sha.clone());
        let next_idx = next_task_idx(state, id);
        // The new commits become the branch's recorded tips in the same update.
        let tip = begun.record.as_ref().map(|r| {
            let moved = begun
                .merges
                .iter()
                .chain(sha.as_ref())
                .fold(r.clone(), |r, c| r.moved_to(c));
            book::set_for(Entry::Branches, id, json!(moved))
        });
        self.update(
            vec![
                book::task_set(id, "status", json!(TaskStatus::Complete)),
                book::task_set(id, "commits", json!(commits)),
                ("plan.currentTaskIdx".into(), json!(next_idx)),
                book::set_for(Entry::Running, id, book::null()),
                book::set_for(Entry::Attempts, id, json!(0)),
                book::set_for(Entry::Errors, id, book::null()),
                book::set_for(Entry::Verified, id, json!(false)),
                book::set_for(Entry::Summaries, id, json!(clip(&summary))),
            ]
            .into_iter()
            .chain(tip)
            .collect(),
        )?;
        self.progress(
            &format!(
                "task {id}: complete ({})",
                sha.map(|s| format!("commit {}", &s[..s.len().min(10)]))
                    .unwrap_or_else(|| "no changes".into())
            ),
            LogLevel::Info,
        );
        Ok(Attempt::Complete)
    }

    /// The executor asked a person: its changes are dropped and the attempt does not count.
    pub(crate) fn attempt_checkpoint(
        &self,
        id: &str,
        wt: &Path,
        head: &str,
        attempt: u32,
        response: &metash_protocol::AgentResponse,
    ) -> Result<Attempt> {
        self.git.reset_to(wt, head)?;
        let p = self.on_checkpoint(
            &self.config.executor,
            response,
            ResumeFor {
                role: "executor".into(),
                task: Some(id.to_string()),
                asked: None,
            },
        )?;
        self.update(vec![
            book::set_for(Entry::Running, id, book::null()),
            book::set_for(Entry::Attempts, id, json!(attempt - 1)),
        ])?;
        Ok(Attempt::Checkpoint(p))
    }

    /// Resets the worktree to where the attempt started and records the failure.
    pub(crate) fn fail_attempt(
        &self,
        id: &str,
        wt: &Path,
        head: &str,
        why: String,
    ) -> Result<Attempt> {
        self.git.reset_to(wt, head)?;
        self.update(vec![
            book::task_set(id, "status", json!(TaskStatus::Failed)),
            book::set_for(Entry::Running, id, book::null()),
            book::set_for(Entry::Errors, id, json!(why)),
        ])?;
        Ok(Attempt::Failed(why))
    }
}

/// The executor's files applied to the worktree and committed: the commit (`None`: nothing
/// changed), or why the files could not be applied (the attempt fails).
///
/// The attempt started at `head`. An agent that committed in the worktree itself (its branch
/// moved) has its commits folded into metash's one (`reset --soft`), so the task's commits are
/// exactly those metash records: the merge checks them and a rollback reverts all of its work.
pub(crate) fn commit_response(
    orch: &Orchestrator<'_>,
    id: &str,
    wt: &Path,
    head: &str,
    data: &str,
) -> Result<std::result::Result<Option<String>, String>> {
    if let Err(why) = apply_files(wt, data) {
        return Ok(Err(why));
    }
    if orch.branch_tip(&crate::engine::branch_of(id))?.as_deref() != Some(head) {
        orch.git.run(wt, &["reset", "--soft", "-q", head])?;
    }
    let state = orch.store().state()?;
    let title = title_of(&state, id);
    let summary = summary_of(data);
    let message = format!("metash: task {id}: {title}\n\n{summary}");
    Ok(Ok(orch.git.commit_all(wt, message.trim_end())?))
}

pub(crate) fn title_of(state: &SessionState, id: &str) -> String {
    state.task(id).map(|t| t.title.clone()).unwrap_or_default()
}

/// Index of the first task that is not complete, counting `id` as complete.
fn next_task_idx(state: &SessionState, id: &str) -> usize {
    let tasks = state.tasks();
    tasks
        .iter()
        .position(|t| t.id != id && t.status != TaskStatus::Complete)
        .unwrap_or(tasks.len())
}

/// The executor's summary: `summary` of a JSON reply, else its text.
fn summary_of(data: &str) -> String {
    match extract_json(data) {
        Ok(Value::Object(m)) => m
            .get("summary")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_default(),
        _ => data.trim().chars().take(2000).collect(),
    }
}
