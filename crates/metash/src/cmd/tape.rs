//! `metash tape list|show`: what model turns exchanged through the credential proxy, as recorded
//! in `.meta/tapes/` (docs/replay.md). Everything shown came from a model or an agent, so every
//! text field goes through the terminal sanitizer.

use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::{Context, Result};
use clap::Subcommand;
use metash_host::config::HostConfig;
use metash_protocol::{sanitize_for_terminal, sanitize_line};
use metash_store::tape::{Tape, TapeExchange, Tapes};
use metash_store::{GcReport, Store};
use serde_json::{json, Value};

use super::Ctx;

#[derive(Debug, Subcommand)]
pub enum TapeCommand {
    /// Recorded model turns (`.meta/tapes/`): list them, show what one exchanged.
    Tape {
        #[command(subcommand)]
        cmd: TapeCmd,
    },
}

#[derive(Debug, Subcommand)]
pub enum TapeCmd {
    /// The recorded turns, oldest first: id, agent, task, attempt, exchanges, bytes.
    List {},
    /// One turn's exchanges in order: request, status, bytes and timing of each.
    Show {
        /// The tape's id (from `metash tape list`).
        id: String,
        /// Print each request and response body too (control characters made visible).
        #[arg(long)]
        bodies: bool,
    },
}

pub fn run(cmd: TapeCommand, ctx: &Ctx) -> Result<ExitCode> {
    let TapeCommand::Tape { cmd } = cmd;
    let store = Store::open(&ctx.workspace)?;
    let tapes = Tapes::new(&store);
    match cmd {
        TapeCmd::List {} => list(&tapes, ctx.json)?,
        TapeCmd::Show { id, bodies } => {
            let tape = tapes
                .get(&id)
                .with_context(|| format!("no readable tape `{id}` (see `metash tape list`)"))?;
            if ctx.json {
                println!(
                    "{}",
                    serde_json::to_string(&show_json(&tapes, &tape, bodies)?)?
                );
            } else {
                show(&tapes, &tape, bodies)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn list(tapes: &Tapes<'_>, json: bool) -> Result<()> {
    let list = tapes.list()?;
    if json {
        println!("{}", serde_json::to_string(&list)?);
        return Ok(());
    }
    if list.is_empty() {
        println!("no tapes");
    }
    for t in &list {
        println!(
            "{}  {}  {}{}  {} exchanges  {} bytes  {}",
            sanitize_line(&t.id),
            sanitize_line(&t.agent),
            match (&t.task, &t.session_id) {
                (Some(x), _) => format!("task {}", sanitize_line(x)),
                // An interactive session's tape (or a turn outside any task).
                (None, Some(s)) => format!("session {}", sanitize_line(s)),
                (None, None) => "-".to_string(),
            },
            t.attempt.map(|a| format!(" #{a}")).unwrap_or_default(),
            t.exchanges,
            t.bytes,
            sanitize_line(&t.started_at),
        );
    }
    Ok(())
}

/// `model=… stream messages=N` from a JSON request body, when it is one.
fn request_summary(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return String::new();
    };
    let mut parts = Vec::new();
    if let Some(m) = v.get("model").and_then(Value::as_str) {
        parts.push(format!("model={}", sanitize_line(m)));
    }
    if v.get("stream").and_then(Value::as_bool) == Some(true) {
        parts.push("stream".to_string());
    }
    for key in ["messages", "input"] {
        if let Some(n) = v.get(key).and_then(Value::as_array).map(Vec::len) {
            parts.push(format!("{key}={n}"));
        }
    }
    parts.join(" ")
}

fn show(tapes: &Tapes<'_>, t: &Tape, bodies: bool) -> Result<()> {
    println!("tape {}", sanitize_line(&t.id));
    println!(
        "  agent {}{}{}{}",
        sanitize_line(&t.agent),
        t.frontend
            .as_deref()
            .map(|f| format!(" ({})", sanitize_line(f)))
            .unwrap_or_default(),
        t.task
            .as_deref()
            .map(|x| format!(", task {}", sanitize_line(x)))
            .unwrap_or_default(),
        t.attempt
            .map(|a| format!(", attempt {a}"))
            .unwrap_or_default(),
    );
    println!(
        "  {} to {}, {} exchanges, {} bytes",
        sanitize_line(&t.started_at),
        sanitize_line(&t.ended_at),
        t.exchanges.len(),
        t.body_bytes()
    );
    for e in &t.exchanges {
        let request = tapes.blob(&e.request_body.sha256).unwrap_or_default();
        println!(
            "  #{} +{} ms {} {}  {}  request {} B -> {}  response {} B in {} chunks, head {} ms, \
             {} ms, {}",
            e.seq,
            e.at_ms,
            sanitize_line(&e.method),
            sanitize_line(&e.target),
            request_summary(&request),
            e.request_body.bytes,
            e.status,
            e.response_body.bytes,
            e.chunks.len(),
            e.head_ms,
            e.duration_ms,
            sanitize_line(&e.end),
        );
        if bodies {
            print_bodies(tapes, e);
        }
    }
    Ok(())
}

/// Both bodies, or why one cannot be shown (a blob missing or damaged).
fn print_bodies(tapes: &Tapes<'_>, e: &TapeExchange) {
    for (what, blob) in [("request", &e.request_body), ("response", &e.response_body)] {
        match tapes.blob(&blob.sha256) {
            Ok(bytes) => {
                println!("    --- {what} body ---");
                println!(
                    "{}",
                    sanitize_for_terminal(&String::from_utf8_lossy(&bytes))
                );
            }
            Err(err) => println!(
                "    --- {what} body unreadable: {} ---",
                sanitize_line(&err.to_string())
            ),
        }
    }
}

/// The tape's index, with each exchange's bodies as text when `bodies`.
fn show_json(tapes: &Tapes<'_>, t: &Tape, bodies: bool) -> Result<Value> {
    let mut v = serde_json::to_value(t)?;
    if bodies {
        if let Some(list) = v.get_mut("exchanges").and_then(Value::as_array_mut) {
            for (e, out) in t.exchanges.iter().zip(list.iter_mut()) {
                let text = |sha: &str| {
                    tapes
                        .blob(sha)
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                        .unwrap_or_default()
                };
                out["request_text"] = json!(text(&e.request_body.sha256));
                out["response_text"] = json!(text(&e.response_body.sha256));
            }
        }
    }
    Ok(v)
}

/// `metash gc`'s second half: the tapes, under `[record]`'s retention.
///
/// # Errors
/// The config does not parse, or the tapes cannot be collected.
pub(super) fn gc(ctx: &Ctx, store: &Store) -> Result<GcReport> {
    let policy = HostConfig::load(&ctx.workspace)?.record.retention();
    Ok(Tapes::new(store).gc(policy, SystemTime::now())?)
}
