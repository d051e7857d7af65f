//! A CLI role runs under the runtime's native sandbox, like any native agent: the task's worktree
//! writable (the project root read-only for a planner), its own HOME and TMPDIR in the spawn's
//! directory, the project's git metadata read-only (so `git status`/`diff`/`log` work in a
//! worktree, and nothing the host's git later runs can be planted; found from the project's own
//! back-pointers, never from the worktree's `.git` file, see [`crate::gitdirs`]), the CLI's install
//! directory read and execute, system directories read-only, nothing else of the user's home, TCP
//! only to the credential proxy, the environment cleared to an allowlist, and the role's quotas.
//! Its own permission prompts and sandbox are off (the harness's `skip_permissions`): metash's
//! sandbox is the boundary.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use metash_protocol::LogKind;

use metash_harness::{ConfineGuard, Confiner};
use metash_protocol::ProcessInvocationSpec;
use metash_runtime::native::confine::{self, ConfineSpec, Confinement, Fence, PASS_ENV};
use metash_runtime::spec::PathAccess;
use metash_runtime::EventSink;
use serde_json::json;

use crate::config::Role;

/// Default quotas for a CLI role's whole process tree (a coding CLI with its shells, test runs
/// and language servers). `[roles.X] mem / cpu / max_pids` override them (disk and files:
/// `metash_runtime::limits::WriteQuota`'s defaults, `[roles.X] disk / files`).
const DEFAULT_MAX_PIDS: u64 = 512;
const DEFAULT_MEM: &str = "4g";

/// What one spawn of a CLI role may reach; applied by the harness to the CLI's `Command`.
/// Public for `metash sandbox` and the benchmark that compares a sandboxed CLI turn with a bare one.
pub struct RoleConfiner {
    pub role: String,
    pub frontend: &'static str,
    /// The spawn's own directory: HOME, the CLI's config and TMPDIR live here.
    pub spawn_dir: PathBuf,
    /// The role's quotas, `[roles.X] network` allowlist, and what the spawn adds (hidden state,
    /// protected `.git`, a read-only workspace, the proxy's port).
    pub fence: Fence,
    /// The project whose `.git` holds the worktrees' admin directories: a command run in one of
    /// its task worktrees may read that worktree's admin directory and the common `.git`. `None`:
    /// no git metadata beyond the working directory.
    pub project: Option<PathBuf>,
    /// The host's values of [`PASS_ENV`].
    pub passed_env: Vec<(String, String)>,
    pub sink: Arc<dyn EventSink>,
    /// Told the pid (= process group) of each confined child once it started: how a spawn
    /// registers the CLI for suspend and resume. `metash sandbox` leaves it unset.
    pub on_spawn: Option<Arc<dyn Fn(u32) + Send + Sync>>,
}

impl RoleConfiner {
    pub fn new(
        name: &str,
        role: &Role,
        spawn_dir: &Path,
        timeout: Duration,
        env: impl Fn(&str) -> Option<String>,
        sink: Arc<dyn EventSink>,
    ) -> Self {
        Self {
            role: name.to_string(),
            frontend: role.frontend.as_str(),
            spawn_dir: spawn_dir.to_path_buf(),
            fence: Fence {
                hidden: Vec::new(),
                protected: Vec::new(),
                workspace_read_only: false,
                connect_ports: Vec::new(),
                allowlist: role.network.clone(),
                mem: role.mem.clone().or_else(|| Some(DEFAULT_MEM.into())),
                cpu: role.cpu.clone(),
                max_pids: role.max_pids.unwrap_or(DEFAULT_MAX_PIDS),
                timeout,
                write: metash_runtime::limits::WriteQuota::new(role.disk.clone(), role.files),
            },
            project: None,
            passed_env: PASS_ENV
                .iter()
                .filter_map(|k| env(k).map(|v| (k.to_string(), v)))
                .collect(),
            sink,
            on_spawn: None,
        }
    }

    /// The confinement for running `argv0` in `cwd` with `extra_env` on top of the allowlisted
    /// environment (also what `metash sandbox` uses for any command).
    pub fn prepare(
        &self,
        argv0: &str,
        cwd: &Path,
        extra_env: &std::collections::BTreeMap<String, String>,
    ) -> Result<Confinement, String> {
        let path_var = self
            .passed_env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| std::ffi::OsString::from(v));
        let program = resolve(Path::new(argv0), path_var.as_deref())
            .ok_or_else(|| format!("`{argv0}` is not an executable on PATH"))?;
        let home = self.spawn_dir.join("home");
        let tmp = self.spawn_dir.join("tmp");
        for d in [&home, &tmp] {
            std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        }
        let mut env: Vec<(String, String)> = self.passed_env.clone();
        let mut set = |k: &str, v: String| {
            env.retain(|(key, _)| key != k);
            env.push((k.to_string(), v));
        };
        // Nothing of the user's home: a HOME of its own unless the harness set one (it does
        // for every isolated CLI, inside the spawn directory).
        set("HOME", home.display().to_string());
        set("TMPDIR", tmp.display().to_string());
        for (k, v) in extra_env {
            set(k, v.clone());
        }
        let mut paths = vec![rw(&self.spawn_dir)];
        if let Some(project) = &self.project {
            paths.extend(git_paths(project, cwd));
        }
        let cs = ConfineSpec {
            name: self.role.clone(),
            program_dirs: confine::program_dirs(&program, path_var.as_deref()),
            program,
            workspace: cwd.to_path_buf(),
            paths,
            fence: self.fence.clone(),
            env,
        };
        Confinement::prepare(&cs, &self.sink).map_err(|e| e.to_string())
    }
}

impl Confiner for RoleConfiner {
    fn confine(
        &self,
        spec: &ProcessInvocationSpec,
        cmd: &mut std::process::Command,
    ) -> Result<ConfineGuard, String> {
        let argv0 = spec.argv.first().ok_or("empty argv")?;
        let confinement = self.prepare(argv0, Path::new(&spec.cwd), &spec.env)?;
        let mut report = confinement.report.clone();
        if let Some(r) = report.as_object_mut() {
            r.insert("frontend".into(), json!(self.frontend));
        }
        self.sink
            .record(LogKind::AgentStarted, Some(&self.role), report);
        confinement.apply(cmd);
        Ok(Box::new(confinement))
    }

    fn spawned(&self, pid: u32) {
        if let Some(f) = &self.on_spawn {
            f(pid);
        }
    }
}

/// A CLI role runs natively (in metash's native sandbox, not WASM): like a native agent, only with
/// the user's consent, asked once and recorded in the ledger (`--yes-to native` gives it for a
/// run; `metash consent grant ROLE native` for longer).
///
/// # Errors
/// [`crate::error::HostError::ConsentRefused`] when it is not given (nothing changes by asking
/// again in the same run), or the ledger cannot be read.
pub(crate) fn native_consent(host: &crate::host::Host, role: &str) -> crate::error::Result<()> {
    use metash_policy::{Authorization, CapabilityRequest};
    let policy = host.policy()?;
    let ask = CapabilityRequest::native_exec(format!(
        "run the role `{role}`'s coding CLI natively, in metash's sandbox"
    ));
    let mut prompter = host.prompter();
    let verdict = policy
        .authorize(role, &ask, prompter.as_mut())
        .map_err(|e| crate::error::HostError::Other(format!("consent for `{role}`: {e}")))?;
    match verdict {
        Authorization::Allowed { .. } => Ok(()),
        Authorization::Denied { message, .. } => Err(crate::error::HostError::consent_refused(
            role,
            "native",
            &format!("native execution of the role `{role}`"),
            &message,
        )),
    }
}

fn rw(p: &Path) -> PathAccess {
    PathAccess {
        path: p.to_path_buf(),
        write: true,
    }
}

/// A task worktree's git metadata, read-only: its admin directory under the project's
/// `.git/worktrees/` and the common directory (objects, refs, config). Read-only because the
/// host's own git runs there after the CLI: a writable config or admin directory could make it run
/// a planted command. Both come from the project's own `.git` (the admin directory whose
/// back-pointer names `cwd`), never from `cwd/.git`, which the agent working there can rewrite to
/// point anywhere. Nothing for the project root (its `.git` is inside the workspace, read-only)
/// or a directory git does not list as a worktree.
fn git_paths(project: &Path, cwd: &Path) -> Vec<PathAccess> {
    let Some(admin) = crate::gitdirs::admin_dir(project, cwd) else {
        return Vec::new();
    };
    let ro = |p: PathBuf| PathAccess {
        path: p,
        write: false,
    };
    std::iter::once(ro(admin))
        .chain(crate::gitdirs::common_dir(project).map(ro))
        .collect()
}

/// `program` as an absolute path: as given when it has a slash, else the first match on `path`.
fn resolve(program: &Path, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let executable = |p: &Path| metash_harness::programs::is_executable(p);
    if program.components().count() > 1 || program.is_absolute() {
        return executable(program).then(|| std::path::absolute(program).ok())?;
    }
    std::env::split_paths(path?)
        .map(|d| d.join(program))
        .find(|p| executable(p))
}

/// The port a base URL names (its scheme's default otherwise): a CLI role without a key to
/// protect talks to its endpoint directly, and may connect only there.
pub(crate) fn url_port(url: &str) -> Option<u16> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || authority.starts_with('[') => {
            port.parse().ok().or(match scheme {
                "https" => Some(443),
                "http" => Some(80),
                _ => None,
            })
        }
        _ => match scheme {
            "https" => Some(443),
            "http" => Some(80),
            _ => None,
        },
    }
}
