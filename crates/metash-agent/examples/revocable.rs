//! An agent that keeps working when a grant is taken away (seed 002: "revocation must not
//! silently break functionality"). The prompt names a capability, and optionally a file of the
//! workspace (`files.read notes.txt`); the agent reads the file, says `waiting`, then listens to
//! the host until that capability is revoked (or expires), reads the file again, and answers with
//! what it will do instead. Builds natively and for `wasm32-wasip1`; the host's tests run both.

use metash_protocol::AgentEvent;

fn main() {
    let result = metash_agent::run(|session, input| {
        let mut words = input.prompt.split_whitespace();
        let capability = words.next().unwrap_or_default().to_string();
        let file = words.next().map(|f| {
            let ws = session.context().workspace.clone().unwrap_or_default();
            std::path::Path::new(&ws).join(f)
        });
        let read = |when: &str| match &file {
            Some(f) => match std::fs::read_to_string(f) {
                Ok(text) => format!("read {when}: {}; ", text.trim()),
                Err(e) => format!("read {when}: refused ({e}); "),
            },
            None => String::new(),
        };
        let before = read("before");
        let io = |e: std::io::Error| e.to_string();
        session.output("text/plain", "waiting\n").map_err(io)?;
        let told = loop {
            match session.recv().map_err(io)? {
                Some(AgentEvent::ConsentRevoke {
                    capability: c,
                    expires_at,
                }) if c == capability => break expires_at,
                Some(_) => {}
                None => return Err("the host ended the input before revoking".into()),
            }
        };
        let still = if session.granted(&capability) {
            "still granted"
        } else {
            "no longer granted"
        };
        let after = read("after");
        let reply = format!(
            "{before}{after}revoked {capability} (expires_at {}); {still}; falling back to cached data",
            told.unwrap_or_else(|| "-".into())
        );
        session.output("text/plain", &reply).map_err(io)
    });
    if let Err(e) = result {
        eprintln!("revocable agent: {e}");
        std::process::exit(1);
    }
}
