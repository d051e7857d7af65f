//! The native sandbox's restrictions, prepared in the parent and applied in the child between fork
//! and exec. Everything that allocates or opens paths (the Landlock ruleset, the seccomp program,
//! the cgroup files) is built before the fork; the child only makes raw syscalls on ready data, so
//! nothing can deadlock on a lock another host thread held at fork time. Every step is fail-closed:
//! an error aborts the spawn and the error says which step failed.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};

use super::privs::drop_capabilities;
pub use super::privs::landlock_abi;
use crate::error::{Result, RuntimeError};
use crate::spec::{NetworkAccess, PathAccess};

/// System paths an executable needs to load (read + execute, never write). `/etc` is deliberately
/// not listed whole: only the loader and locale files in it (no `shadow`, no `passwd`).
const SYSTEM_RO: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/ssl/certs",
    "/etc/ca-certificates",
    // OpenSSL's configuration: Node refuses to start without reading it (no secrets in it).
    "/etc/ssl/openssl.cnf",
];

/// Device files a program may open read-write.
const DEVICES_RW: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];
const DEVICES_RO: &[&str] = &["/dev/urandom", "/dev/random"];

fn setup(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::SandboxSetup(msg.into())
}

fn abi_of(v: i64) -> ABI {
    match v {
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        6 => ABI::V6,
        _ => ABI::V7,
    }
}

/// Filesystem and network plan for Landlock.
pub struct LandlockPlan<'a> {
    pub workspace: &'a Path,
    pub write: bool,
    pub read: bool,
    /// Scoped grants (existing paths only): each its own rule.
    pub paths: &'a [&'a PathAccess],
    /// The agent's own executable (always readable and executable).
    pub entry: &'a Path,
    pub network: &'a NetworkAccess,
    /// Loopback ports it may connect to when `network` is an allowlist: the host's CONNECT
    /// proxy, a credential proxy. Landlock rules name a port only, so every one of these is a
    /// server metash runs.
    pub connect_ports: &'a [u16],
}

/// Build a Landlock ruleset (an fd the child enforces with `landlock_restrict_self`). Fails when
/// the kernel lacks Landlock, or lacks TCP rules (ABI < 4) while network must be confined.
///
/// # Errors
/// [`RuntimeError::SandboxSetup`] naming the missing feature.
pub fn landlock_ruleset(plan: &LandlockPlan<'_>) -> Result<(OwnedFd, i64)> {
    let abi_v = landlock_abi();
    if abi_v < 1 {
        return Err(setup("Landlock is not available in this kernel"));
    }
    let abi = abi_of(abi_v);
    let mut created = handled_ruleset(plan, abi_v)?;
    for p in SYSTEM_RO {
        let path = Path::new(p);
        if path.exists() {
            let access = if path.is_dir() {
                AccessFs::from_read(abi)
            } else {
                AccessFs::ReadFile | AccessFs::Execute
            };
            created = allow(created, path, access)?;
        }
    }
    for (list, access) in [
        (DEVICES_RW, AccessFs::ReadFile | AccessFs::WriteFile),
        (DEVICES_RO, AccessFs::ReadFile.into()),
    ] {
        for p in list.iter().map(Path::new).filter(|p| p.exists()) {
            created = allow(created, p, access)?;
        }
    }
    created = allow(created, plan.entry, AccessFs::ReadFile | AccessFs::Execute)?;
    if plan.read || plan.write {
        let access = if plan.write {
            AccessFs::from_all(abi)
        } else {
            AccessFs::from_read(abi)
        };
        created = allow(created, plan.workspace, access)?;
    }
    for p in plan.paths {
        let access = match (p.write, p.path.is_dir()) {
            (true, true) => AccessFs::from_all(abi),
            (true, false) => AccessFs::from_file(abi),
            (false, true) => AccessFs::from_read(abi),
            (false, false) => AccessFs::ReadFile.into(),
        };
        created = allow(created, &p.path, access)?;
    }
    if matches!(plan.network, NetworkAccess::Allowlist(_)) {
        for port in plan.connect_ports {
            created = created
                .add_rule(NetPort::new(*port, AccessNet::ConnectTcp))
                .map_err(landlock_err)?;
        }
    }
    let fd: Option<OwnedFd> = created.into();
    let fd = fd.ok_or_else(|| setup("Landlock ruleset was not created"))?;
    Ok((fd, abi_v))
}

fn landlock_err(e: landlock::RulesetError) -> RuntimeError {
    setup(format!("landlock: {e}"))
}

/// The ruleset handling every file access of this ABI, TCP connects unless the network is
/// unrestricted (refused on ABIs without TCP rules when an allowlist must hold), and the IPC
/// scopes where the ABI has them.
fn handled_ruleset(plan: &LandlockPlan<'_>, abi_v: i64) -> Result<RulesetCreated> {
    let abi = abi_of(abi_v);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(landlock_err)?;
    let confine_net = !matches!(plan.network, NetworkAccess::Unrestricted);
    if abi_v >= 4 && confine_net {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(landlock_err)?;
    } else if confine_net && matches!(plan.network, NetworkAccess::Allowlist(_)) {
        return Err(setup(format!(
            "Landlock ABI {abi_v} has no TCP rules; a network allowlist cannot be enforced"
        )));
    }
    if abi_v >= 6 {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(landlock_err)?;
    }
    ruleset.create().map_err(landlock_err)
}

/// One rule: `access` beneath `path`.
fn allow(
    created: RulesetCreated,
    path: &Path,
    access: impl Into<landlock::BitFlags<AccessFs>>,
) -> Result<RulesetCreated> {
    let fd =
        PathFd::new(path).map_err(|e| setup(format!("landlock open {}: {e}", path.display())))?;
    created
        .add_rule(PathBeneath::new(fd, access))
        .map_err(landlock_err)
}

/// The seccomp program (see [`super::seccomp`]).
pub use super::seccomp::program as seccomp_program;

/// Everything the child applies, prepared by the parent.
pub struct ChildPlan {
    pub landlock_fd: RawFd,
    pub seccomp: Vec<libc::sock_filter>,
    /// Open join files (`cgroup.procs`; on cgroup v1 `tasks`); the child writes `0` to join.
    pub cgroup_procs: Vec<RawFd>,
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    pub parent_pid: libc::pid_t,
    pub drop_caps: bool,
    /// With a live gate: the exec notify filter and the socket its listener goes to the host on.
    pub exec_gate: Option<super::exec_gate::ChildSide>,
    /// The host's state directories a grant would expose, hidden under empty mounts.
    pub mask: Option<super::mask::Mask>,
    /// Its own mount namespace (if the mask made none), terminal and PID namespace, entered after
    /// the mask ([`super::pidns`]); `None` where the kernel cannot make them (reported).
    pub namespaces: Option<super::pidns::Namespaces>,
}

fn check(rc: libc::c_long, step: &str) -> io::Result<()> {
    if rc < 0 {
        let e = io::Error::last_os_error();
        Err(io::Error::new(
            e.kind(),
            format!("sandbox step {step}: {e}"),
        ))
    } else {
        Ok(())
    }
}

impl ChildPlan {
    /// Apply the plan in the forked child. Only raw syscalls on prepared data (async-signal-safe).
    ///
    /// # Safety
    /// Must only be called in the child between fork and exec.
    pub unsafe fn apply(&self) -> io::Result<()> {
        // SAFETY: as this function's own contract.
        unsafe { self.apply_in(None) }
    }

    /// [`ChildPlan::apply`] in a child that shares the host's memory ([`super::vspawn`]):
    /// `shared` says where the shims' stacks are and what the clone did already.
    ///
    /// # Safety
    /// Must only be called in the child between its start and exec.
    pub(super) unsafe fn apply_in(&self, shared: Option<&super::shim::Shared>) -> io::Result<()> {
        // SAFETY (whole block): plain syscalls with prepared, live arguments in a single-threaded
        // child.
        unsafe {
            check(libc::setsid() as libc::c_long, "setsid")?;
            check(
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) as libc::c_long,
                "pdeathsig",
            )?;
            if host_gone(self.parent_pid, shared) {
                return Err(io::Error::other(
                    "sandbox step pdeathsig: host already gone",
                ));
            }
            let entered = shared.is_some_and(|s| s.entered_mount_ns);
            if let Some(mask) = &self.mask {
                // Before capabilities go (the mounts need them) and before Landlock.
                mask.apply(entered)?;
            }
            let mut joined_by_init = None;
            if let Some(ns) = &self.namespaces {
                // Still before capabilities and Landlock (its mounts add their own rules to the
                // ruleset), and before seccomp (which refuses namespaces). This process stays
                // outside as the tree's waiter (or is the namespace's init); what returns here
                // is the program's process.
                joined_by_init = ns.apply(
                    self.landlock_fd,
                    self.mask.is_some(),
                    shared,
                    &self.cgroup_procs,
                )?;
            }
            // Only the program's process joins the cgroup and takes the limits: the shims hold
            // the host's memory (shared, or a copy), and a memory cgroup's OOM killer, choosing
            // by resident size, would pick a shim, and with it every process sharing that
            // memory: the host. Where the init moves it (see `pidns`), it waits for that last.
            self.limit(joined_by_init.is_some())?;
            self.restrict()?;
            if let Some(fd) = joined_by_init {
                wait_joined(fd)?;
            }
        }
        Ok(())
    }

    /// The program's cgroups (unless the init moves it there) and rlimits.
    ///
    /// # Safety
    /// In the program's process, between its start and exec.
    unsafe fn limit(&self, joined_by_init: bool) -> io::Result<()> {
        // SAFETY (whole block): write(2) to pre-opened join files, setrlimit on local data.
        unsafe {
            if !joined_by_init {
                for &fd in &self.cgroup_procs {
                    let rc = libc::write(fd, b"0".as_ptr().cast(), 1);
                    check(rc as libc::c_long, "cgroup join")?;
                }
            }
            for &(res, value) in &self.rlimits {
                let lim = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                check(libc::setrlimit(res, &lim) as libc::c_long, "setrlimit")?;
            }
        }
        Ok(())
    }

    /// Capabilities, no new privileges, Landlock, seccomp, and the exec gate's filter.
    ///
    /// # Safety
    /// In the program's process, between its start and exec, after the namespaces.
    unsafe fn restrict(&self) -> io::Result<()> {
        // SAFETY (whole block): prctl/syscalls on this process with prepared, live arguments.
        unsafe {
            if self.drop_caps {
                drop_capabilities()?;
            }
            check(
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as libc::c_long,
                "no_new_privs",
            )?;
            check(
                libc::syscall(libc::SYS_landlock_restrict_self, self.landlock_fd, 0u32),
                "landlock_restrict_self",
            )?;
            let prog = libc::sock_fprog {
                len: self.seccomp.len() as libc::c_ushort,
                filter: self.seccomp.as_ptr() as *mut libc::sock_filter,
            };
            check(
                libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                    &prog as *const libc::sock_fprog,
                ) as libc::c_long,
                "seccomp",
            )?;
            if let Some(gate) = &self.exec_gate {
                // After NO_NEW_PRIVS (required for an unprivileged filter) and after the EPERM
                // filter: exec syscalls now wait for the host's supervisor.
                gate.apply()?;
            }
        }
        Ok(())
    }
}

/// Waits for the namespace's init to have moved this process into the agent's cgroups: one byte,
/// 0 or the errno of the join file's write that failed (nothing: the init is gone).
///
/// # Safety
/// In the child only, on the read end of its own pipe.
unsafe fn wait_joined(fd: RawFd) -> io::Result<()> {
    let mut code = [0u8; 1];
    loop {
        // SAFETY: read(2) of one byte into a local.
        let n = unsafe { libc::read(fd, code.as_mut_ptr().cast(), 1) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        // SAFETY: closing our own descriptor.
        unsafe { libc::close(fd) };
        return match (n, code[0]) {
            (1, 0) => Ok(()),
            (1, errno) => {
                let e = io::Error::from_raw_os_error(i32::from(errno));
                Err(io::Error::new(
                    e.kind(),
                    format!("sandbox step cgroup join: {e}"),
                ))
            }
            _ => Err(io::Error::other(
                "sandbox step cgroup join: the namespace's init is gone",
            )),
        };
    }
}

/// Whether the host died before the parent-death signal was set. The parent's pid says so,
/// unless this process is the init of a PID namespace the clone made (its parent is outside, pid
/// 0 here): then the exec-status pipe does, whose read end only the host holds.
///
/// # Safety
/// In the child only.
unsafe fn host_gone(parent: libc::pid_t, shared: Option<&super::shim::Shared>) -> bool {
    // SAFETY (whole block): getppid and a zero-timeout poll on a live descriptor.
    unsafe {
        match shared.filter(|s| s.pid_ns_entered) {
            None => libc::getppid() != parent,
            Some(s) => {
                let mut pfd = libc::pollfd {
                    fd: s.report_fd,
                    events: 0,
                    revents: 0,
                };
                libc::poll(&mut pfd, 1, 0) > 0 && pfd.revents & libc::POLLERR != 0
            }
        }
    }
}

/// Keep the fds alive until the spawn returned.
pub struct Prepared {
    pub plan: ChildPlan,
    pub _landlock: OwnedFd,
    pub landlock_abi: i64,
}

impl Prepared {
    pub fn landlock_raw(&self) -> RawFd {
        self._landlock.as_raw_fd()
    }
}

/// Canonical form of `p` (symlinks resolved), so rules name the real directory.
///
/// # Errors
/// The path does not exist.
pub fn canonical(p: &Path) -> Result<PathBuf> {
    p.canonicalize()
        .map_err(|e| setup(format!("cannot resolve {}: {e}", p.display())))
}
