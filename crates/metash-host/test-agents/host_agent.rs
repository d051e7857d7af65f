//! The host's native test agent: the prompt picks a behaviour, so one binary covers every
//! `AgentResponse` status and the cleanup cases.
//!
//! - `echo TEXT`: outputs TEXT
//! - `config`: outputs the start context's `config` (system prompt, resume data) as JSON
//! - `checkpoint`: asks seed 000's decision_required question with options `a`, `b`
//! - `fail`: ends with an error
//! - `state KEY JSON`: a `state_update` of the session, then outputs `ok`
//! - `hang`: outputs `partial`, starts a grandchild `sleep 300` holding stdout, ignores SIGTERM,
//!   and sleeps forever (the host must kill the whole group at the timeout)

use std::time::Duration;

use metash_protocol::{AgentEvent, CheckpointReason};

fn main() {
    let result = metash_agent::run(|s, input| {
        let (cmd, arg) = input.prompt.split_once(' ').unwrap_or((&input.prompt, ""));
        let io = |e: std::io::Error| e.to_string();
        match cmd {
            "echo" => s.output("text/plain", arg).map_err(io),
            "config" => {
                let cfg = s.context().config.to_string();
                s.output("application/json", &cfg).map_err(io)
            }
            "checkpoint" => s
                .send(AgentEvent::Checkpoint {
                    reason: CheckpointReason::DecisionRequired,
                    message: "Pick one".into(),
                    options: vec!["a".into(), "b".into()],
                    resume_id: Some("pick".into()),
                })
                .map_err(io),
            "fail" => Err("boom".into()),
            "state" => {
                let (key, value) = arg.split_once(' ').unwrap_or((arg, "null"));
                let value = serde_json::from_str(value).map_err(|e| e.to_string())?;
                s.state_update(key, value, None).map_err(io)?;
                s.output("text/plain", "ok").map_err(io)
            }
            "hang" => {
                s.output("text/plain", "partial").map_err(io)?;
                // SAFETY: installing SIG_IGN has no preconditions.
                unsafe {
                    libc::signal(libc::SIGTERM, libc::SIG_IGN);
                }
                let _child = std::process::Command::new("sleep").arg("300").spawn();
                loop {
                    std::thread::sleep(Duration::from_secs(60));
                }
            }
            other => Err(format!("unknown command `{other}`")),
        }
    });
    if let Err(e) = result {
        eprintln!("host-test-agent: {e}");
        std::process::exit(1);
    }
}
