//! What `metash consent revoke` says about an agent that runs now. The ledger changes at once,
//! and the process running the agent (a `run`, a `spawn`, a `serve`, in any terminal) takes the
//! grant back within 100 ms: it withdraws a file grant from the agent's mount namespace, tells
//! the agent, and logs `consent_revoke_sent` with what it withdrew or why it could not. The
//! command waits for that record, so a withdrawal that failed (the agent may still read the
//! files) is an error the user sees, never a reported success.

use std::time::{Duration, Instant};

use metash_protocol::{LogKind, LogRecord};
use metash_store::Store;
use serde_json::Value;

/// How long the running process gets to answer (it polls every 100 ms).
const WAIT: Duration = Duration::from_secs(3);

/// What became of the revocation in a running agent.
pub enum Outcome {
    /// No agent of that id is running (its last spawn ended), or it runs as a model-backed role
    /// (a coding CLI gets no events: its grants are read at its next spawn).
    NotRunning,
    /// The running process told the agent; each `withdrawn` it logged (`null`, `{path}`).
    Applied(Vec<Value>),
    /// It could not take a file grant back: its words.
    Failed(Vec<String>),
    /// A spawn of it has no end in the log, yet nothing answered within [`WAIT`] (a process
    /// that was killed leaves such a spawn).
    Unconfirmed,
}

/// After a revocation of `agent`'s grants logged past `after` (the log's tail before it).
///
/// # Errors
/// The log cannot be read.
pub fn outcome(store: &Store, agent: &str, after: u64, role: bool) -> anyhow::Result<Outcome> {
    if role || !spawn_open(store, agent)? {
        return Ok(Outcome::NotRunning);
    }
    let until = Instant::now() + WAIT;
    loop {
        let (sent, ended) = since(store, agent, after)?;
        if !sent.is_empty() {
            // The watcher logs every capability that ended in one pass: let it finish.
            std::thread::sleep(Duration::from_millis(150));
            let (sent, _) = since(store, agent, after)?;
            return Ok(judge(sent));
        }
        if ended {
            return Ok(Outcome::NotRunning);
        }
        if Instant::now() >= until {
            return Ok(Outcome::Unconfirmed);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Failures first: one failed withdrawal makes the whole revocation a failure.
fn judge(sent: Vec<Value>) -> Outcome {
    let failed: Vec<String> = sent
        .iter()
        .filter_map(|w| w.get("error").and_then(Value::as_str).map(str::to_string))
        .collect();
    if failed.is_empty() {
        Outcome::Applied(sent)
    } else {
        Outcome::Failed(failed)
    }
}

/// Whether `agent`'s last `spawn` has no `spawn_end` after it.
fn spawn_open(store: &Store, agent: &str) -> anyhow::Result<bool> {
    let mut open = false;
    store.log().scan_back(|r| {
        if r.agent.as_deref() != Some(agent) {
            return true;
        }
        match r.kind {
            LogKind::SpawnEnd => false,
            LogKind::Spawn => {
                open = true;
                false
            }
            _ => true,
        }
    })?;
    Ok(open)
}

/// `agent`'s `consent_revoke_sent` records past `after` (their `withdrawn`), and whether a
/// spawn of it ended since.
fn since(store: &Store, agent: &str, after: u64) -> anyhow::Result<(Vec<Value>, bool)> {
    let mut sent = Vec::new();
    let mut ended = false;
    store.log().scan_back(|r: LogRecord| {
        if r.seq <= after {
            return false;
        }
        if r.agent.as_deref() == Some(agent) {
            match r.kind {
                LogKind::ConsentRevokeSent => {
                    sent.push(r.data.get("withdrawn").cloned().unwrap_or(Value::Null));
                }
                LogKind::SpawnEnd => ended = true,
                _ => {}
            }
        }
        true
    })?;
    Ok((sent, ended))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_failed_withdrawal_fails_the_revocation() {
        let ok = json!({"path": "/w"});
        assert!(
            matches!(judge(vec![ok.clone(), Value::Null]), Outcome::Applied(v) if v.len() == 2)
        );
        let bad = json!({"error": "covering /w/.git: EBUSY"});
        match judge(vec![ok, bad]) {
            Outcome::Failed(why) => assert_eq!(why, ["covering /w/.git: EBUSY"]),
            _ => panic!("a failed withdrawal must fail the revocation"),
        }
    }
}
