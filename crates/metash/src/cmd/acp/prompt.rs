//! One prompt in `run` mode, and the driver both modes share ([`drive`]): `metash run` in the
//! session's project as a child process (the same entry point as the shell's, so the editor's
//! run is the shell's run), its checkpoints answered through `session/request_permission` and
//! the run continued with `--answer`, until it completes (`end_turn`), halts (`refusal`) or the
//! editor cancels (`cancelled`). Cancel ends the child's process group, as a killed `metash run`
//! ends: the next run recovers a task it cut short (a half-made worktree, an interrupted merge),
//! so nothing is left half-merged.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use metash_harness::acp::wire::{agent, method, StopReason, ToolKind};
use serde_json::Value;

use super::conn::{Config, Conn, Session};
use super::follow::Follower;

/// How long a consent question of the run waits for the editor's answer before it is denied.
const CONSENT_WAIT_S: &str = "900";

/// How often a waiting prompt looks at its child and at the cancel flag.
const POLL: Duration = Duration::from_millis(50);

/// How one `metash run` ended.
enum Ended {
    /// Its `--json` outcome.
    Outcome(Value),
    Cancelled,
}

/// How a prompt's runs ended, once no checkpoint was left to answer in place.
pub(super) enum Drove {
    /// The last run's `--json` outcome: `complete`, `phase_limit` or `halted`.
    Outcome(Value),
    /// A checkpoint was left for later (or its question cancelled by the editor's side).
    Later,
    Cancelled,
}

/// Runs the prompt: the run, its checkpoints, until it stops.
pub(super) fn run(
    conn: &Arc<Conn>,
    config: &Config,
    session: &Session,
    params: &Value,
) -> Result<StopReason> {
    session.cancel.reset();
    super::follow::use_linked_context(conn, session, params);
    let follower = Follower::start(Arc::clone(conn), session)?;
    let drove = drive(conn, config, session, &follower, &[], halted(session));
    follower.catch_up();
    let stop = match drove? {
        Drove::Cancelled => StopReason::Cancelled,
        Drove::Later => StopReason::EndTurn,
        Drove::Outcome(outcome) => match outcome.get("outcome").and_then(Value::as_str) {
            Some("halted") => {
                say(conn, session, &halt_text(&outcome));
                StopReason::Refusal
            }
            Some("phase_limit") => {
                say(conn, session, "Stopped at the phase limit.\n");
                StopReason::EndTurn
            }
            _ => {
                say(conn, session, "The project is complete.\n");
                StopReason::EndTurn
            }
        },
    };
    follower.stop();
    Ok(stop)
}

/// `metash run` with `extra` arguments (and `--retry` first when `retry`), again with the answer
/// whenever it stops at a checkpoint the editor answers, until it stops otherwise.
pub(super) fn drive(
    conn: &Conn,
    config: &Config,
    session: &Session,
    follower: &Follower,
    extra: &[&str],
    mut retry: bool,
) -> Result<Drove> {
    let mut answer = None;
    loop {
        if session.cancel.is_cancelled() {
            return Ok(Drove::Cancelled);
        }
        let run = run_once(
            config,
            session,
            extra,
            answer.take(),
            std::mem::take(&mut retry),
        )?;
        let outcome = match run {
            Ended::Cancelled => return Ok(Drove::Cancelled),
            Ended::Outcome(v) => v,
        };
        follower.catch_up();
        if outcome.get("outcome").and_then(Value::as_str) != Some("checkpoint") {
            return Ok(Drove::Outcome(outcome));
        }
        match ask_checkpoint(conn, session, &outcome["checkpoint"]) {
            Some(a) => answer = Some(a),
            None if session.cancel.is_cancelled() => return Ok(Drove::Cancelled),
            None => {
                say(
                    conn,
                    session,
                    "The checkpoint waits: the next prompt asks again.\n",
                );
                return Ok(Drove::Later);
            }
        }
    }
}

/// The halt's reason and message, as the prompt's last text.
pub(super) fn halt_text(outcome: &Value) -> String {
    let halt = &outcome["halt"];
    format!(
        "The run halted ({}): {}\n",
        halt["reason"].as_str().unwrap_or("halted"),
        halt["message"].as_str().unwrap_or("")
    )
}

pub(super) fn say(conn: &Conn, session: &Session, text: &str) {
    conn.update(&session.id, agent::text_chunk(text));
}

/// Whether the project's session halted for a reason a retry addresses: a prompt after such a
/// halt is the editor's "go on", so its run is `metash run --retry` (a consent halt needs no
/// retry: the next run asks again).
pub(super) fn halted(session: &Session) -> bool {
    let Ok(report) = metash_store::Store::open(&session.cwd)
        .map_err(anyhow::Error::from)
        .and_then(|s| Ok(metash_orchestrator::report(&s)?))
    else {
        return false;
    };
    report.status == metash_protocol::SessionStatus::Halted
        && report
            .halt
            .is_some_and(|h| h.reason.as_str() != "consent_refused")
}

/// One `metash run [EXTRA] [--answer A] [--retry]`, waited for (or cancelled).
fn run_once(
    config: &Config,
    session: &Session,
    extra: &[&str],
    answer: Option<String>,
    retry: bool,
) -> Result<Ended> {
    let mut cmd = Command::new(&config.exe);
    cmd.arg("-C")
        .arg(&session.cwd)
        .args(["--json", "run", "--non-interactive"])
        .args(["--consent-wait", CONSENT_WAIT_S])
        .args(&config.run_args)
        .args(extra)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(a) = &answer {
        cmd.args(["--answer", a]);
    }
    if retry {
        cmd.arg("--retry");
    }
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().context("starting `metash run`")?;
    session.cancel.set_child(Some(child.id()));
    let readers = (drain(child.stdout.take()), drain(child.stderr.take()));
    let status = wait(&mut child);
    session.cancel.set_child(None);
    let stdout = readers.0.join().unwrap_or_default();
    let stderr = readers.1.join().unwrap_or_default();
    let status = status?;
    if session.cancel.is_cancelled() {
        return Ok(Ended::Cancelled);
    }
    match serde_json::from_str::<Value>(&stdout) {
        Ok(v) if v.get("outcome").is_some() => Ok(Ended::Outcome(v)),
        _ => anyhow::bail!(
            "`metash run` failed ({status}): {}",
            stderr.lines().last().unwrap_or("no message")
        ),
    }
}

fn drain<R: Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut r) = r {
            let _ = r.read_to_string(&mut s);
        }
        s
    })
}

/// Waits for the run to exit; a cancel ends its group from [`super::conn::Cancel::cancel`], and
/// the child is reaped here all the same.
fn wait(child: &mut Child) -> Result<std::process::ExitStatus> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        std::thread::sleep(POLL);
    }
}

/// Asks the editor to answer the checkpoint: each of its options is a permission option
/// (`allow_once`), and "leave it for later" (`reject_once`). `None` when left for later or the
/// question was cancelled.
fn ask_checkpoint(conn: &Conn, session: &Session, p: &Value) -> Option<String> {
    let id = p["id"].as_str().unwrap_or("checkpoint");
    let message = p.pointer("/signal/message").and_then(Value::as_str)?;
    let options: Vec<String> = p
        .pointer("/signal/options")
        .and_then(Value::as_array)
        .map(|o| {
            o.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut offered: Vec<Value> = options
        .iter()
        .enumerate()
        .map(|(i, o)| agent::option(&format!("answer-{i}"), o, "allow_once"))
        .collect();
    offered.push(agent::option("later", "Leave it for later", "reject_once"));
    let title = format!(
        "Checkpoint from {}: {message}",
        p["agent"].as_str().unwrap_or("metash")
    );
    let call = format!("checkpoint-{id}");
    conn.update(
        &session.id,
        agent::tool_call(
            &call,
            &title,
            ToolKind::Think,
            metash_harness::acp::ToolStatus::Pending,
        ),
    );
    let params = agent::permission_request(&session.id, &call, &title, ToolKind::Think, offered);
    let chosen = conn
        .request(method::REQUEST_PERMISSION, &params)
        .ok()
        .as_ref()
        .and_then(agent::chosen_option);
    let answer = chosen
        .as_deref()
        .and_then(|c| c.strip_prefix("answer-"))
        .and_then(|i| i.parse::<usize>().ok())
        .and_then(|i| options.get(i).cloned());
    let status = if answer.is_some() {
        metash_harness::acp::ToolStatus::Completed
    } else {
        metash_harness::acp::ToolStatus::Failed
    };
    let text = answer.as_deref().map(|a| format!("answered: {a}"));
    conn.update(
        &session.id,
        agent::tool_call_update(&call, status, text.as_deref()),
    );
    answer
}
