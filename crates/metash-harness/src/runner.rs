//! Spawns a `ProcessInvocationSpec` exactly as given: argv as is (never through a shell), its
//! cwd, the inherited environment plus the spec's delta. Three I/O modes: `pipes` (stdin null, stdout
//! read line by line), `inherit`, and `pty`. Children get their own process group so a timeout or
//! cancellation kills the whole tree.

use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use metash_protocol::ProcessInvocationSpec;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio_util::sync::CancellationToken;

use crate::error::{HarnessError, Result};

/// How a piped run ended.
#[derive(Debug, Clone)]
pub struct PipedOutcome {
    pub status: ExitStatus,
    /// The last 8 KiB of stderr, for error messages.
    pub stderr_tail: String,
    pub wall: Duration,
}

fn command(spec: &ProcessInvocationSpec) -> Result<std::process::Command> {
    let (prog, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| HarnessError::InvalidRequest("empty argv".to_string()))?;
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args).current_dir(&spec.cwd);
    // The control plane owns terminal multiplexer variables; a harness must not inherit ours.
    for (k, _) in std::env::vars_os() {
        if is_terminal_var(&k.to_string_lossy()) {
            cmd.env_remove(&k);
        }
    }
    cmd.envs(&spec.env);
    Ok(cmd)
}

/// Runs a spec with `pipes`: stdin null, each stdout line to `on_line`, stderr kept as a tail.
/// On `timeout` or `cancel` the process group is killed and `Timeout` / `Cancelled` returned.
///
/// # Errors
/// `Io` when the program cannot be spawned (`ProgramNotFound` when it does not exist).
pub async fn run_piped(
    spec: &ProcessInvocationSpec,
    timeout: Option<Duration>,
    cancel: &CancellationToken,
    on_line: &mut (dyn FnMut(&str) + Send),
) -> Result<PipedOutcome> {
    run_piped_confined(spec, None, timeout, cancel, on_line).await
}

/// The last 8 KiB of what the child wrote to stderr (bounded while it runs).
pub(crate) async fn stderr_tail(stderr: Option<tokio::process::ChildStderr>) -> String {
    let mut buf = Vec::new();
    if let Some(mut s) = stderr {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = s.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            if buf.len() > 64 * 1024 {
                buf.drain(..buf.len() - 8192);
            }
        }
    }
    let from = buf.len().saturating_sub(8192);
    String::from_utf8_lossy(&buf[from..]).into_owned()
}

/// Each non-empty stdout line to `on_line`, until stdout closes.
async fn read_lines(
    stdout: Option<tokio::process::ChildStdout>,
    on_line: &mut (dyn FnMut(&str) + Send),
) {
    let Some(out) = stdout else { return };
    let mut reader = BufReader::with_capacity(64 * 1024, out);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end_matches(['\n', '\r']);
                if !text.is_empty() {
                    on_line(text);
                }
            }
        }
    }
}

/// [`run_piped`] with the process confined by `confiner` (applied to the `Command` right before
/// the spawn; its guard lives until the child has been reaped). A confinement that cannot be
/// prepared fails the run before anything starts.
///
/// # Errors
/// As [`run_piped`]; `HarnessFailed` naming the sandbox step when the confinement fails.
pub async fn run_piped_confined(
    spec: &ProcessInvocationSpec,
    confiner: Option<&dyn crate::confine::Confiner>,
    timeout: Option<Duration>,
    cancel: &CancellationToken,
    on_line: &mut (dyn FnMut(&str) + Send),
) -> Result<PipedOutcome> {
    let start = Instant::now();
    let mut std_cmd = command(spec)?;
    let _guard = confiner
        .map(|c| c.confine(spec, &mut std_cmd))
        .transpose()
        .map_err(|e| HarnessError::HarnessFailed(format!("sandbox: {e}")))?;
    let mut cmd = tokio::process::Command::from(std_cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // A confined child makes itself a session (and group) leader; setting a group here first
    // would make its setsid fail.
    #[cfg(unix)]
    if confiner.is_none() {
        cmd.process_group(0);
    }
    let mut child = cmd.spawn().map_err(|e| spawn_error(spec, e))?;
    let pid = child.id();
    if let (Some(c), Some(pid)) = (confiner, pid) {
        c.spawned(pid);
    }
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let stderr_task = tokio::spawn(stderr_tail(stderr));
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let read_lines = read_lines(stdout, on_line);
    // Done when stdout closes and the child exits. A grandchild that keeps stdout open after the
    // child exited gets a short grace to flush, then the group is killed: a turn never hangs on it.
    let finish = async {
        tokio::pin!(read_lines);
        tokio::select! {
            () = &mut read_lines => child.wait().await,
            status = child.wait() => {
                let _ = tokio::time::timeout(Duration::from_secs(2), &mut read_lines).await;
                kill_group(pid);
                status
            }
        }
    };
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        r = finish => r.map_err(|e| HarnessError::io("wait for harness", e)),
        () = sleep => Err(HarnessError::Timeout(format!("harness ran past {:?}", timeout.unwrap_or_default()))),
        () = cancel.cancelled() => Err(HarnessError::Cancelled),
    };
    if result.is_err() {
        kill_group(pid);
    }
    let status = result?;
    let stderr_tail = tokio::time::timeout(Duration::from_secs(2), stderr_task)
        .await
        .ok()
        .and_then(|r| r.ok())
        .unwrap_or_default();
    Ok(PipedOutcome {
        status,
        stderr_tail,
        wall: start.elapsed(),
    })
}

#[cfg(unix)]
fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) with a negative pid signals the process group we created for the child.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

/// Without process groups (Windows) the tree is the job object's to kill, which the native
/// backend will own (docs/portability.md); `kill_on_drop` still ends the child itself.
#[cfg(not(unix))]
fn kill_group(_: Option<u32>) {}

fn spawn_error(spec: &ProcessInvocationSpec, e: std::io::Error) -> HarnessError {
    let prog = spec.argv.first().cloned().unwrap_or_default();
    if e.kind() == std::io::ErrorKind::NotFound {
        HarnessError::ProgramNotFound(format!("{prog} (cwd {})", spec.cwd))
    } else {
        HarnessError::io(format!("spawn {prog}"), e)
    }
}

/// Runs a spec with the caller's stdin/stdout/stderr and waits for it.
///
/// # Errors
/// As [`run_piped`]'s spawn errors.
pub fn run_inherit(spec: &ProcessInvocationSpec) -> Result<ExitStatus> {
    let mut cmd = command(spec)?;
    cmd.status().map_err(|e| spawn_error(spec, e))
}

/// A process on a new pseudo-terminal; the control plane reads and writes `master`.
#[derive(Debug)]
pub struct PtyProcess {
    pub child: std::process::Child,
    pub master: std::fs::File,
}

/// Spawns a spec on a new pty of `rows`×`cols`, as the session leader with the pty as its
/// controlling terminal (what an interactive CLI expects).
///
/// # Errors
/// `Io` when no pty can be opened or the program cannot be spawned.
#[cfg(not(unix))]
pub fn spawn_pty(spec: &ProcessInvocationSpec, _rows: u16, _cols: u16) -> Result<PtyProcess> {
    Err(HarnessError::HarnessFailed(format!(
        "{}: pty mode needs a Unix pseudo-terminal (ConPTY is not supported yet)",
        spec.argv.first().cloned().unwrap_or_default()
    )))
}

/// Spawns a spec on a new pty of `rows`×`cols`, as the session leader with the pty as its
/// controlling terminal (what an interactive CLI expects).
///
/// # Errors
/// `Io` when no pty can be opened or the program cannot be spawned.
#[cfg(unix)]
pub fn spawn_pty(spec: &ProcessInvocationSpec, rows: u16, cols: u16) -> Result<PtyProcess> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let mut master: libc::c_int = -1;
    let mut slave: libc::c_int = -1;
    // `mut` and `null_mut`: macOS declares these pointers mutable, Linux const.
    let mut ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two fds into the out-pointers; name and termios may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::addr_of_mut!(ws),
        )
    };
    if rc != 0 {
        return Err(HarnessError::io("openpty", std::io::Error::last_os_error()));
    }
    // SAFETY: both fds were just returned by openpty and are owned by nobody else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| HarnessError::io("dup pty", e));
    let mut cmd = command(spec)?;
    cmd.stdin(Stdio::from(dup(&slave)?))
        .stdout(Stdio::from(dup(&slave)?))
        .stderr(Stdio::from(dup(&slave)?));
    if !spec.env.contains_key("TERM") && std::env::var_os("TERM").is_none() {
        cmd.env("TERM", "xterm-256color");
    }
    // SAFETY: only async-signal-safe calls (setsid, ioctl) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| spawn_error(spec, e))?;
    drop(slave);
    let _ = master.as_raw_fd();
    Ok(PtyProcess {
        child,
        master: std::fs::File::from(master),
    })
}

/// Seed 003 section 6.2: terminal multiplexer variables belong to the control plane, never to a
/// harness process.
pub fn is_terminal_var(k: &str) -> bool {
    k.starts_with("TMUX")
        || k.starts_with("GHOSTTY")
        || k == "TERM_PROGRAM"
        || k == "TERM_PROGRAM_VERSION"
        || k == "STY"
}
