//! `run`, `status`, `rollback`: the orchestrator's loop (issue 8) from the shell.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome, StatusReport};
use metash_protocol::{sanitize_for_terminal as text, sanitize_line as line};

use super::host::HostArgs;
use super::Ctx;

use crate::exit::Exit;

#[derive(Debug, Subcommand)]
pub enum OrchestratorCommand {
    /// Plan, execute and verify the project from .meta/context.md until it is complete, a
    /// checkpoint needs you, or the session halts. Continues a stopped or killed run.
    Run(RunArgs),
    /// The session: phase, tasks, gaps, pending checkpoint, budget used.
    Status {},
    /// Undo a task's recorded commits (and of the tasks depending on it, after asking).
    Rollback {
        /// The task's id (as `metash status` lists it).
        task: String,
        /// Also roll back dependent tasks without asking.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Independent tasks run in parallel, up to N (default: `jobs` in [orchestrator]).
    #[arg(long)]
    jobs: Option<usize>,
    /// Answer the pending checkpoint with VALUE (an option, its number, or free text), then go on.
    #[arg(long)]
    answer: Option<String>,
    /// Stop after N phases complete.
    #[arg(long)]
    max_phases: Option<u32>,
    /// Continue a halted session: reset gapCount and attempt counters, retry the failed tasks.
    #[arg(long)]
    retry: bool,
    /// Executor turns are run by `metash worker`s on any machine, through the project's
    /// PostgreSQL store ([store] url); this process plans, verifies and merges.
    #[arg(long)]
    workers: bool,
    #[command(flatten)]
    host: HostArgs,
}

pub fn run(cmd: OrchestratorCommand, ctx: &Ctx) -> Result<ExitCode> {
    let json = ctx.json;
    match cmd {
        OrchestratorCommand::Run(args) => run_loop(args, ctx),
        OrchestratorCommand::Status {} => status(ctx, json),
        OrchestratorCommand::Rollback { task, yes } => rollback(ctx, &task, yes, json),
    }
}

fn run_loop(args: RunArgs, ctx: &Ctx) -> Result<ExitCode> {
    let json = ctx.json;
    let host = args.host.open(ctx)?;
    let left = metash_store::placeholders_in(&host.store().context()?);
    if !left.is_empty() {
        anyhow::bail!(
            ".meta/context.md still holds the template's placeholders ({}): a planner would plan \
             from nothing. Write the project's vision and its current phase's focus with `metash \
             context edit` (or `metash context set FILE`), then run again",
            left.join(", ")
        );
    }
    let mut orch = Orchestrator::new(&host, &host)?;
    if args.answer.is_none() && host.pending_checkpoint()?.is_none() {
        orch.check_roles_resolve()?;
    }
    let mut options = RunOptions {
        jobs: args.jobs,
        max_phases: args.max_phases,
        answer: args.answer,
        retry: args.retry,
        workers: args.workers,
    };
    let mut outcome = orch.run(&options)?;
    // At a terminal, a checkpoint is asked and answered in place; scripts get exit code 4.
    while let RunOutcome::Checkpoint(p) = &outcome {
        if json || !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
            break;
        }
        let Some(answer) = ask(p)? else { break };
        options.answer = Some(answer);
        options.retry = false;
        outcome = orch.run(&options)?;
    }
    let (code, value) = report(&outcome);
    if json {
        println!("{}", serde_json::to_string_pretty(&value)?);
    }
    Ok(code)
}

/// Prints how the run ended for people (stderr) and returns the exit code and the same as
/// JSON. Checkpoints, halts and task titles are agents' words: shown escaped (issue 31).
fn report(outcome: &RunOutcome) -> (ExitCode, serde_json::Value) {
    match outcome {
        RunOutcome::Complete { phases_completed } => {
            eprintln!("metash: the project is complete ({phases_completed} phase(s) completed in this run)");
            (
                ExitCode::SUCCESS,
                serde_json::json!({"outcome": "complete", "phasesCompleted": phases_completed}),
            )
        }
        RunOutcome::PhaseLimit { phases_completed } => {
            eprintln!("metash: stopped after {phases_completed} phase(s) (--max-phases); `metash run` continues");
            (
                ExitCode::SUCCESS,
                serde_json::json!({"outcome": "phase_limit", "phasesCompleted": phases_completed}),
            )
        }
        RunOutcome::Checkpoint(p) => {
            eprintln!(
                "metash: checkpoint `{}` from {} ({:?}):",
                line(&p.id),
                line(&p.agent),
                p.signal.reason
            );
            eprintln!("  {}", text(&p.signal.message));
            for (i, o) in p.signal.options.iter().enumerate() {
                eprintln!("  {}. {}", i + 1, line(o));
            }
            eprintln!("answer with: metash run --answer VALUE");
            (
                Exit::Checkpoint.into(),
                serde_json::json!({"outcome": "checkpoint", "checkpoint": p}),
            )
        }
        RunOutcome::Halted(h) => {
            eprintln!("metash: halted ({}): {}", h.reason, text(&h.message));
            for f in &h.failed {
                eprintln!(
                    "  task {} ({}): {}",
                    line(&f.id),
                    line(&f.title),
                    line(&f.why.join("; "))
                );
            }
            if h.reason == "consent_refused" {
                eprintln!("grant it as above; the next `metash run` takes the session up again");
                return (
                    Exit::ConsentRefused.into(),
                    serde_json::json!({"outcome": "halted", "halt": h}),
                );
            }
            eprintln!("fix the cause, then `metash run --retry` (or `metash rollback TASK`)");
            (
                Exit::Halted.into(),
                serde_json::json!({"outcome": "halted", "halt": h}),
            )
        }
    }
}

/// Shows the checkpoint and reads an answer; `None` when the person leaves it for later.
fn ask(p: &metash_protocol::PendingCheckpoint) -> Result<Option<String>> {
    eprintln!(
        "checkpoint `{}` from {}: {}",
        line(&p.id),
        line(&p.agent),
        text(&p.signal.message)
    );
    for (i, o) in p.signal.options.iter().enumerate() {
        eprintln!("  {}. {}", i + 1, line(o));
    }
    eprint!("answer (empty to stop here): ");
    std::io::stderr().flush().ok();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let line = line.trim();
    Ok((!line.is_empty()).then(|| line.to_string()))
}

fn status(ctx: &Ctx, json: bool) -> Result<ExitCode> {
    let store = metash_store::Store::open(&ctx.workspace)
        .with_context(|| format!("opening the project at {}", ctx.workspace.display()))?;
    let report = metash_orchestrator::report(&store)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// The workers, leases and queue of a project whose store is on PostgreSQL.
fn fleet_table(f: &metash_store::pg::lease::Fleet) -> String {
    let q = &f.queue;
    let mut out = format!(
        "store: PostgreSQL, project {}; queue: {} ready, {} waiting, {} leased, {} done, {} failed\n",
        f.project, q.ready, q.waiting, q.leased, q.done, q.failed
    );
    if f.workers.is_empty() {
        out.push_str("no worker seen in the last ten minutes (start one: metash worker)\n");
    }
    for w in &f.workers {
        out.push_str(&format!(
            "worker {} on {}: {} slot(s), {} lease(s), seen {:.0} s ago{}\n",
            w.id,
            w.host,
            w.slots,
            w.leases,
            w.seen_seconds_ago,
            if w.labels.is_empty() {
                String::new()
            } else {
                format!(", labels {}", w.labels.join(","))
            }
        ));
    }
    for l in &f.leases {
        out.push_str(&format!(
            "lease {} held by {} (attempt {}), expires in {:.1} s\n",
            l.task, l.worker, l.attempt, l.expires_in_seconds
        ));
    }
    out
}

fn table(r: &StatusReport) -> String {
    let mut out = String::new();
    let status = serde_json::to_value(r.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    out.push_str(&format!(
        "phase {}  status {}  gaps {}/{}  revision {}\n",
        r.current_phase, status, r.gap_count, r.max_gap_retries, r.revision
    ));
    if let Some(b) = &r.budget {
        out.push_str(&format!(
            "budget used: {} tokens, ${:.4}\n",
            b.get("tokens_used").and_then(|v| v.as_u64()).unwrap_or(0),
            b.get("cost_usd").and_then(|v| v.as_f64()).unwrap_or(0.0)
        ));
    }
    if r.tasks.is_empty() {
        out.push_str("no tasks planned yet\n");
    } else {
        let w = r.tasks.iter().map(|t| t.id.len()).max().unwrap_or(2).max(2);
        out.push_str(&format!(
            "{:<w$}  {:>5}  {:<8}  {:<18}  {:>7}  {}\n",
            "ID", "PHASE", "STATUS", "STATE", "COMMITS", "TITLE"
        ));
        for t in &r.tasks {
            let st = serde_json::to_value(t.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            let state = t.state_word();
            out.push_str(&format!(
                "{:<w$}  {:>5}  {:<8}  {:<18}  {:>7}  {}\n",
                line(&t.id),
                t.phase,
                st,
                state,
                t.commits.len(),
                line(&t.title)
            ));
            for f in &t.findings {
                out.push_str(&format!("{:<w$}  finding: {}\n", "", line(f)));
            }
            if let Some(c) = t.conflict_line() {
                out.push_str(&format!("{:<w$}  {}\n", "", line(&c)));
            }
        }
    }
    if let Some(p) = &r.pending_checkpoint {
        out.push_str(&checkpoint_lines(p));
    }
    if let Some(h) = &r.halt {
        out.push_str(&format!("halted ({}): {}\n", h.reason, text(&h.message)));
    }
    if let Some(f) = &r.fleet {
        out.push_str(&fleet_table(f));
    }
    if let Some(n) = r.events_lost {
        out.push_str(&format!(
            "events lost: {n} (the log could not be written in time; `events_lost` records say \
             from whom)\n"
        ));
    }
    out
}

/// The pending checkpoint in `metash status`: the agent's message and options, escaped.
fn checkpoint_lines(p: &metash_protocol::PendingCheckpoint) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "checkpoint `{}` from {}: {}\n",
        line(&p.id),
        line(&p.agent),
        text(&p.signal.message)
    ));
    if !p.signal.options.is_empty() {
        let options: Vec<_> = p.signal.options.iter().map(|o| line(o)).collect();
        out.push_str(&format!("  options: {}\n", options.join(", ")));
    }
    out.push_str("  answer with: metash run --answer VALUE\n");
    out
}

fn rollback(ctx: &Ctx, task: &str, yes: bool, json: bool) -> Result<ExitCode> {
    // Rollback runs no agents: nobody to ask, nothing to allow.
    let host = HostArgs {
        yes_to: Vec::new(),
        policy: None,
        non_interactive: true,
        consent_wait: None,
    }
    .open(ctx)?;
    let orch = Orchestrator::new(&host, &host)?;
    let plan = orch.rollback_plan(task)?;
    let mut with_dependents = yes;
    if !plan.dependents.is_empty() && !yes {
        if !std::io::stdin().is_terminal() {
            bail!(
                "tasks {} depend on {task} and would be rolled back too; rerun with --yes",
                plan.dependents.join(", ")
            );
        }
        eprint!(
            "tasks {} depend on {task}; roll them back too? [y/N] ",
            plan.dependents.join(", ")
        );
        std::io::stderr().flush().ok();
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        if !matches!(line.trim(), "y" | "Y" | "yes") {
            eprintln!("nothing was rolled back");
            return Ok(crate::exit::Exit::Failure.into());
        }
        with_dependents = true;
    }
    let done = orch.rollback(&plan, with_dependents)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&done)?);
    } else {
        for d in &done {
            println!(
                "rolled back task {}: {} commit(s) undone, {} revert commit(s)",
                d.task,
                d.commits.len(),
                d.reverts.len()
            );
        }
        println!("the tasks are pending again; `metash run` redoes them");
    }
    Ok(ExitCode::SUCCESS)
}
