//! System calls that touch nothing but registers: no `errno`, no thread-local state, no lock.
//!
//! A native agent's tree starts sharing the host's memory ([`super::vspawn`]), and its two shims
//! ([`super::pidns`]) keep sharing it for as long as the agent runs. libc's wrappers store a
//! failure's code in `errno`, a thread-local of the host thread that started the spawn, which by
//! then is running again: a shim's failed `kill` would change the `errno` the host is about to
//! read. The shims make their calls through [`call`] instead, which returns `-errno` and stores
//! nothing.

/// `syscall(nr, a...)`: the kernel's result, `-errno` on failure.
///
/// # Safety
/// As the system call itself: every pointer argument must be valid for what `nr` does with it.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn call(nr: libc::c_long, a: [usize; 4]) -> isize {
    let rc: isize;
    // SAFETY: the `syscall` instruction clobbers rcx and r11 only; the caller vouches for the
    // arguments.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => rc,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            // The fifth and sixth arguments are always 0: `prctl`, for one, refuses other values.
            in("r8") 0usize,
            in("r9") 0usize,
            out("rcx") _,
            out("r11") _,
            options(nostack),
        );
    }
    rc
}

/// Elsewhere the tree does not share the host's memory (the shims fork, see [`super::shim`]), so
/// libc's wrapper is as good; its `errno` is the copy's own.
///
/// # Safety
/// As the system call itself.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn call(nr: libc::c_long, a: [usize; 4]) -> isize {
    // SAFETY: forwarded as given.
    let rc = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3]) };
    if rc < 0 {
        // SAFETY: reading this thread's errno right after the failed call.
        -(unsafe { *libc::__errno_location() } as isize)
    } else {
        rc as isize
    }
}

/// Whether the tree may share the host's memory: only where [`call`] and the shims' stack switch
/// ([`super::shim`]) are free of thread-local state.
pub(super) const SHARES_MEMORY: bool = cfg!(target_arch = "x86_64");

/// `wait4(pid, &status, options, NULL)`: the pid reaped (0 with `WNOHANG` and nothing yet), or
/// `-errno`.
///
/// # Safety
/// Raw syscall on a live stack variable.
pub(super) unsafe fn wait(pid: libc::pid_t, status: &mut i32, options: i32) -> isize {
    // SAFETY: `status` is a live i32.
    unsafe {
        call(
            libc::SYS_wait4,
            [
                pid as usize,
                status as *mut i32 as usize,
                options as usize,
                0,
            ],
        )
    }
}

/// `kill(pid, sig)`.
///
/// # Safety
/// Raw syscall.
pub(super) unsafe fn kill(pid: libc::pid_t, sig: i32) -> isize {
    // SAFETY: no pointer arguments.
    unsafe { call(libc::SYS_kill, [pid as usize, sig as usize, 0, 0]) }
}

/// `read(fd, buf)`.
///
/// # Safety
/// Raw syscall into a live buffer.
pub(super) unsafe fn read(fd: i32, buf: &mut [u8]) -> isize {
    // SAFETY: the buffer is live for its length.
    unsafe {
        call(
            libc::SYS_read,
            [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0],
        )
    }
}

/// `write(fd, buf)`.
///
/// # Safety
/// Raw syscall from a live buffer.
pub(super) unsafe fn write(fd: i32, buf: &[u8]) -> isize {
    // SAFETY: the buffer is live for its length.
    unsafe {
        call(
            libc::SYS_write,
            [fd as usize, buf.as_ptr() as usize, buf.len(), 0],
        )
    }
}

/// `prctl(option, arg)` with the other arguments 0.
///
/// # Safety
/// Raw syscall; `arg` must not be a pointer the option writes through unless it is valid.
pub(super) unsafe fn prctl(option: i32, arg: usize) -> isize {
    // SAFETY: as the caller vouches.
    unsafe { call(libc::SYS_prctl, [option as usize, arg, 0, 0]) }
}

/// `getpgid(pid)`.
///
/// # Safety
/// Raw syscall.
pub(super) unsafe fn getpgid(pid: libc::pid_t) -> isize {
    // SAFETY: no pointer arguments.
    unsafe { call(libc::SYS_getpgid, [pid as usize, 0, 0, 0]) }
}

/// `rt_sigprocmask(how, set, old)` on the kernel's 8-byte signal set.
///
/// # Safety
/// Raw syscall; `set` and `old` null or valid.
pub(super) unsafe fn sigprocmask(
    how: i32,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> isize {
    // SAFETY: as the caller vouches; the kernel reads and writes 8 bytes of each.
    unsafe {
        call(
            libc::SYS_rt_sigprocmask,
            [how as usize, set as usize, old as usize, 8],
        )
    }
}

/// `rt_sigtimedwait(set, info, NULL)`: waits for one of `set`.
///
/// # Safety
/// Raw syscall on live stack data.
pub(super) unsafe fn sigwaitinfo(set: &libc::sigset_t, info: &mut libc::siginfo_t) -> isize {
    // SAFETY: both live; the kernel reads 8 bytes of the set.
    unsafe {
        call(
            libc::SYS_rt_sigtimedwait,
            [
                set as *const libc::sigset_t as usize,
                info as *mut libc::siginfo_t as usize,
                0,
                8,
            ],
        )
    }
}

/// The kernel's `struct sigaction` on x86_64: handler, flags, restorer, mask.
#[cfg(target_arch = "x86_64")]
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// Sets `sig`'s action to the default.
///
/// # Safety
/// Raw syscall on stack data.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn default_action(sig: i32) -> isize {
    let act = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: a live struct of the kernel's layout, its size given as the set's.
    unsafe {
        call(
            libc::SYS_rt_sigaction,
            [sig as usize, &act as *const KernelSigaction as usize, 0, 8],
        )
    }
}

/// Sets `sig`'s action to the default (libc's wrapper: see [`call`] elsewhere).
///
/// # Safety
/// As `signal(2)`.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn default_action(sig: i32) -> isize {
    // SAFETY: resetting a disposition to the default.
    unsafe { libc::signal(sig, libc::SIG_DFL) as isize }
}

/// `setrlimit(resource, value)` (both limits).
///
/// # Safety
/// Raw syscall on stack data.
pub(super) unsafe fn setrlimit(resource: libc::__rlimit_resource_t, value: u64) -> isize {
    let lim = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: a live rlimit struct.
    unsafe {
        call(
            libc::SYS_prlimit64,
            [
                0,
                resource as usize,
                &lim as *const libc::rlimit as usize,
                0,
            ],
        )
    }
}

/// `close_range(first, last, 0)`.
///
/// # Safety
/// Raw syscall on this process's own descriptors.
pub(super) unsafe fn close_range(first: u32, last: u32) -> isize {
    // SAFETY: no pointer arguments.
    unsafe { call(libc::SYS_close_range, [first as usize, last as usize, 0, 0]) }
}
