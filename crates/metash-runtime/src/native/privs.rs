//! What a sandboxed child gives up, and the Landlock rules it adds itself: the calls shared by
//! the child's plan ([`super::isolate`]), the PID namespace's shims ([`super::pidns`]) and the
//! terminal setup ([`super::tty`]), kept here so none of them has to reach into another.

use std::io;

/// The kernel's Landlock ABI version (0 when Landlock is unavailable).
pub fn landlock_abi() -> i64 {
    // SAFETY: landlock_create_ruleset with NULL attr, size 0 and the VERSION flag only queries.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    v.max(0)
}

/// `struct landlock_path_beneath_attr` (packed in the kernel's header).
#[repr(C, packed)]
struct PathBeneath {
    allowed_access: u64,
    parent_fd: i32,
}

/// Landlock rights, as the kernel numbers them.
pub(super) mod access {
    pub const WRITE_FILE: u64 = 1 << 1;
    pub const READ_FILE: u64 = 1 << 2;
    pub const READ_DIR: u64 = 1 << 3;
    /// ABI 5: ioctl on a device file opened here (a terminal's `tcsetattr`, `TIOCGPTN`...).
    pub const IOCTL_DEV: u64 = 1 << 15;
}

/// Adds a Landlock rule for `path` (as this mount namespace sees it) to the ruleset: `access`
/// beneath it.
///
/// # Safety
/// In a forked child; `landlock_fd` a ruleset.
pub(super) unsafe fn grant(
    landlock_fd: i32,
    path: &std::ffi::CStr,
    access: u64,
    step: &str,
) -> io::Result<()> {
    // SAFETY (whole block): open/landlock_add_rule/close on a NUL-terminated path and a packed
    // struct that lives for the call.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
        check(libc::c_long::from(fd), step)?;
        let attr = PathBeneath {
            allowed_access: access,
            parent_fd: fd,
        };
        let rc = libc::syscall(
            libc::SYS_landlock_add_rule,
            landlock_fd,
            1u32, // LANDLOCK_RULE_PATH_BENEATH
            &attr as *const PathBeneath,
            0u32,
        );
        let e = io::Error::last_os_error();
        libc::close(fd);
        if rc < 0 {
            return Err(io::Error::new(
                e.kind(),
                format!("sandbox step {step}: {e}"),
            ));
        }
    }
    Ok(())
}

/// Drops every capability (the host may run as root; Landlock confines root too, but capabilities
/// would still allow raw sockets and the like).
///
/// # Safety
/// In the forked child only.
pub(super) unsafe fn drop_capabilities() -> io::Result<()> {
    // SAFETY: as `drop_capabilities_raw`.
    let rc = unsafe { drop_capabilities_raw() };
    if rc < 0 {
        let e = io::Error::from_raw_os_error(-rc as i32);
        return Err(io::Error::new(
            e.kind(),
            format!("sandbox step capset: {e}"),
        ));
    }
    Ok(())
}

/// [`drop_capabilities`] without building an error: the raw `capset` result (`-errno`). For the
/// PID namespace's shims, which share their memory (and so malloc's and errno's thread-local
/// state) with each other and with the host ([`super::raw`]), and so must not allocate or touch
/// `errno`.
///
/// # Safety
/// In the forked child only.
pub(super) unsafe fn drop_capabilities_raw() -> libc::c_long {
    // SAFETY: prctl and capset on this process with live stack data.
    unsafe {
        drop_bounding_set();
        let mut hdr = CapHeader {
            version: 0x2008_0522,
            pid: 0,
        };
        let data = [CapData::default(); 2];
        super::raw::call(
            libc::SYS_capset,
            [
                &mut hdr as *mut CapHeader as usize,
                data.as_ptr() as usize,
                0,
                0,
            ],
        ) as libc::c_long
    }
}

/// Empties the capability bounding set of the calling thread. Each drop allocates and commits new
/// credentials, so only the capabilities still in the set are dropped (a second call, or a call
/// in a child of a thread that emptied its own, costs a read per capability) and the loop stops at
/// the first the kernel does not know. Without `CAP_SETPCAP` the drops fail and the set stays.
///
/// # Safety
/// In the forked child, or on the spawner thread (whose set its children inherit).
pub(super) unsafe fn drop_bounding_set() {
    // SAFETY: prctl on this process.
    unsafe {
        for cap in 0..=63 {
            match super::raw::prctl(libc::PR_CAPBSET_READ, cap) {
                1 => {
                    super::raw::prctl(libc::PR_CAPBSET_DROP, cap);
                }
                0 => {}
                _ => break,
            }
        }
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
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
