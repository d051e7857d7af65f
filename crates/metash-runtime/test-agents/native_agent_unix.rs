//! The native test agent: one executable whose prompt names a behaviour, from polite (`echo`) to
//! hostile (escape attempts, fork bombs, runaways). Built by cargo with the crate; the integration
//! tests find it through `CARGO_BIN_EXE_metash-test-agent`. Every attempt reports its result as an
//! event so the log shows what was tried and what the sandbox answered.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use metash_agent::Session;

// The fence's probes use Linux's syscalls and socket options (the agent builds for macOS too).
#[cfg(target_os = "linux")]
#[path = "fence_probes.rs"]
mod fence_probes;

static LINGER: AtomicBool = AtomicBool::new(false);

fn fail<W: Write>(s: &mut Session<W>, what: &str, e: impl std::fmt::Display) -> Result<(), String> {
    s.error("denied", &format!("{what}: {e}"))
        .map_err(|e| e.to_string())
}

fn out<W: Write>(s: &mut Session<W>, text: &str) -> Result<(), String> {
    s.output("text/plain", text).map_err(|e| e.to_string())
}

fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

fn ignore_term() {
    // SAFETY: installing SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
}

/// The host's next message on stdin, as JSON, if one arrives within `within` (the host writes
/// whole lines, so readable stdin means a line is coming).
fn host_notice<W: Write>(s: &mut Session<W>, within: Duration) -> Option<String> {
    let mut pfd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one live pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, within.as_millis() as libc::c_int) };
    if ready != 1 {
        return None;
    }
    let event = s.recv().ok()??;
    serde_json::to_string(&event).ok()
}

/// A datagram to a host socket at `path`: first from a socket of its own, then (if that is
/// refused) from a datagram socket pair, both ways a sandbox must close.
fn unix_dgram<W: Write>(s: &mut Session<W>, path: &str) -> Result<(), String> {
    use std::os::unix::net::UnixDatagram;
    if let Ok(d) = UnixDatagram::unbound() {
        if d.send_to(b"escaped", path).is_ok() {
            return out(s, "DGRAM-OK");
        }
    }
    match UnixDatagram::pair() {
        Ok((d, _)) => match d.send_to(b"escaped", path) {
            Ok(_) => out(s, "DGRAM-OK"),
            Err(e) => fail(s, "unix datagram send", e),
        },
        Err(e) => fail(s, "datagram socketpair", e),
    }
}

/// A seqpacket socket pair (how Codex starts its commands): a message goes through, and the
/// same socket cannot send to a host socket by path (`arg`): a seqpacket sends to its peer only.
fn seqpacket_pair<W: Write>(s: &mut Session<W>, path: &str) -> Result<(), String> {
    let mut fds = [0; 2];
    // SAFETY: socketpair fills the two-element array.
    let rc = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) };
    if rc != 0 {
        return fail(s, "seqpacket socketpair", std::io::Error::last_os_error());
    }
    let msg = b"through the seqpacket pair";
    let mut buf = [0u8; 64];
    // SAFETY: send/recv on the pair just made, with live buffers; then close both.
    let got = unsafe {
        libc::send(fds[0], msg.as_ptr().cast(), msg.len(), 0);
        libc::recv(
            fds[1],
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    let sent_out = std::ffi::CString::new(path).ok().is_some_and(|c| {
        // SAFETY: a sockaddr_un filled within its bounds; sendto on the pair's socket.
        unsafe {
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (d, b) in addr.sun_path.iter_mut().zip(c.as_bytes()) {
                *d = *b as libc::c_char;
            }
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            let n = libc::sendto(
                fds[0],
                b"escaped".as_ptr().cast(),
                7,
                libc::MSG_DONTWAIT,
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            );
            n == 7 && libc::recv(fds[1], buf.as_mut_ptr().cast(), 0, libc::MSG_DONTWAIT) < 0
        }
    });
    // SAFETY: closing the pair's own descriptors.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    let text = String::from_utf8_lossy(&buf[..got.max(0) as usize]).into_owned();
    out(
        s,
        &format!(
            "SEQPAIR-OK:{text}:{}",
            if sent_out { "LEAKED" } else { "peer-only" }
        ),
    )
}

/// Test fixture: one arm per probe the runtime's tests send (escape attempts, limits, protocol
/// misuse). Long on purpose: each arm is a few lines and reading them side by side is the point.
fn handle<W: Write>(s: &mut Session<W>, prompt: &str) -> Result<(), String> {
    let (cmd, arg) = prompt.split_once(' ').unwrap_or((prompt, ""));
    match cmd {
        "echo" => out(s, arg),
        "consent" => match s.request_consent(arg, "the test asks", None) {
            Ok(metash_agent::Consent::Granted { expires_at }) => {
                out(s, &format!("granted {}", expires_at.unwrap_or_default()))
            }
            Ok(metash_agent::Consent::Refused { code, .. }) => out(s, &format!("refused {code}")),
            Err(e) => fail(s, "consent", e),
        },
        "read" => match std::fs::read(arg) {
            Ok(b) => out(
                s,
                &format!("READ-OK:{}", String::from_utf8_lossy(&b[..b.len().min(64)])),
            ),
            Err(e) => fail(s, "read", e),
        },
        "write" => match std::fs::write(arg, b"pwned") {
            Ok(()) => out(s, "WRITE-OK"),
            Err(e) => fail(s, "write", e),
        },
        "connect" => {
            let addr: SocketAddr = arg.parse().map_err(|e| format!("{e}"))?;
            match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                Ok(_) => out(s, "CONNECT-OK"),
                Err(e) => fail(s, "connect", e),
            }
        }
        "unix" => match std::os::unix::net::UnixStream::connect(arg) {
            Ok(_) => out(s, "UNIX-OK"),
            Err(e) => fail(s, "unix connect", e),
        },
        "unixdgram" => unix_dgram(s, arg),
        "pair" => match std::os::unix::net::UnixStream::pair() {
            Ok((mut a, mut b)) => {
                a.write_all(b"through the pair")
                    .map_err(|e| e.to_string())?;
                drop(a);
                let mut got = String::new();
                b.read_to_string(&mut got).map_err(|e| e.to_string())?;
                out(s, &format!("PAIR-OK:{got}"))
            }
            Err(e) => fail(s, "socketpair", e),
        },
        "seqpair" => seqpacket_pair(s, arg),
        "proxy" => {
            let Ok(proxy) = std::env::var("HTTPS_PROXY") else {
                return fail(s, "proxy", "no HTTPS_PROXY in the environment");
            };
            let addr = proxy.trim_start_matches("http://").to_string();
            let mut c = match TcpStream::connect(&addr) {
                Ok(c) => c,
                Err(e) => return fail(s, "proxy connect", e),
            };
            c.set_read_timeout(Some(Duration::from_secs(5)))
                .map_err(|e| e.to_string())?;
            write!(c, "CONNECT {arg} HTTP/1.1\r\nHost: {arg}\r\n\r\n")
                .map_err(|e| e.to_string())?;
            let mut buf = [0u8; 512];
            let n = c.read(&mut buf).map_err(|e| e.to_string())?;
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let status = head.lines().next().unwrap_or("").to_string();
            if status.contains(" 200 ") {
                c.write_all(b"ping\n").map_err(|e| e.to_string())?;
                let n = c.read(&mut buf).map_err(|e| e.to_string())?;
                out(
                    s,
                    &format!("PROXY-OK:{}", String::from_utf8_lossy(&buf[..n]).trim()),
                )
            } else {
                fail(s, "proxy", status)
            }
        }
        "env" => {
            let all: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
            out(s, &format!("ENV:{}", all.join(";")))
        }
        "exec" => {
            // `exec PATH ARGS...`: start a program (its stdout captured, never on the protocol's).
            let mut words = arg.split_whitespace();
            let Some(program) = words.next() else {
                return fail(s, "exec", "no program given");
            };
            match std::process::Command::new(program)
                .args(words)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .output()
            {
                Ok(o) => out(
                    s,
                    &format!(
                        "EXEC-OK:exit={}:stdout={}",
                        o.status.code().map_or("signal".into(), |c| c.to_string()),
                        String::from_utf8_lossy(&o.stdout).trim()
                    ),
                ),
                Err(e) => {
                    let errno = e.raw_os_error().unwrap_or(0);
                    fail(s, "exec", format!("{e} (errno {errno})"))?;
                    // The host explains its refusals on stdin: report what it said, if anything.
                    match host_notice(s, Duration::from_secs(2)) {
                        Some(line) => out(s, &format!("HOST:{line}")),
                        None => Ok(()),
                    }
                }
            }
        }
        "forkbomb" => {
            let (mut ok, mut failed) = (0u32, 0u32);
            for _ in 0..2000 {
                // SAFETY: the child only sleeps and exits.
                match unsafe { libc::fork() } {
                    0 => {
                        std::thread::sleep(Duration::from_secs(30));
                        // SAFETY: _exit in a forked child.
                        unsafe { libc::_exit(0) }
                    }
                    -1 => failed += 1,
                    _ => ok += 1,
                }
                if failed > 20 {
                    break;
                }
            }
            if failed > 0 {
                fail(
                    s,
                    "fork",
                    format!("forked {ok}, then fork failed {failed} times"),
                )
            } else {
                out(s, &format!("FORKBOMB-OK:{ok}"))
            }
        }
        "alloc" => {
            let mib: usize = arg.parse().map_err(|e| format!("{e}"))?;
            let mut keep: Vec<Vec<u8>> = Vec::new();
            for i in 0..mib / 16 {
                let mut v = vec![0u8; 16 << 20];
                for p in (0..v.len()).step_by(4096) {
                    v[p] = i as u8 | 1;
                }
                keep.push(v);
            }
            out(s, &format!("ALLOC-OK:{}", keep.len() * 16))
        }
        "spin" => loop {
            std::hint::spin_loop();
        },
        "ignore-shutdown" => {
            ignore_term();
            LINGER.store(true, Ordering::SeqCst);
            out(s, "IGNORING")
        }
        "child-ignore-term" => {
            ignore_term();
            // SAFETY: the child only sleeps.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                sleep_forever();
            }
            out(s, &format!("CHILD:{pid}"))?;
            sleep_forever();
        }
        "grandchild-stdout" => {
            let mut fds = [0i32; 2];
            // SAFETY: pipe(2) into a local array.
            unsafe { libc::pipe(fds.as_mut_ptr()) };
            // SAFETY: the children only report a pid, try setsid, and sleep.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: as above.
                let g = unsafe { libc::fork() };
                if g == 0 {
                    // Try to leave the process group (seccomp says no) and keep stdout open.
                    // SAFETY: setsid has no preconditions.
                    let rc = unsafe { libc::setsid() };
                    let me = std::process::id() as i32;
                    let msg = [me, rc];
                    // SAFETY: writing a local array to our pipe.
                    unsafe { libc::write(fds[1], msg.as_ptr().cast(), 8) };
                    sleep_forever();
                }
                // SAFETY: _exit in a forked child.
                unsafe { libc::_exit(0) }
            }
            let mut msg = [0i32; 2];
            // SAFETY: reading into a local array from our pipe.
            unsafe { libc::read(fds[0], msg.as_mut_ptr().cast(), 8) };
            out(s, &format!("GRANDCHILD:{}:setsid={}", msg[0], msg[1]))?;
            sleep_forever();
        }
        "flood" => {
            let secs: f64 = arg.parse().map_err(|e| format!("{e}"))?;
            let data = "x".repeat(1024);
            let start = Instant::now();
            let mut seq = 0u64;
            while start.elapsed().as_secs_f64() < secs {
                s.output_chunk("flood", seq, "text/plain", &data)
                    .map_err(|e| e.to_string())?;
                seq += 1;
            }
            s.send(metash_protocol::AgentEvent::Done {
                status: None,
                summary: Some(format!("chunks={seq}")),
            })
            .map_err(|e| e.to_string())?;
            Ok(())
        }
        "checkpoint" => s
            .send(metash_protocol::AgentEvent::Checkpoint {
                reason: metash_protocol::CheckpointReason::DecisionRequired,
                message: "pick one".into(),
                options: vec!["a".into(), "b".into()],
                resume_id: None,
            })
            .map_err(|e| e.to_string()),
        "exit" => std::process::exit(arg.parse().unwrap_or(3)),
        // Dies the way a script does when something is missing: a message on stderr, then exit.
        "die" => {
            eprintln!("fatal: {arg}");
            std::process::exit(9)
        }
        other => probe(s, other, arg),
    }
}

/// A fence probe (Linux), or an unknown command.
#[cfg(target_os = "linux")]
fn probe<W: Write>(s: &mut Session<W>, cmd: &str, arg: &str) -> Result<(), String> {
    fence_probes::handle(s, cmd, arg).unwrap_or_else(|| Err(format!("unknown command {cmd:?}")))
}

#[cfg(not(target_os = "linux"))]
fn probe<W: Write>(_: &mut Session<W>, cmd: &str, _: &str) -> Result<(), String> {
    Err(format!("unknown command {cmd:?}"))
}

pub fn main() {
    let _ = metash_agent::run(|s, input| handle(s, &input.prompt));
    if LINGER.load(Ordering::SeqCst) {
        sleep_forever();
    }
}
