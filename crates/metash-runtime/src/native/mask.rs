//! Hiding the host's state from a native agent whose grants would contain it, and keeping the
//! project's git metadata read-only where a grant would let it be written. Landlock grants whole
//! hierarchies and cannot subtract `.meta/` or `.git/` from a granted project root, and a writable
//! root would let the agent rename `.meta/` away and plant its own. So the child enters a mount
//! namespace of its own and mounts an empty, read-only tmpfs over each such state directory before
//! anything else restricts it: inside, `.meta/` is an empty directory that cannot be written,
//! renamed, removed or replaced (a mount point is busy), and every path to it (`..`, symlinks,
//! hard links, git) resolves to that empty mount. Each protected path (`.git`) a writable grant
//! reaches is bound on itself read-only the same way: readable (git still works), never written,
//! renamed or replaced. The host's view is unchanged.

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{Result, RuntimeError};
use crate::spec::PathAccess;

mod expose;

/// What the host keeps from an agent whatever it is granted (see
/// [`crate::spec::AgentSpec::hidden`] and [`crate::spec::AgentSpec::protected`]), and the
/// agent's workspace: the one grant allowed inside a hidden directory (a task worktree the host
/// made under `.meta/worktrees/`; the host checks that before it asks).
pub struct Shield<'a> {
    pub hidden: &'a [PathBuf],
    pub protected: &'a [PathBuf],
    pub workspace: &'a Path,
}

/// What the child mounts over, prepared in the parent (the child only makes raw syscalls).
#[derive(Debug)]
pub struct Mask {
    dirs: Vec<CString>,
    /// Shown in the start report.
    pub shown: Vec<PathBuf>,
    /// Protected paths a writable grant reaches: bound on themselves read-only, after the binds.
    protect: Vec<CString>,
    /// Shown in the start report.
    pub protected: Vec<PathBuf>,
    /// Not root: a user namespace first (mapping the user to itself), so the mount is allowed.
    userns: Option<(Vec<u8>, Vec<u8>)>,
    /// Granted paths bound on themselves (revocable mid-run), parents first.
    binds: Vec<CString>,
    /// Entered again once the binds are made.
    cwd: Option<CString>,
    /// The agent's own package inside a hidden directory (a project agent in `.meta/agents/`),
    /// shown again read-only ([`expose`]).
    expose: Vec<expose::Exposure>,
    /// Shown in the start report.
    exposed: Vec<PathBuf>,
}

impl Mask {
    /// The start report's `state_hidden` (`None`: nothing had to be hidden).
    pub fn report(&self) -> Option<serde_json::Value> {
        (!self.shown.is_empty()).then(|| {
            let mut r = serde_json::json!({"dirs": self.shown, "via": "mount-namespace",
                                           "as": "empty read-only tmpfs"});
            if !self.exposed.is_empty() {
                r["except"] = serde_json::json!({"paths": self.exposed,
                    "as": "the agent's own package, bound back read-only"});
            }
            r
        })
    }

    /// The start report's `protected` (`None`: no writable grant reached a protected path).
    pub fn protected_report(&self) -> Option<serde_json::Value> {
        (!self.protected.is_empty()).then(|| {
            serde_json::json!({"paths": self.protected, "via": "mount-namespace",
                               "as": "read-only bind"})
        })
    }

    fn empty() -> Self {
        Self {
            dirs: Vec::new(),
            shown: Vec::new(),
            protect: Vec::new(),
            protected: Vec::new(),
            userns: super::mounts::own_maps(),
            binds: Vec::new(),
            cwd: None,
            expose: Vec::new(),
            exposed: Vec::new(),
        }
    }
}

/// The hidden directories a grant contains, and the protected paths a writable grant reaches.
/// Refuses (fail closed) a grant that lies inside a hidden directory (but the workspace: a task
/// worktree), a spec where a hidden directory would also hide a granted one (a workspace inside
/// `.meta/` plus a grant of the project root), and a protected path that is a symlink inside a
/// writable grant (the link itself cannot be bound read-only, and could be replaced).
///
/// # Errors
/// [`RuntimeError::SandboxSetup`] naming the conflict.
pub fn plan(shield: &Shield<'_>, granted: &[PathAccess]) -> Result<Option<Mask>> {
    let hidden: Vec<PathBuf> = shield
        .hidden
        .iter()
        .filter_map(|h| std::fs::canonicalize(h).ok())
        .collect();
    let granted: Vec<PathAccess> = granted
        .iter()
        .filter_map(|g| {
            Some(PathAccess {
                path: std::fs::canonicalize(&g.path).ok()?,
                write: g.write,
            })
        })
        .collect();
    let workspace = std::fs::canonicalize(shield.workspace).ok();
    crate::spec::refuse_inside_hidden(&hidden, &granted, workspace.as_deref())?;
    let masked: Vec<PathBuf> = hidden
        .into_iter()
        .filter(|h| granted.iter().any(|g| h.starts_with(&g.path)))
        .collect();
    if let Some((g, h)) = granted.iter().find_map(|g| {
        masked
            .iter()
            .find(|h| g.path.starts_with(h))
            .map(|h| (&g.path, h))
    }) {
        return Err(RuntimeError::SandboxSetup(format!(
            "{} is granted and lies inside {}, which another grant would expose and so must be \
             hidden: grant one or the other",
            g.display(),
            h.display()
        )));
    }
    let protected = protected_in_reach(shield.protected, &granted, &masked)?;
    if masked.is_empty() && protected.is_empty() {
        return Ok(None);
    }
    Ok(Some(Mask {
        dirs: masked.iter().map(|d| cstr(d)).collect::<Result<Vec<_>>>()?,
        shown: masked,
        protect: protected
            .iter()
            .map(|p| cstr(p))
            .collect::<Result<Vec<_>>>()?,
        protected,
        ..Mask::empty()
    }))
}

/// The protected paths a writable grant contains or lies inside, as the agent's namespace names
/// them (the parent resolved, the entry itself not followed), except those a hidden directory
/// already covers. A symlinked one is refused inside a writable grant; its target is protected.
pub(crate) fn protected_in_reach(
    protected: &[PathBuf],
    granted: &[PathAccess],
    masked: &[PathBuf],
) -> Result<Vec<PathBuf>> {
    let reach = |q: &Path| {
        granted
            .iter()
            .any(|g| g.write && (q.starts_with(&g.path) || g.path.starts_with(q)))
    };
    let covered = |q: &Path| masked.iter().any(|h| q.starts_with(h));
    let mut out = Vec::new();
    for p in protected {
        let Some(entry) = entry_path(p) else {
            continue;
        };
        if covered(&entry) {
            continue;
        }
        if entry.symlink_metadata().is_ok_and(|m| m.is_symlink()) {
            if reach(&entry) {
                return Err(RuntimeError::SandboxSetup(format!(
                    "{} is a symlink inside a writable grant: it cannot be kept read-only (it \
                     could be replaced); grant a directory that does not hold it",
                    entry.display()
                )));
            }
            let target = std::fs::canonicalize(&entry).ok();
            out.extend(target.filter(|t| reach(t) && !covered(t)));
            continue;
        }
        if reach(&entry) {
            out.push(entry);
        }
    }
    // Parents before children (a path sorts before what lies in it).
    out.sort();
    out.dedup();
    Ok(out)
}

/// `p` with its parent resolved and its last component as it is (a symlink not followed), when
/// it exists.
fn entry_path(p: &Path) -> Option<PathBuf> {
    let parent = std::fs::canonicalize(p.parent()?).ok()?;
    let entry = parent.join(p.file_name()?);
    entry.symlink_metadata().ok().map(|_| entry)
}

impl Mask {
    /// Makes each of `granted` a mount of its own in the agent's namespace, so the host can take
    /// it back while the agent runs ([`super::mountns`]), and enters `cwd` again afterwards (the
    /// working directory must be inside those mounts, not under them). Creates the mask when
    /// nothing is hidden.
    pub fn revocable(mask: Option<Self>, granted: &[PathBuf], cwd: &Path) -> Result<Self> {
        let mut mask = mask.unwrap_or_else(Self::empty);
        let mut granted: Vec<PathBuf> = granted
            .iter()
            .filter_map(|g| std::fs::canonicalize(g).ok())
            .collect();
        // Parents first: a child's bind lands inside its parent's.
        granted.sort_by_key(|g| g.components().count());
        granted.dedup();
        mask.binds = granted.iter().map(|g| cstr(g)).collect::<Result<_>>()?;
        mask.cwd = Some(cstr(cwd)?);
        Ok(mask)
    }
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| RuntimeError::SandboxSetup(format!("{}: NUL in path", p.display())))
}

fn check(rc: libc::c_long, step: &str) -> io::Result<()> {
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("sandbox step {step}: {e}"),
        ));
    }
    Ok(())
}

impl Mask {
    /// Whether entering its namespace makes a user namespace too (metash is not root).
    pub fn needs_user_ns(&self) -> bool {
        self.userns.is_some()
    }

    /// Enters the mount namespace (unless the spawn's `clone` did: `entered`), mounts over each
    /// hidden directory, binds the grants and keeps the protected paths read-only.
    ///
    /// # Safety
    /// Only in the child between fork and exec, before capabilities are dropped.
    pub unsafe fn apply(&self, entered: bool) -> io::Result<()> {
        // SAFETY (whole block): raw syscalls on prepared, NUL-terminated data in a single-threaded
        // child.
        unsafe {
            super::mounts::enter(self.userns.as_ref(), entered)?;
            // Nothing mounted here propagates back to the host's namespace.
            check(
                libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) as libc::c_long,
                "hide state: make / private",
            )?;
            for dir in &self.dirs {
                if let Some(x) = self.expose.iter().find(|x| x.hidden == *dir) {
                    x.apply()?;
                    continue;
                }
                if !super::mounts::cover_dir(dir, false) {
                    check(-1, "hide state: mount over the state directory")?;
                }
            }
            for g in &self.binds {
                if !super::mounts::bind_self(g) {
                    check(-1, "revocable grants: bind a granted path on itself")?;
                }
            }
            // After the grants' binds, so this is the topmost mount there (a withdrawal later
            // only narrows it further).
            for p in &self.protect {
                if !(super::mounts::bind_self(p) && super::mounts::read_only(p)) {
                    check(
                        -1,
                        "keep .git read-only: bind a protected path on itself read-only",
                    )?;
                }
            }
            if let Some(cwd) = &self.cwd {
                check(
                    libc::chdir(cwd.as_ptr()) as libc::c_long,
                    "revocable grants: enter the working directory again",
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(path: &Path, write: bool) -> PathAccess {
        PathAccess {
            path: path.to_path_buf(),
            write,
        }
    }

    /// `.git` is kept read-only only where a writable grant reaches it, and not where a hidden
    /// directory already covers it.
    #[test]
    fn protected_paths_in_reach_of_a_writable_grant() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().canonicalize().expect("root");
        let (git, meta) = (root.join(".git"), root.join(".meta"));
        std::fs::create_dir_all(git.join("hooks")).expect("git");
        std::fs::create_dir_all(meta.join("worktrees/t1")).expect("meta");
        std::fs::write(meta.join("worktrees/t1/.git"), "gitdir: x\n").expect("gitfile");
        let wt_git = meta.join("worktrees/t1/.git");
        let protected = [git.clone(), wt_git.clone()];
        let reach = |granted: &[PathAccess], masked: &[PathBuf]| {
            protected_in_reach(&protected, granted, masked).expect("plan")
        };
        assert!(reach(&[access(&root, false)], &[]).is_empty());
        assert_eq!(
            reach(&[access(&root, true)], std::slice::from_ref(&meta)),
            vec![git.clone()]
        );
        assert_eq!(
            reach(&[access(&root, true)], &[]),
            vec![git.clone(), wt_git.clone()]
        );
        assert_eq!(
            reach(&[access(&git.join("hooks"), true)], &[]),
            vec![git.clone()]
        );
        assert_eq!(
            reach(&[access(&meta.join("worktrees/t1"), true)], &[]),
            vec![wt_git]
        );
    }
}
