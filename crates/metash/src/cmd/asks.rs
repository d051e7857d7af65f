//! `metash consent pending | answer`: the agents' questions that wait for any client
//! (`[host] consent_wait_seconds`), answered from a terminal of any process. `metash ui` and
//! JSON-RPC answer the same records; the first answer wins.

use std::process::ExitCode;

use anyhow::{bail, Result};
use metash_policy::Answer;
use metash_protocol::sanitize_line;
use metash_store::Store;
use serde_json::json;

use super::Ctx;

/// One line per waiting question.
pub fn pending(ctx: &Ctx) -> Result<ExitCode> {
    let store = Store::open(&ctx.workspace)?;
    let asks = metash_host::asks::pending(&store)?;
    if ctx.json {
        println!("{}", json!(asks));
    } else if asks.is_empty() {
        println!("no question is waiting");
    } else {
        for a in &asks {
            // The reason (and anything else an agent chose) is shown escaped, on one line.
            println!(
                "{}  {} asks for `{}` ({}): {}; denied at {}",
                a.id,
                sanitize_line(&a.agent),
                sanitize_line(&a.capability),
                a.duration_s
                    .map_or("one action".to_string(), |d| format!("{d} s")),
                sanitize_line(&a.reason),
                a.deadline
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Answers question `id`: `once`, `deny`, or `for` with `seconds`.
pub fn answer(ctx: &Ctx, id: &str, answer: &str, seconds: Option<u64>) -> Result<ExitCode> {
    let answer = match (answer, seconds) {
        ("once", None) => Answer::AllowOnce,
        ("deny", None) => Answer::Deny,
        ("for", Some(s)) => Answer::AllowFor(s),
        ("for", None) => bail!("`for` needs --seconds N (1 to 86400)"),
        (_, _) => bail!("--seconds goes with `for` only"),
    };
    let store = Store::open(&ctx.workspace)?;
    metash_host::asks::reply(&store, id, answer, "cli")?;
    if ctx.json {
        println!("{}", json!({"id": id, "answered": true}));
    } else {
        println!("answered {id}; the waiting agent gets it within 100 ms");
    }
    Ok(ExitCode::SUCCESS)
}
