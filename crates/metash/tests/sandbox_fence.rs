#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 31 from inside a CLI role's sandbox (`metash sandbox --role R`, exactly how the role's CLI
//! runs in a spawn): MPTCP refused while TCP to the credential proxy works, no namespace from
//! `clone`, `clone3` answered `ENOSYS`, x32 refused; no other process visible (a victim holding a
//! secret in its arguments, metash's own command line); with metash on a pseudo-terminal, a
//! headless command cannot reach it, and an interactive one gets a pty metash allocates and relays.
//! Every probe prints its own marker, so a test fails if the probe did not run.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "sk-fence-cli-real-key-0123456789";
const PY: &str = "/usr/bin/python3";

fn project() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(d.path())
        .arg("init")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(
        d.path().join(".meta/config.toml"),
        "[roles.coder]\nfrontend = \"pi-sdk\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         api_key_env = \"METASH_FENCE_KEY\"\nmax_pids = 64\n",
    )
    .unwrap();
    d
}

/// `metash sandbox --role coder -- ARGV` in `ws`, consent given, nothing asked.
fn sandbox(ws: &Path, argv: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metash"));
    c.arg("-C")
        .arg(ws)
        .args([
            "sandbox",
            "--role",
            "coder",
            "--non-interactive",
            "--yes-to",
            "native",
            "--",
        ])
        .args(argv)
        .current_dir(ws)
        .env("METASH_FENCE_KEY", KEY)
        .env("NO_COLOR", "1");
    c
}

fn output(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().unwrap()
}

/// Why the native sandbox cannot run here, if so (it needs Landlock with TCP rules).
fn unavailable(test: &str) -> bool {
    // SAFETY: the VERSION query of landlock_create_ruleset reads nothing.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    let why = if abi < 4 {
        Some(format!("Landlock ABI {abi} < 4"))
    } else if !Path::new(PY).exists() {
        Some(format!("{PY} is not installed"))
    } else {
        None
    };
    if let Some(why) = &why {
        metash_testkit::skip(test, why);
    }
    why.is_some()
}

/// The `agent_started` report of the sandboxed command, from the project's log.
fn report(ws: &Path) -> serde_json::Value {
    let log = std::fs::read_to_string(ws.join(".meta/events.jsonl")).unwrap();
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["data"].get("sandbox_command").is_some())
        .expect("the sandbox is in the log")["data"]["report"]
        .clone()
}

const KERNEL_EDGES: &str = r#"
import ctypes, os, socket, sys, urllib.parse
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
bait = int(sys.argv[1])
for what in ("connect", "listen"):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
        if what == "connect":
            s.connect(("127.0.0.1", bait)); s.sendall(b"escaped-over-mptcp")
        else:
            s.bind(("127.0.0.1", 0)); s.listen(1)
        print("MPTCP-%s-OK" % what)
    except OSError as e:
        print("MPTCP-%s-REFUSED errno=%d" % (what, e.errno))
u = urllib.parse.urlparse(os.environ["METASH_MODEL_BASE_URL"])
socket.create_connection((u.hostname, u.port), timeout=5).close()
print("PROXY-TCP-OK")
def clone(flags):
    pid = libc.syscall(56, ctypes.c_ulong(flags | 17), 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    if pid < 0:
        return "REFUSED errno=%d" % ctypes.get_errno()
    os.waitpid(pid, 0)
    return "OK"
print("CLONE-PLAIN-" + clone(0))
print("CLONE-NEWUSER-" + clone(0x10000000))
print("CLONE-NEWNET-" + clone(0x40000000 | 0x10000000 | 0x20000))
args = (ctypes.c_uint64 * 11)()
args[4] = 17
pid = libc.syscall(435, ctypes.byref(args), 88)
if pid == 0:
    os._exit(0)
print("CLONE3-" + ("REFUSED errno=%d" % ctypes.get_errno() if pid < 0 else "OK"))
r = libc.syscall(0x40000000 | 39)
print("X32-" + ("REFUSED errno=%d" % ctypes.get_errno() if r < 0 else "OK"))
"#;

#[test]
fn a_cli_role_gets_no_mptcp_no_namespaces_no_x32() {
    if unavailable("a_cli_role_gets_no_mptcp_no_namespaces_no_x32") {
        return;
    }
    let p = project();
    std::fs::write(p.path().join("edges.py"), KERNEL_EDGES).unwrap();
    let bait = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    bait.set_nonblocking(true).unwrap();
    let port = bait.local_addr().unwrap().port().to_string();
    let out = output(sandbox(p.path(), &[PY, "edges.py", &port]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for line in [
        format!("MPTCP-connect-REFUSED errno={}", libc::EPERM),
        format!("MPTCP-listen-REFUSED errno={}", libc::EPERM),
        "PROXY-TCP-OK".to_string(),
        "CLONE-PLAIN-OK".to_string(),
        format!("CLONE-NEWUSER-REFUSED errno={}", libc::EPERM),
        format!("CLONE-NEWNET-REFUSED errno={}", libc::EPERM),
        format!("CLONE3-REFUSED errno={}", libc::ENOSYS),
        format!("X32-REFUSED errno={}", libc::EPERM),
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "no {line:?} in:\n{stdout}\n{stderr}"
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        bait.accept().is_err(),
        "an MPTCP stream reached the test's listener"
    );
}

const PROCESSES: &str = r#"
import os, subprocess, sys, time
victim = sys.argv[1]
pid_file = sys.argv[2]
deadline = time.time() + 10
while not os.path.exists(pid_file) and time.time() < deadline:
    time.sleep(0.02)
metash = open(pid_file).read().strip()
print("SELF", os.getpid())
print("LISTED", sorted(int(n) for n in os.listdir("/proc") if n.isdigit()))
for who, pid in (("victim", victim), ("metash", metash)):
    try:
        print(who.upper(), open("/proc/%s/cmdline" % pid, "rb").read())
    except OSError as e:
        print(who.upper(), "unreadable errno=%d" % e.errno)
    try:
        os.kill(int(pid), 0)
        print(who.upper(), "KILL-OK")
    except OSError as e:
        print(who.upper(), "KILL errno=%d" % e.errno)
print("PS", subprocess.run(["ps", "ax", "-o", "pid=,args="], capture_output=True, text=True).stdout)
"#;

#[test]
fn a_cli_role_sees_only_its_own_processes() {
    if unavailable("a_cli_role_sees_only_its_own_processes") {
        return;
    }
    let p = project();
    std::fs::write(p.path().join("procs.py"), PROCESSES).unwrap();
    let secret = "victim-SECRET-cli-31";
    let mut victim = Command::new(PY)
        .args(["-c", "import time; time.sleep(300)", secret])
        .spawn()
        .unwrap();
    let vpid = victim.id().to_string();
    let pid_file = p.path().join("metash.pid");
    let mut c = sandbox(p.path(), &[PY, "procs.py", &vpid, "metash.pid"]);
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let metash_pid = child.id();
    std::fs::write(&pid_file, metash_pid.to_string()).unwrap();
    let out = child.wait_with_output().unwrap();
    let _ = victim.kill();
    let _ = victim.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("SELF 2\n"),
        "the command is pid 2 of its own namespace: {stdout}"
    );
    assert!(
        !stdout.contains(secret),
        "the victim's secret leaked:\n{stdout}"
    );
    assert!(
        !stdout.contains("sandbox --role"),
        "metash's command line leaked:\n{stdout}"
    );
    for who in ["VICTIM", "METASH"] {
        assert!(
            stdout.contains(&format!("{who} unreadable errno={}", libc::ENOENT)),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("{who} KILL errno={}", libc::ESRCH)),
            "{stdout}"
        );
    }
    // `ps` works, and lists the command's own tree only: not pid 1 (metash's own init, whose
    // command line is metash's), nothing of the host.
    let ps = stdout.split("PS ").nth(1).unwrap_or_default();
    assert!(ps.contains("procs.py"), "{stdout}");
    assert!(
        !ps.lines().any(|l| l.trim_start().starts_with("1 ")),
        "{ps}"
    );
    assert!(!ps.contains("sleep(300)"), "{ps}");
    assert!(
        !ps.lines()
            .any(|l| l.trim_start().starts_with(&format!("{vpid} "))),
        "{ps}"
    );
    assert_eq!(report(p.path())["processes"]["own_tree_only"], true);
}

/// `cmd` with `slave` as its controlling terminal (a session of its own), as when a person runs
/// metash in that terminal.
fn on_terminal(cmd: &mut Command, slave: &File) {
    let fd = slave.as_raw_fd();
    // SAFETY: setsid and ioctl are async-signal-safe; `fd` stays open until the spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(fd, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn open_slave(path: &str) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(path)
        .unwrap()
}

use std::os::unix::fs::OpenOptionsExt;

const HEADLESS_TTY: &str = r#"
import os, sys
test_pts = sys.argv[1]
print("PTS-LISTED", sorted(os.listdir("/dev/pts")))
for path in ("/dev/tty", test_pts, "/dev/ptmx"):
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
        print("OPEN", path, "OK", os.fstat(fd).st_dev)
        os.close(fd)
    except OSError as e:
        print("OPEN", path, "errno=%d" % e.errno)
print("DEVPTS", os.stat("/dev/pts").st_dev)
held = []
for n in os.listdir("/proc/self/fd"):
    try:
        held.append(os.readlink("/proc/self/fd/" + n))
    except OSError:
        pass
print("HELD", held)
"#;

#[test]
fn a_headless_command_cannot_reach_the_users_terminal() {
    if unavailable("a_headless_command_cannot_reach_the_users_terminal") {
        return;
    }
    let p = project();
    std::fs::write(p.path().join("tty.py"), HEADLESS_TTY).unwrap();
    let (_master, pts) = metash_testkit::pty::open();
    let slave = open_slave(&pts);
    let mut c = sandbox(p.path(), &[PY, "tty.py", &pts]);
    on_terminal(&mut c, &slave);
    let out = output(c);
    drop(slave);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // No controlling terminal: /dev/tty opens nothing.
    assert!(
        stdout.contains(&format!("OPEN /dev/tty errno={}", libc::ENXIO)),
        "{stdout}"
    );
    // The user's pty is not there at all: the command's devpts is a private instance.
    assert!(
        stdout.contains(&format!("OPEN {pts} errno={}", libc::ENOENT)),
        "{stdout}"
    );
    assert!(stdout.contains("PTS-LISTED ['ptmx']"), "{stdout}");
    let host_devpts = std::fs::metadata("/dev/pts").unwrap();
    let inside: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("DEVPTS "))
        .and_then(|v| v.trim().parse().ok())
        .expect("DEVPTS line");
    assert_ne!(
        inside,
        std::os::unix::fs::MetadataExt::dev(&host_devpts),
        "{stdout}"
    );
    // /dev/ptmx makes ptys in that private instance only (how Codex runs its commands).
    assert!(
        stdout.contains(&format!("OPEN /dev/ptmx OK {inside}")),
        "{stdout}"
    );
    // No descriptor of the user's terminal was handed down either.
    assert!(
        !stdout
            .lines()
            .any(|l| l.starts_with("HELD") && l.contains(&pts)),
        "{stdout}"
    );
    assert_eq!(report(p.path())["terminal"]["controlling"], "none");
}

/// Reads the master until `want` appears or `within` passes.
fn read_until(master: &mut File, want: &str, within: Duration) -> String {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while start.elapsed() < within && !String::from_utf8_lossy(&got).contains(want) {
        let mut pfd = libc::pollfd {
            fd: master.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one live pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 100) } == 1 {
            match master.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[test]
fn an_interactive_sandbox_gets_its_own_relayed_pty() {
    if unavailable("an_interactive_sandbox_gets_its_own_relayed_pty") {
        return;
    }
    let p = project();
    let (mut master, pts) = metash_testkit::pty::open();
    let slave = open_slave(&pts);
    let mut c = sandbox(p.path(), &["/bin/bash", "--norc", "--noprofile", "-i"]);
    c.stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    on_terminal(&mut c, &slave);
    let mut child = c.spawn().unwrap();
    drop(slave);
    // bash's own prompt (the sandbox clears PS1 with the rest of the environment).
    let before = read_until(&mut master, "bash-", Duration::from_secs(20));
    assert!(before.contains("bash-"), "no prompt: {before}");
    master
        .write_all(b"tty; stat -c DEVPTS=%d /dev/pts; echo typed-$((6*7)); exit 3\n")
        .unwrap();
    let after = read_until(&mut master, "typed-42", Duration::from_secs(10));
    let status = child.wait().unwrap();
    let text = format!("{before}{after}");
    assert!(
        after.contains("typed-42"),
        "the typed line did not reach the shell: {text}"
    );
    assert_eq!(status.code(), Some(3), "{text}");
    // bash may put an escape sequence (bracketed paste off) before the output on that line.
    let tty = after
        .lines()
        .find_map(|l| l.find("/dev/pts/").map(|i| l[i..].trim()))
        .unwrap_or_else(|| panic!("tty printed no pts: {text}"));
    let inside: u64 = after
        .lines()
        .find_map(|l| l.trim().strip_prefix("DEVPTS="))
        .and_then(|v| v.parse().ok())
        .expect("DEVPTS line");
    let host = std::os::unix::fs::MetadataExt::dev(&std::fs::metadata("/dev/pts").unwrap());
    assert_ne!(
        inside, host,
        "the shell's pty is in the host's devpts: {text}"
    );
    assert!(tty != pts || inside != host, "{text}");
    assert_eq!(
        report(p.path())["terminal"]["controlling"],
        "a pty metash allocated and relays"
    );
}
