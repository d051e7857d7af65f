//! Hiding the host's state from a native agent whose grants would contain it. Landlock grants
//! whole hierarchies and cannot subtract `.meta/` from a granted project root, and a writable root
//! would let the agent rename `.meta/` away and plant its own. So the child enters a mount
//! namespace of its own and mounts an empty, read-only tmpfs over each such directory before
//! anything else restricts it: inside, `.meta/` is an empty directory that cannot be written,
//! renamed, removed or replaced (a mount point is busy), and every path to it (`..`, symlinks,
//! hard links, git) resolves to that empty mount. The host's view is unchanged.

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{Result, RuntimeError};

/// What the child mounts over, prepared in the parent (the child only makes raw syscalls).
#[derive(Debug)]
pub struct Mask {
    dirs: Vec<CString>,
    /// Shown in the start report.
    pub shown: Vec<PathBuf>,
    /// Not root: a user namespace first (mapping the user to itself), so the mount is allowed.
    userns: Option<(Vec<u8>, Vec<u8>)>,
    /// Granted paths bound on themselves (revocable mid-run), parents first.
    binds: Vec<CString>,
    /// Entered again once the binds are made.
    cwd: Option<CString>,
}

impl Mask {
    /// The start report's `state_hidden`.
    pub fn report(&self) -> serde_json::Value {
        serde_json::json!({"dirs": self.shown, "via": "mount-namespace", "as": "empty read-only tmpfs"})
    }
}

/// The hidden directories a grant contains. Refuses (fail closed) a spec where one would also hide
/// a granted directory (a workspace inside `.meta/` plus a grant of the project root).
///
/// # Errors
/// [`RuntimeError::SandboxSetup`] naming the conflict.
pub fn plan(hidden: &[PathBuf], granted: &[PathBuf]) -> Result<Option<Mask>> {
    let hidden: Vec<PathBuf> = hidden
        .iter()
        .filter_map(|h| std::fs::canonicalize(h).ok())
        .collect();
    let granted: Vec<PathBuf> = granted
        .iter()
        .filter_map(|g| std::fs::canonicalize(g).ok())
        .collect();
    let masked: Vec<PathBuf> = hidden
        .into_iter()
        .filter(|h| granted.iter().any(|g| h.starts_with(g)))
        .collect();
    if masked.is_empty() {
        return Ok(None);
    }
    if let Some((g, h)) = granted
        .iter()
        .find_map(|g| masked.iter().find(|h| g.starts_with(h)).map(|h| (g, h)))
    {
        return Err(RuntimeError::SandboxSetup(format!(
            "{} is granted and lies inside {}, which another grant would expose and so must be \
             hidden: grant one or the other",
            g.display(),
            h.display()
        )));
    }
    let dirs = masked.iter().map(|d| cstr(d)).collect::<Result<Vec<_>>>()?;
    Ok(Some(Mask {
        dirs,
        shown: masked,
        userns: own_maps(),
        binds: Vec::new(),
        cwd: None,
    }))
}

/// Not root: the uid and gid maps of a user namespace mapping the user to itself (so mounts are
/// allowed there). Root needs no user namespace.
pub(crate) fn own_maps() -> Option<(Vec<u8>, Vec<u8>)> {
    // SAFETY: geteuid/getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    (uid != 0).then(|| {
        (
            format!("{uid} {uid} 1\n").into_bytes(),
            format!("{gid} {gid} 1\n").into_bytes(),
        )
    })
}

impl Mask {
    /// Makes each of `granted` a mount of its own in the agent's namespace, so the host can take
    /// it back while the agent runs ([`super::mountns`]), and enters `cwd` again afterwards (the
    /// working directory must be inside those mounts, not under them). Creates the mask when
    /// nothing is hidden.
    pub fn revocable(mask: Option<Self>, granted: &[PathBuf], cwd: &Path) -> Result<Self> {
        let mut mask = mask.unwrap_or_else(|| Self {
            dirs: Vec::new(),
            shown: Vec::new(),
            userns: own_maps(),
            binds: Vec::new(),
            cwd: None,
        });
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

/// Writes `data` to a `/proc/self` file (uid_map and friends).
///
/// # Safety
/// In the forked child only.
unsafe fn write_proc(path: &[u8], data: &[u8], step: &str) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated; plain open/write/close.
    unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
        check(fd as libc::c_long, step)?;
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        libc::close(fd);
        check(n as libc::c_long, step)
    }
}

impl Mask {
    /// Enters the mount namespace and mounts over each directory.
    ///
    /// # Safety
    /// Only in the child between fork and exec, before capabilities are dropped.
    pub unsafe fn apply(&self) -> io::Result<()> {
        // SAFETY (whole block): raw syscalls on prepared, NUL-terminated data in a single-threaded
        // child.
        unsafe {
            enter(self.userns.as_ref())?;
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
                if !super::mountns::cover_dir(dir, false) {
                    check(-1, "hide state: mount over the state directory")?;
                }
            }
            for g in &self.binds {
                if !super::mountns::bind_self(g) {
                    check(-1, "revocable grants: bind a granted path on itself")?;
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

/// Enters a new mount namespace: with a user namespace mapping the user to itself when `userns`
/// has its maps (not root).
///
/// # Safety
/// Only in a forked child, single-threaded, before capabilities are dropped.
pub(crate) unsafe fn enter(userns: Option<&(Vec<u8>, Vec<u8>)>) -> io::Result<()> {
    // SAFETY (whole block): raw syscalls on prepared, NUL-terminated data.
    unsafe {
        match userns {
            Some((uid_map, gid_map)) => {
                check(
                    libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) as libc::c_long,
                    "mount namespace: unshare(user, mount)",
                )?;
                write_proc(
                    b"/proc/self/setgroups\0",
                    b"deny",
                    "mount namespace: setgroups",
                )?;
                write_proc(b"/proc/self/uid_map\0", uid_map, "mount namespace: uid_map")?;
                write_proc(b"/proc/self/gid_map\0", gid_map, "mount namespace: gid_map")
            }
            None => check(
                libc::unshare(libc::CLONE_NEWNS) as libc::c_long,
                "mount namespace: unshare(mount)",
            ),
        }
    }
}
