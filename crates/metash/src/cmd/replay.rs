//! `metash replay TASK [--attempt N]` (issue 36, docs/replay.md): the task's executor turn run
//! again from its tape, in a fresh worktree at the commit the turn started from, the credential
//! proxy answering from the recording (no model asked, no credential, no network); the resulting
//! tree compared with the task's recorded commit. Exit 0 only when it is identical. `--verify`
//! then replays the verifier's recorded turn of that attempt against the tree (verify.rs).

mod verify;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use metash_host::{ReplayPins, SpawnRequest, Spawner, WorkspaceAccess};
use metash_orchestrator::git::Git;
use metash_orchestrator::Verdict;
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
        /// Replay the verifier's recorded turn of that attempt too, against the replayed tree;
        /// exit 0 only when its verdict is the recorded one as well.
        #[arg(long)]
        verify: bool,
        #[command(flatten)]
        host: HostArgs,
    },
}

/// One replayed turn: its tape, how it ended, how much of the tape it asked for.
struct Turn {
    tape: String,
    status: AgentStatus,
    /// The turn's answer (a verifier's verdict is read from it).
    data: String,
    served: usize,
    recorded: usize,
    divergence: Option<Value>,
}

/// What the replay found, printed or as `--json`.
struct Outcome {
    turn: Turn,
    worktree: PathBuf,
    /// `git diff --stat` and `--name-status` against the recorded commit; both empty: identical.
    diff: Option<(String, String)>,
    /// With `--verify`: the verifier's replayed turn and both verdicts.
    verify: Option<Checked>,
}

impl Outcome {
    fn identical(&self) -> bool {
        self.turn.divergence.is_none()
            && self.turn.status == AgentStatus::Success
            && self.diff.as_ref().is_some_and(|(s, _)| s.is_empty())
    }

    fn success(&self) -> bool {
        self.identical() && self.verify.as_ref().is_none_or(Checked::same)
    }
}

/// `--verify`: the verifier's turn replayed (`None` when the tree differed, so it was not), the
/// verdict the orchestrator recorded, and the replayed one (or why the answer is not a verdict).
struct Checked {
    turn: Option<Turn>,
    recorded: Verdict,
    replayed: std::result::Result<Verdict, String>,
}

impl Checked {
    fn same(&self) -> bool {
        self.turn.as_ref().is_some_and(|t| t.divergence.is_none())
            && self
                .replayed
                .as_ref()
                .is_ok_and(|v| verify::same_verdict(&self.recorded, v))
    }
}

pub fn run(cmd: ReplayCommand, ctx: &Ctx) -> Result<ExitCode> {
    let ReplayCommand::Replay {
        task,
        attempt,
        verify,
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
    let roles = metash_orchestrator::OrchestratorConfig::load(&ctx.workspace)?;
    let tape = find_tape(&Tapes::new(&store), &task, &roles.executor, attempt)?;
    let spawn = replayable(&tape)?;
    // Before anything runs: a --verify without the verifier's recorded turn is refused.
    let check = verify
        .then(|| verify::recorded_check(&store, &task, &roles.verifier, &tape.id))
        .transpose()?;
    let commit = recorded_commit(&store, &task)?;
    let git = Git::new(&ctx.workspace);
    git.check_trust()?;
    let wt = fresh_worktree(&git, &store, &task, tape.attempt.unwrap_or(0), &commit)?;
    let turn = replay_turn(ctx, &host, &store, &tape, spawn, &wt)?;
    if turn.status == AgentStatus::Success {
        // As the orchestrator does: files of a JSON reply are written into the worktree.
        if let Err(why) = metash_orchestrator::reply::apply_files(&wt, &turn.data) {
            eprintln!(
                "the replayed reply's files could not be applied: {}",
                sanitize_line(&why)
            );
        }
    }
    let mut outcome = compare(&git, turn, wt, &commit)?;
    if let Some(check) = check {
        outcome.verify = Some(replay_check(
            ctx, &host, &store, &git, &outcome, &commit, check,
        )?);
    }
    print(ctx, &outcome)?;
    Ok(if outcome.success() {
        ExitCode::SUCCESS
    } else {
        Exit::Failure.into()
    })
}

/// The recorded spawn of `tape`, or why it cannot be replayed.
fn replayable(tape: &Tape) -> Result<TapeSpawn> {
    tape.spawn.clone().with_context(|| {
        format!(
            "tape {} was recorded before tapes kept the turn's prompt; it cannot be replayed",
            sanitize_line(&tape.id)
        )
    })
}

/// `.meta/worktrees/replay-<task>-<n>` made afresh at the parent of the task's commit.
fn fresh_worktree(git: &Git, store: &Store, task: &str, n: u32, commit: &str) -> Result<PathBuf> {
    let base = git
        .resolve(git.root(), &format!("{commit}^1"))?
        .with_context(|| format!("the task's commit {commit} has no parent"))?;
    let wt = store
        .meta_dir()
        .join("worktrees")
        .join(format!("replay-{task}-{n}"));
    let branch = format!("metash/replay/{task}-{n}");
    git.remove_worktree(&wt, Some(&branch))?;
    git.ensure_worktree(&wt, &branch, &base)?;
    wt.canonicalize().context("the replay worktree")
}

/// `--verify`: when the tree is identical, the replay's branch is set to the task's commit (the
/// same tree; its id is what the verifier's CLI saw as HEAD) and the verifier's recorded turn is
/// replayed there; its answer is read as the orchestrator reads a verdict.
fn replay_check(
    ctx: &Ctx,
    args: &HostArgs,
    store: &Store,
    git: &Git,
    outcome: &Outcome,
    commit: &str,
    check: verify::RecordedCheck,
) -> Result<Checked> {
    if !outcome.identical() {
        return Ok(Checked {
            turn: None,
            recorded: check.verdict,
            replayed: Err(
                "not replayed: the executor's replay did not reach the task's tree".into(),
            ),
        });
    }
    let wt = &outcome.worktree;
    git.run(wt, &["reset", "-q", "--soft", commit])?;
    let spawn = replayable(&check.tape)?;
    let turn = replay_turn(ctx, args, store, &check.tape, spawn, wt)?;
    let replayed = match (turn.status, &turn.divergence) {
        (AgentStatus::Success, None) => metash_orchestrator::parse_verdict(&turn.data),
        (status, _) => Err(format!("the verifier's replayed turn ended {status:?}")),
    };
    Ok(Checked {
        turn: Some(turn),
        recorded: check.verdict,
        replayed,
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
    let bodies: Vec<Vec<u8>> = tape
        .exchanges
        .iter()
        .filter_map(|e| tapes.blob(&e.request_body.sha256).ok())
        .collect();
    let now = chrono::Local::now();
    for (prefix, format) in DATES {
        let recorded = bodies
            .iter()
            .find_map(|b| dated(b, prefix.as_bytes(), format));
        if let Some(recorded) = recorded {
            let today = format!("{prefix}{}", now.format(format));
            rewrites.push((recorded, today.into_bytes()));
        }
    }
    ReplayPins { rewrites }
}

/// Where each CLI writes today's date into its requests (in local time; Codex in its
/// `<timezone>`, the machine's): pi's system prompt, Claude Code's context (day and month), Codex's
/// environment context. The recorded value becomes today's wherever it occurs.
const DATES: &[(&str, &str)] = &[
    ("Current date: ", "%Y-%m-%d"),
    ("Today's date is ", "%Y-%m-%d"),
    ("The current month is ", "%B %Y"),
    ("<current_date>", "%Y-%m-%d"),
];

/// `prefix` and the date after it (`YYYY-MM-DD`, or `Month YYYY` for `%B %Y`), the first in `body`.
fn dated(body: &[u8], prefix: &[u8], format: &str) -> Option<Vec<u8>> {
    let at = body.windows(prefix.len()).position(|w| w == prefix)? + prefix.len();
    let rest = body.get(at..)?;
    let len = if format == "%B %Y" {
        let month = rest.iter().take_while(|b| b.is_ascii_alphabetic()).count();
        let year = rest.get(month + 1..month + 5)?;
        (month > 0 && rest[month] == b' ' && year.iter().all(u8::is_ascii_digit))
            .then_some(month + 5)?
    } else {
        let d = rest.get(..10)?;
        let shape = d.iter().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                *b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
        shape.then_some(10)?
    };
    Some(body[at - prefix.len()..at + len].to_vec())
}

/// Runs `tape`'s recorded turn again in `wt`, on a host whose credential proxy answers from it.
fn replay_turn(
    ctx: &Ctx,
    args: &HostArgs,
    store: &Store,
    tape: &Tape,
    spawn: TapeSpawn,
    wt: &Path,
) -> Result<Turn> {
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
    let divergence = cassette.divergence().map(|d| {
        let side = |(method, target, body): &(String, String, Vec<u8>)| {
            json!({"method": method, "target": target,
                   "body": String::from_utf8_lossy(body)})
        };
        json!({"request": d.seq, "reason": d.reason,
               "recorded": d.expected.as_ref().map(side), "replayed": side(&d.got)})
    });
    Ok(Turn {
        tape: tape.id.clone(),
        status: response.status,
        data: response.data,
        served: cassette.served(),
        recorded: tape.exchanges.len(),
        divergence,
    })
}

/// Commits the replay's tree as the orchestrator commits a task's (the same files kept out) and
/// diffs it with the recorded commit (not when a request diverged).
fn compare(git: &Git, turn: Turn, wt: PathBuf, commit: &str) -> Result<Outcome> {
    let mut outcome = Outcome {
        turn,
        worktree: wt,
        diff: None,
        verify: None,
    };
    if outcome.turn.divergence.is_some() {
        return Ok(outcome);
    }
    let wt = &outcome.worktree;
    let ours = match git.commit_all(wt, "metash replay")? {
        Some(sha) => sha,
        None => git.head(wt)?,
    };
    let stat = git.run(git.root(), &["diff", "--stat", commit, &ours])?;
    let names = git.run(git.root(), &["diff", "--name-status", commit, &ours])?;
    outcome.diff = Some((stat, names));
    Ok(outcome)
}

fn turn_json(t: &Turn) -> Value {
    json!({"tape": t.tape, "status": t.status, "served": t.served, "recorded": t.recorded,
           "divergence": t.divergence})
}

fn verdict_json(v: &Verdict) -> Value {
    json!({"pass": v.pass, "findings": v.findings})
}

fn print_json(o: &Outcome) -> Result<()> {
    let verify = o.verify.as_ref().map(|c| {
        json!({"turn": c.turn.as_ref().map(turn_json), "same": c.same(),
               "recorded_verdict": verdict_json(&c.recorded),
               "replayed_verdict": c.replayed.as_ref().ok().map(verdict_json),
               "not_a_verdict": c.replayed.as_ref().err()})
    });
    let t = &o.turn;
    let v = json!({
        "tape": t.tape, "worktree": o.worktree, "status": t.status,
        "served": t.served, "recorded": t.recorded, "identical": o.identical(),
        "divergence": t.divergence,
        "diff": o.diff.as_ref().map(|(s, n)| json!({"stat": s, "names": n})),
        "verify": verify,
    });
    println!("{}", serde_json::to_string(&v)?);
    Ok(())
}

fn print(ctx: &Ctx, o: &Outcome) -> Result<()> {
    if ctx.json {
        return print_json(o);
    }
    print_turn(&o.turn, &o.worktree);
    if let Some(d) = &o.turn.divergence {
        print_divergence(d);
        return Ok(());
    }
    if o.turn.status != AgentStatus::Success {
        println!("the replayed turn ended {:?}", o.turn.status);
    }
    match &o.diff {
        Some(_) if o.identical() => println!("identical"),
        Some((stat, names)) => {
            println!("the tree differs from the task's commit:");
            println!("{}", sanitize_for_terminal(stat));
            println!("{}", sanitize_for_terminal(names));
        }
        None => {}
    }
    if let Some(c) = &o.verify {
        print_check(c, &o.worktree);
    }
    Ok(())
}

fn print_turn(t: &Turn, wt: &Path) {
    println!(
        "replayed tape {} in {}: {} of {} recorded exchanges answered",
        sanitize_line(&t.tape),
        wt.display(),
        t.served,
        t.recorded
    );
}

fn print_check(c: &Checked, wt: &Path) {
    let show = |v: &Verdict| {
        let word = if v.pass { "pass" } else { "fail" };
        let findings: Vec<String> = v
            .findings
            .iter()
            .map(|f| sanitize_line(f).into_owned())
            .collect();
        match findings.is_empty() {
            true => word.to_string(),
            false => format!("{word} ({})", findings.join("; ")),
        }
    };
    if let Some(t) = &c.turn {
        print!("verifier: ");
        print_turn(t, wt);
        if let Some(d) = &t.divergence {
            print_divergence(d);
        }
    }
    println!("recorded verdict: {}", show(&c.recorded));
    match &c.replayed {
        Ok(v) => println!("replayed verdict: {}", show(v)),
        Err(why) => println!("replayed verdict: none: {}", sanitize_line(why)),
    }
    println!(
        "{}",
        if c.same() {
            "the verdict is the recorded one"
        } else {
            "the verdict differs from the recorded one"
        }
    );
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

#[cfg(test)]
mod tests {
    use super::dated;

    #[test]
    fn each_clis_date_is_found_with_its_prefix() {
        let body = b"x Today's date is 2026-11-27.\\n The current month is November 2026. You";
        assert_eq!(
            dated(body, b"Today's date is ", "%Y-%m-%d").as_deref(),
            Some(&b"Today's date is 2026-11-27"[..])
        );
        assert_eq!(
            dated(body, b"The current month is ", "%B %Y").as_deref(),
            Some(&b"The current month is November 2026"[..])
        );
        assert_eq!(
            dated(
                b"<current_date>2026-11-27</current_date>",
                b"<current_date>",
                "%Y-%m-%d"
            )
            .as_deref(),
            Some(&b"<current_date>2026-11-27"[..])
        );
        // Not a date after the prefix: nothing to pin.
        assert_eq!(
            dated(b"Current date: soon", b"Current date: ", "%Y-%m-%d"),
            None
        );
    }
}
