//! A real PostgreSQL server for tests: Debian's server binaries (`/usr/lib/postgresql/<v>/bin`,
//! installed by scripts/setup), a new cluster in a temporary directory, listening on 127.0.0.1
//! on a free port and on a socket in that directory. `initdb` refuses to run as root, so when
//! the tests run as root (CI does) the server runs as `nobody`. The cluster keeps `fsync` on:
//! the tests are about durability. Stopped (fast shutdown) when dropped.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The newest server's `bin` directory, or why not.
pub fn prerequisites() -> Result<PathBuf, String> {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .map_err(|e| {
            format!(
                "{}: {e} (Debian's postgresql; run scripts/setup)",
                root.display()
            )
        })?
        .flatten()
        .filter_map(|d| {
            let v: u32 = d.file_name().to_str()?.parse().ok()?;
            let bin = d.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| "no PostgreSQL server under /usr/lib/postgresql (run scripts/setup)".into())
}

/// A running server; `url()` reaches it as the superuser `metash` (trust auth on loopback).
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    /// The directory holding the cluster and its socket (made readable by the server's user).
    pub dir: PathBuf,
    pub port: u16,
    /// Addresses it listens on besides 127.0.0.1 (a test's own network namespaces).
    also: Vec<String>,
    child: Option<Child>,
    _tmp: tempfile_dir::Dir,
}

/// A temporary directory the server's user may enter.
mod tempfile_dir {
    use std::path::PathBuf;

    pub struct Dir(pub PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn as_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `program` run as the server's user: `nobody` under root, else the caller.
fn as_server_user(program: &Path) -> Command {
    if as_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]);
        c.arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Postgres {
    /// Makes a cluster and starts it.
    ///
    /// # Errors
    /// `initdb` or the server failed (their output is in the message).
    pub fn start(bin: &Path) -> Result<Self, String> {
        let dir =
            std::env::temp_dir().join(format!("metash-pg-{}-{}", std::process::id(), uuid_like()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let tmp = tempfile_dir::Dir(dir.clone());
        if as_root() {
            let ok = Command::new("chown")
                .args(["nobody:nogroup"])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                return Err(format!("chown nobody {}", dir.display()));
            }
        }
        let data = dir.join("data");
        let out = as_server_user(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "metash", "--auth=trust", "-E", "UTF8", "--no-locale"])
            .output()
            .map_err(|e| format!("initdb: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let mut pg = Self {
            bin: bin.to_path_buf(),
            data,
            dir,
            port: free_port(),
            also: Vec::new(),
            child: None,
            _tmp: tmp,
        };
        pg.restart()?;
        Ok(pg)
    }

    /// `postgres://metash@127.0.0.1:PORT/DB`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://metash@127.0.0.1:{}/{db}", self.port)
    }

    /// Starts the server (again, after [`Postgres::stop`] or [`Postgres::kill`]) on the same
    /// port and data, and waits until it accepts connections.
    ///
    /// # Errors
    /// It exited or did not answer within 30 s.
    pub fn restart(&mut self) -> Result<(), String> {
        let child = as_server_user(&self.bin.join("postgres"))
            .arg("-D")
            .arg(&self.data)
            .args([
                "-c",
                &format!("listen_addresses={}", {
                    let mut all = vec!["127.0.0.1".to_string()];
                    all.extend(self.also.iter().cloned());
                    all.join(",")
                }),
            ])
            .args(["-c", &format!("port={}", self.port)])
            .args([
                "-c",
                &format!("unix_socket_directories={}", self.dir.display()),
            ])
            .args(["-c", "max_connections=200", "-c", "fsync=on"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so a crash can take the server's backends down with it.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("postgres: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "metash",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("postgres exited: {status}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err("postgres did not accept connections within 30 s".into())
    }

    /// Also listens on `addr`, and trusts clients from `cidr` (a veth link to a network
    /// namespace the test made, as another machine would reach the server); restarts it.
    ///
    /// # Errors
    /// pg_hba.conf cannot be written, or the server does not come back.
    pub fn listen_also(&mut self, addr: &str, cidr: &str) -> Result<(), String> {
        use std::io::Write;
        let hba = self.data.join("pg_hba.conf");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&hba)
            .map_err(|e| format!("{}: {e}", hba.display()))?;
        writeln!(f, "host all all {cidr} trust").map_err(|e| e.to_string())?;
        self.also.push(addr.to_string());
        self.stop();
        self.restart()
    }

    /// Stops the server: SIGINT, PostgreSQL's fast shutdown (it ends every session).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGINT);
            }
            let _ = child.wait();
        }
    }

    /// Kills the server and every backend with SIGKILL, as a machine's crash would (it
    /// recovers from its WAL at restart). Returns once none of them can answer a query.
    ///
    /// PostgreSQL makes each child it forks a process group leader (`setsid`), so its backends
    /// are not in the postmaster's group: they are found by parent, with the postmaster stopped
    /// first so that it forks no new one meanwhile. A backend merely orphaned would go on serving
    /// its connection until it noticed, and a query sent "after the crash" could still commit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let postmaster = child.id() as libc::pid_t;
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(postmaster, libc::SIGSTOP);
            }
            let backends = children_of(postmaster);
            for pid in backends.iter().copied().chain([postmaster]) {
                // SAFETY: kill(2) on the server's own processes (its group, then each one).
                unsafe {
                    libc::kill(-pid, libc::SIGKILL);
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            let _ = child.wait();
            let deadline = Instant::now() + Duration::from_secs(10);
            while backends.iter().any(|&pid| alive(pid)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// The pids whose parent is `parent` (from `/proc/<pid>/stat`).
fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|&pid| stat_of(pid).is_some_and(|(_, ppid)| ppid == parent))
        .collect()
}

/// A process's state letter and parent pid; `None` once it is gone.
fn stat_of(pid: libc::pid_t) -> Option<(char, libc::pid_t)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields follow its last `)`.
    let mut rest = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.next()?.parse().ok()?))
}

/// Still able to run: neither gone nor a zombie (a reaped or unreaped corpse answers nothing).
fn alive(pid: libc::pid_t) -> bool {
    stat_of(pid).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X'))
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

fn uuid_like() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{t:x}")
}
