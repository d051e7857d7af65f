//! Per-action consent for starting processes in the native sandbox (docs/policy.md, "Sensitive
//! actions"): with a live [`ActionGate`] in the spec, every `execve`/`execveat` of the agent and of
//! its descendants waits until the host's gate decided.
//!
//! How: the child installs, after the EPERM filter, a second seccomp filter that returns
//! `SECCOMP_RET_USER_NOTIF` for the exec syscalls and `ALLOW` for everything else (with several
//! filters the kernel takes the strongest action, and `ERRNO` outranks `USER_NOTIF`, so the EPERM
//! rules stay intact). Installing it with `SECCOMP_FILTER_FLAG_NEW_LISTENER` yields a listener fd in
//! the child, which hands it to the host over a socketpair (`SCM_RIGHTS`) and closes its copy before
//! exec: the agent never holds the fd that answers for it. A supervisor thread per sandbox receives
//! the listeners, lets the child's own exec of the entry through, and for every later exec reads
//! the path and argv from `/proc/<pid>/mem`, asks the gate, and answers "continue" or `EPERM`.
//!
//! This is a consent prompt, not a security boundary: `SECCOMP_USER_NOTIF_FLAG_CONTINUE` lets the
//! kernel re-read the syscall's pointer arguments after the host looked at them, so another thread
//! of the agent can swap the path in between (seccomp_unotify(2), "Caveats"). Landlock stays the
//! boundary for what may be executed at all (only the system directories, the entry, and the
//! workspace when granted).

mod filter;
mod handoff;
mod memory;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_protocol::AgentEvent;
use serde_json::json;

pub use filter::available;
pub use handoff::ChildSide;

use crate::error::{Result, RuntimeError};
use crate::reply::Replier;
use crate::sink::EventSink;
use crate::spec::{ActionGate, GateVerdict, GatedAction};
use filter::notify_program;
use handoff::{receive, Received};
use memory::{read_exec, Read};

fn setup(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::SandboxSetup(format!("exec gate: {}", msg.into()))
}

/// Who the supervisor asks and where it reports.
pub struct Cfg {
    pub agent: String,
    /// The entry's `#!` interpreter (canonical): the entry's own process may exec it once, right
    /// after the entry (`#!/usr/bin/env node` is `env` starting `node`), without asking.
    pub interpreter: Option<std::path::PathBuf>,
    pub gate: Arc<dyn ActionGate>,
    pub sink: Arc<dyn EventSink>,
    pub replier: Replier,
}

/// State shared between the supervisor thread and the sandbox.
#[derive(Default)]
struct Shared {
    running: AtomicBool,
    /// A child reported that it could not create its listener.
    child_failure: Mutex<Option<String>>,
}

/// The host's half: a handle on the supervisor thread. The thread stops by itself once the
/// sandbox (and every `Command` built from it) is gone: the socket's child end then closes and the
/// thread sees the hang-up. Dropping this never waits for the thread, so a gate that is still
/// asking someone cannot hang the host; its late answer finds the notification gone.
pub struct Supervisor {
    shared: Arc<Shared>,
}

impl Supervisor {
    /// Check the kernel, create the socketpair and the notify filter, and start the supervisor
    /// thread (before any spawn: the child's own exec is trapped and must be answered while
    /// `Command::spawn` still waits for it).
    ///
    /// # Errors
    /// [`RuntimeError::SandboxSetup`] naming what is missing (fail-closed: the agent is not
    /// started without its gate).
    pub fn start(cfg: Cfg) -> Result<(Self, ChildSide)> {
        available().map_err(setup)?;
        let mut fds = [-1; 2];
        // SAFETY: socketpair fills the two-element array.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(setup(format!("socketpair: {}", io::Error::last_os_error())));
        }
        // SAFETY: both fds were just created and are owned by nobody else.
        let (host, child) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // The child's pid as the host sees it comes with each message (SCM_CREDENTIALS, which the
        // kernel translates): in its own PID namespace, the child's getpid() is not that pid.
        let on: libc::c_int = 1;
        // SAFETY: setsockopt reads the int for the call.
        let rc = unsafe {
            libc::setsockopt(
                host.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(setup(format!(
                "SO_PASSCRED: {}",
                io::Error::last_os_error()
            )));
        }
        let shared = Arc::new(Shared::default());
        shared.running.store(true, Ordering::SeqCst);
        let thread_shared = Arc::clone(&shared);
        thread::Builder::new()
            .name(format!("metash-exec-gate-{}", cfg.agent))
            .spawn(move || {
                supervise(&host, &cfg, &thread_shared);
                thread_shared.running.store(false, Ordering::SeqCst);
            })
            .map_err(|e| setup(format!("starting the supervisor thread: {e}")))?;
        Ok((
            Self { shared },
            ChildSide {
                sock: child,
                filter: notify_program(),
            },
        ))
    }

    /// Why a spawn failed, when the exec gate knows: a child reported that its listener could not
    /// be created (waits up to `within` for that report), or the supervisor is gone.
    pub fn spawn_failure(&self, within: Duration) -> Option<String> {
        let start = Instant::now();
        loop {
            if let Some(f) = self
                .shared
                .child_failure
                .lock()
                .ok()
                .and_then(|g| g.clone())
            {
                return Some(f);
            }
            if !self.shared.running.load(Ordering::SeqCst) {
                return Some("exec gate: the supervisor is not running".into());
            }
            if start.elapsed() >= within {
                return None;
            }
            thread::sleep(Duration::from_millis(2));
        }
    }
}

/// One filter's listener and the child that created it.
struct Listener {
    fd: OwnedFd,
    pid: i32,
    /// The first notification is the child's own exec of the agent entry.
    entry_seen: bool,
    /// The entry's interpreter may still be started by the entry's process (once).
    interpreter_pending: bool,
}

/// The supervisor loop: receive listeners, answer their notifications, drop each when no process
/// uses its filter any more (`POLLHUP`), stop when the sandbox's socket end is closed.
fn supervise(host: &OwnedFd, cfg: &Cfg, shared: &Shared) {
    let mut listeners: Vec<Listener> = Vec::new();
    loop {
        let mut pfds: Vec<libc::pollfd> = std::iter::once(host.as_raw_fd())
            .chain(listeners.iter().map(|l| l.fd.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `pfds` is a live array of `pfds.len()` pollfds.
        let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, -1) };
        if rc < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        let hup = libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
        for i in (0..listeners.len()).rev() {
            let re = pfds[i + 1].revents;
            if re & libc::POLLIN != 0 {
                serve_one(&mut listeners[i], cfg);
            } else if re & hup != 0 {
                listeners.swap_remove(i);
            }
        }
        let re = pfds[0].revents;
        if re & libc::POLLIN != 0 {
            match receive(host) {
                Received::Listener { fd, pid } => listeners.push(Listener {
                    fd,
                    pid,
                    entry_seen: false,
                    interpreter_pending: cfg.interpreter.is_some(),
                }),
                Received::Failure(msg) => {
                    if let Ok(mut g) = shared.child_failure.lock() {
                        *g = Some(msg);
                    }
                }
                Received::Nothing => {}
                Received::Closed => return,
            }
        } else if re & hup != 0 {
            return;
        }
    }
}

pub(super) fn id_valid(fd: &OwnedFd, id: u64) -> bool {
    // SAFETY: the ioctl reads the u64 it is given.
    unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID as _,
            &id as *const u64,
        ) == 0
    }
}

/// Answer notification `id`: let the syscall run (`errno == 0`) or fail it with `-errno`.
fn respond(fd: &OwnedFd, id: u64, errno: i32) {
    let resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: -errno,
        flags: if errno == 0 {
            libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32
        } else {
            0
        },
    };
    // SAFETY: the ioctl reads the response struct. A failure means the target is gone (killed,
    // interrupted): nothing to answer any more.
    unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND as _,
            &resp as *const libc::seccomp_notif_resp,
        );
    }
}

/// Handle one pending notification.
fn serve_one(l: &mut Listener, cfg: &Cfg) {
    // SAFETY: the kernel requires a zeroed seccomp_notif.
    let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: NOTIF_RECV fills `req`.
    let rc = unsafe {
        libc::ioctl(
            l.fd.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV as _,
            &mut req as *mut libc::seccomp_notif,
        )
    };
    if rc != 0 {
        // ENOENT: the target died or was interrupted between poll and receive.
        return;
    }
    if !l.entry_seen {
        l.entry_seen = true;
        // Only the forked child runs under a fresh filter before its exec: this is the agent
        // itself starting, which the user already consented to.
        if req.pid as i32 == l.pid {
            respond(&l.fd, req.id, 0);
            return;
        }
    }
    let exec = match read_exec(&l.fd, &req) {
        Read::Exec(e) => e,
        Read::Gone => return,
        Read::Unreadable(why) => {
            deny(
                l,
                cfg,
                &req,
                "<unreadable>",
                "exec_gate_unreadable",
                &format!("the host could not read what the process asked to run: {why}"),
                None,
            );
            return;
        }
    };
    if let Some(p) = &exec.resolved {
        // A PATH search tries several candidates: do not ask about files that do not exist, the
        // kernel would refuse them with ENOENT anyway.
        if matches!(std::fs::metadata(p), Err(e) if e.kind() == io::ErrorKind::NotFound) {
            respond(&l.fd, req.id, libc::ENOENT);
            return;
        }
    }
    // Only the entry process's very next exec can be its `env` starting the interpreter.
    if l.interpreter_pending && req.pid as i32 == l.pid {
        l.interpreter_pending = false;
        let asked = exec.resolved.as_deref().and_then(|p| p.canonicalize().ok());
        if asked.is_some() && asked == cfg.interpreter {
            respond(&l.fd, req.id, 0);
            return;
        }
    }
    let action = GatedAction::Exec {
        program: &exec.program,
        argv: &exec.argv,
    };
    let verdict = catch_unwind(AssertUnwindSafe(|| cfg.gate.decide(&cfg.agent, &action)))
        .unwrap_or_else(|_| GateVerdict::Deny {
            code: "exec_gate_failed".into(),
            message: "the consent gate failed while deciding".into(),
            hint: None,
        });
    match verdict {
        GateVerdict::Allow => respond(&l.fd, req.id, 0),
        GateVerdict::Deny {
            code,
            message,
            hint,
        } => deny(l, cfg, &req, &exec.program, &code, &message, hint),
    }
}

/// Refuse with `EPERM`: log it and tell the agent (first, so the explanation is on its stdin by
/// the time its exec returns). Nothing is logged when the target is already gone (a late answer
/// after a timeout).
fn deny(
    l: &Listener,
    cfg: &Cfg,
    req: &libc::seccomp_notif,
    program: &str,
    code: &str,
    message: &str,
    hint: Option<String>,
) {
    if !id_valid(&l.fd, req.id) {
        return;
    }
    cfg.sink.record(
        LogKind::SandboxDenied,
        Some(&cfg.agent),
        json!({"what": "exec", "program": program, "code": code, "reason": message,
               "pid": req.pid, "via": "seccomp-user-notif"}),
    );
    cfg.replier.send(AgentEvent::Error {
        code: code.to_string(),
        message: format!("starting {program} refused: {message}"),
        hint,
    });
    respond(&l.fd, req.id, libc::EPERM);
}
