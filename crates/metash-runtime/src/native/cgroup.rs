//! Per-agent cgroups for memory, CPU share and process count. Supports the unified v2 hierarchy and
//! the v1 controllers (this development machine has v1 only); when neither is writable the caller
//! falls back to rlimits and says so in the `agent_started` event.
//!
//! The cgroup also gives a second way to kill everything an agent started, even a process that
//! escaped its process group.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::limits::Applied;

const ROOT: &str = "/sys/fs/cgroup";

/// Which hierarchy a cgroup lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    fn name(self) -> &'static str {
        match self {
            Self::V1 => "cgroup-v1",
            Self::V2 => "cgroup-v2",
        }
    }
}

/// Requested quotas.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quotas {
    pub memory_bytes: Option<u64>,
    pub cpu_millis: Option<u64>,
    pub pids: Option<u64>,
}

/// What got applied by cgroups (each `None` means the caller must fall back).
#[derive(Debug, Default)]
pub struct AppliedQuotas {
    pub memory: Option<Applied>,
    pub cpu: Option<Applied>,
    pub pids: Option<Applied>,
}

/// An agent's cgroup(s): one directory (v2) or one per controller (v1).
#[derive(Debug)]
pub struct AgentCgroup {
    dirs: Vec<(String, PathBuf)>,
    version: Version,
    procs: Vec<OwnedFd>,
}

fn write(path: &Path, value: &str) -> bool {
    fs::write(path, value).is_ok()
}

fn v2_usable() -> bool {
    let ctl = Path::new(ROOT).join("cgroup.controllers");
    fs::read_to_string(ctl)
        .map(|s| s.split_whitespace().any(|c| c == "memory" || c == "pids"))
        .unwrap_or(false)
}

impl AgentCgroup {
    /// Create cgroups named `metash/<name>` and set what the kernel offers. Returns `None` when no
    /// controller is writable (the caller uses rlimits).
    pub fn create(name: &str, q: Quotas) -> Option<(Self, AppliedQuotas)> {
        let mut cg = if v2_usable() {
            Self::v2(name)?
        } else {
            Self::v1(name, &q)?
        };
        let via = cg.version.name();
        let mut applied = AppliedQuotas::default();
        if let Some(mem) = q.memory_bytes {
            if cg.set_memory(mem) {
                applied.memory = Some(Applied::new(mem, via));
            }
        }
        if let Some(milli) = q.cpu_millis {
            if cg.set_cpu(milli) {
                applied.cpu = Some(Applied::new(milli, via));
            }
        }
        if let Some(pids) = q.pids {
            let key = match cg.version {
                Version::V2 => "unified",
                Version::V1 => "pids",
            };
            if cg
                .dir(key)
                .is_some_and(|d| write(&d.join("pids.max"), &pids.to_string()))
            {
                applied.pids = Some(Applied::new(pids, via));
            }
        }
        for (_, dir) in &cg.dirs {
            if let Ok(f) = fs::OpenOptions::new()
                .write(true)
                // v1: `tasks`, whose `0` moves the (single-threaded) child without the global
                // threadgroup lock, which waits an RCU grace period (~10 ms) when spawns are apart.
                .open(dir.join(match cg.version {
                    Version::V1 => "tasks",
                    Version::V2 => "cgroup.procs",
                }))
            {
                cg.procs.push(OwnedFd::from(f));
            }
        }
        if cg.procs.len() != cg.dirs.len() {
            return None;
        }
        Some((cg, applied))
    }

    /// `metash/<name>` in the unified hierarchy, with the controllers delegated to it.
    fn v2(name: &str) -> Option<Self> {
        let parent = Path::new(ROOT).join("metash");
        let _ = fs::create_dir_all(&parent);
        let _ = write(&parent.join("cgroup.subtree_control"), "+memory +pids +cpu");
        let dir = parent.join(name);
        fs::create_dir_all(&dir).ok()?;
        Some(Self {
            dirs: vec![("unified".into(), dir)],
            version: Version::V2,
            procs: Vec::new(),
        })
    }

    /// `<controller>/metash/<name>` for each v1 controller with a quota (each one joined is one
    /// more task migration per spawn); `None` when none is writable.
    fn v1(name: &str, q: &Quotas) -> Option<Self> {
        let wanted = [
            ("memory", q.memory_bytes.is_some()),
            ("cpu", q.cpu_millis.is_some()),
            ("pids", q.pids.is_some()),
        ];
        let mut dirs = Vec::new();
        for ctl in wanted.iter().filter(|(_, w)| *w).map(|(c, _)| *c) {
            let dir = Path::new(ROOT).join(ctl).join("metash").join(name);
            if fs::create_dir_all(&dir).is_ok() && dir.join("cgroup.procs").exists() {
                dirs.push((ctl.to_string(), dir));
            }
        }
        (!dirs.is_empty()).then_some(Self {
            dirs,
            version: Version::V1,
            procs: Vec::new(),
        })
    }

    /// The memory limit, swap included where the kernel accounts it.
    fn set_memory(&self, mem: u64) -> bool {
        match self.version {
            Version::V2 => self.dir("unified").is_some_and(|d| {
                write(&d.join("memory.max"), &mem.to_string()) && {
                    let _ = write(&d.join("memory.swap.max"), "0");
                    true
                }
            }),
            Version::V1 => self.dir("memory").is_some_and(|d| {
                let ok = write(&d.join("memory.limit_in_bytes"), &mem.to_string());
                // Without swap accounting this file is absent; the limit still holds for RAM.
                let _ = write(&d.join("memory.memsw.limit_in_bytes"), &mem.to_string());
                let _ = write(&d.join("memory.swappiness"), "0");
                ok
            }),
        }
    }

    /// The CPU quota in thousandths of a CPU, over a 100 ms period (at least 1 ms of it).
    fn set_cpu(&self, milli: u64) -> bool {
        let period: u64 = 100_000;
        let quota = (milli * period / 1000).max(1000);
        match self.version {
            Version::V2 => self
                .dir("unified")
                .is_some_and(|d| write(&d.join("cpu.max"), &format!("{quota} {period}"))),
            Version::V1 => self.dir("cpu").is_some_and(|d| {
                write(&d.join("cpu.cfs_period_us"), &period.to_string())
                    && write(&d.join("cpu.cfs_quota_us"), &quota.to_string())
            }),
        }
    }

    fn dir(&self, ctl: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(c, _)| c == ctl)
            .map(|(_, d)| d.as_path())
    }

    /// The join files (`cgroup.procs`; on v1 `tasks`) the child writes `0` to.
    pub fn procs_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// Every pid still in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        self.killer().pids()
    }

    /// SIGKILL everything in the cgroup, repeating until it is empty (a fork racing the kill is
    /// caught on the next pass) or `within` has passed.
    pub fn kill_all(&self, within: Duration) {
        self.killer().kill_all(within);
    }

    /// A handle that can kill everything in the cgroup from another thread (the disk quota's
    /// watcher), without owning it: the cgroup is still removed when this drops.
    pub fn killer(&self) -> Killer {
        Killer {
            dirs: self.dirs.iter().map(|(_, d)| d.clone()).collect(),
            version: self.version,
        }
    }

    /// Which limits the kernel reports as hit: `memory` (OOM kill or failed charge), `pids`.
    pub fn limits_hit(&self) -> Vec<&'static str> {
        let mut hit = Vec::new();
        let count = |path: PathBuf, key: &str| -> u64 {
            fs::read_to_string(path)
                .ok()
                .and_then(|s| {
                    s.lines().find_map(|l| {
                        let mut it = l.split_whitespace();
                        (it.next() == Some(key)).then(|| it.next()?.parse().ok())?
                    })
                })
                .unwrap_or(0)
        };
        match self.version {
            Version::V2 => {
                if let Some(d) = self.dir("unified") {
                    if count(d.join("memory.events"), "oom_kill") > 0
                        || count(d.join("memory.events"), "max") > 0
                    {
                        hit.push("memory");
                    }
                    if count(d.join("pids.events"), "max") > 0 {
                        hit.push("pids");
                    }
                }
            }
            Version::V1 => {
                if let Some(d) = self.dir("memory") {
                    let failcnt = fs::read_to_string(d.join("memory.failcnt"))
                        .ok()
                        .and_then(|s| s.trim().parse::<u64>().ok())
                        .unwrap_or(0);
                    if failcnt > 0 || count(d.join("memory.oom_control"), "oom_kill") > 0 {
                        hit.push("memory");
                    }
                }
                if let Some(d) = self.dir("pids") {
                    if count(d.join("pids.events"), "max") > 0 {
                        hit.push("pids");
                    }
                }
            }
        }
        hit
    }
}

/// Kills what is in an agent's cgroup; see [`AgentCgroup::killer`].
#[derive(Debug, Clone)]
pub struct Killer {
    dirs: Vec<PathBuf>,
    version: Version,
}

impl Killer {
    /// Every pid still in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        let mut out = Vec::new();
        for dir in &self.dirs {
            if let Ok(s) = fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(s.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// As [`AgentCgroup::kill_all`].
    pub fn kill_all(&self, within: Duration) {
        if self.version == Version::V2 {
            if let Some(d) = self.dirs.first() {
                let _ = write(&d.join("cgroup.kill"), "1");
            }
        }
        let start = Instant::now();
        loop {
            let pids = self.pids();
            if pids.is_empty() || start.elapsed() > within {
                return;
            }
            for pid in pids {
                // SAFETY: kill(2) with a pid read from our own cgroup.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for AgentCgroup {
    fn drop(&mut self) {
        self.kill_all(Duration::from_millis(200));
        for (_, dir) in &self.dirs {
            for _ in 0..50 {
                if fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}
