//! `metash session start|attach|resume|end` and `metash sessions`: interactive CLI sessions that
//! last (seed 003's control-plane side, issue 35). A session is a record in the store
//! (`metash_store::cp_sessions`); its CLI runs confined in a tmux window, started there by
//! metash's own launcher (`metash session run ID`, [`super::session_run`]), which records the
//! continuation key once the CLI has one and the exit status when it ends.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context as _, Result};
use clap::Subcommand;
use metash_harness::tmux::{Tmux, Window};
use metash_harness::HarnessError;
use metash_protocol::{sanitize_line, HarnessContinuationRef};
use metash_store::cp_sessions::{CpSession, SessionEvent, SessionStatus, Terminal, TerminalHost};
use metash_store::Store;
use serde_json::json;

use super::host::HostArgs;
use metash_host::session_liveness::{self as liveness, reconcile};

use super::session_env;
use super::session_run;
use super::Ctx;

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Interactive CLI sessions of a role, in tmux, confined like its spawns: start, attach,
    /// resume, end.
    Session {
        #[command(subcommand)]
        command: SessionSub,
    },
    /// Every interactive session: status, role, frontend, provider, continuation key, terminal.
    Sessions {},
}

#[derive(Debug, Subcommand)]
pub enum SessionSub {
    /// Start the role's CLI interactively under the role's sandbox, in a new tmux window; prints
    /// the session id and the tmux target (`{"id", "tmux_target"}` with --json).
    Start {
        /// A CLI role of .meta/config.toml (claude-code, agent-sdk, codex-cli, pi-sdk).
        #[arg(long)]
        role: String,
        /// Work in this task's worktree (`.meta/worktrees/TASK`).
        #[arg(long, conflicts_with = "workdir")]
        task: Option<String>,
        /// Work in this directory (default: a worktree made for the session,
        /// `.meta/worktrees/session-ID` on branch `metash/session/ID`; the project itself when it
        /// has no git commit).
        #[arg(long)]
        workdir: Option<PathBuf>,
        #[command(flatten)]
        host: HostArgs,
    },
    /// Attach this terminal to a running session (detaching leaves it running).
    Attach {
        /// The session id.
        id: String,
    },
    /// Start the CLI of an exited session again, on the same conversation (its continuation key).
    Resume {
        /// The session id.
        id: String,
        #[command(flatten)]
        host: HostArgs,
    },
    /// End a session: its window is closed and its CLI stopped; it cannot be resumed.
    End {
        /// The session id.
        id: String,
    },
    /// The launcher that runs in the session's window (started by `start` and `resume`).
    #[command(hide = true)]
    Run {
        /// The session id.
        id: String,
        #[command(flatten)]
        host: HostArgs,
    },
}

pub fn run(cmd: SessionCommand, ctx: &Ctx) -> Result<ExitCode> {
    match cmd {
        SessionCommand::Sessions {} => list(ctx),
        SessionCommand::Session { command } => match command {
            SessionSub::Start {
                role,
                task,
                workdir,
                host,
            } => start(ctx, &role, task.as_deref(), workdir, &host),
            SessionSub::Attach { id } => attach(ctx, &id),
            SessionSub::Resume { id, host } => resume(ctx, &id, &host),
            SessionSub::End { id } => end(ctx, &id),
            SessionSub::Run { id, host } => session_run::launcher(ctx, &id, &host),
        },
    }
}

/// Where sessions' own directories live (outside the project's `.meta/`, which no sandbox may
/// see): `METASH_SESSIONS_DIR`, else `$XDG_STATE_HOME/metash/sessions`, else
/// `~/.local/state/metash/sessions`. They outlive a reboot, so a session can be resumed after
/// one.
fn sessions_dir() -> Result<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    var("METASH_SESSIONS_DIR")
        .or_else(|| var("XDG_STATE_HOME").map(|d| d.join("metash/sessions")))
        .or_else(|| var("HOME").map(|h| h.join(".local/state/metash/sessions")))
        .context("no directory for sessions: set METASH_SESSIONS_DIR, XDG_STATE_HOME or HOME")
}

/// The session's working directory: the task's worktree (`--task`), the directory named
/// (`--workdir`), or by default a worktree made for the session, `.meta/worktrees/session-ID` on
/// its own branch `metash/session/ID` from `HEAD`, so an interactive agent edits a branch of its
/// own, never the user's checkout unless told so (`--workdir .`). A project that is not a git
/// repository with a commit has no branch to give: the session works in the project itself.
fn workdir_of(
    ctx: &Ctx,
    task: Option<&str>,
    workdir: Option<PathBuf>,
    id: &str,
) -> Result<PathBuf> {
    if let Some(t) = task {
        metash_store::names::check(t, "task id")?;
        let dir = ctx.workspace.join(".meta/worktrees").join(t);
        if !dir.is_dir() {
            bail!(
                "task `{t}` has no worktree ({}); `metash run` makes one when the task starts",
                dir.display()
            );
        }
        return Ok(dir);
    }
    if let Some(dir) = workdir {
        return std::path::absolute(&dir).with_context(|| format!("workdir {}", dir.display()));
    }
    session_worktree(&ctx.workspace, id)
}

/// Makes the session's own worktree (see [`workdir_of`]) through the orchestrator's git, which
/// checks the repository's executable configuration against what the user trusted first and
/// runs no hook; the project itself when there is no commit to branch from.
fn session_worktree(workspace: &Path, id: &str) -> Result<PathBuf> {
    let git = metash_orchestrator::git::Git::new(workspace);
    let Ok(Some(head)) = git.resolve(workspace, "HEAD") else {
        return Ok(workspace.to_path_buf());
    };
    git.check_trust()?;
    let dir = workspace
        .join(".meta/worktrees")
        .join(format!("session-{id}"));
    git.ensure_worktree(&dir, &format!("metash/session/{id}"), &head)?;
    Ok(dir)
}

fn start(
    ctx: &Ctx,
    role: &str,
    task: Option<&str>,
    workdir: Option<PathBuf>,
    args: &HostArgs,
) -> Result<ExitCode> {
    let host = args.open(ctx)?;
    let (_, frontend) = host.session_role(role)?;
    // Asked here, at the caller's terminal, before any window opens.
    host.session_consent(role)?;
    let id = metash_store::cp_sessions::new_id();
    let workdir = host.check_workdir(&workdir_of(ctx, task, workdir, &id)?)?;
    let home = sessions_dir()?.join(&id);
    create_private_dir(&home)?;
    // Claude Code takes its conversation's id up front: the key is known before it runs.
    let key = metash_harness::observe::key_up_front(frontend);
    let now = chrono::Utc::now();
    let record = CpSession {
        id: id.clone(),
        role: Some(role.to_string()),
        frontend,
        provider: frontend.provider(),
        continuation_key: key,
        workdir,
        home: Some(home),
        terminal: None,
        process: None,
        status: SessionStatus::Running,
        created_at: now,
        updated_at: now,
        exit_status: None,
        error: None,
        runs: 1,
    };
    let store = host.store();
    store.cp_sessions().create(&record)?;
    let opened = open_launcher(ctx, store, &record, args, SessionEvent::Observed)?;
    print_started(ctx, &opened)
}

/// Opens the session's window running metash's launcher and records where it is. A window that
/// cannot be opened leaves the session `exited` with the reason.
fn open_launcher(
    ctx: &Ctx,
    store: &Store,
    record: &CpSession,
    args: &HostArgs,
    event: SessionEvent,
) -> Result<CpSession> {
    let tmux = Tmux::from_env();
    let argv = session_run::launcher_argv(ctx, &record.id, args)?;
    let (env, secrets) = session_env::split(store, record.role.as_deref());
    let home = record
        .home
        .as_deref()
        .context("the session has no directory")?;
    let fifo = session_env::fifo_path(home);
    session_env::make_fifo(&fifo)?;
    let cwd = record.workdir.to_string_lossy();
    let opened = tmux
        .open_window(&argv, &cwd, &env, &format!("metash-{}", record.id))
        .map_err(anyhow::Error::from)
        .and_then(|w| {
            session_env::hand_over(&fifo, &secrets, session_env::HAND_OVER_WITHIN).map(|()| w)
        });
    let window = match opened {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::remove_file(&fifo);
            let why = format!("the session could not be started in tmux: {e:#}");
            store
                .cp_sessions()
                .update(&record.id, SessionEvent::Exit, |r| {
                    r.status = SessionStatus::Exited;
                    r.error = Some(why.clone());
                    Ok(())
                })?;
            bail!(why);
        }
    };
    Ok(record_window(store, &record.id, &tmux, &window, event)?)
}

/// Records the window and its process on the session.
pub(crate) fn record_window(
    store: &Store,
    id: &str,
    tmux: &Tmux,
    window: &Window,
    event: SessionEvent,
) -> metash_store::Result<CpSession> {
    let process = liveness::process_ref(window.pane_pid);
    store.cp_sessions().update(id, event, |r| {
        r.terminal = Some(Terminal {
            host: TerminalHost::Tmux,
            target: window.target.clone(),
            window_id: Some(window.window_id.clone()),
            socket: tmux.socket.clone(),
        });
        // The launcher may already have ended (a CLI that failed at once) and said so.
        if r.status.is_live() {
            r.process = Some(process);
        }
        Ok(())
    })
}

fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

fn print_started(ctx: &Ctx, s: &CpSession) -> Result<ExitCode> {
    let target = s.terminal.as_ref().map(|t| t.target.clone());
    if ctx.json {
        let doc = json!({"id": s.id, "tmux_target": target, "status": s.status,
            "provider": s.provider, "frontend": s.frontend,
            "continuation_key": s.continuation_key});
        println!("{}", serde_json::to_string(&doc)?);
    } else {
        println!("{}", s.id);
        eprintln!(
            "metash: session {} runs in tmux {}; `metash session attach {}` to see it",
            s.id,
            target.as_deref().unwrap_or("?"),
            s.id
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The sessions as they are: a record that claims a live process whose process is gone (a
/// killed tmux server, a reboot) is marked `exited` first.
fn list(ctx: &Ctx) -> Result<ExitCode> {
    let store = Store::open(&ctx.workspace)?;
    let sessions = reconcile(&store)?;
    if ctx.json {
        println!("{}", serde_json::to_string(&sessions)?);
        return Ok(ExitCode::SUCCESS);
    }
    if sessions.is_empty() {
        eprintln!("no sessions (start one: metash session start --role ROLE)");
    }
    for s in &sessions {
        println!(
            "{}  {:<8}  {}  {}  {}  key={}  tmux={}  {}{}",
            sanitize_line(&s.id),
            s.status.as_str(),
            sanitize_line(s.role.as_deref().unwrap_or("-")),
            s.frontend.as_str(),
            s.provider.as_str(),
            sanitize_line(s.continuation_key.as_deref().unwrap_or("-")),
            sanitize_line(s.terminal.as_ref().map_or("-", |t| t.target.as_str())),
            s.updated_at.format("%Y-%m-%d %H:%M:%S"),
            s.error
                .as_deref()
                .map(|e| format!("  ({})", sanitize_line(e)))
                .unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The session, after [`reconcile`], or an error naming it.
fn current(store: &Store, id: &str) -> Result<CpSession> {
    reconcile(store)?
        .into_iter()
        .find(|s| s.id == id)
        .with_context(|| format!("no session `{id}` (see `metash sessions`)"))
}

fn attach(ctx: &Ctx, id: &str) -> Result<ExitCode> {
    use std::io::IsTerminal;
    let store = Store::open(&ctx.workspace)?;
    let s = current(&store, id)?;
    let (Some(term), true) = (&s.terminal, s.status.is_live()) else {
        bail!(
            "session `{id}` is {}: nothing to attach to (`metash session resume {id}` starts it again)",
            s.status.as_str()
        );
    };
    if !std::io::stdin().is_terminal() {
        bail!(
            "`metash session attach` needs a terminal (its tmux target: {})",
            term.target
        );
    }
    let tmux = Tmux {
        socket: term.socket.clone(),
    };
    let window = term
        .window_id
        .clone()
        .unwrap_or_else(|| term.target.clone());
    store.cp_sessions().update(id, SessionEvent::Attach, |r| {
        r.status = SessionStatus::Running;
        Ok(())
    })?;
    let _ = tmux.command(["select-window", "-t", &window]).status();
    let args = tmux.attach_args(&window);
    let status = tmux
        .command(&args)
        .stdin(std::process::Stdio::inherit())
        .status()
        .context("running tmux")?;
    if !status.success() {
        bail!("tmux could not attach to {window}");
    }
    // Inside tmux the client switched to the window and tmux returned at once: still attached.
    if args.first().is_some_and(|v| v == "switch-client") {
        return Ok(ExitCode::SUCCESS);
    }
    // Back here: the person detached, or the session ended while attached.
    if current(&store, id)?.status.is_live() {
        store.cp_sessions().update(id, SessionEvent::Detach, |r| {
            r.status = SessionStatus::Detached;
            Ok(())
        })?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A refusal with its stable code, as JSON on stdout (as `metash harness` does), exit code 7.
fn refused(err: &HarnessError) -> Result<ExitCode> {
    let doc = json!({"error": {"code": err.code(), "message": err.to_string()}});
    println!("{}", serde_json::to_string(&doc)?);
    eprintln!("metash: {err}");
    Ok(crate::exit::Exit::Refused.into())
}

fn resume(ctx: &Ctx, id: &str, args: &HostArgs) -> Result<ExitCode> {
    let host = args.open(ctx)?;
    let store = host.store();
    let s = current(store, id)?;
    match s.status {
        SessionStatus::Exited => {}
        SessionStatus::Ended => bail!("session `{id}` was ended; start a new one"),
        _ => bail!("session `{id}` is still running: `metash session attach {id}`"),
    }
    let role = s
        .role
        .as_deref()
        .with_context(|| format!("session `{id}` has no role to resume with"))?;
    if s.home.is_none() {
        bail!(
            "session `{id}` was opened by `metash attach` from a spec: resume it with a spec \
             of its own (`metash harness invocation --interactive --continuation-key KEY`)"
        );
    }
    let (_, frontend) = host.session_role(role)?;
    let Some(key) = s.continuation_key.clone() else {
        return refused(&HarnessError::ContinuationNotFound(format!(
            "session `{id}` has no continuation key: its CLI never recorded a conversation"
        )));
    };
    // Provider-typed: the role may have changed frontend since; a key means nothing elsewhere.
    let continuation = HarnessContinuationRef {
        provider: s.provider,
        key: Some(key),
    };
    if let Err(e) = metash_harness::check_continuation(frontend, Some(&continuation)) {
        return refused(&e);
    }
    host.session_consent(role)?;
    let record = store.cp_sessions().update(id, SessionEvent::Resume, |r| {
        r.status = SessionStatus::Running;
        r.frontend = frontend;
        r.runs += 1;
        r.exit_status = None;
        r.error = None;
        r.process = None;
        Ok(())
    })?;
    let opened = open_launcher(ctx, store, &record, args, SessionEvent::Observed)?;
    print_started(ctx, &opened)
}

fn end(ctx: &Ctx, id: &str) -> Result<ExitCode> {
    let store = Store::open(&ctx.workspace)?;
    let s = current(&store, id)?;
    if s.status == SessionStatus::Ended {
        eprintln!("metash: session {id} was already ended");
        return Ok(ExitCode::SUCCESS);
    }
    if let (true, Some(term)) = (s.status.is_live(), &s.terminal) {
        let tmux = Tmux {
            socket: term.socket.clone(),
        };
        if let Some(w) = &term.window_id {
            tmux.kill_window(w)?;
        }
        liveness::wait_gone(s.process.as_ref(), std::time::Duration::from_secs(10));
    }
    store.cp_sessions().update(id, SessionEvent::End, |r| {
        r.status = SessionStatus::Ended;
        Ok(())
    })?;
    if ctx.json {
        println!("{}", json!({"id": id, "status": "ended"}));
    } else {
        eprintln!("metash: session {id} ended");
    }
    Ok(ExitCode::SUCCESS)
}

/// `metash attach`: the window it opened, recorded as a session (no directory of metash's: the
/// spec's CLI keeps its state where the spec says, so a key not in the spec is not observed).
pub(crate) fn record_attached(
    ctx: &Ctx,
    spec: &metash_protocol::ProcessInvocationSpec,
    role: Option<&str>,
    tmux: &Tmux,
    window: &Window,
) -> Result<()> {
    let store = Store::open(&ctx.workspace)?;
    let id = metash_store::cp_sessions::new_id();
    let now = chrono::Utc::now();
    let record = CpSession {
        id: id.clone(),
        role: role.map(str::to_string),
        frontend: spec.frontend,
        provider: spec.provider,
        continuation_key: spec.continuation.as_ref().and_then(|c| c.key.clone()),
        workdir: PathBuf::from(&spec.cwd),
        home: None,
        terminal: None,
        process: None,
        status: SessionStatus::Running,
        created_at: now,
        updated_at: now,
        exit_status: None,
        error: None,
        runs: 1,
    };
    store.cp_sessions().create(&record)?;
    record_window(&store, &id, tmux, window, SessionEvent::Observed)?;
    eprintln!("metash: recorded as session {id} (`metash sessions`)");
    Ok(())
}
