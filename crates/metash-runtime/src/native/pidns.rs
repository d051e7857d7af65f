//! Processes and namespaces of a confined tree: a native agent or a confined CLI sees only its own
//! processes. The child (still metash's code, between its start and exec) enters a mount
//! namespace when nothing else made one, sets up its terminal ([`super::tty`]), then a PID
//! namespace. A confined CLI, started by std's `fork`:
//!
//! ```text
//! host ── P  (the spawned child: host pid, session and group leader; waits, mirrors the status)
//!         └─ Q  (pid 1 of the new namespace: reaps orphans, forwards signals, exits with R)
//!             └─ R  (pid 2: restricted by Landlock and seccomp, then execs the program)
//! ```
//!
//! A native agent, started without a copy of the host ([`super::vspawn`]), whose `clone` makes
//! the namespace, so the spawned child is Q itself: `host ── Q (pid 1) └─ R (pid 2)`. Q writes
//! R's wait status to a pipe the host reads (nothing to mirror), and moves R into the agent's
//! cgroups while R applies the rest of the sandbox.
//!
//! Q mounts a fresh `/proc` (with `hidepid=ptraceable`) in the tree's mount namespace: it lists the
//! tree's own processes only, and not even Q (which the program cannot ptrace: Q keeps its
//! capabilities and stays outside the Landlock domain), so metash's command line is nowhere to
//! read. The program is not pid 1, so the kernel's init rules (signals without a handler ignored,
//! orphans to reap) are Q's business, not the program's.
//!
//! Killing still reaches the whole tree: P, Q and R share P's process group (only R is in the
//! agent's cgroups: see `isolate`), so the host's `killpg` hits all of them and its cgroup kill
//! R's side; when Q dies (SIGKILL, or after R exited) the kernel kills everything left in the
//! namespace; when P dies, Q's parent-death signal kills Q (a native agent's Q has the
//! host's spawner thread as its parent, with the same signal). P and Q ignore the catchable
//! termination signals (the group's signal reaches R directly) and Q forwards them to R only when
//! R left the group.
//!
//! Q and R are split off without copying memory ([`super::shim`]): P, Q and R share one memory
//! until R execs (the fork's copy of the host, or for a native agent the host's own). So the
//! shims cost a spawn no more page-table copies than its start does; P and Q only wait on stacks
//! of their own, making raw system calls only ([`super::raw`]). The capability bounding set is
//! emptied once, before the splits (every process after inherits it).

use std::io;
use std::sync::OnceLock;

use serde_json::{json, Value};

use super::raw;

/// The signals the two shims must survive (and Q forwards): blocked before the fork, consumed by
/// Q with `sigwaitinfo`, restored in R before exec.
const SHIM_SIGNALS: &[i32] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCHLD,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGPIPE,
    libc::SIGALRM,
];

/// What the child sets up beyond the mask, prepared in the parent.
pub struct Namespaces {
    /// Enter a mount namespace here, since the mask made none: with these user namespace maps
    /// when not root.
    own_mount: Option<Option<(Vec<u8>, Vec<u8>)>>,
    /// A PID namespace with its own `/proc` (false where the kernel refused one at the probe).
    pid: bool,
    /// Landlock rights on the new `/proc` (a CLI reads its own entries), 0 for none (a native
    /// agent has no `/proc` grant).
    proc_access: u64,
    pub(super) tty: super::tty::ChildTty,
}

/// Who runs in the tree: it decides the `/proc` rights and the terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenant {
    /// A native agent: no `/proc`, no terminal.
    Agent,
    /// A confined CLI or command: its own `/proc` entries, ptys of its own for its commands.
    Cli,
}

/// Whether PID namespaces (and a `/proc` and `devpts` of their own) can be made here: probed
/// once, by a child doing exactly what a spawn does. The reason otherwise.
pub fn available() -> Result<(), String> {
    static OK: OnceLock<Result<(), String>> = OnceLock::new();
    OK.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    if !super::mountns::available() {
        return Err("no mount namespace can be made (user namespaces are refused)".into());
    }
    let ns = Namespaces {
        own_mount: Some(super::mounts::own_maps()),
        pid: true,
        proc_access: 0,
        tty: super::tty::ChildTty::private(),
    };
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("/bin/true");
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: `apply` makes only raw syscalls on data prepared above.
    unsafe {
        cmd.pre_exec(move || ns.apply(-1, false, None, &[]).map(drop));
    }
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("the probe exited with {s}")),
        Err(e) => Err(e.to_string()),
    }
}

/// The namespaces for one spawn, and their part of the start report. `masked`: the mask enters a
/// mount namespace already. Where namespaces cannot be made, the tree sees every process and has
/// no terminal; the report says so (and why).
pub fn plan(tenant: Tenant, masked: bool) -> (Option<Namespaces>, Value) {
    match available() {
        Ok(()) => {
            let ns = Namespaces {
                own_mount: (!masked).then(super::mounts::own_maps),
                pid: true,
                proc_access: match tenant {
                    Tenant::Agent => 0,
                    Tenant::Cli => super::privs::access::READ_FILE | super::privs::access::READ_DIR,
                },
                tty: match tenant {
                    Tenant::Agent => super::tty::ChildTty::None,
                    Tenant::Cli => super::tty::ChildTty::private(),
                },
            };
            let report = json!({
                "processes": {"own_tree_only": true, "via": "pid-namespace", "proc": "its own (hidepid)"},
                "terminal": ns.tty.report(),
            });
            (Some(ns), report)
        }
        Err(why) => (
            None,
            json!({
                "processes": {"own_tree_only": false, "why": why},
                "terminal": super::tty::ChildTty::None.report(),
            }),
        ),
    }
}

impl Namespaces {
    /// Whether the tree gets a PID namespace of its own.
    pub(super) fn pid_ns(&self) -> bool {
        self.pid
    }

    /// The mount namespace [`Namespaces::apply`] enters when nothing else made one: `None` for
    /// none, `Some(true)` when it comes with a user namespace (metash is not root).
    pub(super) fn own_mount_ns(&self) -> Option<bool> {
        self.own_mount.as_ref().map(Option::is_some)
    }

    /// The terminal part, for an interactive session to replace.
    pub fn tty_mut(&mut self) -> &mut super::tty::ChildTty {
        &mut self.tty
    }

    /// In the forked child, after the mask: the mount namespace (unless `masked` entered one),
    /// the terminal, then the PID namespace. Returns in R; P and Q never return.
    ///
    /// # Safety
    /// Only in the child between fork and exec, single-threaded, before capabilities are dropped
    /// and before Landlock is enforced (`landlock_fd` is the ruleset the new mounts' rules go to;
    /// negative for none).
    pub(super) unsafe fn apply(
        &self,
        landlock_fd: i32,
        masked: bool,
        shared: Option<&super::shim::Shared>,
        join: &[i32],
    ) -> io::Result<Option<i32>> {
        // SAFETY (whole block): raw syscalls on prepared data in a single-threaded child.
        unsafe {
            if let (Some(userns), false) = (&self.own_mount, masked) {
                let entered = shared.is_some_and(|s| s.entered_mount_ns);
                super::mounts::enter(userns.as_ref(), entered)?;
                check(
                    libc::mount(
                        std::ptr::null(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ),
                    "namespaces: make / private",
                )?;
            }
            self.tty.apply(landlock_fd)?;
            if self.pid {
                // Once, here, after any user namespace was entered (that resets the set) and
                // before the split: P, Q and R then each find it empty.
                super::privs::drop_bounding_set();
                return self.enter_pid_ns(landlock_fd, shared, join);
            }
        }
        Ok(None)
    }

    /// P: unshare the PID namespace and split off Q; Q: mount `/proc`, split off R. Returns in R.
    /// Each split shares memory ([`super::shim`]): the shims cost no copy of the host's.
    ///
    /// # Safety
    /// As [`Namespaces::apply`].
    unsafe fn enter_pid_ns(
        &self,
        landlock_fd: i32,
        shared: Option<&super::shim::Shared>,
        join: &[i32],
    ) -> io::Result<Option<i32>> {
        // SAFETY (whole block): raw syscalls on stack data.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for &s in SHIM_SIGNALS {
                libc::sigaddset(&mut set, s);
            }
            libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old);
            if let Some(s) = shared.filter(|s| s.pid_ns_entered) {
                let wait_fd = self.split_as_init(landlock_fd, s, join, set)?;
                libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
                return Ok(wait_fd);
            }
            check(libc::unshare(libc::CLONE_NEWPID), "processes: unshare(pid)")?;
            let mut status_pipe = [-1; 2];
            check(
                libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC),
                "processes: pipe",
            )?;
            let [read_end, write_end] = status_pipe;
            super::shim::split(read_end, outside, None)
                .map_err(|e| step_err(e, "processes: start the namespace's init"))?;
            // Q, pid 1. P may have died before the parent-death signal was set: then the read
            // end is gone (closed by P's exit) and Q must not go on.
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            libc::close(read_end);
            let mut pfd = libc::pollfd {
                fd: write_end,
                events: 0,
                revents: 0,
            };
            if libc::poll(&mut pfd, 1, 0) > 0 && pfd.revents & libc::POLLERR != 0 {
                libc::_exit(1);
            }
            self.mount_proc(landlock_fd)?;
            let ctx = InitCtx::new(write_end, set);
            super::shim::split(ctx, init, None)
                .map_err(|e| step_err(e, "processes: start the program's process"))?;
            libc::close(write_end);
            libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
        Ok(None)
    }

    /// The shared start's Q (the clone made this process the namespace's init already, and the
    /// host reads R's status from the pipe: no waiter outside): mount `/proc`, split off R, and
    /// have the init move R into the agent's cgroups while R applies the rest of the sandbox.
    /// Returns in R, with the pipe R waits on before it execs (`None`: R joins them itself).
    ///
    /// # Safety
    /// As [`Namespaces::apply`], with the shim signals blocked (`set`).
    unsafe fn split_as_init(
        &self,
        landlock_fd: i32,
        s: &super::shim::Shared,
        join: &[i32],
        set: libc::sigset_t,
    ) -> io::Result<Option<i32>> {
        // SAFETY (whole block): raw syscalls on stack data.
        unsafe {
            self.mount_proc(landlock_fd)?;
            let mut ctx = InitCtx::new(s.status_fd, set);
            let mut joined = [-1; 2];
            if !join.is_empty() && join.len() <= MAX_JOIN {
                check(
                    libc::pipe2(joined.as_mut_ptr(), libc::O_CLOEXEC),
                    "cgroup join: pipe",
                )?;
                ctx.join[..join.len()].copy_from_slice(join);
                ctx.join_n = join.len();
                ctx.joined = joined[1];
            }
            super::shim::split(ctx, init, Some(s.init))
                .map_err(|e| step_err(e, "processes: start the program's process"))?;
            if joined[1] >= 0 {
                libc::close(joined[1]);
            }
            Ok((joined[0] >= 0).then_some(joined[0]))
        }
    }

    /// A fresh `/proc` for the new namespace over the host's, and (for a CLI) a Landlock rule on
    /// it: the parent's rule on the host's `/proc` does not reach a mount stacked over it.
    ///
    /// # Safety
    /// In Q, in the tree's mount namespace.
    unsafe fn mount_proc(&self, landlock_fd: i32) -> io::Result<()> {
        // SAFETY (whole block): raw syscalls on static strings.
        unsafe {
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            let mount = |options: &std::ffi::CStr| {
                libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    flags,
                    options.as_ptr().cast(),
                )
            };
            // `ptraceable` (Linux 5.8): a process is listed only to those who may ptrace it, group
            // 0 included (`hidepid=2` lets the `gid=` group, 0 by default, see everything).
            // Before 5.8 the option does not parse, and `hidepid=2` is what there is.
            if mount(c"hidepid=ptraceable") != 0 {
                check(mount(c"hidepid=2"), "processes: mount /proc")?;
            }
            if self.proc_access != 0 && landlock_fd >= 0 {
                super::privs::grant(
                    landlock_fd,
                    c"/proc",
                    self.proc_access,
                    "processes: grant /proc",
                )?;
            }
        }
        Ok(())
    }
}

/// P: keep only the status pipe, wait for Q (so no zombie of it is left to whoever adopts
/// orphans), end as R did: its exit code, or its signal, which Q passed over the pipe (Q itself
/// cannot die by R's signal: the kernel spares a namespace's init). Q ending without a word
/// (killed) ends P as Q did. Runs on its own stack ([`super::shim::split`]) and makes only raw
/// system calls ([`super::raw`]): it may share the host's memory.
///
/// # Safety
/// In P only; never returns.
unsafe extern "C" fn outside(q: libc::pid_t, read_end: *const i32) -> ! {
    // SAFETY (whole block): raw syscalls on stack data, then _exit; `read_end` is the context
    // `split` stored on this stack.
    unsafe {
        let read_end = *read_end;
        keep_only(read_end);
        // P only waits and reports: no privilege kept (as Q, see `init`).
        raw::prctl(libc::PR_SET_NO_NEW_PRIVS, 1);
        super::privs::drop_capabilities_raw();
        let mut status = 0;
        // Signals are blocked here, so the wait is not interrupted. It ends when Q is gone,
        // whatever else happens.
        while raw::wait(q, &mut status, 0) != q as isize {
            if raw::kill(q, 0) != 0 {
                libc::_exit(1);
            }
        }
        let mut r_status = [0u8; 4];
        if raw::read(read_end, &mut r_status) == 4 {
            status = i32::from_ne_bytes(r_status);
        }
        end_as(status)
    }
}

/// Ends this process the way `status` says a process ended: its exit code, or its signal (which
/// this process then takes itself, default action, so the host sees the same).
///
/// # Safety
/// In P only; never returns.
unsafe fn end_as(status: i32) -> ! {
    // SAFETY (whole block): raw syscalls on this process, then _exit.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            // This process holds the host's memory (shared, or a copy): a core-dumping signal
            // must not write it anywhere. A core limit of 1 byte refuses every dump, a piped
            // `core_pattern` included (which ignores a limit of 0). Not `PR_SET_DUMPABLE`: that
            // flag belongs to the memory, which may be the host's own.
            raw::setrlimit(libc::RLIMIT_CORE, 1);
            raw::default_action(sig);
            raw::kill(raw::call(libc::SYS_getpid, [0; 4]) as libc::pid_t, sig);
            let mut only: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut only);
            libc::sigaddset(&mut only, sig);
            raw::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status));
    }
}

/// The most cgroup join files the init writes R's pid to (memory, pids, cpu, and one spare).
const MAX_JOIN: usize = 4;

/// What Q's half keeps on its own stack: the status pipe (to P, or to the host when Q is the
/// spawned process), the signals it waits for, and the cgroup join files it moves R into before
/// anything else (then one byte to `joined`: 0, or the errno of the write that failed).
#[derive(Clone, Copy)]
struct InitCtx {
    write_end: i32,
    set: libc::sigset_t,
    join: [i32; MAX_JOIN],
    join_n: usize,
    joined: i32,
}

impl InitCtx {
    /// Reporting to `write_end`, joining nothing.
    fn new(write_end: i32, set: libc::sigset_t) -> Self {
        Self {
            write_end,
            set,
            join: [-1; MAX_JOIN],
            join_n: 0,
            joined: -1,
        }
    }
}

/// Q: writes R's pid (as this namespace numbers it) to each join file, then the result to
/// `joined`. Raw calls on stack data only.
///
/// # Safety
/// In Q, right after the split.
unsafe fn join_cgroups(r: libc::pid_t, ctx: &InitCtx) {
    let mut digits = [0u8; 12];
    let mut at = digits.len();
    let mut n = r.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut code = 0u8;
    for &fd in &ctx.join[..ctx.join_n.min(MAX_JOIN)] {
        // SAFETY: write(2) from a live stack buffer to a join file the host opened.
        let rc = unsafe { raw::write(fd, &digits[at..]) };
        if rc < 0 {
            code = u8::try_from(-rc).unwrap_or(u8::MAX);
            break;
        }
    }
    // SAFETY: write(2) of one byte to R's pipe.
    unsafe { raw::write(ctx.joined, &[code]) };
}

/// Q, the namespace's init: reap every child, forward the shim signals to R when R left the
/// process group (a group signal reached it already otherwise), and when R ends, tell P how and
/// exit (the kernel then kills whatever is left in the namespace). Runs on its own stack
/// ([`super::shim::split`]) and makes only raw system calls, as P.
///
/// # Safety
/// In Q only; never returns.
unsafe extern "C" fn init(r: libc::pid_t, ctx: *const InitCtx) -> ! {
    // SAFETY (whole block): raw syscalls on stack data, then _exit; `ctx` is the context `split`
    // stored on this stack.
    unsafe {
        let ctx = *ctx;
        if ctx.joined >= 0 {
            join_cgroups(r, &ctx);
        }
        let InitCtx { write_end, set, .. } = ctx;
        keep_only(write_end);
        // Q only reaps, forwards signals to R (its own uid) and writes to P: it needs no
        // privilege, and keeps none once `/proc` is mounted and R forked (a failure to drop them
        // leaves Q as it was: hidden from the tree by `hidepid`, ptrace refused by R's seccomp).
        raw::prctl(libc::PR_SET_NO_NEW_PRIVS, 1);
        super::privs::drop_capabilities_raw();
        loop {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let sig = raw::sigwaitinfo(&set, &mut info) as i32;
            if sig == libc::SIGCHLD {
                loop {
                    let mut st = 0;
                    let pid = raw::wait(-1, &mut st, libc::WNOHANG);
                    if pid <= 0 {
                        break;
                    }
                    if pid == r as isize {
                        raw::write(write_end, &st.to_ne_bytes());
                        libc::_exit(if libc::WIFSIGNALED(st) {
                            128 + libc::WTERMSIG(st)
                        } else {
                            libc::WEXITSTATUS(st)
                        });
                    }
                }
            } else if sig > 0 && forwarded(sig) && raw::getpgid(r) != raw::getpgid(0) {
                raw::kill(r, sig);
            }
        }
    }
}

fn forwarded(sig: i32) -> bool {
    matches!(
        sig,
        libc::SIGTERM
            | libc::SIGINT
            | libc::SIGHUP
            | libc::SIGQUIT
            | libc::SIGUSR1
            | libc::SIGUSR2
            | libc::SIGWINCH
    )
}

/// Closes every descriptor but `fd` (stdio included: the shims hold nothing of the program's,
/// so its pipes close when the program's side does, and the spawn's exec-status pipe reports R's
/// exec).
///
/// # Safety
/// In a forked shim only.
unsafe fn keep_only(fd: i32) {
    let fd = fd as u32;
    // SAFETY: close_range(2) on this process's own descriptors.
    unsafe {
        if fd > 0 {
            raw::close_range(0, fd - 1);
        }
        raw::close_range(fd + 1, u32::MAX);
    }
}

fn step_err(e: io::Error, step: &str) -> io::Error {
    io::Error::new(e.kind(), format!("sandbox step {step}: {e}"))
}

fn check<T: Into<i64>>(rc: T, step: &str) -> io::Result<()> {
    if rc.into() < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("sandbox step {step}: {e}"),
        ));
    }
    Ok(())
}
