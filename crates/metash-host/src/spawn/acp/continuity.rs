//! Continuity of an ACP role across its spawns (seed 003, docs/acp.md "Continuity"): the
//! agent's ACP session id is the role's provider-typed continuation key, kept per metash
//! session, role and task, and the next spawn of that role on that task continues it with
//! `session/load`. Two things must outlive a spawn for that:
//!
//! - the **key**, in `.meta/acp/SESSION/ROLE/TASK.json` (metash's state: no sandbox sees
//!   `.meta/`, so no agent can change which session its next turn loads), with the provider it
//!   was recorded under and the `cwd` it was opened in (an agent files its sessions by `cwd`);
//! - the agent's **HOME**, where it keeps its sessions (claude-code-acp under
//!   `~/.claude/projects/`, codex-acp under `~/.codex/sessions/`): the spawn directory (HOME and
//!   TMPDIR) is a directory of its own in `TMP/metash-acp-UID/` (named in the record; short,
//!   because agents show its paths), kept instead of removed. It is the sandbox's only writable
//!   place besides the worktree, and it never holds a key: the agent gets the credential
//!   proxy's placeholder.
//!
//! A spawn without a task (a planner's, once per phase; `metash spawn`) has no continuity: its
//! spawn directory is a fresh one, removed after it, and its session new, as every CLI role's.

use std::path::{Path, PathBuf};

use metash_protocol::{HarnessContinuationRef, ProviderDomain};
use serde::{Deserialize, Serialize};

use crate::error::{HostError, Result};
use crate::host::Host;

/// What is kept of the scope: its spawn directory, and its last turn's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    /// The kept spawn directory (HOME and TMPDIR inside), in the user's private root.
    spawn_dir: PathBuf,
    #[serde(default)]
    continuation: Option<HarnessContinuationRef>,
    /// The session's `cwd` (the worktree): a key is only continued in the directory it was
    /// opened in.
    #[serde(default)]
    cwd: Option<String>,
}

/// One role's continuity on one task of one metash session.
pub(super) struct Continuity {
    record: PathBuf,
    spawn_dir: PathBuf,
    last: Record,
    /// Why the last key cannot be continued before anything is asked of the agent (its kept
    /// directory is gone).
    lost: Option<String>,
}

impl Continuity {
    /// The scope of `agent` on `task`: its record read, its kept spawn directory found (or made,
    /// private to the user, and recorded at once), its TMPDIR emptied.
    ///
    /// # Errors
    /// The session cannot be read, or a directory or the record cannot be made (or the root is
    /// not the user's own).
    pub(super) fn open(host: &Host, agent: &str, task: &str) -> Result<Self> {
        let record = host
            .store()
            .meta_dir()
            .join("acp")
            .join(component(&host.session_id()?))
            .join(component(agent))
            .join(format!("{}.json", component(task)));
        let root = kept_root(&host.spawn_root()?)?;
        sweep(&host.store().meta_dir().join("acp"), &record, &root);
        let last: Option<Record> = std::fs::read(&record)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        // Only a directory of the user's private root, directly in it, that is still there.
        let found = last.as_ref().map(|r| r.spawn_dir.clone()).filter(|d| {
            d.parent() == Some(root.as_path())
                && std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir())
        });
        let mut lost = None;
        let (spawn_dir, last) = match (found, last) {
            (Some(dir), Some(last)) => (dir, last),
            (_, last) => {
                if let Some(gone) = last.filter(|l| l.continuation.is_some()) {
                    lost = Some(format!(
                        "the agent's kept HOME ({}) is gone",
                        gone.spawn_dir.display()
                    ));
                }
                let dir = tempfile::Builder::new()
                    .prefix("s")
                    .tempdir_in(&root)
                    .map_err(|e| io("making a directory in", &root, &e))?
                    .keep();
                let fresh = Record {
                    spawn_dir: dir.clone(),
                    continuation: None,
                    cwd: None,
                };
                write(&record, &fresh)?;
                (dir, fresh)
            }
        };
        // A new TMPDIR each turn: only HOME carries the agent's sessions.
        let tmp = spawn_dir.join("tmp");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| io("emptying", &tmp, &e))?;
        }
        Ok(Self {
            record,
            spawn_dir,
            last,
            lost,
        })
    }

    /// The key to continue in `cwd` for an agent of `provider`, or why the last one is not
    /// continued (`Ok(None)`: there is none).
    pub(super) fn continuation(
        &self,
        provider: ProviderDomain,
        cwd: &str,
    ) -> std::result::Result<Option<HarnessContinuationRef>, String> {
        if let Some(why) = &self.lost {
            return Err(why.clone());
        }
        let Some(key) = &self.last.continuation else {
            return Ok(None);
        };
        if let Some(then) = self.last.cwd.as_deref().filter(|c| *c != cwd) {
            return Err(format!(
                "the last session was opened in {then}, this turn runs in {cwd}"
            ));
        }
        if key.provider != provider {
            return Err(format!(
                "the last session's key is {}'s, the role's provider is {}",
                key.provider.as_str(),
                provider.as_str()
            ));
        }
        Ok(Some(key.clone()))
    }

    /// Keeps the turn's key (when the agent can load sessions) for the next spawn. A turn
    /// that opened no session (the agent failed first) leaves the last key as it was.
    ///
    /// # Errors
    /// The record cannot be written.
    pub(super) fn keep(&self, key: Option<HarnessContinuationRef>, cwd: &str) -> Result<()> {
        let Some(continuation) = key.filter(|c| c.key.is_some()) else {
            return Ok(());
        };
        let rec = Record {
            spawn_dir: self.spawn_dir.clone(),
            continuation: Some(continuation),
            cwd: Some(cwd.to_string()),
        };
        if self.last == rec {
            return Ok(());
        }
        write(&self.record, &rec)
    }
}

/// Removes what is kept for scopes that cannot be continued any more: another metash
/// session's, and a task's whose worktree is gone (it landed, or was dropped). Each record's
/// spawn directory is removed only when it lies directly in `root`; `current`'s is left alone.
/// Best effort: what cannot be removed now is tried again at the next spawn.
fn sweep(acp: &Path, current: &Path, root: &Path) {
    let Some(session) = current.parent().and_then(Path::parent) else {
        return;
    };
    let mut stale = Vec::new();
    for s in std::fs::read_dir(acp).into_iter().flatten().flatten() {
        let other = s.path() != session;
        for role in std::fs::read_dir(s.path()).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(role.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let path = f.path();
                if path == current || path.extension().is_none_or(|e| e != "json") {
                    continue;
                }
                let rec: Option<Record> = std::fs::read(&path)
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok());
                let gone = |r: &Record| r.cwd.as_deref().is_some_and(|c| !Path::new(c).exists());
                if other || rec.as_ref().is_some_and(gone) {
                    stale.push((path, rec));
                }
            }
        }
    }
    for (path, rec) in stale {
        if let Some(dir) = rec
            .map(|r| r.spawn_dir)
            .filter(|d| d.parent() == Some(root))
        {
            let _ = std::fs::remove_dir_all(dir);
        }
        let _ = std::fs::remove_file(path);
    }
}

/// Writes `rec` to `path` whole (a temporary file renamed over it).
fn write(path: &Path, rec: &Record) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| io("making", dir, &e))?;
    let text = serde_json::to_vec(rec).map_err(|e| HostError::Other(e.to_string()))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(|e| io("writing", &tmp, &e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("writing", path, &e))
}

/// A spawn's directory: kept with its key for a task's spawn, else fresh and removed after it.
pub(super) enum SpawnDir {
    Kept(Continuity),
    Fresh(tempfile::TempDir),
}

impl SpawnDir {
    /// The directory of `agent`'s spawn on `task` (none: a fresh one).
    ///
    /// # Errors
    /// As [`Continuity::open`], or the fresh directory cannot be made.
    pub(super) fn open(host: &Host, agent: &str, task: Option<&str>) -> Result<Self> {
        match task {
            Some(t) => Continuity::open(host, agent, t).map(Self::Kept),
            None => tempfile::Builder::new()
                .prefix("metash-spawn-")
                .tempdir_in(host.spawn_root()?)
                .map(Self::Fresh)
                .map_err(|e| HostError::Other(format!("creating the spawn directory: {e}"))),
        }
    }

    pub(super) fn path(&self) -> &Path {
        match self {
            Self::Kept(c) => &c.spawn_dir,
            Self::Fresh(t) => t.path(),
        }
    }

    /// As [`Continuity::continuation`]; nothing for a fresh directory.
    pub(super) fn continuation(
        &self,
        provider: ProviderDomain,
        cwd: &str,
    ) -> std::result::Result<Option<HarnessContinuationRef>, String> {
        match self {
            Self::Kept(c) => c.continuation(provider, cwd),
            Self::Fresh(_) => Ok(None),
        }
    }

    /// As [`Continuity::keep`]; nothing for a fresh directory.
    ///
    /// # Errors
    /// The record cannot be written.
    pub(super) fn keep(&self, key: Option<HarnessContinuationRef>, cwd: &str) -> Result<()> {
        match self {
            Self::Kept(c) => c.keep(key, cwd),
            Self::Fresh(_) => Ok(()),
        }
    }

    /// The directory, kept for inspection (a fresh one is not removed then).
    pub(super) fn keep_for_inspection(self) -> PathBuf {
        match self {
            Self::Kept(c) => c.spawn_dir,
            Self::Fresh(t) => t.keep(),
        }
    }
}

/// `TMP/metash-acp-UID`, made private to the user; refused when it is not a directory of the
/// user's own (a shared temporary directory: someone else may have made the name first).
fn kept_root(tmp: &Path) -> Result<PathBuf> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        let root = tmp.join(format!("metash-acp-{uid}"));
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&root);
        let meta = std::fs::symlink_metadata(&root).map_err(|e| io("making", &root, &e))?;
        if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
            return Err(HostError::Other(format!(
                "{} is not a private directory of this user: ACP homes are not kept there",
                root.display()
            )));
        }
        Ok(root)
    }
    #[cfg(not(unix))]
    {
        let root = tmp.join("metash-acp");
        std::fs::create_dir_all(&root).map_err(|e| io("making", &root, &e))?;
        Ok(root)
    }
}

/// A name as one path component: letters, digits, `-`, `_` and `.` (not leading) kept, any
/// other byte as `%XX`, so distinct names stay distinct and none climbs out.
fn component(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, b) in name.bytes().enumerate() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => out.push(b as char),
            b'.' if i > 0 => out.push('.'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    if out.is_empty() {
        out.push('%');
    }
    out
}

fn io(what: &str, path: &Path, e: &std::io::Error) -> HostError {
    HostError::Other(format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A record of `session`/`role`/`task` under `acp`, its spawn directory made in `root`.
    fn record(acp: &Path, root: &Path, at: (&str, &str), cwd: Option<&Path>) -> (PathBuf, PathBuf) {
        let dir = root.join(format!("s-{}-{}", at.0, at.1));
        std::fs::create_dir_all(dir.join("home")).unwrap();
        let path = acp.join(at.0).join("coder").join(format!("{}.json", at.1));
        let rec = Record {
            spawn_dir: dir.clone(),
            continuation: None,
            cwd: cwd.map(|c| c.display().to_string()),
        };
        write(&path, &rec).unwrap();
        (path, dir)
    }

    #[test]
    fn the_sweep_removes_other_sessions_and_tasks_whose_worktree_is_gone() {
        let t = tempfile::tempdir().unwrap();
        let (acp, root, live) = (t.path().join("acp"), t.path().join("root"), t.path());
        let current = record(&acp, &root, ("now", "a"), Some(live));
        let kept = record(&acp, &root, ("now", "b"), Some(live));
        let landed = record(&acp, &root, ("now", "c"), Some(&t.path().join("gone")));
        let old = record(&acp, &root, ("before", "a"), Some(live));
        // A record naming a directory outside the root: the record goes, the directory stays.
        let outside = t.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        let (forged, _) = record(&acp, &root, ("before", "x"), None);
        let rec = Record {
            spawn_dir: outside.clone(),
            continuation: None,
            cwd: None,
        };
        write(&forged, &rec).unwrap();
        sweep(&acp, &current.0, &root);
        for (path, dir) in [&current, &kept] {
            assert!(path.exists() && dir.exists(), "{}", path.display());
        }
        for (path, dir) in [&landed, &old] {
            assert!(!path.exists() && !dir.exists(), "{}", path.display());
        }
        assert!(!forged.exists() && outside.exists());
    }

    #[test]
    fn names_become_single_components() {
        assert_eq!(component("coder"), "coder");
        assert_eq!(component("a.b-c_d"), "a.b-c_d");
        assert_eq!(component(".."), "%2E.");
        assert_eq!(component("x/y"), "x%2Fy");
        assert_eq!(component("x%2Fy"), "x%252Fy");
        assert_eq!(component(""), "%");
    }
}
