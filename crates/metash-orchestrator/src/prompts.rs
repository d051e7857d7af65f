//! The prompts each role receives, built as the seed's "How They Are Used" shows: the current state
//! in one line ("Current State: Phase 1 (Executing Task 02: ...)"), then `context.md`, then what the
//! role needs. The system prompt is the role's default prompt shipped in this crate
//! (`prompts/<role>.md`) unless the project overrides it in `.meta/prompts/<role>.md`.
//!
//! The user message ends with a fenced JSON block, the **request**, holding the same facts for
//! agents that parse rather than read (the example agents do):
//! `{"metash_request": 1, "role", "phase", "plan": [...], "task"?, "findings"?, "last_error"?,
//! "decisions", "rejection"?, "summary"?, "resolve"?}`; `resolve` (`{"files", "with", "attempt",
//! "max_attempts", "findings"}`) asks the executor to resolve a merge-queue conflict in its
//! worktree instead of doing the task (resolve.rs).

use std::fmt::Write as _;
use std::path::Path;

use metash_protocol::{SessionState, Task, TaskStatus};
use serde::Serialize;
use serde_json::{json, Value};

use crate::book::{Book, Decision};

/// The orchestrator's three roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Planner,
    Executor,
    Verifier,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Planner => "planner",
            Role::Executor => "executor",
            Role::Verifier => "verifier",
        }
    }

    fn default_prompt(self) -> &'static str {
        match self {
            Role::Planner => include_str!("../prompts/planner.md"),
            Role::Executor => include_str!("../prompts/executor.md"),
            Role::Verifier => include_str!("../prompts/verifier.md"),
        }
    }
}

/// The system prompt for `role`: `.meta/prompts/<role>.md` when the project has one.
pub fn system_prompt(workspace: &Path, role: Role) -> String {
    let custom = workspace
        .join(".meta")
        .join("prompts")
        .join(format!("{}.md", role.as_str()));
    std::fs::read_to_string(custom).unwrap_or_else(|_| role.default_prompt().to_string())
}

/// What a prompt is about beyond the session itself.
#[derive(Debug, Clone, Default)]
pub struct Focus<'a> {
    pub task: Option<&'a str>,
    pub findings: &'a [String],
    pub rejection: Option<&'a str>,
    pub attempt: u32,
    /// The executor's summary of the work under verification.
    pub summary: Option<&'a str>,
    /// Why the executor's previous attempt failed.
    pub last_error: Option<&'a str>,
    /// The executor is asked to resolve a conflict of the merge queue (resolve.rs).
    pub resolve: Option<&'a Conflict<'a>>,
}

/// A conflict the merge queue hands to the task's executor: bringing its branch up to date with
/// the project conflicts in `files`, with the landed work of the tasks `with`.
#[derive(Debug, Clone, Default)]
pub struct Conflict<'a> {
    pub files: &'a [String],
    pub with: &'a [String],
    /// This resolution's number, from 1.
    pub attempt: u32,
    pub max_attempts: u32,
    /// Why the previous resolution failed.
    pub why: &'a [String],
}

/// The resolution request: what conflicts, with whom, and what the executor must leave.
fn write_conflict(out: &mut String, c: &Conflict<'_>) {
    let with = if c.with.is_empty() {
        "changes made in the project".to_string()
    } else {
        format!("the work of task(s) {}", c.with.join(", "))
    };
    let _ = writeln!(
        out,
        "## Resolve a merge conflict

Your task is verified and waits to land. Bringing its \
         branch up to date with the project's current branch conflicts with {with}, in: {}.\n\n\
         The merge is in progress in your working directory: each of these files holds git's \
         conflict markers (`<<<<<<<` your task's side, `=======`, `>>>>>>>` the project's side), \
         and both versions are readable (`git show :2:FILE` is yours, `git show :3:FILE` the \
         project's). Edit the files so that they keep both sides' intent and hold no marker. Do \
         not commit and do not abort the merge: metash commits it, and the verifier checks the \
         result. This is resolution {} of {}.\n",
        c.files.join(", "),
        c.attempt,
        c.max_attempts
    );
    if !c.why.is_empty() {
        let _ = writeln!(out, "The previous resolution failed:\n");
        for w in c.why {
            let _ = writeln!(out, "- {w}");
        }
        out.push('\n');
    }
}

/// The plan as a checklist: status mark, id, title, phase and dependencies.
fn write_plan(out: &mut String, tasks: &[Task], book: &Book, phase: u32) {
    let _ = writeln!(out, "## Plan\n");
    if tasks.is_empty() {
        let _ = writeln!(out, "(no tasks yet)");
    }
    for t in tasks {
        let mark = match t.status {
            TaskStatus::Complete => "x",
            TaskStatus::Failed => "!",
            TaskStatus::Pending => " ",
        };
        let deps = if t.dependencies.is_empty() {
            String::new()
        } else {
            format!("; after {}", t.dependencies.join(", "))
        };
        let _ = writeln!(
            out,
            "- [{mark}] {} {} (phase {}{deps})",
            t.id,
            t.title,
            book.phase_of(&t.id, phase)
        );
    }
    out.push('\n');
}

/// What an executor retrying a task must know: the verifier's findings, the last failure.
fn write_retry(out: &mut String, focus: &Focus<'_>) {
    if !focus.findings.is_empty() {
        let _ = writeln!(
            out,
            "## The verifier rejected the last attempt; fix these findings\n"
        );
        for f in focus.findings {
            let _ = writeln!(out, "- {f}");
        }
        out.push('\n');
    }
    if let Some(e) = focus.last_error {
        let _ = writeln!(out, "## Your previous attempt failed\n\n{e}\n");
    }
}

/// The user message for `role`.
pub fn user_message(
    role: Role,
    state: &SessionState,
    book: &Book,
    context: &str,
    focus: &Focus<'_>,
) -> String {
    let phase = state.current_phase;
    let tasks = state.tasks();
    let task = focus.task.and_then(|id| tasks.iter().find(|t| t.id == id));
    let mut out = String::new();
    let doing = match (role, task) {
        (Role::Planner, _) => "Planning".to_string(),
        (Role::Executor, Some(t)) if focus.resolve.is_some() => {
            format!("Resolving a merge conflict of Task {}: {}", t.id, t.title)
        }
        (Role::Executor, Some(t)) => format!("Executing Task {}: {}", t.id, t.title),
        (Role::Verifier, Some(t)) => format!("Verifying Task {}: {}", t.id, t.title),
        (_, None) => state_word(state).to_string(),
    };
    let _ = writeln!(out, "Current State: Phase {phase} ({doing})\n");
    let _ = writeln!(out, "## Context (.meta/context.md)\n\n{}\n", context.trim());
    write_plan(&mut out, tasks, book, phase);
    if !book.decisions.is_empty() {
        let _ = writeln!(out, "## Decisions the user made\n");
        for d in &book.decisions {
            let _ = writeln!(out, "- {} -> {}", d.question, d.answer);
        }
        out.push('\n');
    }
    if let Some(r) = focus.rejection {
        let _ = writeln!(
            out,
            "## Your previous plan was rejected\n\n{r}\n\nSend a corrected plan.\n"
        );
    }
    if let Some(t) = task {
        let _ = writeln!(out, "## Your task\n\n{}: {}\n", t.id, t.title);
        if role == Role::Verifier {
            if let Some(s) = focus.summary {
                let _ = writeln!(out, "The executor reports: {s}\n");
            }
        }
    }
    if role == Role::Executor {
        write_retry(&mut out, focus);
        if let Some(c) = focus.resolve {
            write_conflict(&mut out, c);
        }
    }
    let request = request_json(role, state, book, focus);
    let _ = write!(
        out,
        "## Request (JSON)\n\n```json\n{}\n```\n",
        serde_json::to_string(&request).unwrap_or_default()
    );
    out
}

fn state_word(state: &SessionState) -> &'static str {
    match state.status {
        metash_protocol::SessionStatus::Planning => "Planning",
        metash_protocol::SessionStatus::Executing => "Executing",
        metash_protocol::SessionStatus::Verifying => "Verifying",
        metash_protocol::SessionStatus::Halted => "Halted",
    }
}

fn request_json(role: Role, state: &SessionState, book: &Book, focus: &Focus<'_>) -> Value {
    let phase = state.current_phase;
    let tasks = state.tasks();
    let plan: Vec<Value> = tasks
        .iter()
        .map(|t| {
            json!({"id": t.id, "title": t.title, "status": t.status,
                   "dependencies": t.dependencies, "phase": book.phase_of(&t.id, phase)})
        })
        .collect();
    let task = focus.task.and_then(|id| tasks.iter().find(|t| t.id == id)).map(|t| {
        json!({"id": t.id, "title": t.title, "dependencies": t.dependencies, "attempt": focus.attempt})
    });
    let decisions: &[Decision] = &book.decisions;
    let mut v = json!({
        "metash_request": 1,
        "role": role,
        "phase": phase,
        "plan": plan,
        "decisions": decisions,
    });
    if let Some(map) = v.as_object_mut() {
        if let Some(t) = task {
            map.insert("task".into(), t);
        }
        if !focus.findings.is_empty() {
            map.insert("findings".into(), json!(focus.findings));
        }
        if let Some(r) = focus.rejection {
            map.insert("rejection".into(), json!(r));
        }
        if let Some(s) = focus.summary {
            map.insert("summary".into(), json!(s));
        }
        if let Some(e) = focus.last_error {
            map.insert("last_error".into(), json!(e));
        }
        if let Some(c) = focus.resolve {
            map.insert(
                "resolve".into(),
                json!({"files": c.files, "with": c.with, "attempt": c.attempt,
                       "max_attempts": c.max_attempts, "findings": c.why}),
            );
        }
    }
    v
}
