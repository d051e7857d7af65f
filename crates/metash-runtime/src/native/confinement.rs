//! The Linux confinement of a program that does not speak the agent protocol (see
//! [`super::confine`] for what is confined and why): Landlock, seccomp, no capabilities, no new
//! privileges, its own session, cgroup or rlimit quotas, `.meta/` masked, `.git` read-only.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::{json, Value};

use super::confine_spec::ConfineSpec;
use super::isolate;
use super::quota::Quota;
use crate::error::Result;
use crate::spec::{NetworkAccess, PathAccess};

/// Besides the loader's files (see `isolate`), what interpreters and shells read to start: the
/// process's own `/proc` entries (Landlock's ptrace scoping keeps other processes' environment and
/// memory unreadable), the resolver and user database (no `shadow`), git's system config.
const CLI_SYSTEM_RO: &[&str] = &[
    "/proc",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/gitconfig",
    "/etc/inputrc",
    "/etc/bash.bashrc",
    "/etc/profile",
    "/etc/profile.d",
    "/etc/environment",
    "/etc/mime.types",
    "/etc/ssl/openssl.cnf",
    "/etc/terminfo",
    "/etc/alternatives",
    "/usr/share/terminfo",
];

/// The controlling terminal, whatever it is: none for a headless CLI (`ENXIO`), a pty of its own
/// making or the one `metash sandbox` relays. `/dev/pts` and `/dev/ptmx` are never the host's:
/// the child mounts a private `devpts` and grants it itself ([`super::tty`]).
const TTY_RW: &[&str] = &["/dev/tty"];

/// A prepared confinement. Keep it alive until the child has been reaped: it owns the ruleset fd
/// and the cgroup (whatever is left in it is killed when it drops).
pub struct Confinement {
    plan: Arc<isolate::ChildPlan>,
    _proxy: Option<super::ConnectProxy>,
    _landlock: OwnedFd,
    quota: Quota,
    env: Vec<(String, String)>,
    /// What was applied, for the log.
    pub report: Value,
    /// The disk and file quotas' watcher, when anything is writable.
    disk: Option<super::disk_quota::DiskWatch>,
}

impl std::fmt::Debug for Confinement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confinement")
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

/// What the program may see besides its working directory, canonical: its own install, the
/// system's read-only files, the terminal, the spec's paths. Paths that do not exist are skipped
/// (and reported).
fn resolve_paths(spec: &ConfineSpec) -> (Vec<PathAccess>, Vec<String>) {
    let ro = |p: &Path| PathAccess {
        path: p.to_path_buf(),
        write: false,
    };
    let wanted = spec
        .program_dirs
        .iter()
        .map(|d| ro(d))
        .chain(CLI_SYSTEM_RO.iter().map(|p| ro(Path::new(p))))
        .chain(TTY_RW.iter().map(|p| PathAccess {
            path: PathBuf::from(p),
            write: true,
        }))
        .chain(spec.paths.iter().cloned());
    let (mut paths, mut skipped) = (Vec::new(), Vec::new());
    for p in wanted {
        match p.path.canonicalize() {
            Ok(path) => paths.push(PathAccess {
                path,
                write: p.write,
            }),
            Err(_) => skipped.push(p.path.display().to_string()),
        }
    }
    (paths, skipped)
}

/// What the child applies before exec: Landlock, seccomp, the cgroup, rlimits, the mask; no
/// exec gate (the CLI's commands are its own business inside the sandbox).
fn child_plan(
    landlock_fd: std::os::fd::RawFd,
    seccomp: Vec<libc::sock_filter>,
    quota: &mut Quota,
    mask: Option<super::mask::Mask>,
) -> isolate::ChildPlan {
    isolate::ChildPlan {
        landlock_fd,
        seccomp,
        cgroup_procs: quota
            .cgroup
            .as_ref()
            .map(super::cgroup::AgentCgroup::procs_fds)
            .unwrap_or_default(),
        rlimits: std::mem::take(&mut quota.rlimits),
        // SAFETY: getpid has no preconditions.
        parent_pid: unsafe { libc::getpid() },
        drop_caps: true,
        exec_gate: None,
        mask,
        namespaces: None,
    }
}

/// The allowlist proxy, when the spec names hosts beyond metash's own ports.
fn start_proxy(
    spec: &ConfineSpec,
    sink: &Arc<dyn crate::sink::EventSink>,
) -> Result<Option<super::ConnectProxy>> {
    if spec.fence.allowlist.is_empty() {
        return Ok(None);
    }
    super::ConnectProxy::start(super::ProxyCfg {
        agent: spec.name.clone(),
        allowlist: spec.fence.allowlist.clone(),
        sink: Arc::clone(sink),
        gate: crate::spec::Gate(None),
        replier: crate::reply::Replier::default(),
    })
    .map(Some)
    .map_err(crate::error::io_err("starting the allowlist proxy"))
}

/// The mount namespace, when one is needed: `.meta/` hidden where a grant contains it, `.git`
/// read-only where a writable grant reaches it; and the two reports (`state_hidden`,
/// `protected`).
fn plan_mask(
    spec: &ConfineSpec,
    workspace: &Path,
    write: bool,
    paths: &[PathAccess],
) -> Result<(Option<super::mask::Mask>, Option<Value>, Option<Value>)> {
    let mut granted = vec![PathAccess {
        path: workspace.to_path_buf(),
        write,
    }];
    granted.extend(paths.iter().cloned());
    let mask = super::mask::plan(
        &super::mask::Shield {
            hidden: &spec.fence.hidden,
            protected: &spec.fence.protected,
            workspace,
        },
        &granted,
    )?;
    let hidden = mask.as_ref().and_then(super::mask::Mask::report);
    let protected = mask.as_ref().and_then(super::mask::Mask::protected_report);
    Ok((mask, hidden, protected))
}

impl Confinement {
    /// Prepares every restriction for `spec`.
    ///
    /// # Errors
    /// [`crate::RuntimeError::SandboxSetup`] when a restriction is unavailable (fail closed: the
    /// caller must not run the program), or a quantity does not parse.
    pub fn prepare(spec: &ConfineSpec, sink: &Arc<dyn crate::sink::EventSink>) -> Result<Self> {
        let workspace = isolate::canonical(&spec.workspace)?;
        let program = isolate::canonical(&spec.program)?;
        let (paths, skipped) = resolve_paths(spec);
        let refs: Vec<&PathAccess> = paths.iter().collect();
        let mut env = spec.env.clone();
        let mut connect_ports = spec.fence.connect_ports.clone();
        let proxy = start_proxy(spec, sink)?;
        if let Some(p) = &proxy {
            env.extend(super::proxy_env(p.port()));
            for k in ["NO_PROXY", "no_proxy"] {
                env.push((k.to_string(), "127.0.0.1,::1".to_string()));
            }
            connect_ports.push(p.port());
        }
        let network = NetworkAccess::Allowlist(Vec::new());
        let write = !spec.fence.workspace_read_only;
        let (ll_fd, abi) = isolate::landlock_ruleset(&isolate::LandlockPlan {
            workspace: &workspace,
            read: true,
            write,
            paths: &refs,
            entry: &program,
            network: &network,
            connect_ports: &connect_ports,
        })?;
        let (mask, hidden_report, protected_report) = plan_mask(spec, &workspace, write, &paths)?;
        let mut quota = Quota::apply(
            &format!("cli-{}", spec.name),
            spec.fence.mem.as_deref(),
            spec.fence.cpu.as_deref(),
            spec.fence.max_pids,
            spec.fence.timeout,
        )?;
        let (ns, ns_report) = super::pidns::plan(super::pidns::Tenant::Cli, mask.is_some());
        // A coding CLI runs its commands on a pty in a session of their own (Codex's unified exec),
        // and an interactive shell puts its jobs in groups of their own: allowed when the cgroup
        // or the PID namespace holds the whole tree (killed as one: the cgroup when the
        // confinement drops, the namespace when its init dies with the group); without either,
        // the process group is the only handle, so it must not be left.
        let new_sessions = quota.cgroup.is_some() || ns.is_some();
        let disk = super::disk_quota::confined(spec, &workspace, &paths, &mut quota, sink)?;
        let seccomp = isolate::seccomp_program(&network, new_sessions)?;
        let mut plan = child_plan(ll_fd.as_raw_fd(), seccomp, &mut quota, mask);
        plan.namespaces = ns;
        let report = json!({
            "sandbox": "native",
            "program": program,
            "workspace": workspace,
            "workspace_access": if write { "read-write" } else { "read-only" },
            "landlock_abi": abi,
            "seccomp": true,
            "new_sessions": if new_sessions { "allowed (the cgroup or the PID namespace holds the tree)" } else { "denied (no cgroup, no PID namespace)" },
            "no_new_privs": true,
            "capabilities_dropped": true,
            "network": {"tcp_connect_ports": connect_ports, "allowlist": spec.fence.allowlist,
                        "proxy_port": proxy.as_ref().map(super::ConnectProxy::port),
                        "listen": false, "unix_sockets": false},
            "paths": paths.iter().map(|p| json!({"path": p.path, "write": p.write})).collect::<Vec<_>>(),
            "skipped_paths": skipped,
            "env": env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            "limits": {"memory_bytes": quota.memory, "cpu_millis": quota.cpu, "pids": quota.pids,
                       "disk_bytes": disk.report["disk_bytes"], "files": disk.report["files"]},
            "state_hidden": hidden_report,
            "protected": protected_report,
            "processes": ns_report["processes"],
            "terminal": ns_report["terminal"],
        });
        Ok(Self {
            plan: Arc::new(plan),
            _proxy: proxy,
            _landlock: ll_fd,
            quota,
            env,
            report,
            disk: disk.watch,
        })
    }

    /// Makes `cmd` run confined: its environment replaced by the spec's, and the restrictions
    /// applied in the child before exec (it also becomes a session and process-group leader, so
    /// the caller must not set a process group itself).
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env_clear()
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let plan = Arc::clone(&self.plan);
        // SAFETY: the pid announcement and `apply` make only async-signal-safe syscalls on data
        // prepared in the parent.
        unsafe {
            if let Some(w) = &self.disk {
                cmd.pre_exec(w.announce_pid());
            }
            cmd.pre_exec(move || plan.apply());
        }
    }

    /// Quotas the kernel reports as hit so far (cgroups only).
    pub fn limits_hit(&self) -> Vec<&'static str> {
        self.quota
            .cgroup
            .as_ref()
            .map(super::cgroup::AgentCgroup::limits_hit)
            .unwrap_or_default()
    }

    /// An interactive session ([`super::tty`]): before [`Confinement::apply`], gives the program a
    /// pty of its own (the size of the terminal on stdin) as stdio and controlling terminal, and
    /// returns the host's side, which relays it.
    ///
    /// # Errors
    /// No namespaces here (the pty lives in the tree's private `devpts`: without one, no terminal
    /// at all), or the socket pair cannot be made.
    pub fn relay_terminal(&mut self) -> Result<super::tty::Relay> {
        let tty = Arc::get_mut(&mut self.plan)
            .and_then(|p| p.namespaces.as_mut())
            .map(super::pidns::Namespaces::tty_mut);
        super::tty::relay_into(tty, &mut self.report)
    }
}
