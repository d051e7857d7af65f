//! `verifying`: the verifier checks each complete, unverified task in its worktree (up to `jobs` at
//! once). A failure sends the task back to `executing` with the findings and raises `gapCount`; at
//! `max_gap_retries` the phase halts with a report naming each failed task and why. When every
//! task passes, the branches are merged (see `merge.rs`) and the phase completes.

use std::path::Path;

use metash_protocol::{
    AgentStatus, LogLevel, PendingCheckpoint, SessionState, SessionStatus, TaskStatus,
};
use serde_json::{json, Value};

use crate::book::{self, Book, Entry, FailedTask, Halt, HaltReason, ResumeFor};
use crate::engine::{worktree_of, Orchestrator, RunOutcome, Step};
use crate::error::Result;
use crate::execute::title_of;
use crate::plan::TaskNode;
use crate::planning::{clip, status_word};

/// Spawns of the verifier per check when it errors or times out.
const VERIFIER_TRIES: usize = 3;
use crate::prompts::{Focus, Role};
use crate::reply::extract_json;

/// A verifier's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub pass: bool,
    pub findings: Vec<String>,
}

/// The finding of a task whose executor changed nothing.
pub const NO_CHANGE: &str = "the executor changed nothing in the worktree, and the task does not \
    say it expects no change (a planner marks such a task \"expects_change\": false)";

/// Reads `{"pass": bool, "findings": [...]}` (also `"verdict": "pass"|"fail"`, and findings given
/// as one string).
///
/// # Errors
/// Why the reply is not a verdict.
pub fn parse_verdict(data: &str) -> std::result::Result<Verdict, String> {
    let v = extract_json(data)?;
    let pass = match (v.get("pass"), v.get("verdict")) {
        (Some(Value::Bool(b)), _) => *b,
        (_, Some(Value::String(s))) => {
            matches!(s.to_ascii_lowercase().as_str(), "pass" | "passed" | "ok")
        }
        _ => return Err("the verdict needs `\"pass\": true|false`".into()),
    };
    let findings = match v.get("findings") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| i.to_string())
            })
            .collect(),
        Some(Value::String(s)) if !s.is_empty() => vec![s.clone()],
        _ => vec![],
    };
    Ok(Verdict { pass, findings })
}

/// How one task's verification ended.
pub(crate) enum Checked {
    Pass,
    Fail,
    Checkpoint(PendingCheckpoint),
}

/// How a phase's verification waves ended.
enum Waves {
    Stop(Step),
    Failed,
    Passed,
}

/// The tasks none of whose dependencies is still waiting, and the rest.
fn next_wave(nodes: &[TaskNode], rest: Vec<String>) -> (Vec<String>, Vec<String>) {
    let waiting: std::collections::HashSet<String> = rest.iter().cloned().collect();
    rest.into_iter().partition(|id| {
        nodes
            .iter()
            .find(|n| &n.id == id)
            .is_none_or(|n| n.dependencies.iter().all(|d| !waiting.contains(d)))
    })
}

impl Orchestrator<'_> {
    pub(crate) fn verify_phase(&self, state: &SessionState) -> Result<Step> {
        let phase = state.current_phase;
        let book = Book::of(state);
        let tasks = state.tasks();
        if tasks
            .iter()
            .any(|t| book.phase_of(&t.id, phase) <= phase && t.status != TaskStatus::Complete)
        {
            self.update(vec![("status".into(), json!(SessionStatus::Executing))])?;
            return Ok(Step::Continue);
        }
        let nodes = Self::nodes(state);
        let todo: Vec<String> = crate::plan::topo_order(&nodes)
            .into_iter()
            // A task the merge queue re-verifies is the queue's to check (queue.rs).
            .filter(|id| book.phase_of(id, phase) <= phase && !book.is_verified(id))
            .filter(|id| {
                book.queued(id)
                    .is_none_or(|q| q.state != crate::book::QueueState::Reverifying)
            })
            .collect();
        // The verifier whose checkpoint was answered goes first (and alone).
        let first = book
            .resume_for
            .as_ref()
            .filter(|r| r.role == "verifier")
            .and_then(|r| r.task.clone())
            .filter(|f| todo.contains(f));
        if !todo.is_empty() {
            self.progress(
                &format!("phase {phase}: verifying {} task(s)", todo.len()),
                LogLevel::Info,
            );
        }
        match self.verify_waves(&nodes, todo, first)? {
            Waves::Stop(step) => Ok(step),
            Waves::Failed => self.after_failure(phase),
            Waves::Passed => self.merge_phase(phase),
        }
    }

    /// Waves in dependency order: a task is checked once its dependencies passed. When one
    /// fails, its dependents are not judged on work that is about to change: they go back to
    /// `pending`, to be rebuilt on the fixed dependency, without counting a gap.
    fn verify_waves(
        &self,
        nodes: &[TaskNode],
        todo: Vec<String>,
        first: Option<String>,
    ) -> Result<Waves> {
        let mut failed = false;
        let mut rejected: Vec<String> = Vec::new();
        let mut left = todo;
        let mut alone = first;
        while !left.is_empty() {
            let blocked_by_failure = |id: &String| {
                nodes
                    .iter()
                    .find(|n| &n.id == id)
                    .is_some_and(|n| n.dependencies.iter().any(|d| rejected.contains(d)))
            };
            let (stale, rest): (Vec<String>, Vec<String>) =
                left.into_iter().partition(|id| blocked_by_failure(id));
            for id in &stale {
                rejected.push(id.clone());
                self.back_to_pending(id)?;
            }
            let (mut wave, later) = next_wave(nodes, rest);
            if wave.is_empty() {
                break;
            }
            let mut first_alone = false;
            if let Some(f) = alone.take() {
                if let Some(pos) = wave.iter().position(|t| t == &f) {
                    let id = wave.remove(pos);
                    wave.insert(0, id);
                    first_alone = true;
                }
            }
            for (id, r) in self.parallel(&wave, first_alone, |id| self.check(id))? {
                match r {
                    Checked::Checkpoint(p) => {
                        return Ok(Waves::Stop(Step::Stop(RunOutcome::Checkpoint(p))))
                    }
                    Checked::Fail => {
                        failed = true;
                        rejected.push(id);
                    }
                    Checked::Pass => {}
                }
            }
            left = later;
        }
        Ok(if failed { Waves::Failed } else { Waves::Passed })
    }

    /// A task whose dependency failed verification is redone on the fix.
    fn back_to_pending(&self, id: &str) -> Result<()> {
        self.update(vec![
            book::task_set(id, "status", json!(TaskStatus::Pending)),
            book::set_for(Entry::Verified, id, json!(false)),
        ])?;
        self.progress(
            &format!("task {id}: a dependency failed verification; it will be redone on the fix"),
            LogLevel::Info,
        );
        Ok(())
    }

    /// A failed verification is a gap: back to executing, or a halt at `max_gap_retries`.
    pub(crate) fn after_failure(&self, phase: u32) -> Result<Step> {
        let state = self.store().state()?;
        let book = Book::of(&state);
        if state.gap_count < self.config.max_gap_retries {
            self.update(vec![("status".into(), json!(SessionStatus::Executing))])?;
            return Ok(Step::Continue);
        }
        let failed: Vec<FailedTask> = state
            .tasks()
            .iter()
            .filter(|t| t.status == TaskStatus::Failed)
            .map(|t| FailedTask {
                id: t.id.clone(),
                title: t.title.clone(),
                why: book.findings(&t.id).to_vec(),
            })
            .collect();
        let names: Vec<String> = failed
            .iter()
            .map(|f| format!("{} ({})", f.id, f.why.join("; ")))
            .collect();
        self.halt(Halt {
            reason: HaltReason::GapLimit,
            phase,
            message: format!(
                "phase {phase} halted after {} failed verifications (max_gap_retries = {}): {}",
                state.gap_count,
                self.config.max_gap_retries,
                names.join(", ")
            ),
            failed,
        })
    }

    /// Runs `f` over `ids`, `self.jobs` at a time (the first alone when `first_alone`); stops
    /// starting new ones after a checkpoint.
    fn parallel<F>(&self, ids: &[String], first_alone: bool, f: F) -> Result<Vec<(String, Checked)>>
    where
        F: Fn(&str) -> Result<Checked> + Sync,
    {
        let mut out = Vec::new();
        let mut rest: &[String] = ids;
        if first_alone {
            if let Some((head, tail)) = ids.split_first() {
                let r = f(head)?;
                let stop = matches!(r, Checked::Checkpoint(_));
                out.push((head.clone(), r));
                if stop {
                    return Ok(out);
                }
                rest = tail;
            }
        }
        let mut error = None;
        let mut stopped = false;
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel();
            let mut next = 0;
            let mut running = 0;
            loop {
                while !stopped && error.is_none() && running < self.jobs && next < rest.len() {
                    let id = rest[next].clone();
                    next += 1;
                    running += 1;
                    let tx = tx.clone();
                    let f = &f;
                    scope.spawn(move || {
                        let r = f(&id);
                        let _ = tx.send((id, r));
                    });
                }
                if running == 0 {
                    break;
                }
                let Ok((id, r)) = rx.recv() else { break };
                running -= 1;
                match r {
                    Ok(c) => {
                        stopped |= matches!(c, Checked::Checkpoint(_));
                        out.push((id, c));
                    }
                    Err(e) => {
                        error.get_or_insert(e);
                    }
                }
            }
        });
        match error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// The verifier's verdict on the task (asked a few times if it fails to run), or the
    /// checkpoint it raised.
    fn ask_verifier(
        &self,
        id: &str,
        book: &Book,
        at: Option<&Path>,
    ) -> Result<std::result::Result<Verdict, Checked>> {
        let summary = book.summaries.get(id).cloned().flatten();
        let wt = at.map_or_else(|| worktree_of(&self.workspace(), id), Path::to_path_buf);
        let workdir = wt.join(".git").exists().then_some(wt);
        // A verifier that fails to run says nothing about the task: try it again (a few times)
        // before counting the failure as a gap.
        let mut response = None;
        for _ in 0..VERIFIER_TRIES {
            let r = self.spawn(
                Role::Verifier,
                &Focus {
                    task: Some(id),
                    summary: summary.as_deref(),
                    ..Focus::default()
                },
                workdir.clone(),
            )?;
            let retry = matches!(r.status, AgentStatus::Error | AgentStatus::Timeout);
            if retry {
                self.progress(
                    &format!(
                        "task {id}: the verifier did not run ({}): {}",
                        status_word(r.status),
                        clip(&r.data)
                    ),
                    LogLevel::Warn,
                );
            }
            response = Some(r);
            if !retry {
                break;
            }
        }
        let Some(response) = response else {
            return Ok(Err(Checked::Fail));
        };
        Ok(Ok(match response.status {
            AgentStatus::Checkpoint => {
                let p = self.on_checkpoint(
                    &self.config.verifier,
                    &response,
                    ResumeFor {
                        role: "verifier".into(),
                        task: Some(id.to_string()),
                        asked: None,
                    },
                )?;
                return Ok(Err(Checked::Checkpoint(p)));
            }
            AgentStatus::Success => parse_verdict(&response.data).unwrap_or_else(|why| Verdict {
                pass: false,
                findings: vec![format!("the verifier's reply was not a verdict: {why}")],
            }),
            AgentStatus::Error | AgentStatus::Timeout => Verdict {
                pass: false,
                findings: vec![format!(
                    "the verifier could not check the task ({}, {VERIFIER_TRIES} tries): {}",
                    status_word(response.status),
                    clip(&response.data)
                )],
            },
        }))
    }

    /// The verifier's verdict on task `id`, recorded: a pass marks it verified, a failure is a gap
    /// (the findings go to the executor's next attempt).
    pub(crate) fn check(&self, id: &str) -> Result<Checked> {
        let state = self.store().state()?;
        let book = Book::of(&state);
        let (verdict, review) = match self.verdict_of(id, &state, &book, None)? {
            Ok(v) => v,
            Err(checkpoint) => return Ok(checkpoint),
        };
        if verdict.pass {
            self.record_pass(id)?;
            return Ok(Checked::Pass);
        }
        self.record_gap(id, &state, verdict, &review)
    }

    /// What task `id` gets: a person's waiting review comments reject it as a verifier would; an
    /// executor that changed nothing did not do the task (unless the planner said it expects no
    /// change); else the verifier's verdict, to which comments made while it worked are added (a
    /// pass does not hide them). With the comments it holds, or the checkpoint the verifier raised.
    /// The verifier works in `at` (the merge queue's worktree, holding what is about to land),
    /// else in the task's worktree.
    pub(crate) fn verdict_of(
        &self,
        id: &str,
        state: &SessionState,
        book: &Book,
        at: Option<&Path>,
    ) -> Result<std::result::Result<(Verdict, Vec<crate::review::Comment>), Checked>> {
        let commits = state
            .task(id)
            .and_then(|t| t.commits.clone())
            .unwrap_or_default();
        let review = crate::review::waiting(self.store(), id)?;
        let mut verdict = if !review.is_empty() {
            Verdict {
                pass: false,
                findings: review
                    .iter()
                    .map(crate::review::Comment::as_finding)
                    .collect(),
            }
        } else if commits.is_empty() && !book.expects_no_change(id) {
            Verdict {
                pass: false,
                findings: vec![NO_CHANGE.to_string()],
            }
        } else {
            match self.ask_verifier(id, book, at)? {
                Ok(v) => v,
                Err(checkpoint) => return Ok(Err(checkpoint)),
            }
        };
        let review = crate::review::waiting(self.store(), id)?;
        for c in &review {
            let f = c.as_finding();
            verdict.pass = false;
            if !verdict.findings.contains(&f) {
                verdict.findings.push(f);
            }
        }
        Ok(Ok((verdict, review)))
    }

    /// Task `id` passed verification.
    pub(crate) fn record_pass(&self, id: &str) -> Result<()> {
        self.update(vec![
            book::set_for(Entry::Verified, id, json!(true)),
            book::set_for(Entry::Findings, id, book::null()),
            book::set(Entry::ResumeFor, book::null()),
        ])?;
        self.progress(&format!("task {id}: verified"), LogLevel::Info);
        Ok(())
    }

    /// Task `id` failed verification: a gap. It goes back to the executor with the findings
    /// (and the person's comments among them, marked delivered once recorded).
    pub(crate) fn record_gap(
        &self,
        id: &str,
        state: &SessionState,
        verdict: Verdict,
        review: &[crate::review::Comment],
    ) -> Result<Checked> {
        let findings = if verdict.findings.is_empty() {
            vec!["the verifier rejected the task without findings".to_string()]
        } else {
            verdict.findings
        };
        // gapCount is read and raised under the store lock: parallel verifiers never lose a count.
        let mut gap = 0;
        self.store()
            .transact(Some(crate::engine::ORCHESTRATOR_AGENT), |s| {
                gap = s.gap_count + 1;
                Ok(vec![
                    ("gapCount".into(), json!(gap)),
                    book::task_set(id, "status", json!("failed")),
                    book::set_for(Entry::Verified, id, json!(false)),
                    book::set_for(Entry::Findings, id, json!(findings)),
                    book::set(Entry::ResumeFor, book::null()),
                ])
            })?;
        if !review.is_empty() {
            crate::review::take(self.store(), id, "verification")?;
        }
        self.progress(
            &format!(
                "task {id} ({}): verification failed (gapCount {gap}): {}",
                title_of(state, id),
                findings.join("; ")
            ),
            LogLevel::Warn,
        );
        Ok(Checked::Fail)
    }
}
