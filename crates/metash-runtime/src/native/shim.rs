//! Splitting a forked child in two without copying its memory, for the PID namespace's shims
//! ([`super::pidns`]).
//!
//! A plain `fork` copies the page tables of the whole host (the child is a copy of metash), and
//! the process that keeps the copy pays again when it ends; a spawn made three such copies (the
//! waiter, the namespace's init, the program's process) where a bare spawn makes one. Here the
//! split is a `clone(CLONE_VM)`: both halves share the memory they already had. The *child* goes
//! on where the call was made, on the same stack (it is the one that returns to std and execs);
//! the *parent* leaves that stack at once, before touching it, for a stack of its own, and runs
//! `entry` there, which never returns. The parent's half (a waiter or an init) makes only raw
//! syscalls on its own stack and on the copy of its context stored there, so nothing the child
//! writes (its stack frames, std's `environ`) is anything the parent reads.
//!
//! Only x86_64 has the stack switch (a few instructions of assembly); elsewhere the split is a
//! plain `fork`, as before.

use std::io;

/// The parent's stack: ample for a waiter's few frames in a debug build. Mapped lazily.
pub(super) const STACK_LEN: usize = 128 * 1024;
/// The lowest page stays unmapped: an overflow faults instead of writing into shared memory.
pub(super) const GUARD: usize = 4096;

/// What the parent's half runs: the child's pid and the context stored on its new stack.
pub(super) type Entry<C> = unsafe extern "C" fn(libc::pid_t, *const C) -> !;

/// A stack the parent's half moves to: `len` bytes above `base`, the lowest [`GUARD`] of them
/// unmapped. Given by a spawn that shares the host's memory ([`super::vspawn`], which unmaps it
/// when the tree is gone); otherwise mapped here, in a copy of the host that ends with the tree.
#[derive(Clone, Copy)]
pub(super) struct Stack {
    pub base: *mut u8,
    pub len: usize,
}

/// What a spawn that shares the host's memory gives the tree ([`super::vspawn`]): the stack the
/// namespace's init moves to (the host reuses it only once the init has exited) and which
/// namespaces the spawn's `clone` made already.
#[derive(Clone, Copy)]
pub(super) struct Shared {
    pub init: Stack,
    pub entered_mount_ns: bool,
    /// The clone made this process the PID namespace's init: it splits off only the program's
    /// process, and writes that process's wait status to `status_fd` (the host's pipe).
    pub pid_ns_entered: bool,
    pub status_fd: i32,
    /// The exec-status pipe: when the host is gone, its read end is, and a write to it fails.
    pub report_fd: i32,
}

/// Splits this process: returns `Ok` in the child, which goes on here; the parent runs
/// `entry(child, &ctx)` on `stack` (a fresh one when `None`) and never returns. The child gets
/// `SIGCHLD` as its exit signal (an ordinary child to wait for).
///
/// # Errors
/// The stack's mapping or the clone failed (in the parent, which then is the only process).
///
/// # Safety
/// In a forked, single-threaded child between fork and exec. `entry` must never return and make
/// only raw system calls ([`super::raw`]: it shares memory with the child, and maybe with the
/// host); `C` must be plain data; a given `stack` must be unused by anyone else.
pub(super) unsafe fn split<C: Copy>(
    ctx: C,
    entry: Entry<C>,
    stack: Option<Stack>,
) -> io::Result<()> {
    // SAFETY (whole block): mmap/mprotect/munmap on a region this process owns; the context is
    // written inside it, below its top, aligned.
    unsafe {
        let (base, len, mapped) = match stack {
            Some(s) => (s.base.cast::<libc::c_void>(), s.len, false),
            None => {
                let base = libc::mmap(
                    std::ptr::null_mut(),
                    STACK_LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                    -1,
                    0,
                );
                if base == libc::MAP_FAILED {
                    return Err(io::Error::last_os_error());
                }
                libc::mprotect(base, GUARD, libc::PROT_NONE);
                (base, STACK_LEN, true)
            }
        };
        let top = base as usize + len;
        let at = (top - std::mem::size_of::<C>()) & !(std::mem::align_of::<C>().max(16) - 1);
        let ctx_ptr = at as *mut C;
        ctx_ptr.write(ctx);
        // 16-byte aligned before the call, as the ABI wants.
        let stack_top = (at & !15) as *mut u8;
        let rc = clone_vm(stack_top, ctx_ptr, entry);
        if rc < 0 {
            if mapped {
                libc::munmap(base, STACK_LEN);
            }
            return Err(io::Error::from_raw_os_error(-rc as i32));
        }
        Ok(())
    }
}

/// `clone(CLONE_VM | SIGCHLD)` with the child on this stack; the parent switches to `stack_top`
/// and calls `entry(pid, ctx)`. Returns 0 in the child, `-errno` on failure (no child).
///
/// # Safety
/// As [`split`]; `stack_top` 16-byte aligned at the top of a mapping only the parent uses.
#[cfg(target_arch = "x86_64")]
unsafe fn clone_vm<C>(stack_top: *mut u8, ctx: *const C, entry: Entry<C>) -> i64 {
    let flags = (libc::CLONE_VM | libc::SIGCHLD) as u64;
    let rc: i64;
    // SAFETY: the syscall returns in both processes. The child (rax 0) and a failure (rax < 0)
    // leave the block as it came in. The parent (rax > 0) writes nothing to the shared stack: it
    // moves to its own stack and calls `entry`, which never returns, so no register or stack the
    // compiler relies on is seen again in that process.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jle 2f",
            "mov rsp, {stack}",
            "mov rdi, rax",
            "mov rsi, {ctx}",
            "call {entry}",
            "ud2",
            "2:",
            stack = in(reg) stack_top,
            ctx = in(reg) ctx,
            entry = in(reg) entry,
            inlateout("rax") libc::SYS_clone => rc,
            in("rdi") flags,
            in("rsi") 0u64, // the child keeps this stack
            in("rdx") 0u64,
            in("r10") 0u64,
            in("r8") 0u64,
            out("rcx") _,
            out("r11") _,
            options(nostack),
        );
    }
    rc
}

/// Elsewhere: a plain fork (the parent keeps its own copy of the stack, so it simply calls
/// `entry` where it is).
///
/// # Safety
/// As [`split`].
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone_vm<C>(_stack_top: *mut u8, ctx: *const C, entry: Entry<C>) -> i64 {
    // SAFETY: fork in a single-threaded child; the parent never returns from `entry`.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return -i64::from(
                io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EAGAIN),
            );
        }
        if pid > 0 {
            entry(pid, ctx);
        }
    }
    0
}
