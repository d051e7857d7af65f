//! Whether a CP session still runs (issue 35): a record saying `running` or `detached` is
//! checked before it is believed. Its process is identified by pid, start time and the kernel's
//! boot id (a reboot or a reused pid is never taken for it) and must still be the process in its
//! tmux window's pane; otherwise the session is recorded `exited`, with why. The CLI
//! (`metash sessions`, `session attach|resume|end`) and `metash ui` read sessions through
//! [`reconcile`].

use std::path::PathBuf;
use std::time::Duration;

use metash_harness::tmux::Tmux;
use metash_store::cp_sessions::{CpSession, ProcessRef, SessionEvent, SessionStatus};
use metash_store::Store;

use crate::error::Result;

/// A session whose process is not yet recorded (its window is being opened) is given this long
/// before it counts as dead.
const OPENING_GRACE: Duration = Duration::from_secs(20);

/// The kernel's boot id (a new one after every reboot).
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// A process's start time in clock ticks since boot, and whether it is a zombie.
fn proc_stat(pid: u32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(PathBuf::from(format!("/proc/{pid}/stat"))).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields after its last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = *fields.first()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((start, state == "Z" || state == "X"))
}

/// The process `pid` as it is now, identified for later liveness checks.
pub fn process_ref(pid: u32) -> ProcessRef {
    ProcessRef {
        pid,
        start_ticks: proc_stat(pid).map(|(t, _)| t),
        boot_id: boot_id(),
    }
}

/// Whether the process recorded is still the one running (same boot, same start time, not a
/// zombie).
pub fn is_alive(p: &ProcessRef) -> bool {
    if p.boot_id.is_some() && p.boot_id != boot_id() {
        return false;
    }
    match proc_stat(p.pid) {
        Some((start, zombie)) => !zombie && p.start_ticks.is_none_or(|t| t == start),
        None => false,
    }
}

/// Why a record claiming a live process is wrong, if it is.
fn dead_because(s: &CpSession) -> Option<String> {
    let Some(p) = &s.process else {
        let age = chrono::Utc::now() - s.updated_at;
        return (age.to_std().unwrap_or_default() > OPENING_GRACE)
            .then(|| "its window never reported a process".to_string());
    };
    if !is_alive(p) {
        return Some(format!(
            "its process {} is gone (killed, or the machine restarted)",
            p.pid
        ));
    }
    let term = s.terminal.as_ref()?;
    let window = term.window_id.as_deref()?;
    let tmux = Tmux {
        socket: term.socket.clone(),
    };
    match tmux.pane_pid(window) {
        Some(pid) if pid == p.pid => None,
        _ => Some(format!("its tmux window {} is gone", term.target)),
    }
}

/// Every session, with those whose process is gone marked `exited` (recorded, with why).
///
/// # Errors
/// The store cannot be read or written.
pub fn reconcile(store: &Store) -> Result<Vec<CpSession>> {
    let mut out = Vec::new();
    for s in store.cp_sessions().list()? {
        let why = s.status.is_live().then(|| dead_because(&s)).flatten();
        let Some(why) = why else {
            out.push(s);
            continue;
        };
        let updated = store.cp_sessions().update(&s.id, SessionEvent::Exit, |r| {
            // Re-checked under the lock: the launcher may have recorded its exit meanwhile.
            if r.status.is_live() {
                r.status = SessionStatus::Exited;
                r.error = Some(why.clone());
            }
            Ok(())
        })?;
        out.push(updated);
    }
    Ok(out)
}

/// Waits (bounded) for a session's process to end.
pub fn wait_gone(p: Option<&ProcessRef>, within: Duration) {
    let Some(p) = p else { return };
    let deadline = std::time::Instant::now() + within;
    while is_alive(p) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn this_process_is_alive_and_a_changed_identity_is_not() {
        let me = process_ref(std::process::id());
        assert!(me.start_ticks.is_some());
        assert!(is_alive(&me));
        let mut other_boot = me.clone();
        other_boot.boot_id = Some("another-boot".into());
        assert!(
            !is_alive(&other_boot),
            "a reboot makes every pid someone else's"
        );
        let mut reused = me.clone();
        reused.start_ticks = me.start_ticks.map(|t| t + 1);
        assert!(!is_alive(&reused), "a reused pid is another process");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = process_ref(child.id());
        child.wait().unwrap();
        assert!(!is_alive(&gone));
    }
}
