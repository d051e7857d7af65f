//! An agent with seed 002's `shutdown()` hook: it works in memory and flushes what it learned
//! when the host shuts it down. As WASM its manifest says `hooks = ["shutdown"]`, so the host
//! runs the module once more, with `shutdown`, before terminating it.

fn main() {
    let result = metash_agent::run_with_shutdown(
        |session, input| {
            session
                .output("text/plain", &format!("working on {}", input.prompt))
                .map_err(|e| e.to_string())
        },
        |session| {
            session
                .state_update("flushed", serde_json::json!(true), Some("agent"))
                .map_err(|e| e.to_string())
        },
    );
    if let Err(e) = result {
        eprintln!("flusher agent: {e}");
        std::process::exit(1);
    }
}
