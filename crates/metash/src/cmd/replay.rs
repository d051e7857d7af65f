//! `metash replay TASK [--attempt N]` (issue 36, docs/replay.md): the task's executor turn run
//! again from its tape, in a fresh worktree at the commit the turn started from, the credential
//! proxy answering from the recording (no model asked, no credential, no network); the resulting
//! tree compared with the task's recorded commit. Exit 0 only when it is identical.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use metash_host::{ReplayPins, SpawnRequest, Spawner, WorkspaceAccess};
use metash_orchestrator::git::Git;
use metash_protocol::{sanitize_for_terminal, sanitize_line, AgentStatus, SpawnOptions};
use metash_store::tape::{Tape, TapeSpawn, Tapes};
use metash_store::Store;
use serde_json::{json, Value};

use super::host::HostArgs;
use super::Ctx;
use crate::exit::Exit;

#[derive(Debug, Subcommand)]
pub enum ReplayCommand {
    /// Run a task's recorded executor turn again from its tape (no model, no network) in a
    /// fresh worktree, and compare the tree with the task's commit. Exit 0 only when identical.
    Replay {
        /// The task's id (`metash status`).
        task: String,
        /// Which attempt's turn (`metash tape list`); default the latest recorded.
        #[arg(long)]
        attempt: Option<u32>,
        #[command(flatten)]
        host: HostArgs,
    },
}

/// What the replay found, printed or as `--json`.
struct Outcome {
    tape: String,
    worktree: PathBuf,
    status: AgentStatus,
    served: usize,
    recorded: usize,
    divergence: Option<Value>,
    /// `git diff --stat` and `--name-status` against the recorded commit; both empty: identical.
    diff: Option<(String, String)>,
}

pub fn run(cmd: ReplayCommand, ctx: &Ctx) -> Result<ExitCode> {
    let ReplayCommand::Replay {
        task,
        attempt,
        host,
    } = cmd;
    if task.is_empty()
        || !task
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        bail!("task `{}`: not a task id", sanitize_line(&task));
    }
    let store = Store::open(&ctx.workspace)?;
    let executor = metash_orchestrator::OrchestratorConfig::load(&ctx.workspace)?.executor;
    let tape = find_tape(&Tapes::new(&store), &task, &executor, attempt)?;
    let spawn = tape.spawn.clone().with_context(|| {
        format!(
            "tape {} was recorded before tapes kept the turn's prompt; it cannot be replayed",
            sanitize_line(&tape.id)
        )
    })?;
    let commit = recorded_commit(&store, &task)?;
    let git = Git::new(&ctx.workspace);
    git.check_trust()?;
    let base = git
        .resolve(git.root(), &format!("{commit}^1"))?
        .with_context(|| format!("the task's commit {commit} has no parent"))?;
    let n = tape.attempt.unwrap_or(0);
    let wt = store
        .meta_dir()
        .join("worktrees")
        .join(format!("replay-{task}-{n}"));
    let branch = format!("metash/replay/{task}-{n}");
    git.remove_worktree(&wt, Some(&branch))?;
    git.ensure_worktree(&wt, &branch, &base)?;
    let wt = wt.canonicalize().context("the replay worktree")?;
    let outcome = replay_turn(ctx, &host, &store, &tape, spawn, &wt)?;
    let outcome = compare(&git, outcome, &commit)?;
    print(ctx, &outcome)?;
    Ok(match (&outcome.divergence, &outcome.diff) {
        (None, Some((stat, _))) if stat.is_empty() && outcome.status == AgentStatus::Success => {
            ExitCode::SUCCESS
        }
        _ => Exit::Failure.into(),
    })
}

/// The executor's latest tape of `task` (of attempt `attempt` when given).
fn find_tape(tapes: &Tapes<'_>, task: &str, executor: &str, attempt: Option<u32>) -> Result<Tape> {
    let id = tapes
        .list()?
        .into_iter()
        .rfind(|t| {
            t.task.as_deref() == Some(task)
                && t.agent == executor
                && (attempt.is_none() || t.attempt == attempt)
        })
        .map(|t| t.id)
        .with_context(|| {
            let which = attempt.map(|a| format!(" attempt {a}")).unwrap_or_default();
            format!(
                "no recorded turn of `{executor}` for task {task}{which} (see `metash tape list`)"
            )
        })?;
    Ok(tapes.get(&id)?)
}

/// The commit the task's executor made (the last of the task's commits).
fn recorded_commit(store: &Store, task: &str) -> Result<String> {
    let state = store.state()?;
    let t = state
        .task(task)
        .with_context(|| format!("no task {task} in the session's plan"))?;
    t.commits
        .as_ref()
        .and_then(|c| c.last().cloned())
        .with_context(|| {
            format!("task {task} has no recorded commit (not complete, or no changes)")
        })
}

/// What differs from run to run by design, put back as the recording had it
/// (docs/replay.md, "What a replay pins").
fn pins(tapes: &Tapes<'_>, tape: &Tape, spawn: &TapeSpawn, wt: &Path) -> ReplayPins {
    let mut rewrites = Vec::new();
    if let Some(old) = &spawn.workdir {
        rewrites.push((
            old.as_bytes().to_vec(),
            wt.to_string_lossy().as_bytes().to_vec(),
        ));
    }
    // pi ends its system prompt with `Current date: YYYY-MM-DD` (local time).
    const DATE: &[u8] = b"Current date: ";
    let first = tape
        .exchanges
        .first()
        .and_then(|e| tapes.blob(&e.request_body.sha256).ok());
    if let Some(body) = first {
        if let Some(at) = body.windows(DATE.len()).position(|w| w == DATE) {
            let date = body.get(at..at + DATE.len() + 10).map(<[u8]>::to_vec);
            let today = format!("Current date: {}", chrono::Local::now().format("%Y-%m-%d"));
            if let Some(date) = date {
                rewrites.push((date, today.into_bytes()));
            }
        }
    }
    ReplayPins { rewrites }
}

fn replay_turn(
    ctx: &Ctx,
    args: &HostArgs,
    store: &Store,
    tape: &Tape,
    spawn: TapeSpawn,
    wt: &Path,
) -> Result<Outcome> {
    let pins = pins(&Tapes::new(store), tape, &spawn, wt);
    let cassette = Arc::new(metash_host::tape_cassette_with(store, &tape.id, &pins)?);
    let host = args.open(ctx)?;
    host.replay_from(Arc::clone(&cassette));
    let request = SpawnRequest {
        agent_name: tape.agent.clone(),
        system_prompt: spawn.system_prompt,
        user_message: spawn.user_message,
        options: serde_json::from_value::<SpawnOptions>(spawn.options).unwrap_or_default(),
        workdir: Some(wt.to_path_buf()),
        task_id: tape.task.clone(),
        access: WorkspaceAccess::ReadWrite,
    };
    let response = host.spawn_agent(&request)?;
    host.flush_events()?;
    if response.status == AgentStatus::Success {
        // As the orchestrator does: files of a JSON reply are written into the worktree.
        if let Err(why) = metash_orchestrator::reply::apply_files(wt, &response.data) {
            eprintln!(
                "the replayed reply's files could not be applied: {}",
                sanitize_line(&why)
            );
        }
    }
    let divergence = cassette.divergence().map(|d| {
        let side = |(method, target, body): &(String, String, Vec<u8>)| {
            json!({"method": method, "target": target,
                   "body": String::from_utf8_lossy(body)})
        };
        json!({"request": d.seq, "reason": d.reason,
               "recorded": d.expected.as_ref().map(side), "replayed": side(&d.got)})
    });
    Ok(Outcome {
        tape: tape.id.clone(),
        worktree: wt.to_path_buf(),
        status: response.status,
        served: cassette.served(),
        recorded: tape.exchanges.len(),
        divergence,
        diff: None,
    })
}

/// Commits the replay's tree as the orchestrator commits a task's (the same files kept out) and
/// diffs it with the recorded commit.
fn compare(git: &Git, mut outcome: Outcome, commit: &str) -> Result<Outcome> {
    if outcome.divergence.is_some() {
        return Ok(outcome);
    }
    let wt = outcome.worktree.clone();
    let ours = match git.commit_all(&wt, "metash replay")? {
        Some(sha) => sha,
        None => git.head(&wt)?,
    };
    let stat = git.run(git.root(), &["diff", "--stat", commit, &ours])?;
    let names = git.run(git.root(), &["diff", "--name-status", commit, &ours])?;
    outcome.diff = Some((stat, names));
    Ok(outcome)
}

fn print(ctx: &Ctx, o: &Outcome) -> Result<()> {
    let identical = o.divergence.is_none()
        && o.status == AgentStatus::Success
        && o.diff.as_ref().is_some_and(|(s, _)| s.is_empty());
    if ctx.json {
        let v = json!({
            "tape": o.tape, "worktree": o.worktree, "status": o.status,
            "served": o.served, "recorded": o.recorded, "identical": identical,
            "divergence": o.divergence,
            "diff": o.diff.as_ref().map(|(s, n)| json!({"stat": s, "names": n})),
        });
        println!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    println!(
        "replayed tape {} in {}: {} of {} recorded exchanges answered",
        sanitize_line(&o.tape),
        o.worktree.display(),
        o.served,
        o.recorded
    );
    if let Some(d) = &o.divergence {
        print_divergence(d);
        return Ok(());
    }
    if o.status != AgentStatus::Success {
        println!("the replayed turn ended {:?}", o.status);
    }
    match &o.diff {
        Some((stat, _)) if stat.is_empty() && identical => println!("identical"),
        Some((stat, names)) => {
            println!("the tree differs from the task's commit:");
            println!("{}", sanitize_for_terminal(stat));
            println!("{}", sanitize_for_terminal(names));
        }
        None => {}
    }
    Ok(())
}

fn print_divergence(d: &Value) {
    let text = |v: &Value| sanitize_for_terminal(v.as_str().unwrap_or_default()).into_owned();
    println!(
        "the replay stopped at request {}: it differs from the recording: {}",
        d["request"],
        text(&d["reason"])
    );
    for side in ["recorded", "replayed"] {
        let s = &d[side];
        if s.is_null() {
            println!("--- {side}: nothing (the recording had ended) ---");
            continue;
        }
        println!(
            "--- {side}: {} {} ---",
            text(&s["method"]),
            text(&s["target"])
        );
        println!("{}", text(&s["body"]));
    }
}
