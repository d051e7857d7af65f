//! What a running agent is told or made to do by other processes, polled every 100 ms while it
//! runs: the end of its grants, and suspend/resume requests (see [`crate::control`]).
//!
//! Live revocation (seed 002 §2): while an agent runs, its grants are watched, and each one that
//! ends (revoked by any process, `metash consent revoke` included, or expired) is pushed to the
//! agent at once as a `consent_revoke` event, so it can switch to its fallback before its next
//! use is refused ("revocation must not silently break functionality").
//!
//! What the sandbox checks per use refuses the next use (proxied connections, process starts
//! through the exec gate, KV and state through the host). A file grant is withdrawn from the
//! agent's mount namespace before the event is sent ([`metash_runtime::Withdrawer`]: the path
//! becomes read-only, or unreadable), so when the agent hears of it, the next open is already
//! refused; the log's `consent_revoke_sent` says what was withdrawn.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use metash_policy::consent;
use metash_protocol::{AgentEvent, LogKind};
use metash_runtime::{Pauser, Replier, Withdrawer};
use metash_store::Store;
use serde_json::json;

use crate::control::{self, Running};

/// How often the grants are read: the most a revocation waits before the agent hears of it.
const POLL: Duration = Duration::from_millis(100);

/// The agent's grants at one moment: live ones (capability → expiry) and the revocations seen.
#[derive(Default)]
struct Seen {
    live: BTreeMap<String, String>,
    revoked: BTreeSet<(String, String)>,
}

impl Seen {
    /// `None` when the grants cannot be read now (the next poll tries again).
    fn read(store: &Store, agent: &str) -> Option<Self> {
        let grants = consent::load_for(store, agent).ok()?;
        let now = store.now();
        let mut seen = Self::default();
        for g in grants {
            let cap = g.capability.to_string();
            match &g.revoked_at {
                Some(at) => {
                    seen.revoked.insert((cap, at.clone()));
                }
                None if g.active_at(now) => {
                    let e = seen.live.entry(cap).or_default();
                    if *e < g.expires_at {
                        *e = g.expires_at;
                    }
                }
                None => {}
            }
        }
        Some(seen)
    }
}

/// How the watcher reaches an agent that speaks the protocol: its stdin, and its file grants.
pub(crate) struct Reach {
    pub replier: Replier,
    pub withdrawer: Option<Withdrawer>,
}

impl Reach {
    /// Withdraws what `capability` gave (when it gave files) and tells the agent; what was
    /// withdrawn, for the log.
    fn revoke(&self, capability: &str, expires_at: &str) -> serde_json::Value {
        let withdrawn = match self
            .withdrawer
            .as_ref()
            .and_then(|w| w.withdraw(capability))
        {
            None => serde_json::Value::Null,
            Some(Ok(path)) => json!({"path": path}),
            Some(Err(e)) => json!({"error": e.to_string()}),
        };
        self.replier.send(AgentEvent::ConsentRevoke {
            capability: capability.to_string(),
            expires_at: Some(expires_at.to_string()),
        });
        withdrawn
    }
}

/// Watches one agent's grants and control requests while it runs; stops when dropped, at once:
/// the poll waits on a channel that dropping closes, so a spawn's end never waits out a poll.
pub(crate) struct RunWatch {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl RunWatch {
    /// Watches `agent` until dropped. `reach`: for agents that speak the protocol (a coding CLI
    /// does not: its grants are its role's, and it gets no events).
    /// Suspend/resume requests go to whatever pauser `running` holds for it by then.
    pub(crate) fn start(
        store: Store,
        agent: &str,
        reach: Option<Reach>,
        running: Arc<Running>,
    ) -> Self {
        let (stop, stopped) = mpsc::channel::<()>();
        let agent = agent.to_string();
        let thread = std::thread::Builder::new()
            .name("metash-run-watch".into())
            .spawn(move || {
                let mut before = Seen::read(&store, &agent).unwrap_or_default();
                // Only requests made after the agent started are for it.
                let mut obeyed = store.log().tail().map(|t| t.seq).unwrap_or(u64::MAX);
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(POLL) {
                    if let Some(seq) = obey(&store, &agent, &running, obeyed) {
                        obeyed = seq;
                    }
                    let Some(reach) = &reach else {
                        continue;
                    };
                    let Some(now) = Seen::read(&store, &agent) else {
                        continue;
                    };
                    for (capability, expires_at, why) in ended(&before, &now) {
                        let withdrawn = reach.revoke(&capability, &expires_at);
                        let _ = store.append(
                            LogKind::ConsentRevokeSent,
                            Some(&agent),
                            json!({"capability": capability, "expires_at": expires_at, "why": why,
                                   "withdrawn": withdrawn}),
                        );
                    }
                    before = now;
                }
            })
            .ok();
        Self {
            stop: Some(stop),
            thread,
        }
    }
}

/// Applies the latest suspend/resume request made after `obeyed`, once the agent's pauser is
/// registered (a CLI's only when its process has started); answers it in the log. The request's
/// seq when it was applied.
fn obey(store: &Store, agent: &str, running: &Running, obeyed: u64) -> Option<u64> {
    let (want, seq) = control::pending(store, agent, obeyed)?;
    let pauser: Pauser = running.get(agent)?;
    let changed = control::apply(&pauser, want);
    // The answer the requester waits for (it names the request).
    let _ = store.append(
        LogKind::AgentControl,
        Some(agent),
        json!({"want": want.as_str(), "request": seq, "changed": changed}),
    );
    Some(seq)
}

impl Drop for RunWatch {
    fn drop(&mut self) {
        // Closing the channel ends the watcher's wait at once.
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What ended between two readings, each once: a live grant that is gone (revoked, or expired
/// when no new revocation names it), and a new revocation of a capability that was not a live
/// grant of its own (a narrow scope revoked under a broader grant).
fn ended(before: &Seen, now: &Seen) -> Vec<(String, String, &'static str)> {
    let fresh: BTreeSet<&String> = now
        .revoked
        .difference(&before.revoked)
        .map(|(cap, _)| cap)
        .collect();
    let mut out = Vec::new();
    for (cap, expires_at) in &before.live {
        if !now.live.contains_key(cap) {
            let why = if fresh.contains(cap) {
                "revoked"
            } else {
                "expired"
            };
            out.push((cap.clone(), expires_at.clone(), why));
        }
    }
    for cap in fresh {
        if !before.live.contains_key(cap) {
            out.push((cap.clone(), String::new(), "revoked"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(live: &[(&str, &str)], revoked: &[(&str, &str)]) -> Seen {
        Seen {
            live: live
                .iter()
                .map(|(c, e)| (c.to_string(), e.to_string()))
                .collect(),
            revoked: revoked
                .iter()
                .map(|(c, a)| (c.to_string(), a.to_string()))
                .collect(),
        }
    }

    #[test]
    fn each_end_is_reported_once_with_its_reason() {
        let before = seen(&[("network:a", "t9"), ("memory", "t5")], &[]);
        let now = seen(&[], &[("network:a", "t2"), ("network:b", "t2")]);
        assert_eq!(
            ended(&before, &now),
            vec![
                ("memory".to_string(), "t5".to_string(), "expired"),
                ("network:a".to_string(), "t9".to_string(), "revoked"),
                ("network:b".to_string(), String::new(), "revoked"),
            ]
        );
        assert!(ended(&now, &now).is_empty());
    }
}
