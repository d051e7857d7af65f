//! Starting a native agent without copying the host: `clone(CLONE_VM)` onto a stack of its own,
//! as `posix_spawn` does, instead of `fork`.
//!
//! A `fork` copies the host's page tables, every page either side writes afterwards is copied
//! again, and the copy is torn down when its last user exits: on a virtual machine, where each
//! page-table change is a trip to the hypervisor, that was a third of a sandboxed spawn. Here the
//! child (P) runs in the host's own memory, on a stack mapped for it, while the spawning thread
//! waits on the exec-status pipe. The `clone` also makes the namespaces: P is the PID
//! namespace's init from its first instruction (no waiter outside it, unlike a confined CLI's
//! tree, see [`super::pidns`]). P applies the sandbox ([`super::isolate::ChildPlan`]), splits off
//! the program's process (R, pid 2) the same way ([`super::shim`]) and stays as the init; R
//! execs, which gives it memory of its own.
//!
//! What that asks of the code, and how it is met:
//! - **Nothing the host reads is written.** Until R has exec'd, the spawning thread is blocked,
//!   so the child may use its thread-local state (`errno`, malloc's cache) as a forked child uses
//!   its copy. Afterwards P keeps running in the host's memory, on its own stack, making only raw
//!   system calls ([`super::raw`]).
//! - **Signals.** Every signal is blocked around the `clone`; the child sets every disposition to
//!   the default before it unblocks any, so no host handler ever runs in it (tested: a handler
//!   the host installed does not run when P gets its signal).
//! - **Namespaces.** A process sharing its memory cannot `unshare` a user namespace, so when one
//!   is needed (metash is not root) the `clone` itself makes it, with the mount and PID
//!   namespaces.
//! - **The stacks** are reused or unmapped only when nothing runs on them any more: when P has
//!   exited (its pidfd says so; R has exec'd or died before that), on the spawner's keeper
//!   thread ([`super::spawner`]).
//! - **Memory limits.** Only R joins the agent's cgroups (P writes R's pid to them while R
//!   applies the rest; R waits for that before it execs): a memory cgroup's OOM killer picks by
//!   resident size, P's is the host's, and killing P kills every process sharing its memory, the
//!   host included (tested: with P in the cgroup, the OOM killer killed the test process).
//! - **The program's end** comes from P before P's own exit: P writes R's wait status to a pipe
//!   the host reads ([`Spawned::wait`]), then exits; the keeper reaps P.
//! - **What a failed step said** comes back whole: the child writes its error's code and message
//!   to the exec-status pipe (std's `Command` passes only an errno).
//!
//! Elsewhere than x86_64 the shims' stack switch does not exist ([`super::shim`]), so the same
//! code runs with a plain copy (no `CLONE_VM`).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::fds;
use super::isolate::ChildPlan;
use super::raw;
use super::shim::{Shared, Stack, GUARD, STACK_LEN};

/// P's stack, which R inherits: the sandbox's steps and std's error formatting run on it, in a
/// debug build too. Mapped lazily.
const MAIN_LEN: usize = 512 * 1024;
/// The most of a failed step's message that comes back (one atomic pipe write).
const REPORT_MAX: usize = 4000;

/// What a standard stream of the agent is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildIo {
    /// `/dev/null`.
    Null,
    /// A pipe whose other end the host gets ([`Spawned`]).
    Piped,
}

/// Everything the child needs, owned, so the spawner thread can run it.
pub(super) struct Request {
    pub program: CString,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub cwd: CString,
    pub plan: Arc<ChildPlan>,
    /// The disk watcher's pid pipe ([`super::disk_quota::DiskWatch`]): the host writes the
    /// child's pid (the process group's id) there as soon as it has one.
    pub announce: Option<RawFd>,
    pub io: [ChildIo; 3],
}

/// A started agent: its pid (P, the process group's leader) and the host's ends of its pipes.
#[derive(Debug)]
pub struct Spawned {
    pid: libc::pid_t,
    /// P's pidfd: every wait names P itself ([`reap_pidfd`]).
    pidfd: OwnedFd,
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    status: Option<ExitStatus>,
    /// Whether P has been reaped (by this handle).
    reaped: bool,
    /// When P is the PID namespace's init: the pipe it writes the program's wait status to, then
    /// exits. The program's end is known from it without waiting for the init's own exit, which
    /// the spawner's keeper reaps when this handle is gone ([`Spawned::drop`]).
    program_status: Option<File>,
    keeper_reaps: Arc<AtomicBool>,
}

impl Spawned {
    /// P's pid, which is also the process group's id.
    pub fn id(&self) -> u32 {
        self.pid.unsigned_abs()
    }

    /// Waits for the program to end: its wait status (the program's own, which the
    /// namespace's init reports, or P's when P ended first).
    ///
    /// # Errors
    /// `waitpid` or the status pipe's read failed other than by a signal's interruption.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(s) = self.status {
            return Ok(s);
        }
        if let Some(st) = self.read_program_status(true)? {
            return Ok(self.ended(st));
        }
        let st = self.reap(0)?.unwrap_or(0);
        Ok(self.ended(st))
    }

    /// The status if the program has ended, `None` if it runs.
    ///
    /// # Errors
    /// As [`Spawned::wait`].
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        if let Some(st) = self.read_program_status(false)? {
            return Ok(Some(self.ended(st)));
        }
        Ok(self.reap(libc::WNOHANG)?.map(|st| {
            // P is gone: whatever the init wrote before it is in the pipe by now.
            let st = self.read_program_status(false).ok().flatten().unwrap_or(st);
            self.ended(st)
        }))
    }

    fn ended(&mut self, st: i32) -> ExitStatus {
        let s = ExitStatus::from_raw(st);
        self.status = Some(s);
        s
    }

    /// The program's wait status from the init's pipe: `None` when there is none (no pipe, the
    /// init ended without writing, or, not `blocking`, nothing yet).
    fn read_program_status(&mut self, blocking: bool) -> io::Result<Option<i32>> {
        let Some(pipe) = &self.program_status else {
            return Ok(None);
        };
        let fd = pipe.as_raw_fd();
        if !blocking {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll(2) on one live pollfd, no timeout.
            if unsafe { libc::poll(&mut pfd, 1, 0) } <= 0 {
                return Ok(None);
            }
        }
        let mut word = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            // SAFETY: read(2) into the rest of a live local buffer.
            let n = unsafe { libc::read(fd, word[got..].as_mut_ptr().cast(), 4 - got) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                // The init is gone without a word: its own status stands (see `reap`).
                self.program_status = None;
                return Ok(None);
            }
            got += n as usize;
        }
        self.program_status = None;
        Ok(Some(i32::from_ne_bytes(word)))
    }

    /// Reaps P: its raw wait status, `None` with `WNOHANG` while it runs.
    fn reap(&mut self, options: i32) -> io::Result<Option<i32>> {
        let st = reap_pidfd(self.pidfd.as_raw_fd(), options)?;
        self.reaped |= st.is_some();
        Ok(st)
    }
}

/// Reaps the child `pidfd` refers to (`waitid(P_PIDFD)`: that process and no other, even if its
/// number has been reused since): its status as `waitpid` would give it, `None` with `WNOHANG`
/// while it runs.
///
/// # Errors
/// `waitid` failed other than by a signal's interruption (`ECHILD`: reaped already).
pub(super) fn reap_pidfd(pidfd: RawFd, options: i32) -> io::Result<Option<i32>> {
    loop {
        // SAFETY: a zeroed siginfo is a valid out-parameter.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid(2) on a live pidfd of our own child, into a live siginfo.
        let rc = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                pidfd as libc::id_t,
                &mut info,
                libc::WEXITED | options,
            )
        };
        if rc == 0 {
            // SAFETY: filled in by waitid for a child that changed state; zero when none did.
            let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
            if pid == 0 {
                return Ok(None);
            }
            return Ok(Some(match info.si_code {
                libc::CLD_EXITED => (status & 0xff) << 8,
                libc::CLD_DUMPED => (status & 0x7f) | 0x80,
                _ => status & 0x7f,
            }));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl Drop for Spawned {
    /// P not reaped yet (the program's status came from the pipe, or nobody waited): the keeper
    /// reaps it when it has exited; if it already has, it is reaped here. Both orders are
    /// covered: the keeper reads the flag after P's exit, this reaps after setting it.
    fn drop(&mut self) {
        if !self.reaped {
            self.keeper_reaps.store(true, Ordering::SeqCst);
            let _ = self.reap(libc::WNOHANG);
        }
    }
}

/// The mapping holding the two stacks: P's (which R inherits when P splits it off) and the one P
/// moves to as the namespace's init. Pooled or unmapped when dropped (by the spawner's keeper,
/// once nothing runs on it).
pub(super) struct Stacks {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: a mapping's address and length, unmapped exactly once (in `drop`); nothing is read
// through it in this process.
unsafe impl Send for Stacks {}

/// Stacks whose trees are gone, kept for the next spawns: their pages are mapped already (a
/// fresh stack faults a page in at each first touch), and no `munmap` makes every CPU running a
/// host thread flush its TLB.
static POOL: Mutex<Vec<Stacks>> = Mutex::new(Vec::new());
/// At most this many are kept (each holds only the pages its spawn touched).
const POOLED: usize = 8;

impl Stacks {
    /// Stacks from the pool, or a new mapping.
    fn take() -> io::Result<Self> {
        if let Some(s) = POOL.lock().ok().and_then(|mut p| p.pop()) {
            return Ok(s);
        }
        Self::map()
    }

    fn map() -> io::Result<Self> {
        let len = MAIN_LEN + STACK_LEN;
        // SAFETY: an anonymous private mapping; the lowest page of each of its two stacks is
        // made inaccessible so an overflow faults.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let stacks = Self { base, len };
            for at in [0, MAIN_LEN] {
                libc::mprotect(base.cast::<u8>().add(at).cast(), GUARD, libc::PROT_NONE);
            }
            Ok(stacks)
        }
    }

    fn at(&self, offset: usize, len: usize) -> Stack {
        Stack {
            // SAFETY: within the mapping.
            base: unsafe { self.base.cast::<u8>().add(offset) },
            len,
        }
    }

    /// The top of P's stack, 16-byte aligned.
    fn main_top(&self) -> *mut libc::c_void {
        self.at(0, MAIN_LEN).top()
    }
}

impl Stack {
    fn top(&self) -> *mut libc::c_void {
        ((self.base as usize + self.len) & !15) as *mut libc::c_void
    }
}

impl Drop for Stacks {
    /// Back to the pool, or unmapped. Either way nothing runs on it any more (see the module).
    fn drop(&mut self) {
        if self.base.is_null() {
            return;
        }
        if let Ok(mut pool) = POOL.lock() {
            if pool.len() < POOLED {
                pool.push(Stacks {
                    base: std::mem::replace(&mut self.base, std::ptr::null_mut()),
                    len: self.len,
                });
                return;
            }
        }
        // SAFETY: our own mapping, unmapped once.
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

/// What the spawner's keeper holds until P has exited: the stacks (P, the namespace's init, runs
/// on one of them until then) and whether it is the keeper's to reap P.
pub(super) struct Tree {
    pub stacks: Stacks,
    pub keeper_reaps: Arc<AtomicBool>,
}

/// What the child reads: pointers into the request and the fds, all live until it has exec'd.
struct Ctx {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    plan: *const ChildPlan,
    stdio: [RawFd; 3],
    report: RawFd,
    shared: Shared,
}

/// `fd` moved to 3 or above (close-on-exec), so the child's `dup2` onto 0–2 never overwrites
/// another of its streams.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on a live descriptor; the new one is owned once.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just returned by fcntl.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// `/dev/null`, opened once (close-on-exec, above the standard streams) for every spawn that
/// wants it: the child `dup2`s it, so it is never the child's to close.
fn dev_null() -> io::Result<RawFd> {
    static NULL: OnceLock<Result<OwnedFd, i32>> = OnceLock::new();
    let opened = NULL.get_or_init(|| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .and_then(|f| above_stdio(f.into()))
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    });
    match opened {
        Ok(fd) => Ok(fd.as_raw_fd()),
        Err(code) => Err(io::Error::from_raw_os_error(*code)),
    }
}

/// The child's end of stream `n` (owned when it is a new pipe's) and the host's end, if piped.
fn stream(n: usize, io: ChildIo) -> io::Result<(RawFd, Option<OwnedFd>, Option<File>)> {
    match io {
        ChildIo::Null => Ok((dev_null()?, None, None)),
        ChildIo::Piped => {
            let (r, w) = fds::pipe(0)?;
            let (child, host) = if n == 0 { (r, w) } else { (w, r) };
            let child = above_stdio(child)?;
            Ok((child.as_raw_fd(), Some(child), Some(File::from(host))))
        }
    }
}

/// The clone's flags, and which namespaces they make.
struct Flags {
    flags: libc::c_int,
    mount_ns: bool,
    pid_ns: bool,
}

/// The memory shared where the shims can run in it; the mount namespace (with the user namespace
/// when not root) and the PID namespace made by the clone itself when the plan has them. With
/// the PID namespace made here, P is the namespace's init from its start: no waiter outside it.
fn clone_flags(plan: &ChildPlan) -> Flags {
    let mount = match (&plan.mask, &plan.namespaces) {
        (Some(mask), _) => Some(mask.needs_user_ns()),
        (None, Some(ns)) => ns.own_mount_ns(),
        (None, None) => None,
    };
    let mut flags = libc::SIGCHLD;
    if raw::SHARES_MEMORY {
        flags |= libc::CLONE_VM;
    }
    if let Some(user) = mount {
        flags |= libc::CLONE_NEWNS;
        if user {
            flags |= libc::CLONE_NEWUSER;
        }
    }
    let pid_ns = plan.namespaces.as_ref().is_some_and(|ns| ns.pid_ns());
    if pid_ns {
        flags |= libc::CLONE_NEWPID;
    }
    Flags {
        flags,
        mount_ns: mount.is_some(),
        pid_ns,
    }
}

/// Null-terminated pointer array over `v`.
fn ptrs(v: &[CString]) -> Vec<*const libc::c_char> {
    v.iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Starts the agent and waits until it has exec'd (or a step failed, which is returned with the
/// step's own message). Call it on the spawner thread ([`super::spawner`]): the parent-death
/// signal follows the thread that started the child.
pub(super) fn spawn(req: &Request) -> io::Result<(Spawned, Tree)> {
    let (child_fds, child_ends, mut host_ends) = streams(&req.io)?;
    let (report_r, report_w) = fds::pipe(0)?;
    let flags = clone_flags(&req.plan);
    let (status_r, status_w) = match flags.pid_ns {
        true => fds::pipe(0).map(|(r, w)| (Some(r), Some(w)))?,
        false => (None, None),
    };
    let stacks = Stacks::take()?;
    let (argv, envp) = (ptrs(&req.argv), ptrs(&req.envp));
    let ctx = Ctx {
        program: req.program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: req.cwd.as_ptr(),
        plan: Arc::as_ptr(&req.plan),
        stdio: child_fds,
        report: report_w.as_raw_fd(),
        shared: Shared {
            init: stacks.at(MAIN_LEN, STACK_LEN),
            entered_mount_ns: flags.mount_ns,
            pid_ns_entered: flags.pid_ns,
            status_fd: status_w.as_ref().map_or(-1, AsRawFd::as_raw_fd),
            report_fd: report_w.as_raw_fd(),
        },
    };
    let pid = start(&ctx, stacks.main_top(), flags.flags)?;
    if let Some(fd) = req.announce {
        // The host writes it: inside its PID namespace the child's own pid is 1.
        let bytes = pid.to_ne_bytes();
        // SAFETY: write(2) of a local to the watcher's pipe, which the sandbox keeps open.
        unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    }
    // The child has its own copies: the host's ends of its side go now, so the exec-status pipe
    // ends when the child's last copy does.
    drop((child_ends, report_w, status_w));
    // Nothing returns before the report is read: until then the child runs on `stacks` and
    // reads `ctx`, both this frame's.
    let report = read_report(report_r);
    let pidfd = pidfd_or_kill(pid)?;
    let keeper_reaps = Arc::new(AtomicBool::new(false));
    let tree = Tree {
        stacks,
        keeper_reaps: Arc::clone(&keeper_reaps),
    };
    let mut spawned = Spawned {
        pid,
        pidfd,
        stdin: host_ends[0].take(),
        stdout: host_ends[1].take(),
        stderr: host_ends[2].take(),
        status: None,
        reaped: false,
        program_status: status_r.map(File::from),
        keeper_reaps,
    };
    match report {
        Ok(()) => Ok((spawned, tree)),
        Err(e) => {
            // P ends soon after (R failed, and P, the init, follows it). Reaped here, before the
            // stacks go: nothing may still run on them.
            let _ = spawned.reap(0);
            Err(e)
        }
    }
}

/// The three streams: the child's fds, the child's ends to close once it has them, the host's
/// ends.
type Streams = ([RawFd; 3], Vec<Option<OwnedFd>>, Vec<Option<File>>);

fn streams(io: &[ChildIo; 3]) -> io::Result<Streams> {
    let mut child_fds = [-1; 3];
    let mut child_ends = Vec::with_capacity(3);
    let mut host_ends = Vec::with_capacity(3);
    for (n, io) in io.iter().enumerate() {
        let (fd, owned, host) = stream(n, *io)?;
        child_fds[n] = fd;
        child_ends.push(owned);
        host_ends.push(host);
    }
    Ok((child_fds, child_ends, host_ends))
}

/// P's pidfd; where none can be had (descriptors exhausted?), there is no way to wait for exactly
/// this process later: the tree goes now, and is reaped before its stacks go.
fn pidfd_or_kill(pid: libc::pid_t) -> io::Result<OwnedFd> {
    fds::pidfd(pid).inspect_err(|_| {
        // SAFETY: kill(2) and waitpid(2) on our own child, not reaped yet.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            while libc::waitpid(pid, std::ptr::null_mut(), 0) < 0
                && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
            {}
        }
    })
}

/// `clone` with every signal blocked around it.
fn start(ctx: &Ctx, stack_top: *mut libc::c_void, flags: libc::c_int) -> io::Result<libc::pid_t> {
    // SAFETY: sigset operations on stack data; clone(2) with a stack the child alone uses and a
    // context that outlives it (this thread waits for the exec-status pipe before `ctx` drops).
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            stack_top,
            flags,
            (ctx as *const Ctx).cast_mut().cast(),
        );
        let err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(err);
        }
        Ok(pid)
    }
}

/// Reads the exec-status pipe to its end: nothing means the program was exec'd; otherwise the
/// failed step's code and message.
fn read_report(r: OwnedFd) -> io::Result<()> {
    use std::io::Read;
    let mut buf = Vec::new();
    let mut f = File::from(r);
    loop {
        match f.read_to_end(&mut buf) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    if buf.len() < 4 {
        return Ok(());
    }
    let code = i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let msg = String::from_utf8_lossy(&buf[4..]).into_owned();
    let kind = if code > 0 {
        io::Error::from_raw_os_error(code).kind()
    } else {
        io::ErrorKind::Other
    };
    Err(io::Error::new(kind, msg))
}

/// P's entry, on its own stack: signals to their defaults and unblocked, the streams, the working
/// directory, the sandbox, exec. A failure is written to the exec-status
/// pipe and ends the process with 127.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Ctx` the spawning thread keeps alive until this process (or its
    // successor R) has exec'd or reported; every call below is on that prepared data.
    unsafe {
        let ctx = &*(arg as *const Ctx);
        let result: io::Result<()> = prepare(ctx).and_then(|()| {
            (*ctx.plan).apply_in(Some(&ctx.shared))?;
            libc::execve(ctx.program, ctx.argv, ctx.envp);
            Err(io::Error::last_os_error())
        });
        if let Err(e) = result {
            report(ctx.report, &e);
        }
        libc::_exit(127)
    }
}

/// The steps before the sandbox's: signal dispositions and mask, streams, directory.
///
/// # Safety
/// In the child only.
unsafe fn prepare(ctx: &Ctx) -> io::Result<()> {
    // SAFETY (whole block): raw syscalls on the prepared context.
    unsafe {
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                raw::default_action(sig);
            }
        }
        let empty: libc::sigset_t = std::mem::zeroed();
        raw::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        for (target, &fd) in ctx.stdio.iter().enumerate() {
            if libc::dup2(fd, target as i32) < 0 {
                return Err(step("standard streams"));
            }
        }
        if libc::chdir(ctx.cwd) != 0 {
            return Err(step("working directory"));
        }
    }
    Ok(())
}

fn step(name: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("sandbox step {name}: {e}"))
}

/// Writes `e`'s code and message to the exec-status pipe, in one write (atomic below
/// `PIPE_BUF`).
fn report(fd: RawFd, e: &io::Error) {
    let code = e.raw_os_error().unwrap_or(0);
    let mut buf = code.to_ne_bytes().to_vec();
    let msg = e.to_string();
    let cut = (0..=msg.len().min(REPORT_MAX))
        .rev()
        .find(|&i| msg.is_char_boundary(i))
        .unwrap_or(0);
    buf.extend_from_slice(&msg.as_bytes()[..cut]);
    // SAFETY: write(2) from a live buffer.
    unsafe {
        raw::write(fd, &buf);
    }
}
