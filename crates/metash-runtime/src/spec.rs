//! What the host hands the runtime to run one agent: the manifest plus what policy decided
//! (granted capabilities, native consent, network allowlist) and the limits. Everything here is
//! data so the decision is visible in the log.

use std::path::PathBuf;
use std::time::Duration;

use metash_protocol::Manifest;
use serde::Serialize;
use serde_json::Value;

use crate::stream::Throttle;

/// Capability names the runtime enforces (seed 002 section 2).
pub mod caps {
    pub const FILES_READ: &str = "files.read";
    pub const FILES_WRITE: &str = "files.write";
    pub const NETWORK: &str = "network";
}

/// Outbound network access, decided by policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "mode", content = "domains", rename_all = "snake_case")]
pub enum NetworkAccess {
    /// No sockets at all (the default).
    None,
    /// Only HTTP CONNECT through the host's proxy to these domains (`example.com` or
    /// `*.example.com`).
    Allowlist(Vec<String>),
    /// Unrestricted outbound TCP (natively only; still no raw sockets).
    Unrestricted,
}

/// One agent to run.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// Unique id for logs and the protocol's `agent_id`.
    pub id: String,
    pub manifest: Manifest,
    /// The resolved `entry`: a `.wasm`/`.wat` module or an executable.
    pub entry: PathBuf,
    pub args: Vec<String>,
    /// The workspace root; the only part of the filesystem an agent may see (by capability).
    pub workspace: PathBuf,
    /// Capabilities declared AND granted (the policy layer computes the intersection).
    pub granted: Vec<String>,
    /// Network mode; only honoured when `network` is granted.
    pub network: NetworkAccess,
    /// The user's consent to run this agent natively (stands in for the policy layer's consent).
    pub allow_native: bool,
    /// Free-form config passed in `start`.
    pub config: Value,
    /// The only environment the agent sees (native) / gets (WASM).
    pub env: Vec<(String, String)>,
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
    /// Events buffered between the reader and the consumer (bounds host memory with `max_line`).
    pub channel_capacity: usize,
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
            args: Vec::new(),
            workspace: workspace.into(),
            granted: Vec::new(),
            network: NetworkAccess::None,
            allow_native: false,
            config: Value::Null,
            env: Vec::new(),
            timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_millis(500),
            throttle: Throttle::default(),
            output_cap: 64 * 1024 * 1024,
            max_line: 1024 * 1024,
            max_pids: 64,
            channel_capacity: 64,
        }
    }

    pub fn has(&self, cap: &str) -> bool {
        self.granted.iter().any(|c| c == cap)
    }

    /// The network mode in force: `None` unless `network` is granted.
    pub fn effective_network(&self) -> NetworkAccess {
        if self.has(caps::NETWORK) {
            self.network.clone()
        } else {
            NetworkAccess::None
        }
    }
}

/// Whether `host` matches an allowlist entry (`example.com` exactly, `*.example.com` for
/// subdomains). Case-insensitive; a trailing dot is ignored.
pub fn domain_allowed(allowlist: &[String], host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    allowlist.iter().any(|entry| {
        let entry = entry.trim_end_matches('.').to_ascii_lowercase();
        match entry.strip_prefix("*.") {
            Some(suffix) => host.len() > suffix.len() && host.ends_with(&format!(".{suffix}")),
            None => host == entry,
        }
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
