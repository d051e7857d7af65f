//! The listener's trip from the child to the host: the child sends its pid and the seccomp
//! listener fd (`SCM_RIGHTS`) over a socketpair made before the fork, using only stack buffers
//! (between fork and exec nothing may allocate); the supervisor receives it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The child's half, kept in the [`super::isolate::ChildPlan`]: the socket end it inherits and the
/// notify filter, both ready before the fork.
pub struct ChildSide {
    pub(super) sock: OwnedFd,
    pub(super) filter: Vec<libc::sock_filter>,
}

/// What the child sends: its pid and 0 with the listener attached, or the errno of the failed
/// listener creation (so the host can name the step; std passes only an errno back).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Handoff {
    pid: i32,
    errno: i32,
}

/// Room for one `SCM_RIGHTS` fd and one `SCM_CREDENTIALS` (56 bytes), aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

impl ChildSide {
    /// Install the notify filter and hand its listener to the host. Only raw syscalls on data
    /// prepared before the fork; no allocation.
    ///
    /// # Safety
    /// Must only be called in the forked child, after `PR_SET_NO_NEW_PRIVS`.
    pub unsafe fn apply(&self) -> io::Result<()> {
        let prog = libc::sock_fprog {
            len: self.filter.len() as libc::c_ushort,
            filter: self.filter.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: seccomp(2) reads the program, which lives in `self` for the whole call.
        let listener = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
                &prog as *const libc::sock_fprog,
            )
        } as RawFd;
        // Read errno before any other call.
        let err = io::Error::last_os_error();
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        if listener < 0 {
            let msg = Handoff {
                pid,
                errno: err.raw_os_error().unwrap_or(libc::EINVAL),
            };
            // SAFETY: as below, without a control message; best effort, the spawn fails anyway.
            unsafe { self.send(&msg, None) };
            return Err(err);
        }
        let msg = Handoff { pid, errno: 0 };
        // SAFETY: `listener` is the fd seccomp just returned; closed right after the send (the
        // host holds its own copy from then on).
        let rc = unsafe { self.send(&msg, Some(listener)) };
        // SAFETY: closing our own fd.
        unsafe { libc::close(listener) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// One `sendmsg` of `msg` with `fd` attached. Stack buffers only.
    ///
    /// # Safety
    /// `fd`, when given, must be open.
    unsafe fn send(&self, msg: &Handoff, fd: Option<RawFd>) -> isize {
        let mut data = *msg;
        let mut iov = no_iovec();
        let mut hdr = header(&mut iov, &mut data);
        let mut ctrl = CmsgBuf([0; 64]);
        if let Some(fd) = fd {
            // SAFETY: CMSG_* are pointer arithmetic on `ctrl`, which is large enough (64 bytes
            // for one 4-byte fd) and aligned for cmsghdr; every write stays inside it.
            unsafe {
                let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32);
                hdr.msg_control = ctrl.0.as_mut_ptr().cast();
                hdr.msg_controllen = space as _;
                let cmsg = libc::CMSG_FIRSTHDR(&hdr);
                if cmsg.is_null() {
                    return -1;
                }
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
            }
        }
        // SAFETY: `hdr` points at live stack buffers; MSG_NOSIGNAL avoids SIGPIPE if the host's
        // end is gone (then the spawn fails: fail-closed).
        unsafe { libc::sendmsg(self.sock.as_raw_fd(), &hdr, libc::MSG_NOSIGNAL) }
    }
}

fn no_iovec() -> libc::iovec {
    libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }
}

/// The header both sides use: `data` as the only iovec, no name, no control yet. It points at
/// `iov` and `data`, which stay in the caller's frame (the child side may not allocate).
fn header(iov: &mut libc::iovec, data: &mut Handoff) -> libc::msghdr {
    *iov = libc::iovec {
        iov_base: (data as *mut Handoff).cast(),
        iov_len: std::mem::size_of::<Handoff>(),
    };
    // SAFETY: an all-zero msghdr is valid (no name, no control).
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = iov;
    hdr.msg_iovlen = 1;
    hdr
}

pub(super) enum Received {
    /// A child's listener and the child's pid.
    Listener {
        fd: OwnedFd,
        pid: i32,
    },
    Failure(String),
    Nothing,
    Closed,
}

/// Read one handoff message from a child.
pub(super) fn receive(host: &OwnedFd) -> Received {
    let mut data = Handoff::default();
    let mut iov = no_iovec();
    let mut hdr = header(&mut iov, &mut data);
    let mut ctrl = CmsgBuf([0; 64]);
    hdr.msg_control = ctrl.0.as_mut_ptr().cast();
    hdr.msg_controllen = ctrl.0.len() as _;
    // SAFETY: recvmsg into the buffers above; MSG_CMSG_CLOEXEC keeps received fds out of other
    // spawns.
    let n = unsafe { libc::recvmsg(host.as_raw_fd(), &mut hdr, libc::MSG_CMSG_CLOEXEC) };
    if n == 0 {
        return Received::Closed;
    }
    if n < 0 {
        return match io::Error::last_os_error().kind() {
            io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => Received::Nothing,
            _ => Received::Closed,
        };
    }
    let mut fd: Option<OwnedFd> = None;
    // The sender's pid in the host's namespace (the socket has SO_PASSCRED).
    let mut sender: Option<i32> = None;
    // SAFETY: walking the control messages the kernel wrote into `ctrl`, bounded by
    // `msg_controllen`; every SCM_RIGHTS fd is taken into an OwnedFd so none leaks.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&hdr);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_CREDENTIALS
            {
                let cred = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::ucred>());
                sender = Some(cred.pid);
            }
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let ptr = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for k in 0..bytes / std::mem::size_of::<RawFd>() {
                    let raw = std::ptr::read_unaligned(ptr.add(k));
                    let owned = OwnedFd::from_raw_fd(raw);
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&hdr, cmsg);
        }
    }
    if (n as usize) < std::mem::size_of::<Handoff>() {
        return Received::Nothing;
    }
    if data.errno != 0 {
        return Received::Failure(format!(
            "exec gate: the child could not create its seccomp listener \
             (seccomp SECCOMP_FILTER_FLAG_NEW_LISTENER): {}",
            io::Error::from_raw_os_error(data.errno)
        ));
    }
    match fd {
        Some(fd) => Received::Listener {
            fd,
            pid: sender.unwrap_or(data.pid),
        },
        // Without its listener the child's exec fails with ENOSYS (fail-closed).
        None => Received::Failure("exec gate: the child's handoff carried no listener".into()),
    }
}
