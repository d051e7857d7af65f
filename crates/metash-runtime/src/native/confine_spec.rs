//! What a confined program may reach ([`ConfineSpec`], the role's [`Fence`]) and what it needs to
//! run (its program's directories, a script's interpreter): the data [`super::confine`] names,
//! kept apart from the backends that confine by it ([`super::confinement`], [`super::refused`])
//! so that neither side imports the other.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::spec::PathAccess;

/// Host variables a confined program keeps (everything else is cleared): how to find programs,
/// the locale and the terminal. Secrets live in other variables, and none of these holds one.
pub const PASS_ENV: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TERM",
    "COLORTERM",
    "TZ",
    "NO_COLOR",
];

/// What a confined program may reach.
#[derive(Debug, Clone)]
pub struct ConfineSpec {
    /// Names the cgroup and the report.
    pub name: String,
    /// The executable, and what it needs to run (an install directory, an interpreter's prefix):
    /// read and execute.
    pub program: PathBuf,
    pub program_dirs: Vec<PathBuf>,
    /// Read-write: the task's worktree.
    pub workspace: PathBuf,
    /// Further grants (its own HOME and TMPDIR read-write, the project's `.git` read-only…);
    /// missing paths are skipped and listed in the report.
    pub paths: Vec<PathAccess>,
    /// What it may reach and use, whatever the command.
    pub fence: Fence,
    /// The whole environment it gets (nothing is inherited).
    pub env: Vec<(String, String)>,
}

/// The part of a confinement that belongs to the role, not to one command: a host keeps one per
/// role and hands a copy to each command it confines.
#[derive(Debug, Clone, Default)]
pub struct Fence {
    /// metash's state directories: masked wherever a grant would contain them. No grant but the
    /// workspace (a task worktree the host made there) may lie inside one.
    pub hidden: Vec<PathBuf>,
    /// What the program may read but never change, whatever else is writable: the project's
    /// `.git` (see [`crate::spec::AgentSpec::protected`]). Kept read-only by a read-only bind
    /// wherever a writable grant contains it.
    pub protected: Vec<PathBuf>,
    /// The workspace read-only (a planner, any spawn that is not a task's executor): its own
    /// HOME and TMPDIR stay writable.
    pub workspace_read_only: bool,
    /// Loopback TCP ports it may connect to. Nothing else, and no listening socket.
    pub connect_ports: Vec<u16>,
    /// Domains it may reach through the allowlist proxy (started when this is not empty; the
    /// manifest's `network:` syntax, `*.example.com` included). Its address is in `HTTPS_PROXY`
    /// and friends; loopback stays direct (`NO_PROXY`).
    pub allowlist: Vec<String>,
    /// `512m`, `2g`… and `500m`, `2`…: as in a manifest.
    pub mem: Option<String>,
    pub cpu: Option<String>,
    pub max_pids: u64,
    /// Only for the RLIMIT_CPU fallback; the caller enforces the wall-clock deadline.
    pub timeout: Duration,
    /// Bytes and files it may add under what it can write (defaults where unset); its `hit`
    /// tells the caller why the tree was killed.
    pub write: crate::limits::WriteQuota,
}

/// What a program needs to run besides itself: for a script, its interpreter's install prefix
/// (`#!/usr/bin/env node` finds `node` on `path`); for a program inside a `node_modules` tree, the
/// whole tree (a launcher script loads a platform binary from a sibling package). Read and
/// execute only.
pub fn program_dirs(program: &Path, path: Option<&std::ffi::OsStr>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let Ok(real) = program.canonicalize() else {
        return dirs;
    };
    match real.ancestors().find(|a| a.ends_with("node_modules")) {
        Some(nm) => dirs.push(nm.to_path_buf()),
        None => dirs.extend(real.parent().map(Path::to_path_buf)),
    }
    if let Some(interp) = interpreter(&real, path) {
        // `<prefix>/bin/node` → `<prefix>` (its `lib/` holds the runtime's own modules).
        let prefix = interp.parent().and_then(Path::parent);
        dirs.extend(prefix.map(Path::to_path_buf).or(Some(interp)));
    }
    dirs
}

/// The interpreter a `#!` line names, resolved through `env` and `path`.
pub(crate) fn interpreter(script: &Path, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(script).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = String::from_utf8_lossy(line);
    let line = line.lines().next()?;
    let mut words = line.split_whitespace();
    let first = PathBuf::from(words.next()?);
    let prog = if first.file_name().is_some_and(|f| f == "env") {
        let name = words.find(|w| !w.starts_with('-'))?;
        std::env::split_paths(path?)
            .map(|d| d.join(name))
            .find(|p| p.is_file())?
    } else {
        first
    };
    prog.canonicalize().ok()
}
