//! Preparing the native sandbox for one agent: the Landlock ruleset, the seccomp program, the
//! cgroups (or rlimits), the allowlist proxy, and the start that applies them in the child before
//! exec ([`Sandbox::start`], `super::vspawn`). Separate from the process plumbing so the
//! benchmark can measure exactly this.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};

use super::cgroup;
use super::exec_gate;
use super::isolate;
use super::proxy::{ConnectProxy, ProxyCfg};
// Named here too for `disk_quota`, which takes it from this module.
pub(super) use super::quota::Quota;
use crate::error::{io_err, Result};
use crate::limits::{Applied, AppliedLimits};
use crate::reply::Replier;
use crate::sink::EventSink;
use crate::spec::{AgentSpec, Category, NetworkAccess, PathAccess};

/// Everything prepared for one agent. Keep it alive as long as the agent runs: it owns the cgroup
/// (removed, after killing what is left in it, on drop) and the proxy.
pub struct Sandbox {
    plan: Arc<isolate::ChildPlan>,
    _landlock: OwnedFd,
    pub(crate) cgroup: Option<cgroup::AgentCgroup>,
    _proxy: Option<ConnectProxy>,
    /// The exec supervisor, when the spec has a live gate (none otherwise: no filter, no thread).
    exec_gate: Option<exec_gate::Supervisor>,
    entry: PathBuf,
    workspace: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// What was applied and how (the `agent_started` event).
    pub report: Value,
    /// The agent gets a mount namespace whose grants the host can withdraw.
    pub(crate) revocable: bool,
    /// The disk and file quotas' watcher, when anything is writable.
    disk: Option<super::disk_quota::DiskWatch>,
}

/// The allowlist proxy every connection goes through, when the agent has a network allowlist.
fn start_proxy(
    spec: &AgentSpec,
    network: &NetworkAccess,
    sink: &Arc<dyn EventSink>,
    replier: &Replier,
) -> Result<Option<ConnectProxy>> {
    let NetworkAccess::Allowlist(list) = network else {
        return Ok(None);
    };
    ConnectProxy::start(ProxyCfg {
        agent: spec.id.clone(),
        allowlist: list.clone(),
        sink: Arc::clone(sink),
        gate: spec.gate.clone(),
        replier: replier.clone(),
    })
    .map(Some)
    .map_err(io_err("starting the allowlist proxy"))
}

/// Per-action consent for process starts: only with a live gate.
fn start_exec_gate(
    spec: &AgentSpec,
    interpreter: Option<PathBuf>,
    sink: &Arc<dyn EventSink>,
    replier: &Replier,
) -> Result<Option<(exec_gate::Supervisor, exec_gate::ChildSide)>> {
    let Some(gate) = &spec.gate.0 else {
        return Ok(None);
    };
    exec_gate::Supervisor::start(exec_gate::Cfg {
        agent: spec.id.clone(),
        interpreter,
        gate: Arc::clone(gate),
        sink: Arc::clone(sink),
        replier: replier.clone(),
    })
    .map(Some)
}

/// What a native agent needs besides its entry, read and execute only: its package directory
/// (modules shipped beside a script), and for a script its `#!` interpreter as the agent's own
/// `PATH` finds it, with that install's `lib/` (an interpreter outside the system directories:
/// nvm's node, a pyenv python). The interpreter, canonical, is also what the exec gate lets the
/// entry's `env` start without asking: running the script is what the user consented to.
fn own_paths(
    spec: &AgentSpec,
    entry: &Path,
    workspace: &Path,
) -> (Vec<PathAccess>, Option<PathBuf>) {
    let read = |path: PathBuf| PathAccess { path, write: false };
    let mut own = Vec::new();
    if let Some(pkg) = spec.package.as_ref().and_then(|p| p.canonicalize().ok()) {
        let holds_hidden = spec.hidden.iter().any(|h| {
            h.canonicalize()
                .unwrap_or_else(|_| h.clone())
                .starts_with(&pkg)
        });
        if entry.starts_with(&pkg) && !holds_hidden && !workspace.starts_with(&pkg) {
            own.push(read(pkg));
        }
    }
    // With no PATH, `env` searches what execvp does: /bin, then /usr/bin.
    let path = spec
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or("/bin:/usr/bin", |(_, v)| v.as_str());
    let interpreter = super::confine_spec::interpreter(entry, Some(std::ffi::OsStr::new(path)));
    if let Some(i) = &interpreter {
        own.push(read(i.clone()));
        let lib = i.parent().and_then(Path::parent).map(|p| p.join("lib"));
        own.extend(lib.filter(|l| l.is_dir()).map(read));
    }
    (own, interpreter)
}

/// Every limit as applied, and by what, for the start report.
fn applied_limits(spec: &AgentSpec, quota: &Quota) -> AppliedLimits {
    AppliedLimits {
        memory_bytes: quota.memory.clone(),
        cpu_millis: quota.cpu.clone(),
        pids: quota.pids.clone(),
        timeout_ms: Some(Applied::new(
            spec.timeout.as_millis() as u64,
            "host-deadline+killpg",
        )),
        output_bytes: Some(Applied::new(spec.output_cap, "host-reader")),
        events_per_s: Some(Applied::new(spec.throttle.rate as u64, "token-bucket")),
        // Fuel meters WASM instructions; a native agent has only its deadline and CPU quota.
        fuel: spec
            .fuel
            .map(|f| Applied::new(f, "none").with_note("fuel applies to WASM agents only")),
    }
}

/// The agent's network as confined: the allowlist proxy (when it has an allowlist), the loopback
/// ports Landlock lets it connect to, and the access seccomp and Landlock enforce.
struct Network {
    proxy: Option<ConnectProxy>,
    ports: Vec<u16>,
    access: NetworkAccess,
}

impl Network {
    fn start(spec: &AgentSpec, sink: &Arc<dyn EventSink>, replier: &Replier) -> Result<Self> {
        let granted = spec.effective_network();
        let proxy = start_proxy(spec, &granted, sink, replier)?;
        let mut ports: Vec<u16> = proxy.iter().map(ConnectProxy::port).collect();
        ports.extend(&spec.connect_ports);
        // Loopback ports without a network grant: confined as an allowlist of no host (TCP
        // streams may be opened; Landlock lets them connect to these ports only).
        let access = match granted {
            NetworkAccess::None if !spec.connect_ports.is_empty() => {
                NetworkAccess::Allowlist(Vec::new())
            }
            other => other,
        };
        Ok(Self {
            proxy,
            ports,
            access,
        })
    }

    fn proxy_port(&self) -> Option<u16> {
        self.proxy.as_ref().map(ConnectProxy::port)
    }
}

/// The Landlock ruleset for the agent: its grants, its own paths (package, interpreter) and the
/// network's ports. Returns the ruleset and the kernel's ABI.
fn landlock(
    spec: &AgentSpec,
    (workspace, entry): (&Path, &Path),
    own: &[PathAccess],
    net: &Network,
) -> Result<(OwnedFd, i64)> {
    let mut paths = spec.split_paths().0;
    paths.extend(own.iter());
    isolate::landlock_ruleset(&isolate::LandlockPlan {
        workspace,
        read: spec.has(Category::FilesRead),
        write: spec.has(Category::FilesWrite),
        paths: &paths,
        entry,
        network: &net.access,
        connect_ports: &net.ports,
    })
}

/// The memory, CPU and process quotas, then the disk and file quotas over what it may write.
fn quotas(
    spec: &AgentSpec,
    workspace: &Path,
    sink: &Arc<dyn EventSink>,
) -> Result<(Quota, super::disk_quota::Planned)> {
    let mut quota = Quota::apply(
        &spec.id,
        spec.manifest.resources.mem.as_deref(),
        spec.manifest.resources.cpu.as_deref(),
        spec.max_pids,
        spec.timeout,
    )?;
    let disk = super::disk_quota::agent(spec, workspace, &mut quota, sink)?;
    Ok((quota, disk))
}

/// The parts of the start report the preparation decided, beside the limits.
struct ReportParts<'a> {
    limits: Value,
    abi: i64,
    exec_gate: bool,
    net: &'a Network,
    hidden: &'a Value,
    revocable: bool,
    namespaces: &'a Value,
}

/// What was applied and how: the `agent_started` event's sandbox part.
fn start_report(spec: &AgentSpec, r: &ReportParts<'_>) -> Value {
    json!({
        "sandbox": "native",
        "limits": r.limits,
        "landlock_abi": r.abi,
        "seccomp": true,
        "exec_gate": if r.exec_gate { json!("seccomp-user-notif") } else { json!(false) },
        "no_new_privs": true,
        "capabilities_dropped": true,
        "network": r.net.access,
        "proxy_port": r.net.proxy_port(),
        "workspace_access": if spec.has(Category::FilesWrite) { "read-write" }
            else if spec.has(Category::FilesRead) { "read-only" } else { "none" },
        "paths": crate::spec::paths_report(spec, None),
        "state_hidden": r.hidden["state_hidden"],
        "protected": r.hidden["protected"],
        "paths_revocable": if r.revocable { json!("mount-namespace") }
            else if spec.has_files() { json!(false) } else { json!(null) },
        "processes": r.namespaces["processes"],
        "terminal": r.namespaces["terminal"],
    })
}

impl Sandbox {
    /// Prepare every restriction for `spec`.
    ///
    /// # Errors
    /// [`crate::RuntimeError::SandboxSetup`] when a restriction is unavailable (fail-closed), bad
    /// resource quantities, proxy start failure.
    pub fn prepare(spec: &AgentSpec, sink: &Arc<dyn EventSink>, replier: &Replier) -> Result<Self> {
        let workspace = isolate::canonical(&spec.workspace)?;
        let entry = isolate::canonical(&spec.entry)?;
        let net = Network::start(spec, sink, replier)?;
        let (own, interpreter) = own_paths(spec, &entry, &workspace);
        let (ll_fd, abi) = landlock(spec, (&workspace, &entry), &own, &net)?;
        let seccomp = isolate::seccomp_program(&net.access, false)?;
        let (mask, hidden, revocable) = plan_mounts(spec, &workspace, &entry)?;
        let (exec_gate, exec_child) = start_exec_gate(spec, interpreter, sink, replier)?.unzip();
        let (quota, disk) = quotas(spec, &workspace, sink)?;
        let limits = applied_limits(spec, &quota);
        let Quota {
            cgroup: cg,
            rlimits,
            ..
        } = quota;
        let (ns, namespaces) = super::pidns::plan(super::pidns::Tenant::Agent, mask.is_some());
        let plan = isolate::ChildPlan {
            landlock_fd: ll_fd.as_raw_fd(),
            seccomp,
            cgroup_procs: cg
                .as_ref()
                .map(cgroup::AgentCgroup::procs_fds)
                .unwrap_or_default(),
            rlimits,
            // SAFETY: getpid has no preconditions.
            parent_pid: unsafe { libc::getpid() },
            drop_caps: true,
            exec_gate: exec_child,
            mask,
            namespaces: ns,
        };
        let report = start_report(
            spec,
            &ReportParts {
                limits: disk.with_limits(&limits),
                abi,
                exec_gate: exec_gate.is_some(),
                net: &net,
                hidden: &hidden,
                revocable,
                namespaces: &namespaces,
            },
        );
        let mut env = spec.env.clone();
        env.extend(net.proxy_port().map(super::proxy_env).into_iter().flatten());
        Ok(Self {
            plan: Arc::new(plan),
            _landlock: ll_fd,
            cgroup: cg,
            _proxy: net.proxy,
            exec_gate,
            entry,
            workspace,
            args: spec.args.clone(),
            env,
            report,
            revocable,
            disk: disk.watch,
        })
    }

    /// Whether the agent is over its disk or file quota, measured now (the invocation is
    /// ending); a hit kills what is left of its tree and is recorded once.
    pub(crate) fn write_quota_exceeded(&self) -> Option<crate::limits::QuotaHit> {
        self.disk
            .as_ref()
            .and_then(super::disk_quota::DiskWatch::check_now)
    }

    /// When [`Sandbox::start`] failed: what the exec gate's supervisor knows of it (the child's
    /// own error names its step already). Bounded wait, only with an exec gate.
    pub fn spawn_failure(&self) -> Option<String> {
        self.exec_gate
            .as_ref()
            .and_then(|g| g.spawn_failure(std::time::Duration::from_millis(50)))
    }

    /// Starts the agent confined, from the spawner thread and without copying the host
    /// ([`super::vspawn`]), with its standard streams as `io` says. Returns once it has exec'd.
    ///
    /// # Errors
    /// A sandbox step failed in the child (its message names the step), the entry could not be
    /// exec'd, or a name holds a NUL byte.
    pub fn start(&self, io: [super::ChildIo; 3]) -> std::io::Result<super::Spawned> {
        use std::os::unix::ffi::OsStrExt;
        let c = |b: &[u8]| {
            std::ffi::CString::new(b).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in a name")
            })
        };
        let program = c(self.entry.as_os_str().as_bytes())?;
        let mut argv = vec![program.clone()];
        for a in &self.args {
            argv.push(c(a.as_bytes())?);
        }
        let envp = self
            .env
            .iter()
            .map(|(k, v)| c(format!("{k}={v}").as_bytes()))
            .collect::<std::io::Result<Vec<_>>>()?;
        super::spawner::spawn_sandboxed(super::vspawn::Request {
            program,
            argv,
            envp,
            cwd: c(self.workspace.as_os_str().as_bytes())?,
            plan: Arc::clone(&self.plan),
            announce: self.disk.as_ref().map(super::disk_quota::DiskWatch::pid_fd),
            io,
        })
    }
}

/// The child's mount namespace: the host's state hidden where a grant would contain it, `.git`
/// read-only where a writable grant would reach it (and their reports, `state_hidden` and
/// `protected`), and each granted path a mount of its own so a revocation can take it back
/// mid-run (whether it can). A project agent's own package, inside the hidden `.meta/`, is
/// shown again read-only (its entry is there).
fn plan_mounts(
    spec: &AgentSpec,
    workspace: &Path,
    entry: &Path,
) -> Result<(Option<super::mask::Mask>, Value, bool)> {
    let package = spec.package.as_ref().and_then(|p| p.canonicalize().ok());
    let mask = super::mask::plan(
        &super::mask::Shield {
            hidden: &spec.hidden,
            protected: &spec.protected,
            workspace,
        },
        &spec.granted_access(),
    )?
    .map(|m| m.with_own_package(entry, package.as_deref(), workspace))
    .transpose()?;
    let hidden_report = json!({
        "state_hidden": mask.as_ref().and_then(super::mask::Mask::report),
        "protected": mask.as_ref().and_then(super::mask::Mask::protected_report),
    });
    let revocable = spec.has_files() && super::mountns::available();
    let mask = if revocable {
        Some(super::mask::Mask::revocable(
            mask,
            &spec.granted_dirs(),
            workspace,
        )?)
    } else {
        mask
    };
    Ok((mask, hidden_report, revocable))
}
