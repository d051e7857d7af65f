//! Mount namespaces the host can still change after an agent started, so that a path grant can be
//! withdrawn mid-run (seed 002 §2: revocable at any time).
//!
//! Landlock rules and a WASM preopen are fixed once made: neither can be narrowed from outside. A
//! mount, though, can be changed by whoever holds its namespace. So every granted path is its
//! own mount in a namespace metash keeps a handle on (the native agent's own, or a holder's for a
//! WASM agent), and withdrawing it is a mount operation there:
//!
//! - **write** withdrawn: the path's mount (and everything under it) becomes read-only
//!   (`mount_setattr`), which holds for every way in, the agent's working directory and
//!   descriptors opened later included;
//! - **all** withdrawn: read-only as above, then an empty mode-000 tmpfs (a socket placeholder no
//!   one can open, for a file) is mounted over each entry of the directory, and an empty tmpfs
//!   over the directory itself, so a lookup by any path, relative to a working directory inside
//!   it or not, finds nothing readable.
//!
//! Descriptors the agent opened before stay open (as with any revocation in Unix); names in a
//! directory it already stands in stay listable, their contents do not.
//!
//! The operations run in a process forked for the purpose, which joins the namespaces with
//! `setns` (a multi-threaded host cannot) and makes only raw syscalls on data prepared before the
//! fork.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::mounts::{bind_self, cover_dir, read_only};
use crate::error::{Result, RuntimeError};

/// What a withdrawal takes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdraw {
    /// Writing (the path stays readable).
    Write,
    /// Everything: reading and writing.
    All,
}

/// A handle on one mount namespace (and the user namespace that owns it, when it is not ours).
#[derive(Debug)]
pub struct MountNs {
    user: Option<OwnedFd>,
    mnt: OwnedFd,
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| RuntimeError::SandboxSetup(format!("{}: NUL in path", p.display())))
}

fn open_ns(pid: i32, kind: &str) -> io::Result<File> {
    File::open(format!("/proc/{pid}/ns/{kind}"))
}

/// Whether mount namespaces can be made here (always as root; otherwise with user namespaces,
/// probed once).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| euid() == 0 || super::probe::user_namespaces().is_ok())
}

/// What is mounted over a withdrawn file (a tmpfs covers only directories): a socket inode with
/// mode 000, which no one can open (`EACCES`, and `ENXIO` for root, whose permission checks are
/// bypassed: a WASM guest's file access is the host's own). One per user, made once.
fn blank_file() -> Result<&'static Path> {
    static BLANK: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BLANK
        .get_or_init(|| {
            use std::os::unix::fs::{FileTypeExt, PermissionsExt};
            let dir = std::env::temp_dir().join(format!("metash-withdrawn-{}", euid()));
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let file = dir.join("placeholder.sock");
            let is_socket =
                |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket());
            if !is_socket(&file) {
                let _ = std::fs::remove_file(&file);
                // Bound and dropped: the socket file stays, with nothing listening.
                if let Err(e) = std::os::unix::net::UnixListener::bind(&file) {
                    if !is_socket(&file) {
                        return Err(format!("{}: {e}", file.display()));
                    }
                }
            }
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o000))
                .map_err(|e| format!("{}: {e}", file.display()))?;
            Ok(file)
        })
        .as_deref()
        .map_err(|e| {
            RuntimeError::SandboxSetup(format!("the placeholder for withdrawn files: {e}"))
        })
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// The step that covers `at`, by the kind of `source` (not following a symlink: a link is
/// covered as a file is, not where it points). An entry is covered unreadable (its contents are
/// gone: "permission denied"); the withdrawn directory itself `empty` (it can still be opened,
/// so an agent that falls back finds an empty directory, not a failure to start).
fn cover(at: &Path, source: &Path, empty: bool) -> Result<Step> {
    let target = cstr(at)?;
    Ok(if source.symlink_metadata().is_ok_and(|m| m.is_dir()) {
        Step::CoverDir { target, empty }
    } else {
        Step::CoverFile {
            target,
            blank: cstr(blank_file()?)?,
        }
    })
}

/// One mount step for the forked child.
enum Step {
    /// The mount at `target` read-only. When the agent holds a file open for writing there the
    /// kernel refuses (`EBUSY`); then each of `entries` is bound on itself read-only, and so is
    /// `target` on top: every existing file is read-only by any path, and a new file can only be
    /// made through a descriptor of the directory itself opened before (a WASM preopen, a native
    /// working directory) until the agent closes what it writes.
    ReadOnly {
        target: CString,
        entries: Vec<CString>,
        /// `target` is not a mount of its own yet: bind it on itself first.
        bind_first: bool,
    },
    CoverDir {
        target: CString,
        empty: bool,
    },
    CoverFile {
        target: CString,
        blank: CString,
    },
}

impl MountNs {
    /// The namespaces of process `pid` (a confined agent metash started).
    ///
    /// # Errors
    /// The process is gone, or `/proc` cannot be read.
    pub fn of_process(pid: i32) -> Result<Self> {
        let err = |e: io::Error| {
            RuntimeError::SandboxSetup(format!("the mount namespace of process {pid}: {e}"))
        };
        let mnt = open_ns(pid, "mnt").map_err(err)?;
        let user = open_ns(pid, "user").map_err(err)?;
        let ours = std::fs::metadata("/proc/self/ns/user").map_err(err)?;
        let theirs = user.metadata().map_err(err)?;
        let same = ours.ino() == theirs.ino() && ours.dev() == theirs.dev();
        Ok(Self {
            user: (!same).then(|| OwnedFd::from(user)),
            mnt: OwnedFd::from(mnt),
        })
    }

    /// Takes `what` away at `at`, a path as the namespace sees it; `source` is the same place as
    /// the host sees it (the same path for a native agent), listed for the entries to cover.
    /// `own_mount`: `at` is a mount of its own (metash makes every granted path one at start);
    /// otherwise (a directory inside a granted one) it is bound on itself first.
    ///
    /// # Errors
    /// A step the kernel refused, named.
    pub fn withdraw(
        &self,
        at: &Path,
        source: &Path,
        what: Withdraw,
        own_mount: bool,
    ) -> Result<()> {
        let entries: Vec<(PathBuf, PathBuf, bool)> = if source.is_dir() {
            std::fs::read_dir(source)
                .map_err(|e| RuntimeError::SandboxSetup(format!("{}: {e}", source.display())))?
                .flatten()
                .map(|e| {
                    let link = e.file_type().is_ok_and(|t| t.is_symlink());
                    (at.join(e.file_name()), e.path(), link)
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut steps = vec![Step::ReadOnly {
            target: cstr(at)?,
            bind_first: !own_mount,
            // A symlink is not bound on itself (that would follow it): a lookup through it
            // reaches a mount that is withdrawn itself or was never granted.
            entries: entries
                .iter()
                .filter(|(_, _, link)| !link)
                .map(|(a, _, _)| cstr(a))
                .collect::<Result<_>>()?,
        }];
        if what == Withdraw::All {
            // Entries first: once the directory is covered, they cannot be reached to cover.
            for (a, src, _) in &entries {
                steps.push(cover(a, src, false)?);
            }
            steps.push(cover(at, source, true)?);
        }
        self.run(&steps)
    }

    /// Runs `steps` in a child joined to the namespaces; the first failure is the error.
    fn run(&self, steps: &[Step]) -> Result<()> {
        let user = self.user.as_ref().map(AsRawFd::as_raw_fd);
        let mnt = self.mnt.as_raw_fd();
        let (report_r, report_w) = pipe()?;
        // SAFETY: the child makes only raw syscalls on data prepared above, then _exits.
        let pid = unsafe { fork_for("a withdrawal")? };
        if pid == 0 {
            // SAFETY: in the forked child, see above.
            unsafe {
                let failed = child_steps(user, mnt, steps);
                if let Some((step, errno)) = failed {
                    let report = [step, errno];
                    libc::write(report_w.as_raw_fd(), report.as_ptr().cast(), 8);
                }
                libc::_exit(i32::from(failed.is_some()));
            }
        }
        drop(report_w);
        let mut report = [0u8; 8];
        let n = io::Read::read(&mut File::from(report_r), &mut report).unwrap_or(0);
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc < 0 || !libc::WIFEXITED(status) {
            return Err(RuntimeError::SandboxSetup(
                "the withdrawal process did not finish".into(),
            ));
        }
        if libc::WEXITSTATUS(status) == 0 {
            return Ok(());
        }
        let step = i32::from_ne_bytes([report[0], report[1], report[2], report[3]]);
        let errno = i32::from_ne_bytes([report[4], report[5], report[6], report[7]]);
        Err(RuntimeError::SandboxSetup(if n == 8 {
            describe(step, errno, steps)
        } else {
            "the withdrawal process failed without saying why".into()
        }))
    }
}

/// `fork(2)`; 0 in the child.
///
/// # Safety
/// The child may only make async-signal-safe calls on data prepared before, then `_exit`: the
/// host has other threads.
unsafe fn fork_for(what: &str) -> Result<libc::pid_t> {
    // SAFETY: per the contract.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(RuntimeError::SandboxSetup(format!(
            "fork for {what}: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(pid)
}

/// A failed withdrawal step (`-1`: joining the namespaces) and its errno, in words.
fn describe(step: i32, errno: i32, steps: &[Step]) -> String {
    let why = io::Error::from_raw_os_error(errno);
    let Ok(i) = usize::try_from(step) else {
        return format!("joining the agent's namespaces: {why}");
    };
    let what = match steps.get(i) {
        Some(Step::ReadOnly { target: p, .. }) => {
            format!("making {} read-only", p.to_string_lossy())
        }
        Some(Step::CoverDir { target: p, .. }) | Some(Step::CoverFile { target: p, .. }) => {
            format!("covering {}", p.to_string_lossy())
        }
        None => format!("step {i}"),
    };
    format!("{what} in the agent's mount namespace: {why}")
}

/// The failed step (`-1` for joining) and its errno, or `None` when every step was made.
///
/// # Safety
/// Only in a freshly forked child.
unsafe fn child_steps(user: Option<i32>, mnt: i32, steps: &[Step]) -> Option<(i32, i32)> {
    // SAFETY (whole block): raw syscalls on NUL-terminated data prepared before the fork.
    unsafe {
        if let Some(u) = user {
            if libc::setns(u, libc::CLONE_NEWUSER) != 0 {
                return Some((-1, errno()));
            }
        }
        if libc::setns(mnt, libc::CLONE_NEWNS) != 0 {
            return Some((-1, errno()));
        }
        for (i, step) in steps.iter().enumerate() {
            let ok = match step {
                Step::ReadOnly {
                    target,
                    entries,
                    bind_first,
                } => {
                    (*bind_first && bind_self(target) && read_only(target))
                        || (!*bind_first && read_only(target))
                        || (errno() == libc::EBUSY
                            && entries.iter().all(|e| bind_self(e) && read_only(e))
                            && bind_self(target)
                            && read_only(target))
                }
                Step::CoverDir { target, empty } => cover_dir(target, *empty),
                Step::CoverFile { target, blank } => {
                    libc::mount(
                        blank.as_ptr(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    ) == 0
                        && read_only(target)
                }
            };
            if !ok {
                return Some((i32::try_from(i).unwrap_or(i32::MAX), errno()));
            }
        }
        None
    }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A WASM agent's view of its grants: a directory `root` (preopened as the guest's `/`) in a
/// namespace of its own, where each granted path is bound at its guest path. Withdrawing is done
/// at `root` joined with the guest path. The namespace lives as long as this handle.
#[derive(Debug)]
pub struct Holder {
    pub ns: std::sync::Arc<MountNs>,
    /// `root` as the namespace sees it, open (preopen `/proc/self/fd/<it>`).
    pub root_fd: OwnedFd,
    /// The directory on the host side (empty mount points only).
    pub root: PathBuf,
}

/// One bind of a holder: `source` (host path) at `target` (under the root), writable or not.
#[derive(Debug, Clone)]
pub struct Bind {
    pub source: PathBuf,
    pub target: PathBuf,
    pub write: bool,
}

impl Holder {
    /// Makes the namespace: `root` bound on itself read-only, then each bind in order (parents
    /// before children), read-only unless writable, then an empty read-only tmpfs over each of
    /// `hide` (paths under `root`: the host's state inside a grant), then each of `protect`
    /// (paths under `root`: `.git` inside a writable grant) bound on itself read-only.
    ///
    /// # Errors
    /// A namespace or mount step the kernel refused, named.
    pub fn create(
        root: &Path,
        binds: &[Bind],
        hide: &[PathBuf],
        protect: &[PathBuf],
    ) -> Result<Self> {
        let root_c = cstr(root)?;
        let binds_c = binds
            .iter()
            .map(|b| Ok((cstr(&b.source)?, cstr(&b.target)?, b.write)))
            .collect::<Result<Vec<_>>>()?;
        let hide_c = hide.iter().map(|h| cstr(h)).collect::<Result<Vec<_>>>()?;
        let protect_c = protect
            .iter()
            .map(|p| cstr(p))
            .collect::<Result<Vec<_>>>()?;
        let userns = super::mounts::own_maps();
        let (ready_r, ready_w) = pipe()?;
        let (wait_r, wait_w) = pipe()?;
        // SAFETY: the child makes only raw syscalls on data prepared above, then _exits.
        let pid = unsafe { fork_for("a WASM agent's mount namespace")? };
        if pid == 0 {
            // SAFETY: in the forked child.
            unsafe {
                // Only its two pipe ends: a copy of another thread's descriptor (another holder's
                // pipe, the run lock) would keep that open for as long as this child waits.
                keep_only(ready_w.as_raw_fd(), wait_r.as_raw_fd());
                let step = holder_steps(userns.as_ref(), &root_c, &binds_c, (&hide_c, &protect_c));
                libc::write(ready_w.as_raw_fd(), (&step as *const u8).cast(), 1);
                let mut b = 0u8;
                libc::read(wait_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
                libc::_exit(0);
            }
        }
        drop(ready_w);
        drop(wait_r);
        let opened = (|| {
            let mut b = [0u8; 1];
            let n = io::Read::read(&mut File::from(ready_r), &mut b)
                .map_err(|e| RuntimeError::SandboxSetup(format!("holder: {e}")))?;
            if n != 1 || b[0] != 0 {
                return Err(RuntimeError::SandboxSetup(format!(
                    "making a WASM agent's mount namespace failed at step {} (of: 1 new \
                     namespace, 2 private, 3 root read-only, 4.. each grant, {HIDE_STEP} hiding \
                     the host's state, {PROTECT_STEP} keeping .git read-only)",
                    if n == 1 { b[0] } else { 0 }
                )));
            }
            let ns = MountNs::of_process(pid)?;
            let inside = PathBuf::from(format!("/proc/{pid}/root")).join(
                root.strip_prefix("/")
                    .map_err(|_| RuntimeError::SandboxSetup("holder root not absolute".into()))?,
            );
            let dir = File::open(&inside)
                .map_err(|e| RuntimeError::SandboxSetup(format!("{}: {e}", inside.display())))?;
            Ok((ns, OwnedFd::from(dir)))
        })();
        drop(wait_w);
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let (ns, root_fd) = opened?;
        Ok(Self {
            ns: std::sync::Arc::new(ns),
            root_fd,
            root: root.to_path_buf(),
        })
    }

    /// The path to preopen (this process's handle on the root inside the namespace).
    pub fn preopen_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.root_fd.as_raw_fd()))
    }
}

/// Closes every descriptor but `a`, `b` and stdio (`close_range(2)`; a kernel without it leaves
/// them, as before).
///
/// # Safety
/// In a forked child only: the closed descriptors are the parent's copies.
unsafe fn keep_only(a: i32, b: i32) {
    let (lo, hi) = (a.min(b) as libc::c_uint, a.max(b) as libc::c_uint);
    let close = |from: libc::c_uint, to: libc::c_uint| {
        if from <= to {
            // SAFETY: close_range(2) on descriptors of this (forked) process.
            unsafe { libc::syscall(libc::SYS_close_range, from, to, 0u32) };
        }
    };
    close(3, lo.saturating_sub(1));
    close(lo + 1, hi.saturating_sub(1));
    close(hi + 1, libc::c_uint::MAX);
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    super::fds::pipe(0).map_err(|e| RuntimeError::SandboxSetup(format!("pipe: {e}")))
}

/// The holder's failed step when covering the host's state, and when keeping `.git` read-only.
const HIDE_STEP: u8 = u8::MAX;
const PROTECT_STEP: u8 = u8::MAX - 1;

/// The holder child's setup; 0 or the 1-based step that failed. `shield`: the paths to hide,
/// then those to keep read-only.
///
/// # Safety
/// Only in a freshly forked child.
unsafe fn holder_steps(
    userns: Option<&(Vec<u8>, Vec<u8>)>,
    root: &CString,
    binds: &[(CString, CString, bool)],
    shield: (&[CString], &[CString]),
) -> u8 {
    let (hide, protect) = shield;
    // SAFETY (whole block): raw syscalls on data prepared before the fork.
    unsafe {
        if super::mounts::enter(userns, false).is_err() {
            return 1;
        }
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return 2;
        }
        if !bind_self(root) || !read_only(root) {
            return 3;
        }
        for (i, (source, target, write)) in binds.iter().enumerate() {
            let bound = libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ) == 0;
            if !bound || (!write && !read_only(target)) {
                return u8::try_from(i + 4).unwrap_or(PROTECT_STEP - 1);
            }
        }
        for h in hide {
            if !cover_dir(h, false) {
                return HIDE_STEP;
            }
        }
        for p in protect {
            if !bind_self(p) || !read_only(p) {
                return PROTECT_STEP;
            }
        }
        0
    }
}
