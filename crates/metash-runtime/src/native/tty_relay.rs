//! The host's half of a relayed terminal: receiving the pty's master from the child, the user's
//! terminal in raw mode, and the copy loop.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::Child;
use std::time::{Duration, Instant};

/// After the program ended: how long the relay still copies what its pty holds.
const DRAIN: Duration = Duration::from_millis(300);
/// `VEOF` as a byte: what a terminal sends for Ctrl-D (ends input for a program in canonical mode).
const EOF_BYTE: u8 = 0x04;

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: RawFd) -> bool {
    // SAFETY: isatty(3) only queries the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

/// Waits (at most `within`) for the child's message and takes the fd it carries.
pub(super) fn receive(sock: &OwnedFd, within: Duration) -> io::Result<OwnedFd> {
    let mut pfd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one live pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, within.as_millis() as libc::c_int) };
    if ready != 1 {
        return Err(io::Error::other(
            "the sandboxed program never sent its terminal",
        ));
    }
    let mut byte = 0u8;
    let mut iov = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast(),
        iov_len: 1,
    };
    let mut ctrl = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid; recvmsg writes into the live buffers above.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = ctrl.as_mut_ptr().cast();
    hdr.msg_controllen = std::mem::size_of_val(&ctrl) as _;
    // SAFETY: as above; MSG_CMSG_CLOEXEC keeps the master out of other children.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut hdr, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fd = None;
    // SAFETY: walking the control messages the kernel wrote, bounded by msg_controllen; every
    // received fd becomes an OwnedFd so none leaks.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&hdr);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let ptr = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for k in 0..bytes / std::mem::size_of::<RawFd>() {
                    let owned = OwnedFd::from_raw_fd(std::ptr::read_unaligned(ptr.add(k)));
                    fd.get_or_insert(owned);
                }
            }
            cmsg = libc::CMSG_NXTHDR(&hdr, cmsg);
        }
    }
    fd.ok_or_else(|| io::Error::other("the sandboxed program's message carried no terminal"))
}

/// The user's terminal in raw mode (every key goes to the program, whose own pty interprets it),
/// restored when dropped. Nothing when `fd` is not a terminal.
pub(super) struct RawMode {
    fd: RawFd,
    saved: Option<libc::termios>,
}

impl RawMode {
    pub(super) fn enter(fd: RawFd) -> Self {
        // SAFETY: an all-zero termios is valid; tcgetattr fills it.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr/tcsetattr on our own descriptor with a live struct.
        let saved = unsafe {
            (libc::tcgetattr(fd, &mut t) == 0).then(|| {
                let saved = t;
                libc::cfmakeraw(&mut t);
                libc::tcsetattr(fd, libc::TCSANOW, &t);
                saved
            })
        };
        Self { fd, saved }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(t) = &self.saved {
            // SAFETY: restoring the settings read in `enter`.
            unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, t) };
        }
    }
}

/// Writes all of `buf` to `fd`.
fn write_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: write(2) from a live slice.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// One read; `Ok(0)` at the end (a pty master reads `EIO` once every slave is closed).
fn read_some(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: read(2) into a live buffer.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n >= 0 {
        return Ok(n as usize);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EIO) => Ok(0),
        Some(libc::EINTR) | Some(libc::EAGAIN) => Err(io::ErrorKind::Interrupted.into()),
        _ => Err(e),
    }
}

/// Copies stdin to the master and the master to stdout, keeps the pty's size the user's, until
/// the pty closes (every process holding it ended) or the program ended and its output drained.
/// A stdout that fails (the user's terminal closed) is no longer written to.
pub(super) fn pump(master: &OwnedFd, child: &mut Child) -> io::Result<()> {
    let m = master.as_raw_fd();
    let stdin_tty = is_terminal(0);
    let mut stdin_open = true;
    let mut size = super::window_size(0);
    let mut ended: Option<Instant> = None;
    // A terminal that went away (its window closed) ends the copying out, not the relay: the
    // program's output is read and dropped until it ends, so its end is still waited for.
    let mut stdout_open = true;
    let mut buf = [0u8; 16 * 1024];
    loop {
        if stdin_tty {
            let now = super::window_size(0);
            if let (Some(ws), true) = (now, now.map(key) != size.map(key)) {
                // SAFETY: TIOCSWINSZ reads the struct; the kernel signals the pty's group.
                unsafe { libc::ioctl(m, libc::TIOCSWINSZ, &ws) };
                size = now;
            }
        }
        let mut pfds = [
            libc::pollfd {
                fd: m,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if stdin_open { 0 } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll(2) on a live array of two pollfds.
        unsafe { libc::poll(pfds.as_mut_ptr(), 2, 50) };
        if pfds[0].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            match read_some(m, &mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) if stdout_open => stdout_open = write_all(1, &buf[..n]).is_ok(),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if pfds[1].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            match read_some(0, &mut buf) {
                Ok(0) => {
                    stdin_open = false;
                    if !stdin_tty {
                        write_all(m, &[EOF_BYTE])?;
                    }
                }
                Ok(n) => write_all(m, &buf[..n])?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => stdin_open = false,
            }
        }
        if ended.is_none() && child.try_wait()?.is_some() {
            ended = Some(Instant::now());
        }
        if ended.is_some_and(|t| t.elapsed() > DRAIN) {
            return Ok(());
        }
    }
}

fn key(ws: libc::winsize) -> (u16, u16) {
    (ws.ws_row, ws.ws_col)
}
