//! `metash agents suspend|resume ID`: pauses or resumes an agent that a `metash` process (a
//! `run`, a `spawn`, a `serve`) is running now, from any terminal. The request goes through the
//! store; the process running the agent applies it within 100 ms and answers in the log. Nobody
//! answering within `--wait-ms` means nothing runs that agent: the request is withdrawn, so it
//! cannot freeze a later run, and the command fails saying so.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use metash_host::control::{self, Want};
use metash_store::Store;
use serde_json::json;

use super::Ctx;

pub fn run(ctx: &Ctx, agent: &str, want: Want, wait_ms: u64) -> Result<ExitCode> {
    let store = Store::open(&ctx.workspace)?;
    let seq = control::request(&store, agent, want)?.seq;
    let until = Instant::now() + Duration::from_millis(wait_ms);
    let changed = loop {
        if let Some(changed) = control::answer(&store, agent, seq) {
            break changed;
        }
        if Instant::now() >= until {
            control::withdraw(&store, agent, seq)?;
            bail!(
                "no running metash answered within {wait_ms} ms: is `{agent}` running? (the \
                 request was withdrawn)"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if ctx.json {
        println!(
            "{}",
            json!({"agent": agent, "want": want.as_str(), "changed": changed})
        );
    } else {
        let done = match (want, changed) {
            (Want::Suspended, true) => "suspended",
            (Want::Suspended, false) => "was already suspended:",
            (Want::Active, true) => "resumed",
            (Want::Active, false) => "was not suspended:",
        };
        println!("{done} {agent}");
    }
    Ok(ExitCode::SUCCESS)
}
