//! The session's side in its terminal. `metash session run ID` is what the tmux window runs: it
//! opens the host, prepares the role's CLI under the role's sandbox
//! ([`metash_host::interactive`]), runs it on a relayed pty, records the continuation key as soon
//! as the CLI has written one, and the exit status at the end. (Whether a recorded session still
//! runs: [`metash_host::session_liveness`].)

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use metash_host::interactive::Launch;
use metash_protocol::{HarnessContinuationRef, HarnessFrontend};
use metash_store::cp_sessions::{CpSession, SessionEvent, SessionStatus};
use metash_store::Store;

use super::host::HostArgs;
use super::session_env;
use super::Ctx;

/// How often the launcher looks for the CLI's continuation key.
const KEY_POLL: Duration = Duration::from_millis(500);

/// The launcher's command line: this metash, the project, the session, and the consent the
/// caller already gave (asked at its terminal by `start`/`resume` before the window opened).
pub(crate) fn launcher_argv(ctx: &Ctx, id: &str, args: &HostArgs) -> Result<Vec<String>> {
    let exe = std::env::current_exe().context("locating the metash executable")?;
    let mut argv = vec![
        exe.display().to_string(),
        "-C".into(),
        ctx.workspace.display().to_string(),
        "session".into(),
        "run".into(),
        id.to_string(),
        "--yes-to".into(),
        "native".into(),
        "--non-interactive".into(),
    ];
    for c in args.yes_to.iter().filter(|c| c.as_str() != "native") {
        argv.extend(["--yes-to".to_string(), c.clone()]);
    }
    if let Some(p) = &args.policy {
        argv.extend(["--policy".to_string(), p.display().to_string()]);
    }
    Ok(argv)
}

/// `metash session run ID`: the CLI in this terminal until it ends.
pub(crate) fn launcher(ctx: &Ctx, id: &str, args: &HostArgs) -> Result<ExitCode> {
    let store = Store::open(&ctx.workspace)?;
    let s = store
        .cp_sessions()
        .get(id)?
        .with_context(|| format!("no session `{id}`"))?;
    let home = s.home.clone().context("the session has no directory")?;
    let secrets = session_env::receive(
        &session_env::fifo_path(&home),
        session_env::HAND_OVER_WITHIN,
    )?;
    let host = open_host(ctx, args, secrets)?;
    let launch = launch_of(&s)?;
    let prepared = match host.interactive_session(&launch) {
        Ok(p) => p,
        Err(e) => return Ok(failed(&store, id, &e.to_string())),
    };
    let since = SystemTime::now() - Duration::from_secs(2);
    let done = Arc::new(AtomicBool::new(false));
    let cli_pid = Arc::new(AtomicU32::new(0));
    catch_hangup();
    let watcher = watch(&store, &s, since, Arc::clone(&done), Arc::clone(&cli_pid));
    let status = prepared.run(|pid| cli_pid.store(pid, Ordering::Relaxed));
    done.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    observe_key(&store, &s, since);
    // The CLI's tree ended with its leader (reaped by now: no signal to its pid any more).
    let hung_up = HUNG_UP.load(Ordering::Relaxed);
    let (code, why) = match (status, hung_up) {
        (Ok(st), false) => (Some(exit_code(st)), None),
        (Ok(st), true) => (Some(exit_code(st)), Some(WINDOW_CLOSED.to_string())),
        (Err(_), true) => (None, Some(WINDOW_CLOSED.to_string())),
        (Err(e), false) => return Ok(failed(&store, id, &e.to_string())),
    };
    store.cp_sessions().update(id, SessionEvent::Exit, |r| {
        if r.status != SessionStatus::Ended {
            r.status = SessionStatus::Exited;
        }
        r.exit_status = code;
        r.error = why.clone();
        Ok(())
    })?;
    let code = code.unwrap_or(128 + libc::SIGHUP);
    host.flush_events()?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// The host, with the caller's credentials as its own variables (never this process's
/// environment, which its children would inherit). Consent as `HostArgs` gives it, never asked
/// here (the caller was asked before the window opened).
fn open_host(
    ctx: &Ctx,
    args: &HostArgs,
    env: std::collections::BTreeMap<String, String>,
) -> Result<metash_host::Host> {
    let yes_to = args
        .yes_to
        .iter()
        .map(|c| c.parse().map_err(|e| anyhow::anyhow!("--yes-to {c}: {e}")))
        .collect::<Result<Vec<_>>>()?;
    let options = metash_host::HostOptions {
        terminal: metash_host::Terminal::Stderr,
        consent: metash_host::ConsentMode::NonInteractive,
        policy_file: args.policy.clone(),
        yes_to,
        config_home: super::host::config_home(),
        env,
    };
    Ok(metash_host::Host::open(&ctx.workspace, options)?)
}

/// What to start for a record: a first run, or a resume through its key.
fn launch_of(s: &CpSession) -> Result<Launch> {
    let role = s.role.clone().context("the session has no role")?;
    let home = s.home.clone().context("the session has no directory")?;
    let resuming = s.runs > 1;
    Ok(Launch {
        role,
        cp_session_id: s.id.clone(),
        workdir: s.workdir.clone(),
        home,
        continuation: resuming.then(|| HarnessContinuationRef {
            provider: s.provider,
            key: s.continuation_key.clone(),
        }),
        fixed_key: (!resuming).then(|| s.continuation_key.clone()).flatten(),
    })
}

/// The session could not run: said in the window, and recorded as the session's `exited` with
/// the reason. The window stays a moment so a person sees why.
fn failed(store: &Store, id: &str, why: &str) -> ExitCode {
    eprintln!(
        "metash: session {id}: {}",
        metash_protocol::sanitize_line(why)
    );
    let _ = store.cp_sessions().update(id, SessionEvent::Exit, |r| {
        if r.status != SessionStatus::Ended {
            r.status = SessionStatus::Exited;
        }
        r.error = Some(why.to_string());
        Ok(())
    });
    std::thread::sleep(Duration::from_secs(3));
    crate::exit::Exit::Failure.into()
}

/// Why a run ended when its window was closed under it.
const WINDOW_CLOSED: &str = "its tmux window was closed (the CLI was stopped)";

/// Set by SIGHUP: the session's window was closed, or its tmux server killed.
static HUNG_UP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_hangup(_: libc::c_int) {
    HUNG_UP.store(true, Ordering::Relaxed);
}

/// A closed window sends SIGHUP. Instead of dying at once (no exit recorded, the last usage not
/// charged), the launcher hangs the CLI up, kills it past [`HANGUP_GRACE`], and ends as when it
/// exits. A handler, not `SIG_IGN`:
/// the CLI must not inherit an ignored SIGHUP.
fn catch_hangup() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGHUP,
            on_hangup as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
}

/// How long a CLI whose window was closed has to end by itself after its hangup before it is
/// killed: time to save its conversation (Claude Code writes its transcript on a timer; killed
/// at once, it lost the answer it had just shown, and the resumed session did not have it).
const HANGUP_GRACE: Duration = Duration::from_secs(10);

/// The CLI's sandbox leader (the process started), when it runs.
fn cli_leader(pid: &AtomicU32) -> Option<i32> {
    i32::try_from(pid.load(Ordering::Relaxed))
        .ok()
        .filter(|p| *p > 0)
}

/// Hangs the CLI up as a closed terminal does: SIGHUP to the sandbox's process group, whose
/// namespace init passes it to the CLI (on its own pty, in its own session).
fn hang_up_cli(pid: &AtomicU32) {
    if let Some(pid) = cli_leader(pid) {
        // SAFETY: killpg(2) on the group this process started. Once its leader is reaped the
        // watch ends within one period, and the kernel hands out pids in order, not at once again.
        unsafe { libc::killpg(pid, libc::SIGHUP) };
    }
}

/// Kills the CLI (the init of its PID namespace: the whole tree goes with it).
fn stop_cli(pid: &AtomicU32) {
    if let Some(pid) = cli_leader(pid) {
        // SAFETY: kill(2) with a pid this process started and has not reaped.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// Until `done`: stops the CLI once the window is closed, and looks for the CLI's key (Codex
/// and pi write theirs at the first prompt).
fn watch(
    store: &Store,
    s: &CpSession,
    since: SystemTime,
    done: Arc<AtomicBool>,
    cli_pid: Arc<AtomicU32>,
) -> std::thread::JoinHandle<()> {
    let (store, s) = (store.clone(), s.clone());
    std::thread::spawn(move || {
        let mut last_look = std::time::Instant::now() - KEY_POLL;
        let mut hung_up_at: Option<std::time::Instant> = None;
        while !done.load(Ordering::Relaxed) {
            if HUNG_UP.load(Ordering::Relaxed) {
                let at = *hung_up_at.get_or_insert_with(|| {
                    hang_up_cli(&cli_pid);
                    std::time::Instant::now()
                });
                if at.elapsed() >= HANGUP_GRACE {
                    stop_cli(&cli_pid);
                }
            }
            if last_look.elapsed() >= KEY_POLL {
                observe_key(&store, &s, since);
                last_look = std::time::Instant::now();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// Records the key the CLI wrote under the session's home, when it is new. Claude Code's was
/// fixed up front and is not read back.
fn observe_key(store: &Store, s: &CpSession, since: SystemTime) {
    if s.frontend == HarnessFrontend::ClaudeCode {
        return;
    }
    let Some(home) = &s.home else { return };
    let Some(key) = metash_harness::observe::observed_key(s.frontend, home, since) else {
        return;
    };
    let known = store
        .cp_sessions()
        .get(&s.id)
        .ok()
        .flatten()
        .and_then(|r| r.continuation_key);
    if known.as_deref() != Some(key.as_str()) {
        let _ = store
            .cp_sessions()
            .update(&s.id, SessionEvent::Observed, |r| {
                r.continuation_key = Some(key.clone());
                Ok(())
            });
    }
}

/// A process's exit as a shell reports it (128 + signal when killed).
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}
