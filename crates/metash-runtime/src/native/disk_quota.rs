//! The write quotas of one confined process tree (a native agent, a CLI role, `metash sandbox`) or
//! one WASM agent: how many bytes and files it may add, while it runs, under every directory it
//! may write (its workspace, its HOME and TMPDIR; a WASM agent's writable preopens). Linux has no per-directory quota an unprivileged host can set
//! on any filesystem, so a watcher thread measures those directories: at the start (the
//! baseline), then every [`POLL`] (slower when a walk is slow: at most an eighth of the time goes
//! to walking), and once more when the turn ends. Past a quota it records a `limit_exceeded`
//! event (`{limit: "disk"|"files", used, max}`), kills the tree the way a timeout does (the
//! process group, then the cgroup) and keeps the hit for the caller, which ends the turn saying
//! why. What the tree wrote is left in place for inspection. A WASM guest has no tree: a hit sets
//! the flag its epoch callback checks ([`Stop::Guest`]), and it stops at its next epoch.
//!
//! Between two walks a single file could grow by a few hundred megabytes; `RLIMIT_FSIZE` at the
//! quota plus one byte stops any one file there (`SIGXFSZ`), and the file then counts as over.
//! (Not for a WASM guest: its writes are this process's, which no rlimit may cap; there only the
//! walks bound it.)
//! No inotify: its watches are a per-user resource (an editor's file watcher shares them) and a
//! tree with many directories would use them up.
//!
//! What counts: every entry (file, directory, link) is one file; bytes are the larger of its size
//! and its allocated blocks (a sparse or compressed file counts as large as it claims to be); hard
//! links count once. Used = now − baseline, so deleting what was there frees room. metash's own
//! directories inside a root (`.meta/`, the project's `.git`) are not walked: the host writes there,
//! the agent cannot.

use std::collections::HashSet;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use metash_protocol::LogKind;
use serde_json::{json, Value};

use super::cgroup::Killer;
use crate::error::{io_err, Result};
use crate::limits::{Applied, QuotaHit, WriteHit, WriteLimit, WriteQuota};
use crate::sink::EventSink;

/// How often the roots are measured (at least).
pub const POLL: Duration = Duration::from_millis(200);
/// The share of the time a walk may take: the next walk waits this many times the last one.
const BACKOFF: u32 = 8;

/// What to watch.
pub(crate) struct WatchCfg<'a> {
    /// Names the events.
    pub agent: &'a str,
    /// Every directory the tree may write (files, devices and missing paths are ignored).
    pub roots: Vec<PathBuf>,
    /// Directories inside a root that are not the tree's (the host's state, read-only `.git`).
    pub skip: Vec<PathBuf>,
    pub quota: &'a WriteQuota,
    /// What a hit stops.
    pub stop: Stop,
    pub sink: Arc<dyn EventSink>,
}

/// What a hit stops, and so how the quota is enforced.
pub(crate) enum Stop {
    /// A process tree: its process groups and its cgroup (when it has one) are killed, and
    /// `RLIMIT_FSIZE` stops any one file at the quota.
    Tree(Option<Killer>),
    /// A WASM guest running in this process: the flag its epoch callback checks. No rlimit: the
    /// guest's writes are the host process's own.
    Guest(Arc<AtomicBool>),
}

impl Stop {
    /// The tree's, from its quota's cgroup.
    fn tree(quota: &super::quota::Quota) -> Self {
        Self::Tree(
            quota
                .cgroup
                .as_ref()
                .map(super::cgroup::AgentCgroup::killer),
        )
    }
}

impl<'a> WatchCfg<'a> {
    /// A confined program's (a CLI role, `metash sandbox`): its workspace when writable and every
    /// writable grant (its HOME and TMPDIR); not the host's state nor the protected `.git`.
    pub(super) fn confined(
        spec: &'a super::confine_spec::ConfineSpec,
        workspace: &Path,
        write: bool,
        paths: &[crate::spec::PathAccess],
        quota: &super::quota::Quota,
        sink: &Arc<dyn EventSink>,
    ) -> Self {
        let mut roots: Vec<PathBuf> = write.then(|| workspace.to_path_buf()).into_iter().collect();
        roots.extend(paths.iter().filter(|p| p.write).map(|p| p.path.clone()));
        let fence = &spec.fence;
        Self {
            agent: &spec.name,
            roots,
            skip: fence
                .hidden
                .iter()
                .chain(&fence.protected)
                .cloned()
                .collect(),
            quota: &fence.write,
            stop: Stop::tree(quota),
            sink: Arc::clone(sink),
        }
    }

    /// A native agent's: its workspace with `files.write`, its writable scoped paths.
    pub(super) fn agent(
        spec: &'a crate::spec::AgentSpec,
        workspace: &Path,
        quota: &super::quota::Quota,
        sink: &Arc<dyn EventSink>,
    ) -> Self {
        Self::of_spec(spec, workspace, Stop::tree(quota), sink)
    }

    /// A WASM agent's: what it may write is what is preopened read-write, the same directories
    /// as a native agent's (the workspace with `files.write`, the writable scoped grants); a hit
    /// sets `stop`.
    pub(crate) fn wasm(
        spec: &'a crate::spec::AgentSpec,
        stop: Arc<AtomicBool>,
        sink: &Arc<dyn EventSink>,
    ) -> Self {
        Self::of_spec(spec, &spec.workspace, Stop::Guest(stop), sink)
    }

    fn of_spec(
        spec: &'a crate::spec::AgentSpec,
        workspace: &Path,
        stop: Stop,
        sink: &Arc<dyn EventSink>,
    ) -> Self {
        let write = spec.has(crate::spec::Category::FilesWrite);
        let mut roots: Vec<PathBuf> = write.then(|| workspace.to_path_buf()).into_iter().collect();
        let granted = spec.split_paths().0.into_iter();
        roots.extend(granted.filter(|p| p.write).map(|p| p.path.clone()));
        Self {
            agent: &spec.id,
            roots,
            skip: spec.hidden.iter().chain(&spec.protected).cloned().collect(),
            quota: &spec.write_quota,
            stop,
            sink: Arc::clone(sink),
        }
    }
}

/// Bytes and files under the roots at one time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Totals {
    bytes: u64,
    files: u64,
}

struct Shared {
    agent: String,
    roots: Vec<PathBuf>,
    skip: Vec<PathBuf>,
    max_bytes: u64,
    max_files: u64,
    base: OnceLock<Totals>,
    hit: WriteHit,
    stop: Stop,
    sink: Arc<dyn EventSink>,
    /// The read end of the pipe each child writes its pid to (before anything else in
    /// `pre_exec`): the process groups to kill.
    pid_rx: OwnedFd,
    groups: Mutex<Vec<i32>>,
    stopped: Mutex<bool>,
    wake: Condvar,
    /// One walk at a time (the thread's and a final check).
    walking: Mutex<()>,
    killed: AtomicBool,
}

/// A running watcher; stops (after one last measurement, recorded if over) when dropped.
pub(crate) struct DiskWatch {
    shared: Arc<Shared>,
    pid_tx: OwnedFd,
}

/// The watcher (none when nothing is writable), the `RLIMIT_FSIZE` to set in the child, and the
/// start report's `disk_bytes` and `files`.
pub(crate) struct Planned {
    pub watch: Option<DiskWatch>,
    pub rlimit: Option<(libc::__rlimit_resource_t, u64)>,
    pub report: Value,
}

impl Planned {
    /// The start report's `limits` with `disk_bytes` and `files` added.
    pub(crate) fn with_limits(&self, limits: &impl serde::Serialize) -> Value {
        let mut v = serde_json::to_value(limits).unwrap_or_else(|_| json!({}));
        if let (Some(all), Some(ours)) = (v.as_object_mut(), self.report.as_object()) {
            all.extend(ours.clone());
        }
        v
    }
}

/// Starts watching `cfg.roots`.
///
/// # Errors
/// A quota that does not parse; the pipe or the thread cannot be made (fail closed).
pub(crate) fn plan(cfg: WatchCfg<'_>) -> Result<Planned> {
    let (max_bytes, max_files) = cfg.quota.resolve()?;
    let roots = roots(&cfg.roots);
    if roots.is_empty() {
        let none = |v| Applied::new(v, "none").with_note("nothing writable");
        return Ok(Planned {
            watch: None,
            rlimit: None,
            report: json!({"disk_bytes": none(max_bytes), "files": none(max_files)}),
        });
    }
    let (stopped, disk_via, files_via) = match cfg.stop {
        Stop::Tree(_) => (
            "the tree is killed",
            "disk-watch+rlimit-fsize",
            "disk-watch",
        ),
        Stop::Guest(_) => (
            "the guest is stopped at its next epoch",
            "disk-watch+wasm-epoch",
            "disk-watch+wasm-epoch",
        ),
    };
    let note = format!(
        "added under {} while it runs, measured every {} ms and at the end; past it {stopped}",
        roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        POLL.as_millis()
    );
    let report = json!({
        "disk_bytes": Applied::new(max_bytes, disk_via).with_note(&note),
        "files": Applied::new(max_files, files_via).with_note(&note),
    });
    let rlimit = matches!(cfg.stop, Stop::Tree(_))
        .then_some((libc::RLIMIT_FSIZE, max_bytes.saturating_add(1)));
    let (pid_rx, pid_tx) = pid_pipe()?;
    let shared = Arc::new(Shared {
        agent: cfg.agent.to_string(),
        skip: cfg.skip.iter().map(|s| canonical(s)).collect(),
        roots,
        max_bytes,
        max_files,
        base: OnceLock::new(),
        hit: cfg.quota.hit.clone(),
        stop: cfg.stop,
        sink: cfg.sink,
        pid_rx,
        groups: Mutex::new(Vec::new()),
        stopped: Mutex::new(false),
        wake: Condvar::new(),
        walking: Mutex::new(()),
        killed: AtomicBool::new(false),
    });
    let thread = Arc::clone(&shared);
    std::thread::Builder::new()
        .name(format!("metash-disk-{}", cfg.agent))
        .spawn(move || thread.run())
        .map_err(io_err("starting the disk quota watcher"))?;
    Ok(Planned {
        watch: Some(DiskWatch { shared, pid_tx }),
        rlimit,
        report,
    })
}

/// [`plan`] for a confined program ([`WatchCfg::confined`]), its `RLIMIT_FSIZE` added to
/// `quota`'s rlimits.
///
/// # Errors
/// As [`plan`].
pub(super) fn confined(
    spec: &super::confine_spec::ConfineSpec,
    workspace: &Path,
    paths: &[crate::spec::PathAccess],
    quota: &mut super::quota::Quota,
    sink: &Arc<dyn EventSink>,
) -> Result<Planned> {
    let write = !spec.fence.workspace_read_only;
    let cfg = WatchCfg::confined(spec, workspace, write, paths, quota, sink);
    let planned = plan(cfg)?;
    quota.rlimits.extend(planned.rlimit);
    Ok(planned)
}

/// [`plan`] for a native agent ([`WatchCfg::agent`]), its `RLIMIT_FSIZE` added to `quota`'s
/// rlimits.
///
/// # Errors
/// As [`plan`].
pub(super) fn agent(
    spec: &crate::spec::AgentSpec,
    workspace: &Path,
    quota: &mut super::quota::Quota,
    sink: &Arc<dyn EventSink>,
) -> Result<Planned> {
    let planned = plan(WatchCfg::agent(spec, workspace, quota, sink))?;
    quota.rlimits.extend(planned.rlimit);
    Ok(planned)
}

/// The canonical directories among `paths`, none inside another (it would count twice).
fn roots(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = paths
        .iter()
        .filter_map(|p| p.canonicalize().ok())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.dedup();
    let all = dirs.clone();
    dirs.retain(|d| !all.iter().any(|o| o != d && d.starts_with(o)));
    dirs
}

/// [`QuotaHit::explain`] for a WASM guest, which has no process tree to kill.
fn explain_guest(hit: &QuotaHit) -> String {
    let what = match hit.limit {
        WriteLimit::Disk => format!(
            "its disk quota: it wrote {} bytes where it may write {} (`disk`)",
            hit.used, hit.max
        ),
        WriteLimit::Files => format!(
            "its file quota: it made {} files where it may make {} (`files`)",
            hit.used, hit.max
        ),
    };
    format!("{what}; the guest was stopped and what it wrote is left in place")
}

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

/// A pipe whose read end does not block; both ends close on exec.
fn pid_pipe() -> Result<(OwnedFd, OwnedFd)> {
    super::fds::pipe(libc::O_NONBLOCK).map_err(io_err("making the disk quota's pid pipe"))
}

/// Every entry under `roots` (not following links, not walking `skip`), hard links once.
fn measure(roots: &[PathBuf], skip: &[PathBuf]) -> Totals {
    let mut t = Totals::default();
    let mut linked: HashSet<(u64, u64)> = HashSet::new();
    let mut stack: Vec<PathBuf> = roots.to_vec();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            // A DirEntry's metadata is the entry's own (lstat): a link is not followed.
            let Ok(md) = e.metadata() else {
                continue;
            };
            if !md.is_dir() && md.nlink() > 1 && !linked.insert((md.dev(), md.ino())) {
                continue;
            }
            t.files += 1;
            t.bytes = t
                .bytes
                .saturating_add(md.len().max(md.blocks().saturating_mul(512)));
            if md.is_dir() {
                let path = e.path();
                if !skip.contains(&path) {
                    stack.push(path);
                }
            }
        }
    }
    t
}

impl Shared {
    fn run(self: Arc<Self>) {
        loop {
            if self.is_stopped() {
                return;
            }
            let started = Instant::now();
            if self.step(true).is_some() {
                return;
            }
            let wait = POLL.max(started.elapsed() * BACKOFF);
            let stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
            if *stopped {
                return;
            }
            drop(
                self.wake
                    .wait_timeout(stopped, wait)
                    .unwrap_or_else(PoisonError::into_inner),
            );
        }
    }

    fn is_stopped(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One measurement: the baseline the first time, then a check. With `kill`, a hit kills the
    /// tree. The hit, if any (also an earlier one).
    fn step(&self, kill: bool) -> Option<QuotaHit> {
        if self.killed.load(Ordering::SeqCst) {
            return self.hit.get();
        }
        let _one = self.walking.lock().unwrap_or_else(PoisonError::into_inner);
        self.read_pids();
        let now = measure(&self.roots, &self.skip);
        let Some(base) = self.base.get() else {
            let _ = self.base.set(now);
            return None;
        };
        let bytes = now.bytes.saturating_sub(base.bytes);
        let files = now.files.saturating_sub(base.files);
        let hit = if bytes > self.max_bytes {
            QuotaHit {
                limit: WriteLimit::Disk,
                used: bytes,
                max: self.max_bytes,
            }
        } else if files > self.max_files {
            QuotaHit {
                limit: WriteLimit::Files,
                used: files,
                max: self.max_files,
            }
        } else {
            return None;
        };
        self.hit_found(hit, kill);
        Some(hit)
    }

    /// Records the first hit (once) and, with `kill`, kills the tree.
    fn hit_found(&self, hit: QuotaHit, kill: bool) {
        if self.hit.set(hit) {
            let explain = match self.stop {
                Stop::Tree(_) => hit.explain(),
                Stop::Guest(_) => explain_guest(&hit),
            };
            self.sink.record(
                LogKind::LimitExceeded,
                Some(&self.agent),
                json!({"limit": hit.limit.as_str(), "used": hit.used, "max": hit.max,
                       "via": "disk-watch", "roots": self.roots,
                       "message": format!("`{}` exceeded {explain}", self.agent)}),
            );
        }
        if kill && !self.killed.swap(true, Ordering::SeqCst) {
            self.kill_tree();
        }
    }

    /// The process groups the children announced so far.
    fn read_pids(&self) {
        let mut buf = [0u8; 512];
        loop {
            // SAFETY: reads into a buffer of its length from our own non-blocking pipe.
            let n =
                unsafe { libc::read(self.pid_rx.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            let Ok(n) = usize::try_from(n) else {
                return;
            };
            if n == 0 {
                return;
            }
            let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
            for chunk in buf[..n].chunks_exact(4) {
                let pid = i32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                if pid > 1 && !groups.contains(&pid) {
                    groups.push(pid);
                }
            }
        }
    }

    /// As a timeout does: SIGKILL the process groups, then everything in the cgroup; a WASM
    /// guest is told to stop.
    fn kill_tree(&self) {
        let killer = match &self.stop {
            Stop::Tree(killer) => killer,
            Stop::Guest(flag) => {
                flag.store(true, Ordering::SeqCst);
                return;
            }
        };
        self.read_pids();
        for pgid in self
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            // SAFETY: kill(2) on a process group one of our confined children leads.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        if let Some(k) = killer {
            k.kill_all(Duration::from_millis(200));
        }
    }
}

impl DiskWatch {
    /// The `pre_exec` step to run first in every child: it writes its pid (its process group's
    /// id once the sandbox makes it a session leader) to the watcher. Async-signal-safe: getpid
    /// and write only.
    pub(crate) fn announce_pid(
        &self,
    ) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
        let fd = self.pid_tx.as_raw_fd();
        move || {
            // SAFETY: getpid has no preconditions; write(2) of 4 bytes from a local to a pipe
            // whose write end the parent keeps open until every child has started.
            unsafe {
                let pid = libc::getpid().to_ne_bytes();
                libc::write(fd, pid.as_ptr().cast(), pid.len());
            }
            Ok(())
        }
    }

    /// The pipe [`DiskWatch::announce_pid`] writes to, for a spawn that writes the pid itself
    /// ([`super::vspawn`]).
    pub(crate) fn pid_fd(&self) -> RawFd {
        self.pid_tx.as_raw_fd()
    }

    /// Takes the baseline now unless the thread already has: a WASM guest starts in this
    /// process as soon as it is asked to, and none of its writes may count as the baseline.
    pub(crate) fn baseline_now(&self) {
        if self.shared.base.get().is_none() {
            let _ = self.shared.step(false);
        }
    }

    /// Measures now (the turn is ending): the hit, if the tree is over a quota now or was
    /// before. A hit found now kills what is left of the tree.
    pub(crate) fn check_now(&self) -> Option<QuotaHit> {
        self.shared.step(true)
    }
}

impl Drop for DiskWatch {
    /// Stops the thread and measures one last time (recorded if over; nothing is killed: the
    /// tree is gone and its process group ids may be reused).
    fn drop(&mut self) {
        *self
            .shared
            .stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        self.shared.wake.notify_all();
        if self.shared.hit.get().is_none() {
            let _ = self.shared.step(false);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::sink::MemorySink;

    #[test]
    fn counts_what_was_added_links_once_and_skips_the_hosts_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join(".meta")).unwrap();
        std::fs::write(ws.join("old"), vec![1u8; 10_000]).unwrap();
        let base = measure(std::slice::from_ref(&ws), &[ws.join(".meta")]);
        std::fs::write(ws.join(".meta/log"), vec![1u8; 1 << 20]).unwrap();
        std::fs::write(ws.join("new"), vec![1u8; 8192]).unwrap();
        std::fs::hard_link(ws.join("new"), ws.join("same")).unwrap();
        std::os::unix::fs::symlink("/usr", ws.join("usr")).unwrap();
        let now = measure(std::slice::from_ref(&ws), &[ws.join(".meta")]);
        assert_eq!(
            now.files - base.files,
            2,
            "new and same (one inode), usr (a link)"
        );
        let added = now.bytes - base.bytes;
        assert!((8192..8192 + 8192).contains(&added), "{added}");
    }

    #[test]
    fn nested_roots_count_once() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        let got = roots(&[
            inner.clone(),
            dir.path().to_path_buf(),
            PathBuf::from("/dev/tty"),
            dir.path().join("missing"),
        ]);
        assert_eq!(got, vec![dir.path().canonicalize().unwrap()]);
    }

    #[test]
    fn past_the_file_quota_a_hit_is_recorded_once() {
        let dir = tempfile::tempdir().unwrap();
        let sink = Arc::new(MemorySink::new());
        let quota = WriteQuota::new(Some("1m".into()), Some(5));
        let planned = plan(WatchCfg {
            agent: "w",
            roots: vec![dir.path().to_path_buf()],
            skip: Vec::new(),
            quota: &quota,
            stop: Stop::Tree(None),
            sink: sink.clone(),
        })
        .unwrap();
        assert_eq!(
            planned.rlimit,
            Some((libc::RLIMIT_FSIZE, (1 << 20) + 1)),
            "one file stops at the quota"
        );
        let watch = planned.watch.unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while watch.shared.base.get().is_none() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        for i in 0..6 {
            std::fs::write(dir.path().join(format!("f{i}")), "x").unwrap();
        }
        let hit = watch.check_now().unwrap();
        assert_eq!((hit.limit, hit.used, hit.max), (WriteLimit::Files, 6, 5));
        assert_eq!(quota.hit.get(), Some(hit), "the caller's copy sees it");
        drop(watch);
        let events = sink.of_kind(LogKind::LimitExceeded);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].data["limit"], "files");
        assert_eq!(events[0].data["max"], 5);
    }

    #[test]
    fn a_guests_hit_sets_its_flag_and_no_rlimit_is_planned() {
        let dir = tempfile::tempdir().unwrap();
        let sink = Arc::new(MemorySink::new());
        let quota = WriteQuota::new(Some("4k".into()), None);
        let flag = Arc::new(AtomicBool::new(false));
        let planned = plan(WatchCfg {
            agent: "g",
            roots: vec![dir.path().to_path_buf()],
            skip: Vec::new(),
            quota: &quota,
            stop: Stop::Guest(Arc::clone(&flag)),
            sink: sink.clone(),
        })
        .unwrap();
        assert_eq!(planned.rlimit, None, "the host process is never capped");
        assert_eq!(planned.report["disk_bytes"]["via"], "disk-watch+wasm-epoch");
        let watch = planned.watch.unwrap();
        watch.baseline_now();
        std::fs::write(dir.path().join("big"), vec![1u8; 8192]).unwrap();
        let hit = watch.check_now().unwrap();
        assert_eq!((hit.limit, hit.max), (WriteLimit::Disk, 4000));
        assert!(flag.load(Ordering::SeqCst), "the guest is told to stop");
        let events = sink.of_kind(LogKind::LimitExceeded);
        let message = events[0].data["message"].as_str().unwrap();
        assert!(message.contains("the guest was stopped"), "{message}");
    }
}
