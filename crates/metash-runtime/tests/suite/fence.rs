//! Issue 31, from inside native agents (one with a network allowlist, one without): MPTCP refused
//! where plain TCP to the proxy works, no namespace from `clone`, `clone3` answered `ENOSYS`, x32
//! numbers refused, no other process visible or reachable, no terminal. Every probe's answer is
//! the agent's own line (`fence_probes.rs`), so a test fails if the probe did not run.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::Duration;

use metash_protocol::LogKind;
use metash_runtime::{InvocationStatus, NetworkAccess};

use super::common::*;

/// A listener the test owns, and whether anything connected to it within a short wait.
struct Bait(TcpListener);

impl Bait {
    fn new() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        Self(l)
    }

    fn port(&self) -> u16 {
        self.0.local_addr().unwrap().port()
    }

    fn reached(&self) -> bool {
        std::thread::sleep(Duration::from_millis(100));
        self.0.accept().is_ok()
    }
}

/// A one-shot line server on 127.0.0.1 that answers "pong".
fn pong_server() -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        if let Ok((mut c, _)) = listener.accept() {
            let mut line = String::new();
            let _ = BufReader::new(c.try_clone().unwrap()).read_line(&mut line);
            let _ = c.write_all(b"pong\n");
        }
    });
    (port, h)
}

fn ask(a: &mut metash_runtime::Agent, prompt: &str) -> String {
    text(&run(a, prompt).1)
}

#[test]
fn mptcp_is_refused_with_or_without_network_and_tcp_to_the_proxy_still_works() {
    require_native!();
    let f = Fixture::new();
    let bait = Bait::new();
    let mut spec = f.native("f-net", &["network"], None);
    spec.network = NetworkAccess::Allowlist(vec!["localhost".into()]);
    let mut a = f.start(spec);
    let got = ask(&mut a, &format!("mptcp {}", bait.port()));
    assert_eq!(got, format!("MPTCP-SOCKET-REFUSED errno={}", libc::EPERM));
    assert!(
        !bait.reached(),
        "an MPTCP stream reached the test's listener"
    );
    let got = ask(&mut a, "mptcp-listen");
    assert_eq!(got, format!("MPTCP-SOCKET-REFUSED errno={}", libc::EPERM));
    // The positive control: plain TCP to the allowlist proxy, and through it to the test's server.
    let (port, server) = pong_server();
    assert_eq!(
        ask(&mut a, &format!("proxy localhost:{port}")),
        "PROXY-OK:pong"
    );
    server.join().unwrap();
    a.shutdown().unwrap();

    let mut a = f.start(f.native("f-nonet", &["files.read"], None));
    let got = ask(&mut a, &format!("mptcp {}", bait.port()));
    assert_eq!(got, format!("MPTCP-SOCKET-REFUSED errno={}", libc::EPERM));
    assert!(!bait.reached());
    a.shutdown().unwrap();
}

#[test]
fn no_namespace_from_clone_and_clone3_says_enosys_and_x32_is_refused() {
    require_native!();
    let f = Fixture::new();
    let mut spec = f.native("f-ns", &["network"], None);
    spec.network = NetworkAccess::Allowlist(vec!["localhost".into()]);
    let mut a = f.start(spec);
    // A plain fork through clone works: the control.
    assert_eq!(ask(&mut a, "clone 0"), "CLONE-OK");
    for flags in [
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWNS,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWUSER | libc::CLONE_NEWNET | libc::CLONE_NEWNS,
    ] {
        let got = ask(&mut a, &format!("clone {flags:x}"));
        assert_eq!(
            got,
            format!("CLONE-REFUSED errno={}", libc::EPERM),
            "{flags:x}"
        );
    }
    assert_eq!(
        ask(&mut a, "clone3"),
        format!("CLONE3-REFUSED errno={}", libc::ENOSYS)
    );
    // EPERM is the filter's answer: a kernel without x32 says ENOSYS, one with it runs the call.
    assert_eq!(
        ask(&mut a, "x32"),
        format!("X32-REFUSED errno={}", libc::EPERM)
    );
    // The agent still forks and runs programs (libc falls back from clone3 to clone).
    assert_eq!(
        ask(&mut a, "exec /bin/echo still-forks"),
        "EXEC-OK:exit=0:stdout=still-forks"
    );
    a.shutdown().unwrap();
}

/// A process of the user's holding a secret in its arguments.
struct Victim(std::process::Child);

const VICTIM_SECRET: &str = "victim-SECRET-31";

impl Victim {
    fn start() -> Self {
        let child = std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import time; time.sleep(300)", VICTIM_SECRET])
            .spawn()
            .unwrap();
        Self(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn another_process_and_the_host_are_invisible_and_unreachable() {
    require_native!();
    let f = Fixture::new();
    let victim = Victim::start();
    // The victim is really there, secret and all, for whoever can look.
    std::thread::sleep(Duration::from_millis(50));
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", victim.pid())).unwrap();
    assert!(String::from_utf8_lossy(&cmdline).contains(VICTIM_SECRET));
    let mut a = f.start(f.native("f-procs", &["files.read"], None));
    let report = f.events("f-procs", LogKind::AgentStarted)[0].data.clone();
    assert_eq!(report["processes"]["own_tree_only"], true, "{report}");
    let host = std::process::id();
    let got = ask(&mut a, &format!("procs {} {host}", victim.pid()));
    assert!(
        got.starts_with("PROCS:self=2;"),
        "the agent is pid 2 of its own namespace: {got}"
    );
    for pid in [victim.pid(), host] {
        assert!(
            got.contains(&format!("kill({pid})=errno={}", libc::ESRCH)),
            "{pid} is reachable: {got}"
        );
        assert!(got.contains(&format!("cmdline({pid})=unreadable")), "{got}");
    }
    assert!(!got.contains(VICTIM_SECRET), "{got}");
    a.shutdown().unwrap();
}

#[test]
fn a_native_agent_has_no_terminal() {
    require_native!();
    let f = Fixture::new();
    let (_master, pts) = test_pty();
    let mut a = f.start(f.native("f-tty", &["files.write"], None));
    let report = f.events("f-tty", LogKind::AgentStarted)[0].data.clone();
    assert_eq!(report["terminal"]["devices"], "none", "{report}");
    let got = ask(&mut a, &format!("open /dev/tty {pts} /dev/ptmx"));
    assert!(got.starts_with("OPEN;"), "{got}");
    assert!(!got.contains("=OK"), "{got}");
    a.shutdown().unwrap();
}

/// A pty the test holds (its master) and the slave's path, as a user's terminal would be.
fn test_pty() -> (std::fs::File, String) {
    use std::os::fd::FromRawFd;
    // SAFETY: posix_openpt/grantpt/unlockpt/ptsname on the fd just opened.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(fd >= 0);
        assert_eq!(libc::grantpt(fd), 0);
        assert_eq!(libc::unlockpt(fd), 0);
        let name = std::ffi::CStr::from_ptr(libc::ptsname(fd))
            .to_string_lossy()
            .into_owned();
        (std::fs::File::from_raw_fd(fd), name)
    }
}

#[test]
fn the_host_sees_the_programs_own_end_through_the_namespace() {
    require_native!();
    let f = Fixture::new();
    let mut a = f.start(f.native("f-sig", &[], None));
    let program = metash_runtime::native::procs::program(a.pid().unwrap());
    assert_ne!(
        program,
        a.pid().unwrap(),
        "the program runs in a namespace of its own"
    );
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: kill(2) on the agent's program process.
        unsafe { libc::kill(program, libc::SIGKILL) };
    });
    let (o, _) = run(&mut a, "spin");
    killer.join().unwrap();
    assert_eq!(
        o.status,
        InvocationStatus::Exited {
            code: None,
            signal: Some(libc::SIGKILL)
        }
    );
}
