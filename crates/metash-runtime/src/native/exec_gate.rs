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

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use metash_protocol::AgentEvent;
use serde_json::json;

use crate::error::{Result, RuntimeError};
use crate::reply::Replier;
use crate::sink::{kinds, EventSink};
use crate::spec::{ActionGate, GateVerdict, GatedAction};

/// Bounds on what is read from the agent's memory per exec: the gate sees at most this much.
const MAX_PATH: usize = 4096;
const MAX_ARGS: usize = 256;
const MAX_ARG: usize = 4096;
const MAX_ARGV_BYTES: usize = 64 * 1024;
const PAGE: u64 = 4096;

const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
/// Offsets in `struct seccomp_data`.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// `execve`, `execveat`, and their x32 numbers (the x32 ABI shares the x86_64 audit arch, so a
/// filter that only knew the native numbers could be walked around where x32 is enabled).
#[cfg(target_arch = "x86_64")]
const EXEC_NRS: &[u32] = &[
    libc::SYS_execve as u32,
    libc::SYS_execveat as u32,
    0x4000_0000 | 520,
    0x4000_0000 | 545,
];
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;
#[cfg(target_arch = "aarch64")]
const EXEC_NRS: &[u32] = &[libc::SYS_execve as u32, libc::SYS_execveat as u32];

fn setup(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::SandboxSetup(format!("exec gate: {}", msg.into()))
}

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

/// The notify filter: kill on a foreign architecture (as the EPERM filter does), notify on the
/// exec syscalls, allow everything else (the EPERM filter decides those).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn notify_program() -> Vec<libc::sock_filter> {
    let n = EXEC_NRS.len();
    let mut p = vec![
        stmt(BPF_LD_W_ABS, ARCH_OFFSET),
        libc::sock_filter {
            code: BPF_JEQ_K,
            jt: 1,
            jf: 0,
            k: AUDIT_ARCH,
        },
        stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, NR_OFFSET),
    ];
    for (i, &nr) in EXEC_NRS.iter().enumerate() {
        // Jump over the remaining comparisons and the ALLOW to the USER_NOTIF return.
        p.push(libc::sock_filter {
            code: BPF_JEQ_K,
            jt: (n - i) as u8,
            jf: 0,
            k: nr,
        });
    }
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
    p.push(stmt(BPF_RET_K, libc::SECCOMP_RET_USER_NOTIF));
    p
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn notify_program() -> Vec<libc::sock_filter> {
    Vec::new()
}

/// `(major, minor)` of the running kernel.
fn kernel_version() -> Option<(u32, u32)> {
    // SAFETY: uname fills a zeroed, caller-owned struct.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a valid, writable utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return None;
    }
    let release: String = uts
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether this machine can gate execs: seccomp user notification (Linux 5.0) with
/// `SECCOMP_USER_NOTIF_FLAG_CONTINUE` (5.5), on x86_64 or aarch64. The error says what is missing;
/// the tests print it when they skip.
///
/// # Errors
/// The missing feature.
pub fn available() -> std::result::Result<(), String> {
    if notify_program().is_empty() {
        return Err(format!(
            "no exec filter for architecture {}",
            std::env::consts::ARCH
        ));
    }
    let action: u32 = libc::SECCOMP_RET_USER_NOTIF;
    // SAFETY: SECCOMP_GET_ACTION_AVAIL only reads the u32 it is given.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0u32,
            &action as *const u32,
        )
    };
    if rc != 0 {
        return Err(format!(
            "the kernel has no seccomp user notification (SECCOMP_RET_USER_NOTIF, Linux 5.0+): {}",
            io::Error::last_os_error()
        ));
    }
    match kernel_version() {
        Some(v) if v >= (5, 5) => Ok(()),
        Some((a, b)) => Err(format!(
            "Linux {a}.{b} has no SECCOMP_USER_NOTIF_FLAG_CONTINUE (5.5+)"
        )),
        None => Err("cannot read the kernel version (uname)".into()),
    }
}

/// The child's half, kept in the [`super::isolate::ChildPlan`]: the socket end it inherits and the
/// notify filter, both ready before the fork.
pub struct ChildSide {
    sock: OwnedFd,
    filter: Vec<libc::sock_filter>,
}

/// What the child sends: its pid and 0 with the listener attached, or the errno of the failed
/// listener creation (so the host can name the step; std passes only an errno back).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Handoff {
    pid: i32,
    errno: i32,
}

/// Room for one `SCM_RIGHTS` fd, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

impl ChildSide {
    /// Install the notify filter and hand its listener to the host. Only raw syscalls on data
    /// prepared before the fork; no allocation.
    ///
    /// # Safety
    /// Must only be called in the forked child, after `PR_SET_NO_NEW_PRIVS`.
    pub unsafe fn apply(&self) -> io::Result<()> {
        let prog = libc::sock_fprog {
            len: self.filter.len() as libc::c_ushort,
            filter: self.filter.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: seccomp(2) reads the program, which lives in `self` for the whole call.
        let listener = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
                &prog as *const libc::sock_fprog,
            )
        } as RawFd;
        // Read errno before any other call.
        let err = io::Error::last_os_error();
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        if listener < 0 {
            let msg = Handoff {
                pid,
                errno: err.raw_os_error().unwrap_or(libc::EINVAL),
            };
            // SAFETY: as below, without a control message; best effort, the spawn fails anyway.
            unsafe { self.send(&msg, None) };
            return Err(err);
        }
        let msg = Handoff { pid, errno: 0 };
        // SAFETY: `listener` is the fd seccomp just returned; closed right after the send (the
        // host holds its own copy from then on).
        let rc = unsafe { self.send(&msg, Some(listener)) };
        // SAFETY: closing our own fd.
        unsafe { libc::close(listener) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// One `sendmsg` of `msg` with `fd` attached. Stack buffers only.
    ///
    /// # Safety
    /// `fd`, when given, must be open.
    unsafe fn send(&self, msg: &Handoff, fd: Option<RawFd>) -> isize {
        let mut data = *msg;
        let mut iov = libc::iovec {
            iov_base: (&mut data as *mut Handoff).cast(),
            iov_len: std::mem::size_of::<Handoff>(),
        };
        let mut ctrl = CmsgBuf([0; 64]);
        // SAFETY: an all-zero msghdr is valid (no name, no control).
        let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        if let Some(fd) = fd {
            // SAFETY: CMSG_* are pointer arithmetic on `ctrl`, which is large enough (64 bytes
            // for one 4-byte fd) and aligned for cmsghdr; every write stays inside it.
            unsafe {
                let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32);
                hdr.msg_control = ctrl.0.as_mut_ptr().cast();
                hdr.msg_controllen = space as _;
                let cmsg = libc::CMSG_FIRSTHDR(&hdr);
                if cmsg.is_null() {
                    return -1;
                }
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
            }
        }
        // SAFETY: `hdr` points at live stack buffers; MSG_NOSIGNAL avoids SIGPIPE if the host's
        // end is gone (then the spawn fails: fail-closed).
        unsafe { libc::sendmsg(self.sock.as_raw_fd(), &hdr, libc::MSG_NOSIGNAL) }
    }
}

/// Who the supervisor asks and where it reports.
pub struct Cfg {
    pub agent: String,
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
                Received::Listener(l) => listeners.push(l),
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

enum Received {
    Listener(Listener),
    Failure(String),
    Nothing,
    Closed,
}

/// Read one handoff message from a child.
fn receive(host: &OwnedFd) -> Received {
    let mut data = Handoff::default();
    let mut iov = libc::iovec {
        iov_base: (&mut data as *mut Handoff).cast(),
        iov_len: std::mem::size_of::<Handoff>(),
    };
    let mut ctrl = CmsgBuf([0; 64]);
    // SAFETY: an all-zero msghdr is valid; the pointers set below are live for the call.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = ctrl.0.as_mut_ptr().cast();
    hdr.msg_controllen = ctrl.0.len() as _;
    // SAFETY: recvmsg into the buffers above; MSG_CMSG_CLOEXEC keeps received fds out of other
    // spawns.
    let n = unsafe { libc::recvmsg(host.as_raw_fd(), &mut hdr, libc::MSG_CMSG_CLOEXEC) };
    if n == 0 {
        return Received::Closed;
    }
    if n < 0 {
        return match io::Error::last_os_error().kind() {
            io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => Received::Nothing,
            _ => Received::Closed,
        };
    }
    let mut fd: Option<OwnedFd> = None;
    // SAFETY: walking the control messages the kernel wrote into `ctrl`, bounded by
    // `msg_controllen`; every SCM_RIGHTS fd is taken into an OwnedFd so none leaks.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&hdr);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let ptr = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for k in 0..bytes / std::mem::size_of::<RawFd>() {
                    let raw = std::ptr::read_unaligned(ptr.add(k));
                    let owned = OwnedFd::from_raw_fd(raw);
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&hdr, cmsg);
        }
    }
    if (n as usize) < std::mem::size_of::<Handoff>() {
        return Received::Nothing;
    }
    if data.errno != 0 {
        return Received::Failure(format!(
            "exec gate: the child could not create its seccomp listener \
             (seccomp SECCOMP_FILTER_FLAG_NEW_LISTENER): {}",
            io::Error::from_raw_os_error(data.errno)
        ));
    }
    match fd {
        Some(fd) => Received::Listener(Listener {
            fd,
            pid: data.pid,
            entry_seen: false,
        }),
        // Without its listener the child's exec fails with ENOSYS (fail-closed).
        None => Received::Failure("exec gate: the child's handoff carried no listener".into()),
    }
}

fn id_valid(fd: &OwnedFd, id: u64) -> bool {
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

/// An exec as the gate sees it.
struct Exec {
    program: String,
    argv: Vec<String>,
    /// The path as the agent gave it resolved to an absolute path the host could check.
    resolved: Option<PathBuf>,
}

enum Read {
    Exec(Exec),
    /// The target is gone or the notification no longer valid: nothing to answer.
    Gone,
    /// Its memory could not be read: refused (fail-closed).
    Unreadable(String),
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
        kinds::DENIED,
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

/// Read the exec's path and argv from the target's memory, checking (seccomp_unotify(2)) that the
/// notification is still valid after opening `/proc/<pid>/mem` (the pid was not recycled) and after
/// reading (what was read belongs to this request).
fn read_exec(fd: &OwnedFd, req: &libc::seccomp_notif) -> Read {
    let pid = req.pid;
    let mem = match File::open(format!("/proc/{pid}/mem")) {
        Ok(m) => m,
        Err(e) => {
            return if id_valid(fd, req.id) {
                Read::Unreadable(format!("/proc/{pid}/mem: {e}"))
            } else {
                Read::Gone
            }
        }
    };
    if !id_valid(fd, req.id) {
        return Read::Gone;
    }
    let args = req.data.args;
    let nr = req.data.nr as i64;
    let (dirfd, path_ptr, argv_ptr, empty_path_ok) =
        if nr == libc::SYS_execveat || nr == 0x4000_0000 | 545 {
            (
                args[0] as i32,
                args[1],
                args[2],
                args[4] & libc::AT_EMPTY_PATH as u64 != 0,
            )
        } else {
            (libc::AT_FDCWD, args[0], args[1], false)
        };
    let path = match read_cstr(&mem, path_ptr, MAX_PATH) {
        Ok((s, false)) => s,
        Ok((_, true)) => return Read::Unreadable("path longer than PATH_MAX".into()),
        Err(e) => return Read::Unreadable(format!("path: {e}")),
    };
    let argv = read_argv(&mem, argv_ptr);
    if !id_valid(fd, req.id) {
        return Read::Gone;
    }
    let base = |fd: i32| -> Option<PathBuf> {
        let link = if fd == libc::AT_FDCWD {
            format!("/proc/{pid}/cwd")
        } else {
            format!("/proc/{pid}/fd/{fd}")
        };
        std::fs::read_link(link).ok()
    };
    let (program, resolved) = if path.starts_with('/') {
        (path.clone(), Some(PathBuf::from(&path)))
    } else if path.is_empty() && empty_path_ok {
        // fexecve: the program is whatever the fd points to.
        let p = base(dirfd).map(|p| p.display().to_string());
        (p.unwrap_or_else(|| format!("<fd {dirfd}>")), None)
    } else {
        match base(dirfd) {
            Some(b) => {
                let full = b.join(&path);
                (full.display().to_string(), Some(full))
            }
            None => (path.clone(), None),
        }
    };
    Read::Exec(Exec {
        program,
        argv,
        resolved: resolved.filter(|p| Path::is_absolute(p)),
    })
}

/// A NUL-terminated string at `addr`, at most `max` bytes; `true` when it was cut. Reads page by
/// page so a string that ends just before an unmapped page is still read.
fn read_cstr(mem: &File, addr: u64, max: usize) -> io::Result<(String, bool)> {
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < max {
        let chunk = ((PAGE - at % PAGE) as usize).min(max - out.len());
        let mut buf = vec![0u8; chunk];
        let n = mem.read_at(&mut buf, at)?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        if let Some(end) = buf[..n].iter().position(|&b| b == 0) {
            out.extend_from_slice(&buf[..end]);
            return Ok((String::from_utf8_lossy(&out).into_owned(), false));
        }
        out.extend_from_slice(&buf[..n]);
        at += n as u64;
    }
    Ok((String::from_utf8_lossy(&out).into_owned(), true))
}

/// The argv array, best effort and bounded: what cannot be read is marked, not guessed.
fn read_argv(mem: &File, addr: u64) -> Vec<String> {
    let mut argv = Vec::new();
    if addr == 0 {
        return argv;
    }
    let mut total = 0usize;
    for i in 0..MAX_ARGS {
        let mut word = [0u8; 8];
        match mem.read_at(&mut word, addr + 8 * i as u64) {
            Ok(8) => {}
            _ => {
                argv.push("<unreadable>".into());
                return argv;
            }
        }
        let ptr = u64::from_ne_bytes(word);
        if ptr == 0 {
            return argv;
        }
        let room = MAX_ARG.min(MAX_ARGV_BYTES.saturating_sub(total));
        if room == 0 {
            argv.push("<truncated>".into());
            return argv;
        }
        match read_cstr(mem, ptr, room) {
            Ok((s, cut)) => {
                total += s.len();
                argv.push(if cut { format!("{s}<truncated>") } else { s });
            }
            Err(_) => {
                argv.push("<unreadable>".into());
                return argv;
            }
        }
    }
    argv.push("<truncated>".into());
    argv
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run the classic-BPF subset the notify filter uses on one `seccomp_data`.
    fn eval(prog: &[libc::sock_filter], nr: u32, arch: u32) -> u32 {
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let ins = prog[pc];
            pc += 1;
            match ins.code {
                BPF_LD_W_ABS => acc = if ins.k == ARCH_OFFSET { arch } else { nr },
                BPF_JEQ_K => {
                    pc += if acc == ins.k {
                        ins.jt as usize
                    } else {
                        ins.jf as usize
                    }
                }
                BPF_RET_K => return ins.k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn notify_filter_traps_exec_only() {
        let p = notify_program();
        for &nr in EXEC_NRS {
            assert_eq!(eval(&p, nr, AUDIT_ARCH), libc::SECCOMP_RET_USER_NOTIF);
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_openat,
            libc::SYS_clone,
            libc::SYS_exit,
        ] {
            assert_eq!(eval(&p, nr as u32, AUDIT_ARCH), libc::SECCOMP_RET_ALLOW);
        }
        assert_eq!(
            eval(&p, libc::SYS_execve as u32, 0x4000_0003),
            libc::SECCOMP_RET_KILL_PROCESS
        );
    }

    #[test]
    fn reads_strings_across_pages() {
        let f = tempfile::tempfile().unwrap();
        let mut data = vec![b'a'; 5000];
        data.push(0);
        f.write_all_at(&data, 0).unwrap();
        // Starts mid-page, ends on the next one.
        let (s, cut) = read_cstr(&f, 100, 8192).unwrap();
        assert_eq!((s.len(), cut), (4900, false));
        let (s, cut) = read_cstr(&f, 0, MAX_PATH).unwrap();
        assert_eq!((s.len(), cut), (MAX_PATH, true));
        let (s, cut) = read_cstr(&f, 0, 10).unwrap();
        assert_eq!((s.as_str(), cut), ("aaaaaaaaaa", true));
    }
}
