//! Descriptors the native sandbox makes on the host's side: pipes and pidfds, owned at once.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A pipe, both ends close-on-exec, plus `flags` (`O_NONBLOCK`): (read, write).
pub(super) fn pipe(flags: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two descriptors pipe2 just returned, each owned once.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A pidfd for our own child `pid`, not reaped yet (Linux 5.3; Landlock's ABI 4, which the
/// native sandbox requires, came later).
pub(super) fn pidfd(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) on our own child; no pointer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor pidfd_open just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}
