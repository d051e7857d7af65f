//! Pseudo-terminals for tests that run metash as a person does, at a terminal: the consent
//! prompt, the first run of the README, escape sequences reaching a screen, the fence around the
//! user's own terminal.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};

/// A new pseudo-terminal: its controlling side (to read what was shown and type into) and the
/// terminal's path (to open as a program's stdin, stdout and stderr).
///
/// # Panics
/// When the system has no pseudo-terminal to give (a test prerequisite).
pub fn open() -> (File, String) {
    // SAFETY: plain libc calls on a descriptor this function owns; ptsname's buffer is copied
    // before any other call.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(fd >= 0, "posix_openpt");
        assert_eq!(libc::grantpt(fd), 0, "grantpt");
        assert_eq!(libc::unlockpt(fd), 0, "unlockpt");
        let name = std::ffi::CStr::from_ptr(libc::ptsname(fd))
            .to_string_lossy()
            .into_owned();
        (File::from_raw_fd(fd), name)
    }
}

/// [`open`], with the terminal's output post-processing (`\n` to `\r\n`) off, so a `\r` read
/// back can only be one a program wrote raw.
///
/// # Panics
/// As [`open`]; when the terminal's attributes cannot be set.
pub fn open_raw_output() -> (File, String) {
    let (master, name) = open();
    let slave = File::options()
        .read(true)
        .write(true)
        .open(&name)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    // SAFETY: `t` is a termios the kernel fills before it is read; the descriptor is open.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        assert_eq!(libc::tcgetattr(slave.as_raw_fd(), &mut t), 0, "tcgetattr");
        t.c_oflag &= !libc::OPOST;
        assert_eq!(
            libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &t),
            0,
            "tcsetattr"
        );
    }
    (master, name)
}
