//! Issue 31 from inside a real coding CLI (Claude Code, Codex, pi) running as a role, driven by a
//! loopback model that asks for one shell tool call per probe: an MPTCP stream to the test's
//! listener and an MPTCP listener are refused, `clone(CLONE_NEWUSER)` is refused, `clone3` is
//! `ENOSYS`, an x32 call is refused, a victim process holding a secret in its arguments and the
//! host's own process are invisible and unreachable, and neither the test's pty nor a `devpts` of
//! the host's is there. The CLI's own model traffic, over TCP to its credential proxy, is the
//! control that plain TCP still works: the turn ends with every probe's result.

use std::net::TcpListener;
use std::os::fd::FromRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use metash_host::{SpawnRequest, Spawner};
use metash_protocol::AgentStatus;
use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

use super::cli_sandbox::cli_host;
use super::common::Project;

/// One probe script, a subcommand per probe; each prints one marker line.
const PROBE: &str = r#"
import ctypes, os, socket, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
what = sys.argv[1]
def refused(name, rc):
    print("%s-%s" % (name, "OK" if rc >= 0 else "REFUSED errno=%d" % ctypes.get_errno()))
if what in ("mptcp", "mptcp-listen"):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
        if what == "mptcp":
            s.connect(("127.0.0.1", int(sys.argv[2]))); s.sendall(b"escaped")
        else:
            s.bind(("127.0.0.1", 0)); s.listen(1)
        print("FENCE-%s-OK" % what)
    except OSError as e:
        print("FENCE-%s-REFUSED errno=%d" % (what, e.errno))
elif what == "clone":
    pid = libc.syscall(56, ctypes.c_ulong(0x10000000 | 17), 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    refused("FENCE-clone-newuser", pid)
elif what == "clone3":
    args = (ctypes.c_uint64 * 11)()
    args[4] = 17
    pid = libc.syscall(435, ctypes.byref(args), 88)
    if pid == 0:
        os._exit(0)
    refused("FENCE-clone3", pid)
elif what == "x32":
    refused("FENCE-x32", libc.syscall(0x40000000 | 39))
elif what == "procs":
    secret = "victim-" + "SECRET-" + sys.argv[2]
    ps = subprocess.run(["ps", "ax", "-o", "pid=,args="], capture_output=True, text=True).stdout
    print("FENCE-procs", "SEEN" if secret in ps else "HIDDEN", "self=%d" % os.getpid())
    for pid in sys.argv[3:]:
        try:
            seen = secret in open("/proc/%s/cmdline" % pid).read().replace("\0", " ")
            print("FENCE-cmdline", pid, "READ", "SECRET" if seen else "")
        except OSError as e:
            print("FENCE-cmdline", pid, "errno=%d" % e.errno)
        try:
            os.kill(int(pid), 0)
            print("FENCE-kill", pid, "OK")
        except OSError as e:
            print("FENCE-kill", pid, "errno=%d" % e.errno)
elif what == "tty":
    for path in ("/dev/tty", sys.argv[2]):
        try:
            os.close(os.open(path, os.O_RDWR | os.O_NOCTTY))
            print("FENCE-open", path, "OK")
        except OSError as e:
            print("FENCE-open", path, "errno=%d" % e.errno)
    print("FENCE-devpts", os.stat("/dev/pts").st_dev, sorted(os.listdir("/dev/pts")))
"#;

/// A process of the user's holding a secret in its arguments, killed when dropped.
struct Victim(std::process::Child);

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The test's own pty (as a user's terminal): the master kept open, the slave's path.
fn test_pty() -> (std::fs::File, String) {
    // SAFETY: posix_openpt/grantpt/unlockpt/ptsname on the descriptor just opened; the name is
    // copied before any other call.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::grantpt(fd), 0);
        assert_eq!(libc::unlockpt(fd), 0);
        let name = std::ffi::CStr::from_ptr(libc::ptsname(fd))
            .to_string_lossy()
            .into_owned();
        (std::fs::File::from_raw_fd(fd), name)
    }
}

/// A loopback listener of the test's that counts every connection it gets.
fn bait() -> (u16, Arc<AtomicUsize>) {
    let bait = TcpListener::bind("127.0.0.1:0").expect("bait");
    let port = bait.local_addr().expect("addr").port();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for c in bait.incoming().flatten() {
            h.fetch_add(1, Ordering::SeqCst);
            drop(c);
        }
    });
    (port, hits)
}

fn fence_run(cli: Cli, test: &str) {
    let Some(tools) = super::common::cli_ready(cli, test) else {
        return;
    };
    let p = Project::new();
    std::fs::write(p.path().join("fence_probe.py"), PROBE).expect("probe");
    let tag = std::process::id().to_string();
    let victim = Victim(
        std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import time; time.sleep(300)"])
            .arg(format!("victim-SECRET-{tag}"))
            .spawn()
            .expect("victim"),
    );
    let (bait_port, hits) = bait();
    let (_master, pts) = test_pty();
    let py = |args: String| format!("/usr/bin/python3 fence_probe.py {args} 2>&1 | tail -8");
    let commands = [
        py(format!("mptcp {bait_port}")),
        py("mptcp-listen".into()),
        py("clone".into()),
        py("clone3".into()),
        py("x32".into()),
        py(format!(
            "procs {tag} {} {}",
            victim.0.id(),
            std::process::id()
        )),
        py(format!("tty {pts}")),
    ];
    let n = commands.len();
    let server = ModelServer::start(move |c| {
        let body = c.text();
        if !body.contains("Probe the fence.") {
            return cli.text("ok");
        }
        let done = cli.results(&body);
        match commands.get(done) {
            Some(cmd) => cli.shell(done, &body, cmd),
            None => cli.text("all fence probes ran"),
        }
    });
    std::os::unix::fs::symlink(&tools, p.path().join(".tools")).expect("link .tools");
    p.config(&cli.role("coder", &server.base));
    let host = cli_host(&p);
    let mut req = SpawnRequest::new("coder", "You are a test.", "Probe the fence.");
    req.options.timeout_seconds = Some(300.0);
    let r = host.spawn_agent(&req).expect("spawn");
    // The control: the whole turn went over TCP to the credential proxy.
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(r.data.contains("all fence probes ran"), "{}", r.data);
    let results = p.log_data("tool_result");
    assert_eq!(results.len(), n, "{results:#?}");
    let all: String = results
        .iter()
        .map(|r| r["output"].as_str().unwrap_or("").to_string())
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!("{all}");
    check(&all, victim.0.id(), &pts);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "an MPTCP stream reached the bait"
    );
    let started = p.log_data("agent_started");
    let report = started
        .iter()
        .find(|s| s.get("frontend").is_some())
        .expect("the CLI's sandbox report");
    assert_eq!(report["processes"]["own_tree_only"], true, "{report}");
    assert_eq!(report["terminal"]["controlling"], "none", "{report}");
}

/// Every probe ran (its marker is there) and every one was refused.
fn check(all: &str, victim: u32, pts: &str) {
    let host = std::process::id();
    let has = |line: &str| all.lines().any(|l| l.trim() == line);
    for want in [
        format!("FENCE-mptcp-REFUSED errno={}", libc::EPERM),
        format!("FENCE-mptcp-listen-REFUSED errno={}", libc::EPERM),
        format!("FENCE-clone-newuser-REFUSED errno={}", libc::EPERM),
        format!("FENCE-clone3-REFUSED errno={}", libc::ENOSYS),
        format!("FENCE-x32-REFUSED errno={}", libc::EPERM),
        format!("FENCE-cmdline {victim} errno={}", libc::ENOENT),
        format!("FENCE-cmdline {host} errno={}", libc::ENOENT),
        format!("FENCE-kill {victim} errno={}", libc::ESRCH),
        format!("FENCE-kill {host} errno={}", libc::ESRCH),
        format!("FENCE-open /dev/tty errno={}", libc::ENXIO),
        format!("FENCE-open {pts} errno={}", libc::ENOENT),
    ] {
        assert!(has(&want), "no {want:?} in:\n{all}");
    }
    assert!(all.contains("FENCE-procs HIDDEN"), "{all}");
    let devpts = all
        .lines()
        .find_map(|l| l.trim().strip_prefix("FENCE-devpts "))
        .unwrap_or_else(|| panic!("no devpts line in:\n{all}"));
    let host_dev = std::fs::metadata("/dev/pts").expect("/dev/pts").dev();
    assert!(
        !devpts.starts_with(&format!("{host_dev} ")),
        "the CLI sees the host's devpts: {devpts}"
    );
}

#[test]
fn claude_code_cannot_pass_the_kernels_edges() {
    fence_run(Cli::Claude, "claude_code_cannot_pass_the_kernels_edges");
}

#[test]
fn codex_cannot_pass_the_kernels_edges() {
    fence_run(Cli::Codex, "codex_cannot_pass_the_kernels_edges");
}

#[test]
fn pi_cannot_pass_the_kernels_edges() {
    fence_run(Cli::Pi, "pi_cannot_pass_the_kernels_edges");
}
