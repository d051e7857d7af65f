//! What the host hands the runtime to run one agent: the manifest plus what policy decided
//! (granted capabilities, native consent, network allowlist) and the limits. Everything here is
//! data so the decision is visible in the log.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use metash_protocol::Manifest;
use serde::Serialize;
use serde_json::Value;

use crate::stream::Throttle;

/// The capability categories the runtime enforces (seed 002 section 2): files.read, files.write,
/// network.
pub use metash_protocol::capability::Category;

/// Outbound network access, decided by policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "mode", content = "domains", rename_all = "snake_case")]
pub enum NetworkAccess {
    /// No sockets at all (the default).
    None,
    /// Only HTTP CONNECT through the host's proxy to these domains (`example.com` or
    /// `*.example.com`).
    Allowlist(Vec<String>),
    /// Unrestricted outbound TCP. Natively: any TCP or UDP socket, still no raw ones. WASM
    /// (preview-2 components only): outbound TCP and name lookup, no UDP, no listening socket.
    Unrestricted,
}

/// An action the runtime sees while an agent runs and can hold until someone decides: the host's
/// consent layer answers through [`ActionGate`]. Without a gate the runtime applies only what the
/// spec fixed at start (the allowlist; processes allowed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedAction<'a> {
    /// An outbound connection through the host's proxy. `write` is true when the request may send
    /// data the proxy cannot see (a CONNECT tunnel) or uses a method that changes state (POST,
    /// PUT, PATCH, DELETE).
    Connect {
        host: &'a str,
        port: u16,
        method: &'a str,
        write: bool,
    },
    /// A native agent (or one of its children) is about to `execve` `program`.
    Exec {
        program: &'a str,
        argv: &'a [String],
    },
}

/// The gate's answer. A denial reaches the agent as an `error` event with `code` and `hint`, and
/// the log as `sandbox_denied`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateVerdict {
    Allow,
    Deny {
        code: String,
        message: String,
        hint: Option<String>,
    },
}

/// Live per-action decisions. Called from runtime threads (the proxy's, the exec supervisor's)
/// while the agent waits, so it may block to ask a person; it must never block forever.
pub trait ActionGate: Send + Sync {
    fn decide(&self, agent: &str, action: &GatedAction<'_>) -> GateVerdict;
}

/// The optional gate in a spec (a newtype so the spec stays `Debug`).
#[derive(Clone, Default)]
pub struct Gate(pub Option<Arc<dyn ActionGate>>);

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Gate(live)"
        } else {
            "Gate(none)"
        })
    }
}

impl Gate {
    /// The gate's verdict, or `None` when there is no gate (the caller applies its static rule).
    pub fn decide(&self, agent: &str, action: &GatedAction<'_>) -> Option<GateVerdict> {
        self.0.as_ref().map(|g| g.decide(agent, action))
    }
}

/// A scoped file grant (`files.read:src`, `files.write:/tmp/out`): one more path the agent may
/// read, or read and write, beyond what `files.read`/`files.write` give for the whole workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PathAccess {
    /// Absolute (the host resolves workspace-relative scopes).
    pub path: PathBuf,
    pub write: bool,
}

impl PathAccess {
    /// Where the path appears inside a WASM guest: under the guest's workspace for a path inside
    /// the workspace, at its own absolute path otherwise.
    pub fn guest_path(&self, workspace: &std::path::Path, guest_workspace: &str) -> String {
        match self.path.strip_prefix(workspace) {
            Ok(rel) if rel.as_os_str().is_empty() => guest_workspace.to_string(),
            Ok(rel) => format!("{guest_workspace}/{}", rel.display()),
            Err(_) => self.path.display().to_string(),
        }
    }
}

/// One agent to run.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// Unique id for logs and the protocol's `agent_id`.
    pub id: String,
    pub manifest: Manifest,
    /// The resolved `entry`: a `.wasm`/`.wat` module or an executable.
    pub entry: PathBuf,
    /// The agent's own directory (its manifest's, holding the entry), when it has one: a native
    /// agent may read and execute it (never write), so a script finds the modules shipped beside
    /// it (`node_modules/`, a vendored package). Ignored when it contains a [`Self::hidden`]
    /// directory or the workspace: then only the entry itself is readable.
    pub package: Option<PathBuf>,
    pub args: Vec<String>,
    /// The workspace root; the only part of the filesystem an agent may see (by capability).
    pub workspace: PathBuf,
    /// Capabilities declared AND granted (the policy layer computes the intersection).
    pub granted: Vec<String>,
    /// Scoped file grants, each applied on its own (a path that does not exist is skipped and the
    /// start report says so).
    pub paths: Vec<PathAccess>,
    /// Network mode; only honoured when `network` is granted.
    pub network: NetworkAccess,
    /// The user's consent to run this agent natively (stands in for the policy layer's consent).
    pub allow_native: bool,
    /// Free-form config passed in `start`.
    pub config: Value,
    /// The only environment the agent sees (native) / gets (WASM).
    pub env: Vec<(String, String)>,
    /// Loopback TCP ports a native agent may connect to whatever its network grant: the host's
    /// credential proxies (OAuth handles). Nothing else becomes reachable.
    pub connect_ports: Vec<u16>,
    /// Per-invocation deadline.
    pub timeout: Duration,
    /// How long `shutdown()` (and timeouts) wait between the polite request and the kill.
    pub shutdown_grace: Duration,
    pub throttle: Throttle,
    /// Output bytes accepted per invocation; past it the invocation ends with `limit_exceeded`.
    pub output_cap: u64,
    /// Longest single protocol line accepted.
    pub max_line: usize,
    /// Process limit for native agents (fork bombs).
    pub max_pids: u64,
    /// Native agents: bytes and files the spawn may add under what it can write (defaults where
    /// unset; see [`crate::limits::WriteQuota`]).
    pub write_quota: crate::limits::WriteQuota,
    /// Events buffered between the reader and the consumer (bounds host memory with `max_line`).
    pub channel_capacity: usize,
    /// Live consent for sensitive actions (proxied connections, process starts).
    pub gate: Gate,
    /// Deterministic CPU limit for WASM agents: wasmtime fuel units per invocation (`None`: only
    /// the wall-clock deadline applies). Running out ends the invocation `limit_exceeded: fuel`.
    /// Metering costs speed, so such agents run on a second engine, created on first use.
    pub fuel: Option<u64>,
    /// Directories no agent may see, whatever it is granted: the host's own state (`.meta/`).
    /// A grant that contains one gets it masked (natively: an empty read-only mount over it in the
    /// agent's own mount namespace); a WASM preopen that contains one is refused. The runtime
    /// knows no names: the host says which. A grant that lies inside one is refused, except the
    /// workspace itself (a task worktree the host made under `.meta/worktrees/`, which the host
    /// checks before it builds the spec).
    pub hidden: Vec<PathBuf>,
    /// Paths no agent may change, whatever it is granted: the project's `.git`. metash's own git and the user's run what is configured there, so
    /// a planted hook, filter or ref would run or be merged outside any sandbox. A writable grant
    /// that contains one (or lies inside one) gets it read-only (natively: a read-only bind of it
    /// on itself in the agent's own mount namespace; for WASM, the same in its view); where that
    /// cannot be done the agent does not start.
    pub protected: Vec<PathBuf>,
}

impl AgentSpec {
    /// A spec with conservative defaults: nothing granted, no network, no native consent, 30 s.
    pub fn new(
        id: impl Into<String>,
        manifest: Manifest,
        entry: impl Into<PathBuf>,
        workspace: impl Into<PathBuf>,
    ) -> Self {
        Self {
            id: id.into(),
            manifest,
            entry: entry.into(),
            package: None,
            args: Vec::new(),
            workspace: workspace.into(),
            granted: Vec::new(),
            paths: Vec::new(),
            network: NetworkAccess::None,
            allow_native: false,
            config: Value::Null,
            env: Vec::new(),
            connect_ports: Vec::new(),
            timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_millis(500),
            throttle: Throttle::default(),
            output_cap: 64 * 1024 * 1024,
            max_line: 1024 * 1024,
            max_pids: 64,
            write_quota: crate::limits::WriteQuota::default(),
            channel_capacity: 64,
            gate: Gate::default(),
            fuel: None,
            hidden: Vec::new(),
            protected: Vec::new(),
        }
    }

    /// The directories the agent is granted (the workspace with a files capability, and each
    /// existing scoped path): what [`Self::hidden`] is checked against.
    pub fn granted_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        if self.has(Category::FilesRead) || self.has(Category::FilesWrite) {
            dirs.push(self.workspace.clone());
        }
        dirs.extend(self.split_paths().0.into_iter().map(|p| p.path.clone()));
        dirs
    }

    /// The same as [`Self::granted_dirs`], each with whether it is writable: what
    /// [`Self::protected`] is checked against.
    pub fn granted_access(&self) -> Vec<PathAccess> {
        let mut all = Vec::new();
        if self.has(Category::FilesRead) || self.has(Category::FilesWrite) {
            all.push(PathAccess {
                path: self.workspace.clone(),
                write: self.has(Category::FilesWrite),
            });
        }
        all.extend(self.split_paths().0.into_iter().cloned());
        all
    }

    /// Whether the whole category is granted (unscoped).
    pub fn has(&self, cap: Category) -> bool {
        self.granted.iter().any(|c| c == cap.as_str())
    }

    /// Whether the agent can see any file of its own (the workspace, or a scoped path).
    pub fn has_files(&self) -> bool {
        self.has(Category::FilesRead) || self.has(Category::FilesWrite) || !self.paths.is_empty()
    }

    /// The scoped paths that exist (applied) and those that do not (skipped, reported).
    pub fn split_paths(&self) -> (Vec<&PathAccess>, Vec<&PathAccess>) {
        self.paths.iter().partition(|p| p.path.exists())
    }

    /// The network mode in force: `None` unless `network` is granted.
    pub fn effective_network(&self) -> NetworkAccess {
        if self.has(Category::Network) {
            self.network.clone()
        } else {
            NetworkAccess::None
        }
    }
}

/// A grant inside a hidden directory (a file in `.meta/`, another task's worktree) is never given:
/// only the workspace itself may be there, strictly inside (a task worktree the host made under
/// `.meta/worktrees/`). All paths canonical.
///
/// # Errors
/// [`crate::RuntimeError::SandboxSetup`] naming the grant.
pub fn refuse_inside_hidden(
    hidden: &[PathBuf],
    granted: &[PathAccess],
    workspace: Option<&std::path::Path>,
) -> crate::error::Result<()> {
    for g in granted {
        let Some(h) = hidden.iter().find(|h| g.path.starts_with(h)) else {
            continue;
        };
        if workspace == Some(g.path.as_path()) && g.path != *h {
            continue;
        }
        return Err(crate::RuntimeError::SandboxSetup(format!(
            "{} lies inside {}, metash's own state, which no grant reaches",
            g.path.display(),
            h.display()
        )));
    }
    Ok(())
}

/// Whether `host` matches an allowlist entry (`example.com` exactly, `*.example.com` for
/// subdomains, `*` for any host: unrestricted network that still goes through the proxy so each
/// connection can be gated). Case-insensitive; a trailing dot is ignored.
pub fn domain_allowed(allowlist: &[String], host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    allowlist.iter().any(|entry| {
        if entry == "*" {
            return true;
        }
        let entry = entry.trim_end_matches('.').to_ascii_lowercase();
        match entry.strip_prefix("*.") {
            Some(suffix) => host.len() > suffix.len() && host.ends_with(&format!(".{suffix}")),
            None => host == entry,
        }
    })
}

/// The start report's view of the scoped file grants: each path, read-only or read-write, where a
/// WASM guest sees it, and the ones skipped (missing; for WASM also plain files, since WASI preopens
/// are directories).
pub fn paths_report(spec: &AgentSpec, guest_workspace: Option<&str>) -> serde_json::Value {
    let (applied, missing) = spec.split_paths();
    let mut out = Vec::new();
    let mut not_dirs = Vec::new();
    for p in applied {
        let mut v = serde_json::json!({
            "path": p.path,
            "access": if p.write { "read-write" } else { "read-only" },
        });
        if let Some(g) = guest_workspace {
            if !p.path.is_dir() {
                not_dirs.push(&p.path);
                continue;
            }
            v["guest"] = serde_json::json!(p.guest_path(&spec.workspace, g));
        }
        out.push(v);
    }
    serde_json::json!({
        "applied": out,
        "skipped_missing": missing.into_iter().map(|p| &p.path).collect::<Vec<_>>(),
        "skipped_not_a_directory": not_dirs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowlist_matching() {
        let list = vec!["localhost".to_string(), "*.example.org".to_string()];
        assert!(domain_allowed(&list, "LOCALHOST."));
        assert!(domain_allowed(&list, "a.example.org"));
        assert!(!domain_allowed(&list, "example.org"));
        assert!(!domain_allowed(&list, "evil-example.org"));
        assert!(!domain_allowed(&list, "localhost.evil.com"));
    }
}
