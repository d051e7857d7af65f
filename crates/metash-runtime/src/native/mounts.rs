//! The mount calls the sandbox makes in a child, shared by the agent's mask ([`super::mask`]),
//! the namespaces the host can change later ([`super::mountns`]) and the PID namespace's own
//! mount namespace ([`super::pidns`]): entering a mount namespace (with a user namespace when
//! metash is not root), binding a path on itself, covering a directory, making a mount
//! read-only. Raw syscalls on data prepared before the fork, nothing else, so each caller may
//! use them between fork and exec.

use std::ffi::CString;
use std::io;

/// `AT_RECURSIVE` (linux/fcntl.h): `mount_setattr` on the whole subtree.
const AT_RECURSIVE: libc::c_uint = 0x8000;

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

/// Enters a new mount namespace: with a user namespace mapping the user to itself when `userns`
/// has its maps (not root). `entered`: the spawn's `clone` made both namespaces already (a
/// process sharing the host's memory cannot `unshare` a user namespace, see
/// [`super::vspawn`]); only the maps are left to write.
///
/// # Safety
/// Only in a forked child, single-threaded, before capabilities are dropped.
pub(crate) unsafe fn enter(userns: Option<&(Vec<u8>, Vec<u8>)>, entered: bool) -> io::Result<()> {
    // SAFETY (whole block): raw syscalls on prepared, NUL-terminated data.
    unsafe {
        match userns {
            Some((uid_map, gid_map)) => {
                if !entered {
                    check(
                        libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) as libc::c_long,
                        "mount namespace: unshare(user, mount)",
                    )?;
                }
                write_proc(
                    b"/proc/self/setgroups\0",
                    b"deny",
                    "mount namespace: setgroups",
                )?;
                write_proc(b"/proc/self/uid_map\0", uid_map, "mount namespace: uid_map")?;
                write_proc(b"/proc/self/gid_map\0", gid_map, "mount namespace: gid_map")
            }
            None if entered => Ok(()),
            None => check(
                libc::unshare(libc::CLONE_NEWNS) as libc::c_long,
                "mount namespace: unshare(mount)",
            ),
        }
    }
}

/// Makes the mount at `p` and every mount under it read-only, leaving its other flags alone.
///
/// # Safety
/// Raw syscall; `p` NUL-terminated.
pub(crate) unsafe fn read_only(p: &CString) -> bool {
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr(2) with a valid path and attr struct of the size given.
    unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            p.as_ptr(),
            AT_RECURSIVE,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        ) == 0
    }
}

/// Mounts an empty, read-only tmpfs over the directory `p`: mode 000, or 555 when `empty` (an
/// empty directory that can be listed). Hides the host's state at start and withdraws a path
/// later.
///
/// # Safety
/// Raw syscall; `p` NUL-terminated.
pub(crate) unsafe fn cover_dir(p: &CString, empty: bool) -> bool {
    let options = if empty {
        c"size=4k,mode=555"
    } else {
        c"size=4k,mode=000"
    };
    // SAFETY: mount(2) with NUL-terminated strings.
    unsafe {
        libc::mount(
            c"metash-covered".as_ptr(),
            p.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            options.as_ptr().cast(),
        ) == 0
    }
}

/// Binds `p` onto itself with everything mounted under it, so it is a mount of its own that can
/// later be made read-only without touching anything else.
///
/// # Safety
/// Raw syscall; `p` NUL-terminated.
pub(crate) unsafe fn bind_self(p: &CString) -> bool {
    // SAFETY: mount(2) with NUL-terminated strings.
    unsafe {
        libc::mount(
            p.as_ptr(),
            p.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        ) == 0
    }
}
