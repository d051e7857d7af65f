//! Memory, CPU and process quotas for one confined process tree (a native agent's or a confined
//! CLI's): a cgroup of its own where this host may make one, rlimits for whatever it could not do.

use std::sync::atomic::{AtomicU64, Ordering};

use super::cgroup;
use crate::error::Result;
use crate::limits::{parse_cpu, parse_mem, Applied};

/// Makes each cgroup's name unique within this process.
static NONCE: AtomicU64 = AtomicU64::new(0);

/// Memory, CPU and process quotas for one confined process tree: cgroups first, rlimits for
/// whatever they could not do.
pub(super) struct Quota {
    pub cgroup: Option<cgroup::AgentCgroup>,
    pub memory: Option<Applied>,
    pub cpu: Option<Applied>,
    pub pids: Option<Applied>,
    /// Set in the child before exec.
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
}

impl Quota {
    /// `mem` (`512m`, `2g`…) and `cpu` (`500m`, `2`…) as written in a manifest or a role.
    ///
    /// # Errors
    /// A quantity that does not parse.
    pub fn apply(
        name: &str,
        mem: Option<&str>,
        cpu: Option<&str>,
        max_pids: u64,
        timeout: std::time::Duration,
    ) -> Result<Self> {
        let mem = mem.map(parse_mem).transpose()?;
        let cpu = cpu.map(parse_cpu).transpose()?;
        let name = format!(
            "{}-{}-{}",
            name.chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect::<String>(),
            std::process::id(),
            NONCE.fetch_add(1, Ordering::Relaxed)
        );
        let quotas = cgroup::Quotas {
            memory_bytes: mem,
            cpu_millis: cpu,
            pids: Some(max_pids),
        };
        let (cg, applied) = match cgroup::AgentCgroup::create(&name, quotas) {
            Some((cg, a)) => (Some(cg), a),
            None => (None, cgroup::AppliedQuotas::default()),
        };
        let mut q = Self {
            cgroup: cg,
            memory: applied.memory,
            cpu: applied.cpu,
            pids: applied.pids,
            rlimits: vec![(libc::RLIMIT_CORE, 0)],
        };
        if let (Some(m), None) = (mem, &q.memory) {
            q.rlimits.push((libc::RLIMIT_AS, m));
            q.memory = Some(
                Applied::new(m, "rlimit")
                    .with_note("RLIMIT_AS: address space, not resident memory"),
            );
        }
        if q.pids.is_none() {
            q.rlimits.push((libc::RLIMIT_NPROC, max_pids));
            q.pids = Some(
                Applied::new(max_pids, "rlimit")
                    .with_note("RLIMIT_NPROC counts all processes of the user; root ignores it"),
            );
        }
        if let (Some(c), None) = (cpu, &q.cpu) {
            let secs = timeout.as_secs().max(1) + 1;
            q.rlimits.push((libc::RLIMIT_CPU, secs));
            q.cpu = Some(Applied::new(c, "rlimit").with_note(
                "no CPU share without cgroups; RLIMIT_CPU caps CPU seconds at the timeout",
            ));
        }
        Ok(q)
    }
}
