//! `planning`: decide what phase `currentPhase` needs. Tasks already planned for it (planned ahead,
//! or pending again after a rollback) are executed without asking the planner; the planner is asked
//! only when the phase has no tasks. A bad plan goes back to the planner with the reason, at most
//! `max_plan_attempts` times; an empty plan means the project is complete.

use metash_protocol::{AgentStatus, LogLevel, SessionState, SessionStatus, TaskStatus};
use serde_json::json;

use crate::book::{self, Book, Entry, Halt, HaltReason, ResumeFor};
use crate::engine::{Orchestrator, RunOutcome, Step};
use crate::error::Result;
use crate::plan::{self, TaskNode};
use crate::prompts::{Focus, Role};

/// Where a phase stands, from its tasks alone.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PhaseState {
    /// No task belongs to the phase: ask the planner.
    Unplanned,
    Executing,
    Verifying,
    /// Every task of this and earlier phases is complete, verified and merged.
    Done,
}

pub(crate) fn phase_state(state: &SessionState, nodes: &[TaskNode]) -> PhaseState {
    let book = Book::of(state);
    let phase = state.current_phase;
    let tasks = state.tasks();
    let upto: Vec<_> = tasks
        .iter()
        .filter(|t| book.phase_of(&t.id, phase) <= phase)
        .collect();
    if upto.iter().any(|t| t.status != TaskStatus::Complete) {
        return PhaseState::Executing;
    }
    if upto
        .iter()
        .any(|t| !book.is_verified(&t.id) || book.merged_at(&t.id).is_none())
    {
        return PhaseState::Verifying;
    }
    if nodes.iter().any(|n| n.phase == phase) {
        PhaseState::Done
    } else {
        PhaseState::Unplanned
    }
}

/// What came of asking the planner.
enum Planned {
    Stop(Step),
    Rejected(String),
    Accepted(plan::PlannerReply, Vec<TaskNode>),
}

impl Orchestrator<'_> {
    pub(crate) fn plan_phase(&self, state: &SessionState) -> Result<Step> {
        let nodes = Self::nodes(state);
        let phase = state.current_phase;
        match phase_state(state, &nodes) {
            PhaseState::Executing => {
                self.update(vec![("status".into(), json!(SessionStatus::Executing))])?;
                return Ok(Step::Continue);
            }
            PhaseState::Verifying => {
                self.update(vec![("status".into(), json!(SessionStatus::Verifying))])?;
                return Ok(Step::Continue);
            }
            PhaseState::Done => return self.complete_phase(phase),
            PhaseState::Unplanned => {}
        }
        let book = Book::of(state);
        if book.plan_attempts >= self.config.max_plan_attempts {
            return self.halt(Halt {
                reason: HaltReason::PlanRejected,
                phase,
                failed: vec![],
                message: format!(
                    "phase {phase}: {} plans were rejected; the last because: {}",
                    book.plan_attempts,
                    book.last_rejection.as_deref().unwrap_or("(unknown)")
                ),
            });
        }
        self.progress(&format!("phase {phase}: planning"), LogLevel::Info);
        let (reply, all) = match self.ask_planner(&book, &nodes, phase)? {
            Planned::Stop(step) => return Ok(step),
            Planned::Rejected(reason) => {
                self.progress(&format!("plan rejected: {reason}"), LogLevel::Warn);
                self.update(vec![
                    book::set(Entry::PlanAttempts, json!(book.plan_attempts + 1)),
                    book::set(Entry::LastRejection, json!(reason)),
                    book::set(Entry::ResumeFor, book::null()),
                ])?;
                return Ok(Step::Continue);
            }
            Planned::Accepted(reply, all) => (reply, all),
        };
        if reply.tasks.is_empty() {
            return self.halt(Halt {
                reason: HaltReason::Complete,
                phase,
                failed: vec![],
                message: format!(
                    "the planner has nothing left to do at phase {phase}: the project is complete"
                ),
            });
        }
        self.record_plan(state, &all[nodes.len()..])?;
        Ok(Step::Continue)
    }

    /// The planner's answer: a checkpoint, a plan that fails validation (with why), or a plan
    /// whose new tasks fit the graph.
    fn ask_planner(&self, book: &Book, nodes: &[TaskNode], phase: u32) -> Result<Planned> {
        let response = self.spawn(
            Role::Planner,
            &Focus {
                rejection: book.last_rejection.as_deref(),
                ..Focus::default()
            },
            None,
        )?;
        let reply = match response.status {
            AgentStatus::Checkpoint => {
                let p = self.on_checkpoint(
                    &self.config.planner,
                    &response,
                    ResumeFor {
                        role: "planner".into(),
                        task: None,
                        asked: None,
                    },
                )?;
                return Ok(Planned::Stop(Step::Stop(RunOutcome::Checkpoint(p))));
            }
            AgentStatus::Error | AgentStatus::Timeout => Err(format!(
                "the planner did not answer ({}): {}",
                status_word(response.status),
                clip(&response.data)
            )),
            AgentStatus::Success => plan::parse_reply(&response.data).and_then(|reply| {
                let all = plan::validate(nodes, &reply.tasks, phase)?;
                let in_phase = reply
                    .tasks
                    .iter()
                    .any(|t| t.phase.unwrap_or(phase) == phase);
                if !in_phase && !reply.tasks.is_empty() {
                    return Err(format!(
                        "the plan has no task for phase {phase} (the phase being planned)"
                    ));
                }
                Ok((reply, all))
            }),
        };
        Ok(match reply {
            Ok((reply, all)) => Planned::Accepted(reply, all),
            Err(reason) => Planned::Rejected(reason),
        })
    }

    /// The new tasks into the plan (pending, with their phases), in one update that also resets
    /// the rejection count and moves the session to executing.
    fn record_plan(&self, state: &SessionState, new: &[TaskNode]) -> Result<()> {
        let phase = state.current_phase;
        let mut tasks: Vec<serde_json::Value> = state
            .plan
            .as_ref()
            .map(|p| p.tasks.iter().map(|t| json!(t)).collect())
            .unwrap_or_default();
        let idx = state.plan.as_ref().map(|p| p.current_task_idx).unwrap_or(0);
        let mut book_updates = Vec::new();
        for n in new {
            tasks.push(json!({"id": n.id, "title": n.title, "status": "pending",
                              "dependencies": n.dependencies, "commits": []}));
            book_updates.push(book::set_for(Entry::Phases, &n.id, json!(n.phase)));
            if !n.expects_change {
                book_updates.push(book::set_for(Entry::NoChange, &n.id, json!(true)));
            }
            if !n.labels.is_empty() {
                book_updates.push(book::set_for(Entry::Labels, &n.id, json!(n.labels)));
            }
            if !n.paths.is_empty() {
                book_updates.push(book::set_for(Entry::Paths, &n.id, json!(n.paths)));
            }
        }
        let mut updates = vec![(
            "plan".to_string(),
            json!({"tasks": tasks, "currentTaskIdx": idx}),
        )];
        updates.extend(book_updates);
        updates.push(book::set(Entry::PlanAttempts, json!(0)));
        updates.push(book::set(Entry::LastRejection, book::null()));
        updates.push(book::set(Entry::ResumeFor, book::null()));
        updates.push(("status".into(), json!(SessionStatus::Executing)));
        self.update(updates)?;
        let ids: Vec<&str> = new.iter().map(|n| n.id.as_str()).collect();
        self.progress(
            &format!(
                "phase {phase}: planned {} task(s): {}",
                new.len(),
                ids.join(", ")
            ),
            LogLevel::Info,
        );
        Ok(())
    }

    /// Every task of the phase is merged: the next phase starts with a fresh gapCount.
    pub(crate) fn complete_phase(&self, phase: u32) -> Result<Step> {
        self.update(vec![
            ("status".into(), json!(SessionStatus::Planning)),
            ("currentPhase".into(), json!(phase + 1)),
            ("gapCount".into(), json!(0)),
            book::set(Entry::PlanAttempts, json!(0)),
        ])?;
        self.progress(&format!("phase {phase} complete"), LogLevel::Info);
        Ok(Step::PhaseDone)
    }
}

/// The first 400 characters of an agent's output, for messages.
pub(crate) fn clip(s: &str) -> String {
    let mut out: String = s.trim().chars().take(400).collect();
    if s.trim().chars().count() > 400 {
        out.push('…');
    }
    out
}

/// `error`, `timeout`, ... as the wire spells them.
pub(crate) fn status_word(status: AgentStatus) -> &'static str {
    match status {
        AgentStatus::Success => "success",
        AgentStatus::Error => "error",
        AgentStatus::Timeout => "timeout",
        AgentStatus::Checkpoint => "checkpoint",
    }
}
