//! What the connection's parts share: the editor's end of the connection (writing lines,
//! sending requests and waiting for their answers), a session, and its cancel switch. Below
//! [`super::server`], [`super::prompt`] and [`super::follow`], so none of them import another's
//! internals in a circle.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, PoisonError};

use metash_harness::acp::wire::{self, agent, method, RpcError};
use serde_json::Value;

/// What every prompt needs: the metash to run and the consent arguments it passes on.
#[derive(Debug, Clone)]
pub(super) struct Config {
    pub exe: PathBuf,
    /// `--yes-to` and `--policy` as `metash acp` got them, for each `metash run`.
    pub run_args: Vec<String>,
}

/// The editor's end of the connection, shared by the threads that write to it.
pub(super) struct Conn {
    out: Mutex<std::io::Stdout>,
    next_id: AtomicU64,
    waiting: Mutex<HashMap<u64, Sender<Result<Value, RpcError>>>>,
    /// The editor offered `fs/read_text_file` in `initialize`.
    pub fs_read: AtomicBool,
}

impl Conn {
    pub fn new() -> Self {
        Self {
            out: Mutex::new(std::io::stdout()),
            next_id: AtomicU64::new(1),
            waiting: Mutex::new(HashMap::new()),
            fs_read: AtomicBool::new(false),
        }
    }

    /// Writes one line; a closed stdout (the editor went away) is ignored here: the reader sees
    /// the end of stdin and stops everything.
    pub fn send(&self, line: &str) {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    /// A `session/update` notification.
    pub fn update(&self, session_id: &str, update: Value) {
        self.send(&wire::notification(
            method::SESSION_UPDATE,
            &agent::update(session_id, update),
        ));
    }

    /// Sends a request to the editor and waits for its answer (an error when the connection
    /// closes first).
    pub fn request(&self, method: &str, params: &Value) -> Result<Value, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = channel();
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, tx);
        self.send(&wire::request(id, method, params));
        rx.recv().unwrap_or_else(|_| {
            Err(RpcError {
                code: wire::INTERNAL_ERROR,
                message: "the editor closed the connection".into(),
                data: None,
            })
        })
    }

    pub fn answered(&self, id: &Value, result: Result<Value, RpcError>) {
        let Some(id) = id.as_u64() else { return };
        let tx = self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        if let Some(tx) = tx {
            let _ = tx.send(result);
        }
    }

    /// Fails every request still waiting (the connection is closing).
    pub fn drop_waiting(&self) {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// One editor session: a metash project.
pub(super) struct Session {
    pub id: String,
    pub cwd: PathBuf,
    pub cancel: Arc<Cancel>,
    /// A prompt is running (ACP allows one at a time per session).
    pub busy: AtomicBool,
    /// What a prompt does (`session/set_mode`); a change applies from the next prompt.
    pub mode: Mutex<Mode>,
}

impl Session {
    pub fn mode(&self) -> Mode {
        *self.mode.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.mode.lock().unwrap_or_else(PoisonError::into_inner) = mode;
    }
}

/// The session modes an editor can pick (docs/acp.md, "metash as an editor's agent").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Mode {
    /// A prompt is one task: one executor turn in a fresh worktree, verified and merged.
    #[default]
    Turn,
    /// A prompt runs the project's whole loop (plan, execute, verify) from its context.
    Run,
}

impl Mode {
    pub const ALL: [Mode; 2] = [Mode::Turn, Mode::Run];

    /// The mode's ACP description (`SessionMode`).
    pub fn describe(self) -> agent::Mode {
        match self {
            Mode::Turn => agent::Mode {
                id: "turn",
                name: "Turn",
                description: "The prompt is one task: one turn of the executor role in a fresh \
                              task worktree, verified and merged like any task",
            },
            Mode::Run => agent::Mode {
                id: "run",
                name: "Run",
                description: "Plan, execute and verify the project from .meta/context.md until \
                              it is complete, a checkpoint needs an answer, or the run halts",
            },
        }
    }

    pub fn from_id(id: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.describe().id == id)
    }
}

/// A session's cancel switch: set by `session/cancel`, obeyed by the running child.
#[derive(Debug, Default)]
pub(crate) struct Cancel {
    flag: AtomicBool,
    child: Mutex<Option<u32>>,
}

impl Cancel {
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
        if let Some(pid) = *self.child.lock().unwrap_or_else(PoisonError::into_inner) {
            stop_group(pid);
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    pub fn reset(&self) {
        self.flag.store(false, Ordering::SeqCst);
    }

    pub fn set_child(&self, pid: Option<u32>) {
        *self.child.lock().unwrap_or_else(PoisonError::into_inner) = pid;
        if pid.is_some() && self.is_cancelled() {
            self.cancel();
        }
    }
}

/// Ends the run's process group (the run and every agent it started that did not leave it).
#[cfg(unix)]
fn stop_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) on our own child's process group; no memory is involved.
        unsafe {
            libc::kill(-pid, libc::SIGTERM);
        }
    }
}

/// Windows has no process groups to signal: the run's process tree is ended by `taskkill /T`.
#[cfg(not(unix))]
fn stop_group(pid: u32) {
    let _ = std::process::Command::new("taskkill")
        .args(["/T", "/F", "/PID", &pid.to_string()])
        .status();
}
