//! The smallest agent: echoes its prompt, reports what it may do, and counts invocations through
//! `state_update`. The same source builds natively (`cargo build --example echo`) and for WASM
//! (`cargo build --example echo --target wasm32-wasip1`); the runtime's tests run the WASM build.

fn main() {
    let result = metash_agent::run(|session, input| {
        let fs = if session.granted("files.read") {
            // Inside WASM the workspace is preopened at the path `start` gave.
            let ws = session.context().workspace.clone().unwrap_or_default();
            match std::fs::read_to_string(format!("{ws}/inside.txt")) {
                Ok(s) => format!("workspace says {s:?}"),
                Err(e) => format!("workspace unreadable: {e}"),
            }
        } else {
            "no files granted".to_string()
        };
        let reply = format!("echo: {} ({fs})", input.prompt);
        session
            .output("text/plain", &reply)
            .and_then(|()| session.state_update("last_prompt", input.prompt.into(), Some("agent")))
            .map_err(|e| e.to_string())
    });
    if let Err(e) = result {
        eprintln!("echo agent: {e}");
        std::process::exit(1);
    }
}
