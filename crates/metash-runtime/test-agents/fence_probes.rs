//! Probes at the kernel's edges (issue 31): MPTCP, namespace flags on `clone`, `clone3`, the x32
//! numbering, other processes, terminals. Each answers with one line that names the probe and the
//! raw result (`errno=N` or what it reached), so a test can tell "refused by the sandbox" from
//! "did not run".

use std::io::Write;

use metash_agent::Session;

/// `IPPROTO_MPTCP`.
const MPTCP: i32 = 262;

fn out<W: Write>(s: &mut Session<W>, text: &str) -> Result<(), String> {
    s.output("text/plain", text).map_err(|e| e.to_string())
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A `sockaddr_in` for `127.0.0.1:port`.
fn loopback(port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_be_bytes([127, 0, 0, 1]).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// `mptcp PORT`: an MPTCP stream to the test's loopback listener. `mptcp-listen`: one listening.
fn mptcp(connect_to: Option<u16>) -> String {
    // SAFETY: raw socket calls on a local address struct; the fd is closed below.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, MPTCP);
        if fd < 0 {
            return format!("MPTCP-SOCKET-REFUSED errno={}", errno());
        }
        let addr = loopback(connect_to.unwrap_or(0));
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let sa = (&addr as *const libc::sockaddr_in).cast::<libc::sockaddr>();
        let result = match connect_to {
            Some(_) if libc::connect(fd, sa, len) == 0 => {
                let _ = libc::write(fd, b"escaped-over-mptcp\n".as_ptr().cast(), 19);
                "MPTCP-CONNECT-OK".to_string()
            }
            Some(_) => format!("MPTCP-CONNECT-REFUSED errno={}", errno()),
            None if libc::bind(fd, sa, len) == 0 && libc::listen(fd, 1) == 0 => {
                "MPTCP-LISTEN-OK".to_string()
            }
            None => format!("MPTCP-LISTEN-REFUSED errno={}", errno()),
        };
        libc::close(fd);
        result
    }
}

/// `clone FLAGS` (hex): a raw `clone` with those flags; the child exits at once.
fn clone_with(flags: u64) -> String {
    // SAFETY: the child only _exits; the parent reaps it.
    unsafe {
        let pid = libc::syscall(
            libc::SYS_clone,
            flags | libc::SIGCHLD as u64,
            0usize,
            0usize,
            0usize,
            0usize,
        );
        if pid == 0 {
            libc::_exit(0);
        }
        if pid < 0 {
            return format!("CLONE-REFUSED errno={}", errno());
        }
        libc::waitpid(pid as i32, std::ptr::null_mut(), 0);
        "CLONE-OK".to_string()
    }
}

/// `clone3`: a plain fork through `clone3` (its flags live in memory a filter cannot read).
fn clone3() -> String {
    // struct clone_args: flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size,
    // tls, set_tid, set_tid_size, cgroup (11 u64s).
    let mut args = [0u64; 11];
    args[4] = libc::SIGCHLD as u64;
    // SAFETY: clone3 reads `args`; the child only _exits.
    unsafe {
        let pid = libc::syscall(libc::SYS_clone3, args.as_mut_ptr(), 88usize);
        if pid == 0 {
            libc::_exit(0);
        }
        if pid < 0 {
            return format!("CLONE3-REFUSED errno={}", errno());
        }
        libc::waitpid(pid as i32, std::ptr::null_mut(), 0);
        "CLONE3-OK".to_string()
    }
}

/// `x32`: getpid through the x32 numbering (`0x40000000 | 39`).
fn x32() -> String {
    // SAFETY: getpid takes no arguments.
    let rc = unsafe { libc::syscall(0x4000_0000 | 39) };
    if rc < 0 {
        format!("X32-REFUSED errno={}", errno())
    } else {
        format!("X32-OK:{rc}")
    }
}

/// `procs`: its own pid, the pids `/proc` lists, and whether `kill(PID, 0)` reaches each of the
/// pids given (the test's victim, the host).
fn procs(arg: &str) -> String {
    let listed: Vec<String> = match std::fs::read_dir("/proc") {
        Ok(d) => d
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            .collect(),
        Err(e) => vec![format!("unreadable({e})")],
    };
    let mut line = format!(
        "PROCS:self={};listed={}",
        std::process::id(),
        listed.join(",")
    );
    for pid in arg.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
        // SAFETY: kill with signal 0 only checks.
        let rc = unsafe { libc::kill(pid, 0) };
        let reach = if rc == 0 {
            "0".to_string()
        } else {
            format!("errno={}", errno())
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_else(|e| format!("unreadable({})", e.raw_os_error().unwrap_or(0)));
        line.push_str(&format!(";kill({pid})={reach};cmdline({pid})={cmdline}"));
    }
    line
}

/// `open PATH...`: opens each for reading and writing (a terminal would not become controlling).
fn open_each(arg: &str) -> String {
    let mut line = String::from("OPEN");
    for path in arg.split_whitespace() {
        let Ok(c) = std::ffi::CString::new(path) else {
            continue;
        };
        // SAFETY: open/close on a NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_NOCTTY) };
        if fd >= 0 {
            // SAFETY: closing what we opened.
            unsafe { libc::close(fd) };
            line.push_str(&format!(";{path}=OK"));
        } else {
            line.push_str(&format!(";{path}=errno={}", errno()));
        }
    }
    line
}

/// The probes; `None` for a command that is not one.
pub fn handle<W: Write>(s: &mut Session<W>, cmd: &str, arg: &str) -> Option<Result<(), String>> {
    let text = match cmd {
        "mptcp" => mptcp(Some(arg.trim().parse().ok()?)),
        "mptcp-listen" => mptcp(None),
        "clone" => clone_with(u64::from_str_radix(arg.trim_start_matches("0x"), 16).ok()?),
        "clone3" => clone3(),
        "x32" => x32(),
        "procs" => procs(arg),
        "open" => open_each(arg),
        _ => return None,
    };
    Some(out(s, &text))
}
