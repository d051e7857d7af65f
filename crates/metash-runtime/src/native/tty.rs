//! Terminals of a confined tree. Never the user's: no confined program gets a descriptor of the
//! user's terminal, and the `devpts` it can name by path is one of its own.
//!
//! - A native agent has no terminal device at all (no grant under `/dev` but `null`, `zero`,
//!   `full` and the random devices; stdio piped; no controlling terminal after `setsid`).
//! - A headless CLI (a role spawned by `metash run`/`spawn`, `metash sandbox` without a terminal)
//!   gets a private `devpts` instance mounted over `/dev/pts` in its mount namespace, with
//!   `/dev/ptmx` bound to that instance's `ptmx`: it can make ptys for its own commands (Codex runs
//!   them on a pty), none of the user's `/dev/pts/N` exists there, and it has no controlling
//!   terminal, so `/dev/tty` opens nothing.
//! - An interactive session (`metash sandbox` from a terminal, which `metash attach` runs) gets,
//!   besides, one pty allocated by the child in that private instance before it drops anything:
//!   its slave becomes the program's stdin, stdout, stderr and controlling terminal, its master
//!   goes to the host over a socket ([`Relay`]), which relays between the user's terminal (raw
//!   mode) and the master until the program ends.
//!
//! The Landlock rules for the private instance are added by the child once it is mounted: a rule
//! made by the parent on the host's `/dev/pts` does not reach a mount stacked over it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{Child, ExitStatus};
use std::time::Duration;

use serde_json::{json, Value};

use super::privs::{access, grant};

/// `TIOCGPTPEER` (asm-generic/ioctls.h): open the slave of a master without a path lookup.
const TIOCGPTPEER: libc::c_ulong = 0x5441;

/// The child's terminal plan.
pub enum ChildTty {
    /// No terminal device.
    None,
    /// A private `devpts` (Landlock rights for its directory and for `/dev/ptmx`).
    Private { dir: u64, file: u64 },
    /// Private, plus a pty for the program whose master goes to the host over `sock`.
    Relayed {
        dir: u64,
        file: u64,
        sock: OwnedFd,
        winsize: libc::winsize,
    },
}

/// The rights a pty needs: read, write, and (ABI 5) terminal ioctls.
fn rights() -> (u64, u64) {
    let ioctl = if super::privs::landlock_abi() >= 5 {
        access::IOCTL_DEV
    } else {
        0
    };
    let file = access::READ_FILE | access::WRITE_FILE | ioctl;
    (file | access::READ_DIR, file)
}

impl ChildTty {
    /// A private `devpts` instance (headless CLI).
    pub fn private() -> Self {
        let (dir, file) = rights();
        Self::Private { dir, file }
    }

    /// The start report's `terminal`.
    pub fn report(&self) -> Value {
        match self {
            Self::None => json!({"devices": "none", "controlling": "none"}),
            Self::Private { .. } => json!({"devices": "private devpts (its own ptys only)",
                                           "controlling": "none"}),
            Self::Relayed { .. } => json!({"devices": "private devpts (its own ptys only)",
                                           "controlling": "a pty metash allocated and relays"}),
        }
    }

    /// In the child, in its mount namespace and session (after `setsid`), before anything drops
    /// capabilities: the private instance, its rules, and for a relayed session the pty.
    ///
    /// # Safety
    /// Only between fork and exec; `landlock_fd` the ruleset (negative: none, the probe).
    pub(super) unsafe fn apply(&self, landlock_fd: RawFd) -> io::Result<()> {
        let (dir, file) = match self {
            Self::None => return Ok(()),
            Self::Private { dir, file } | Self::Relayed { dir, file, .. } => (*dir, *file),
        };
        // SAFETY (whole block): raw syscalls on static strings and prepared data.
        unsafe {
            check(
                libc::mount(
                    c"devpts".as_ptr(),
                    c"/dev/pts".as_ptr(),
                    c"devpts".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NOEXEC,
                    c"newinstance,ptmxmode=0666,mode=0620".as_ptr().cast(),
                ),
                "terminal: mount a private devpts",
            )?;
            check(
                libc::mount(
                    c"/dev/pts/ptmx".as_ptr(),
                    c"/dev/ptmx".as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ),
                "terminal: bind the private ptmx",
            )?;
            if landlock_fd >= 0 {
                grant(landlock_fd, c"/dev/pts", dir, "terminal: grant /dev/pts")?;
                grant(landlock_fd, c"/dev/ptmx", file, "terminal: grant /dev/ptmx")?;
            }
            if let Self::Relayed { sock, winsize, .. } = self {
                own_pty(sock.as_raw_fd(), winsize)?;
            }
        }
        Ok(())
    }
}

/// Opens a pty in the private instance, makes its slave the controlling terminal and stdio, and
/// sends the master to the host.
///
/// # Safety
/// In the child, a session leader without a controlling terminal.
unsafe fn own_pty(sock: RawFd, winsize: &libc::winsize) -> io::Result<()> {
    // SAFETY (whole block): raw syscalls on stack data.
    unsafe {
        let master = libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        check(master, "terminal: open ptmx")?;
        let unlock: libc::c_int = 0;
        check(
            libc::ioctl(master, libc::TIOCSPTLCK, &unlock),
            "terminal: unlock the pty",
        )?;
        let slave = libc::ioctl(master, TIOCGPTPEER as _, libc::O_RDWR | libc::O_NOCTTY);
        check(slave, "terminal: open the pty's slave")?;
        libc::ioctl(slave, libc::TIOCSWINSZ, winsize as *const libc::winsize);
        check(
            libc::ioctl(slave, libc::TIOCSCTTY, 0),
            "terminal: make the pty the controlling terminal",
        )?;
        for fd in 0..=2 {
            check(libc::dup2(slave, fd), "terminal: the pty as stdio")?;
        }
        if slave > 2 {
            libc::close(slave);
        }
        let sent = send_fd(sock, master);
        libc::close(master);
        check(sent as i64, "terminal: hand the pty to metash")?;
    }
    Ok(())
}

/// Room for one `SCM_RIGHTS` fd, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// One `sendmsg` of a byte with `fd` attached. Stack buffers only.
///
/// # Safety
/// `sock` and `fd` open.
unsafe fn send_fd(sock: RawFd, fd: RawFd) -> isize {
    let mut byte = 0u8;
    let mut iov = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast(),
        iov_len: 1,
    };
    let mut ctrl = CmsgBuf([0; 64]);
    // SAFETY: an all-zero msghdr is valid; CMSG_* stay inside `ctrl` (64 bytes for one 4-byte
    // fd), which is aligned for cmsghdr; sendmsg reads the live stack buffers.
    unsafe {
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = ctrl.0.as_mut_ptr().cast();
        hdr.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&hdr);
        if cmsg.is_null() {
            return -1;
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        libc::sendmsg(sock, &hdr, libc::MSG_NOSIGNAL)
    }
}

fn check<T: Into<i64>>(rc: T, step: &str) -> io::Result<()> {
    if rc.into() < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("sandbox step {step}: {e}"),
        ));
    }
    Ok(())
}

/// The host's side of an interactive session: receives the pty's master from the child and
/// relays between the user's terminal and it.
pub struct Relay {
    sock: OwnedFd,
}

/// The child's plan for a relayed terminal of `winsize`, and the host's side.
///
/// # Errors
/// The socket pair cannot be made.
pub fn relayed(winsize: libc::winsize) -> io::Result<(ChildTty, Relay)> {
    let mut fds = [-1; 2];
    // SAFETY: socketpair fills the two-element array.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    let (host, child) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let (dir, file) = rights();
    Ok((
        ChildTty::Relayed {
            dir,
            file,
            sock: child,
            winsize,
        },
        Relay { sock: host },
    ))
}

/// The size of the terminal on `fd`, if it is one.
pub fn window_size(fd: RawFd) -> Option<libc::winsize> {
    // SAFETY: an all-zero winsize is valid; TIOCGWINSZ fills it.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: the ioctl writes into `ws`.
    (unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0).then_some(ws)
}

#[path = "tty_relay.rs"]
mod relay;
pub use relay::is_terminal;

impl Relay {
    /// Once the child has started: takes its pty's master and relays until the program ends, then
    /// reaps it. The user's terminal (stdin, when it is one) is in raw mode meanwhile.
    ///
    /// # Errors
    /// The child never sent its pty, or the relay's I/O failed.
    pub fn run(self, child: &mut Child) -> io::Result<ExitStatus> {
        let master = relay::receive(&self.sock, Duration::from_secs(10))?;
        drop(self.sock);
        let _raw = relay::RawMode::enter(0);
        relay::pump(&master, child)?;
        child.wait()
    }
}

/// Makes the child's terminal plan `tty` (of a plan not yet shared with a `Command`; `None`
/// where the namespaces could not be made) relay its terminal; `report` says so.
///
/// # Errors
/// As [`super::confine::Confinement::relay_terminal`].
pub(super) fn relay_into(
    tty: Option<&mut ChildTty>,
    report: &mut Value,
) -> crate::error::Result<Relay> {
    let setup = crate::error::RuntimeError::SandboxSetup;
    let why = report["processes"]["why"].clone();
    let slot = tty.ok_or_else(|| {
        setup(format!(
            "an interactive sandbox needs a terminal of its own, in a private devpts, and \
                 this machine cannot make the namespaces for it ({why}); run the command \
                 without a terminal (stdin redirected) instead"
        ))
    })?;
    let winsize = window_size(0).unwrap_or(libc::winsize {
        ws_row: 24,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    });
    let (tty, relay) =
        relayed(winsize).map_err(|e| setup(format!("the terminal's socket pair: {e}")))?;
    *slot = tty;
    report["terminal"] = slot.report();
    Ok(relay)
}
