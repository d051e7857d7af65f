//! metash as an ACP client: starts the agent (confined by the caller's [`Confiner`]), speaks
//! JSON-RPC 2.0 over its stdin and stdout, one JSON object per line, and runs one prompt turn:
//! `initialize`, `session/new` (the worktree as `cwd`), `session/prompt`, and `session/cancel`
//! when the deadline passes or the caller cancels. The agent's requests are answered by the
//! caller's [`AcpHost`]: permission questions go to metash's consent, file reads and writes are
//! the host's to allow or refuse. `terminal/*` is declined in `initialize` and refused if asked.
//!
//! Continuity (seed 003): when the agent advertises `loadSession`, the ACP session id is the
//! turn's continuation key ([`AcpOutcome::continuation`]); a later turn whose spec carries that
//! key (`ProcessInvocationSpec::continuation`) continues the session with `session/load`
//! instead of `session/new`. The history the agent replays while loading is not the new turn's
//! output, so it is not reported.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use metash_protocol::{HarnessContinuationRef, ProcessInvocationSpec};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::map::{AcpEvent, Mapper, Subject};
use super::wire::{self, method, Incoming, RpcError, StopReason};
use crate::confine::Confiner;
use crate::error::{HarnessError, Result};

/// How long an agent has to end its turn after `session/cancel` before its tree is killed.
pub const CANCEL_GRACE: Duration = Duration::from_secs(3);
/// How long an agent has to exit once its stdin closed and it was asked to end (`SIGTERM`)
/// before its tree is killed.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// What the client asks of metash while the agent runs. Each call may block (a person may be
/// asked); the client runs it off the connection's task.
pub trait AcpHost: Send + Sync {
    /// Whether the tool use `subject` may go ahead (metash's consent: grants, the policy file,
    /// `--yes-to`, a person).
    fn permission(&self, subject: &Subject) -> bool;
    /// `fs/read_text_file`: the whole text of `path`, or why it is refused.
    ///
    /// # Errors
    /// A message for the agent (the path is outside what it may read, or cannot be read).
    fn read_text_file(&self, path: &str) -> std::result::Result<String, String>;
    /// `fs/write_text_file`: writes `content` to `path`, or says why not.
    ///
    /// # Errors
    /// A message for the agent (the path is outside what it may write, or cannot be written).
    fn write_text_file(&self, path: &str, content: &str) -> std::result::Result<(), String>;
}

/// One prompt turn of an ACP agent.
pub struct AcpTurn<'a> {
    /// The agent's command line, working directory (the worktree, also the session's `cwd`) and
    /// environment delta.
    pub spec: &'a ProcessInvocationSpec,
    pub confiner: Option<&'a dyn Confiner>,
    pub prompt: &'a str,
    /// `session/new`'s `mcpServers`.
    pub mcp_servers: Vec<Value>,
    pub timeout: Option<Duration>,
    pub cancel: &'a CancellationToken,
    pub host: Arc<dyn AcpHost>,
    /// The caller keeps the session to continue it in a later turn: an agent that needs a
    /// moment to save it gets that moment before it is ended ([`settle_time`]).
    pub keep_session: bool,
}

/// How the turn ended.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// The agent answered `session/prompt` with this stop reason.
    Stopped(StopReason),
    /// The deadline passed: `session/cancel` was sent, then the tree killed.
    TimedOut,
    /// The caller cancelled (a budget, a person): `session/cancel`, then the tree killed.
    Cancelled,
    /// The conversation broke (the agent exited, refused a request, answered nonsense).
    Failed(String),
}

/// What the turn produced.
#[derive(Debug, Clone)]
pub struct AcpOutcome {
    pub end: End,
    /// The ACP session id (the agent's continuation key, when it can load sessions).
    pub session_id: Option<String>,
    /// The session id as the role's provider-typed continuation key (seed 003), when the agent
    /// advertised `loadSession`: a later turn given it continues this session.
    pub continuation: Option<HarnessContinuationRef>,
    /// This turn continued the session of the spec's continuation key (`session/load`
    /// succeeded); false when it started a new one (no key, an agent that cannot load, or a
    /// key the agent no longer knows).
    pub resumed: bool,
    /// Why the spec's continuation key was not continued (`None`: there was none, or it was):
    /// the agent does not advertise `loadSession`, refused `session/load` (its answer), or the
    /// key is another provider's.
    pub fallback: Option<String>,
    /// The agent's answer: its message chunks, joined.
    pub text: String,
    /// The last 8 KiB of the agent's stderr.
    pub stderr_tail: String,
}

/// Runs one prompt turn; every event goes to `on_event` as it happens.
///
/// # Errors
/// `ProgramNotFound` or `Io` when the agent cannot be started; `HarnessFailed` naming the
/// sandbox step when the confinement cannot be prepared (nothing runs then). A turn that
/// started and failed is an `Ok` outcome with [`End::Failed`].
pub async fn run_turn(
    turn: AcpTurn<'_>,
    on_event: &mut (dyn FnMut(AcpEvent) + Send),
) -> Result<AcpOutcome> {
    let mut std_cmd = command(turn.spec)?;
    let _guard = turn
        .confiner
        .map(|c| c.confine(turn.spec, &mut std_cmd))
        .transpose()
        .map_err(|e| HarnessError::HarnessFailed(format!("sandbox: {e}")))?;
    let mut cmd = tokio::process::Command::from(std_cmd);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    #[cfg(unix)]
    if turn.confiner.is_none() {
        cmd.process_group(0);
    }
    let mut child = cmd.spawn().map_err(|e| spawn_error(turn.spec, e))?;
    let pid = child.id();
    if let (Some(c), Some(pid)) = (turn.confiner, pid) {
        c.spawned(pid);
    }
    let stderr = tokio::spawn(crate::runner::stderr_tail(child.stderr.take()));
    let (out, incoming) = pipes(child.stdin.take(), child.stdout.take());
    let mut conn = Conn::new(out, incoming, turn.host, on_event);
    let resume = match resume_key(turn.spec) {
        Ok(key) => key,
        Err(why) => {
            conn.fallback = Some(why);
            None
        }
    };
    let end = conn
        .drive(
            &turn.spec.cwd,
            turn.prompt,
            &turn.mcp_servers,
            resume,
            turn.timeout,
            turn.cancel,
        )
        .await;
    let (session_id, text) = (conn.session.clone(), std::mem::take(&mut conn.text));
    let (can_load, resumed, fallback) = (conn.can_load, conn.resumed, conn.fallback.take());
    let agent = conn.agent.take();
    conn.stopping.cancel();
    drop(conn);
    // A session to continue must be on disk before the agent is asked to end.
    let keeps = turn.keep_session && can_load && session_id.is_some();
    let settle = (keeps && matches!(end, End::Stopped(_))).then(|| settle_time(agent.as_deref()));
    end_tree(&mut child, pid, settle).await;
    let stderr_tail = tokio::time::timeout(Duration::from_secs(2), stderr)
        .await
        .ok()
        .and_then(|r| r.ok())
        .unwrap_or_default();
    let continuation = session_id
        .clone()
        .filter(|_| can_load)
        .map(|key| HarnessContinuationRef {
            provider: turn.spec.provider,
            key: Some(key),
        });
    Ok(AcpOutcome {
        end,
        session_id,
        continuation,
        resumed,
        fallback,
        text,
        stderr_tail,
    })
}

/// Ends the agent's tree once the turn is over, after `settle` (time to save its session). Its
/// stdin is closed by then; claude-code-acp and codex-acp do not exit on that alone (each would
/// idle out the whole grace, a second of every turn), so the tree is asked to end at once
/// (`SIGTERM`), and killed if it has not within the grace.
async fn end_tree(child: &mut tokio::process::Child, pid: Option<u32>, settle: Option<Duration>) {
    if let Some(d) = settle {
        tokio::time::sleep(d).await;
    }
    signal_group(pid, Signal::Term);
    let _ = tokio::time::timeout(EXIT_GRACE, child.wait()).await;
    signal_group(pid, Signal::Kill);
    let _ = child.wait().await;
}

/// How long an agent that can load sessions is given, after a turn that ended, to write the
/// session to its store before it is asked to end (`SIGTERM` ends it at once, and in the
/// sandbox its helpers with it). Claude Code, inside claude-code-acp, appends its transcript on
/// a 100 ms timer: ended sooner, the session file stays empty and `session/load` cannot find the
/// conversation (docs/acp.md). codex-acp writes its rollout before it answers the prompt.
fn settle_time(agent: Option<&str>) -> Duration {
    match agent {
        Some("@zed-industries/claude-code-acp") => Duration::from_millis(250),
        _ => Duration::ZERO,
    }
}

/// The key to continue: the spec's, when it is of the spec's provider (a key is only ever
/// reused within its provider, seed 003); why not, when it is another's.
fn resume_key(spec: &ProcessInvocationSpec) -> std::result::Result<Option<&str>, String> {
    match &spec.continuation {
        Some(c) if c.provider != spec.provider => Err(format!(
            "the continuation key is {}'s, the agent's provider is {}",
            c.provider.as_str(),
            spec.provider.as_str()
        )),
        Some(c) => Ok(c.key.as_deref()),
        None => Ok(None),
    }
}

/// Why waiting for an answer stopped.
enum Wait {
    /// The agent's stdout closed (it exited).
    Closed,
    Rpc(RpcError),
}

impl Wait {
    fn explain(self, what: &str) -> String {
        match self {
            Wait::Closed => format!("the agent exited before answering {what}"),
            Wait::Rpc(e) => format!("the agent refused {what}: {e}"),
        }
    }
}

/// The connection: lines out, classified messages in, answers to the agent's requests from
/// tasks that report their events back here.
struct Conn<'e> {
    out: mpsc::UnboundedSender<String>,
    incoming: mpsc::Receiver<Incoming>,
    events_tx: mpsc::UnboundedSender<AcpEvent>,
    events: mpsc::UnboundedReceiver<AcpEvent>,
    host: Arc<dyn AcpHost>,
    mapper: Mapper,
    /// Cancelled when the turn is being cancelled: open permission questions answer
    /// `cancelled`, as ACP asks of a client.
    stopping: CancellationToken,
    next_id: u64,
    session: Option<String>,
    /// The agent advertised `loadSession`.
    can_load: bool,
    /// The agent's `agentInfo.name` from `initialize`, when it gave one.
    agent: Option<String>,
    /// The session is the one the spec's continuation key named, loaded.
    resumed: bool,
    /// Why a continuation key given was not continued.
    fallback: Option<String>,
    /// `session/load` is replaying the session's history: its updates are not this turn's.
    replaying: bool,
    prompt_id: Option<u64>,
    text: String,
    on_event: &'e mut (dyn FnMut(AcpEvent) + Send),
}

impl<'e> Conn<'e> {
    fn new(
        out: mpsc::UnboundedSender<String>,
        incoming: mpsc::Receiver<Incoming>,
        host: Arc<dyn AcpHost>,
        on_event: &'e mut (dyn FnMut(AcpEvent) + Send),
    ) -> Self {
        let (events_tx, events) = mpsc::unbounded_channel();
        Self {
            out,
            incoming,
            events_tx,
            events,
            host,
            mapper: Mapper::default(),
            stopping: CancellationToken::new(),
            next_id: 0,
            session: None,
            can_load: false,
            agent: None,
            resumed: false,
            fallback: None,
            replaying: false,
            prompt_id: None,
            text: String::new(),
            on_event,
        }
    }

    /// The turn, bounded by the deadline and the caller's cancellation.
    async fn drive(
        &mut self,
        cwd: &str,
        prompt: &str,
        mcp: &[Value],
        resume: Option<&str>,
        timeout: Option<Duration>,
        cancel: &CancellationToken,
    ) -> End {
        let sleep = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        let stopped = tokio::select! {
            r = self.converse(cwd, prompt, mcp, resume) => return match r {
                Ok(reason) => {
                    self.emit(AcpEvent::Stopped { reason });
                    End::Stopped(reason)
                }
                Err(why) => End::Failed(why),
            },
            () = sleep => End::TimedOut,
            () = cancel.cancelled() => End::Cancelled,
        };
        self.cancel_prompt().await;
        stopped
    }

    /// `initialize`, `session/load` or `session/new`, `session/prompt`: the stop reason, or
    /// why not.
    async fn converse(
        &mut self,
        cwd: &str,
        prompt: &str,
        mcp: &[Value],
        resume: Option<&str>,
    ) -> std::result::Result<StopReason, String> {
        let init = self
            .call(method::INITIALIZE, wire::initialize_params())
            .await
            .map_err(|w| w.explain("initialize"))?;
        let version = init["protocolVersion"].as_u64();
        if version != Some(wire::PROTOCOL_VERSION) {
            return Err(format!(
                "the agent speaks ACP protocol version {version:?}; metash speaks {}",
                wire::PROTOCOL_VERSION
            ));
        }
        self.can_load = init["agentCapabilities"]["loadSession"].as_bool() == Some(true);
        self.agent = init["agentInfo"]["name"].as_str().map(str::to_string);
        if resume.is_some() && !self.can_load {
            self.fallback = Some("the agent does not advertise loadSession".into());
        }
        let sid = match resume.filter(|_| self.can_load) {
            Some(key) if self.load(key, cwd, mcp).await => key.to_string(),
            _ => self.new_session(cwd, mcp).await?,
        };
        self.emit(AcpEvent::Session {
            id: sid.clone(),
            loaded: self.resumed,
            fallback: self.fallback.clone(),
        });
        let id = self.send(method::SESSION_PROMPT, &wire::prompt_params(&sid, prompt));
        self.prompt_id = Some(id);
        let r = self
            .wait_response(id)
            .await
            .map_err(|w| w.explain("session/prompt"))?;
        serde_json::from_value::<wire::PromptResponse>(r)
            .map(|p| p.stop_reason)
            .map_err(|e| format!("session/prompt answered without a stop reason: {e}"))
    }

    /// `session/new`: the new session's id, or why not.
    async fn new_session(
        &mut self,
        cwd: &str,
        mcp: &[Value],
    ) -> std::result::Result<String, String> {
        let new = self
            .call(method::SESSION_NEW, wire::new_session_params(cwd, mcp))
            .await
            .map_err(|w| w.explain("session/new"))?;
        let sid = serde_json::from_value::<wire::NewSessionResponse>(new)
            .map_err(|e| format!("session/new answered without a session id: {e}"))?
            .session_id;
        self.session = Some(sid.clone());
        Ok(sid)
    }

    /// `session/load` of `key` in `cwd`, its replayed history dropped: whether the agent
    /// loaded it. A key it no longer knows (its session store is gone) is no error: the turn
    /// goes on in a new session, and [`AcpOutcome::resumed`] says so.
    async fn load(&mut self, key: &str, cwd: &str, mcp: &[Value]) -> bool {
        self.session = Some(key.to_string());
        self.replaying = true;
        let params = json!({"sessionId": key, "cwd": cwd, "mcpServers": mcp});
        let answer = self.call(wire::agent::SESSION_LOAD, params).await;
        self.replaying = false;
        let loaded = answer.is_ok();
        if let Err(w) = answer {
            self.session = None;
            self.fallback = Some(w.explain("session/load"));
        }
        self.resumed = loaded;
        loaded
    }

    /// `session/cancel`, open permission questions answered `cancelled`, and a short wait for
    /// the agent to end its turn (its events until then still count).
    async fn cancel_prompt(&mut self) {
        self.stopping.cancel();
        let (Some(sid), Some(id)) = (self.session.clone(), self.prompt_id) else {
            return;
        };
        let line = wire::notification(method::SESSION_CANCEL, &wire::cancel_params(&sid));
        let _ = self.out.send(line);
        if let Ok(Ok(r)) = tokio::time::timeout(CANCEL_GRACE, self.wait_response(id)).await {
            // The agent ended its turn as asked (its stop reason should be `cancelled`).
            if let Ok(p) = serde_json::from_value::<wire::PromptResponse>(r) {
                self.emit(AcpEvent::Stopped {
                    reason: p.stop_reason,
                });
            }
        }
    }

    fn send(&mut self, method: &str, params: &Value) -> u64 {
        self.next_id += 1;
        let _ = self.out.send(wire::request(self.next_id, method, params));
        self.next_id
    }

    async fn call(&mut self, method: &str, params: Value) -> std::result::Result<Value, Wait> {
        let id = self.send(method, &params);
        self.wait_response(id).await
    }

    /// Handles everything the agent sends until the answer to request `id` arrives.
    /// Cancellation-safe: a message is taken from the channel only when it is handled.
    async fn wait_response(&mut self, id: u64) -> std::result::Result<Value, Wait> {
        loop {
            tokio::select! {
                m = self.incoming.recv() => match m {
                    None => return Err(Wait::Closed),
                    Some(Incoming::Response { id: rid, result }) if rid == json!(id) => {
                        return result.map_err(Wait::Rpc);
                    }
                    Some(other) => self.dispatch(other),
                },
                Some(ev) = self.events.recv() => self.emit(ev),
            }
        }
    }

    fn emit(&mut self, ev: AcpEvent) {
        if let AcpEvent::Text { text } = &ev {
            self.text.push_str(text);
        }
        (self.on_event)(ev);
    }

    fn dispatch(&mut self, m: Incoming) {
        match m {
            Incoming::Notification { method, params } if method == method::SESSION_UPDATE => {
                let Ok(n) = serde_json::from_value::<wire::SessionNotification>(params) else {
                    return;
                };
                if self.replaying || self.session.as_deref() != Some(n.session_id.as_str()) {
                    return;
                }
                for ev in self.mapper.update(n.update) {
                    self.emit(ev);
                }
            }
            Incoming::Request { id, method, params } => self.request(id, &method, params),
            // Other notifications, and answers nobody waits for any more.
            Incoming::Notification { .. } | Incoming::Response { .. } => {}
        }
    }

    /// One request of the agent, answered from a task (it may wait for a person).
    fn request(&mut self, id: Value, method: &str, params: Value) {
        let out = self.out.clone();
        let bad = |id: &Value, why: String| wire::error(id, wire::INVALID_PARAMS, &why);
        if params["sessionId"].as_str() != self.session.as_deref() {
            let _ = out.send(bad(&id, "no such session".into()));
            return;
        }
        match method {
            method::REQUEST_PERMISSION => match serde_json::from_value(params) {
                Ok(req) => self.permission(id, req),
                Err(e) => drop(out.send(bad(&id, e.to_string()))),
            },
            method::READ_TEXT_FILE => match serde_json::from_value::<wire::ReadTextFile>(params) {
                Ok(r) => self.file_task(id, move |h| {
                    h.read_text_file(&r.path)
                        .map(|t| json!({"content": wire::slice_lines(&t, r.line, r.limit)}))
                }),
                Err(e) => drop(out.send(bad(&id, e.to_string()))),
            },
            method::WRITE_TEXT_FILE => {
                match serde_json::from_value::<wire::WriteTextFile>(params) {
                    Ok(w) => self.file_task(id, move |h| {
                        h.write_text_file(&w.path, &w.content).map(|()| json!({}))
                    }),
                    Err(e) => drop(out.send(bad(&id, e.to_string()))),
                }
            }
            other => {
                let why = format!("metash does not offer {other}");
                let _ = out.send(wire::error(&id, wire::METHOD_NOT_FOUND, &why));
            }
        }
    }

    fn file_task(
        &self,
        id: Value,
        f: impl FnOnce(&dyn AcpHost) -> std::result::Result<Value, String> + Send + 'static,
    ) {
        let (host, out) = (Arc::clone(&self.host), self.out.clone());
        tokio::spawn(async move {
            let answer = tokio::task::spawn_blocking(move || f(host.as_ref()))
                .await
                .unwrap_or_else(|_| Err("metash failed the request".into()));
            let line = match answer {
                Ok(v) => wire::result(&id, &v),
                Err(why) => wire::error(&id, wire::INTERNAL_ERROR, &why),
            };
            let _ = out.send(line);
        });
    }

    /// A permission question: metash's consent decides, the matching option answers (or
    /// `cancelled` when the turn is being cancelled first).
    fn permission(&mut self, id: Value, req: wire::RequestPermission) {
        let subject = self.mapper.subject(&req);
        let (host, out, events) = (
            Arc::clone(&self.host),
            self.out.clone(),
            self.events_tx.clone(),
        );
        let stopping = self.stopping.clone();
        tokio::spawn(async move {
            let asked = subject.clone();
            let decide = tokio::task::spawn_blocking(move || host.permission(&asked));
            let allowed = tokio::select! {
                r = decide => r.unwrap_or(false),
                () = stopping.cancelled() => {
                    let _ = out.send(wire::result(&id, &wire::permission_outcome(None)));
                    return;
                }
            };
            let option_id = req.option_for(allowed).map(|o| o.option_id.clone());
            let _ = out.send(wire::result(
                &id,
                &wire::permission_outcome(option_id.as_deref()),
            ));
            let _ = events.send(AcpEvent::Permission {
                tool_call_id: subject.tool_call_id,
                kind: subject.kind,
                title: subject.title,
                allowed,
                option_id,
            });
        });
    }
}

/// The writer task (lines to the agent's stdin until every sender is gone, which closes it)
/// and the reader task (its stdout, classified, until it closes).
fn pipes(
    stdin: Option<tokio::process::ChildStdin>,
    stdout: Option<tokio::process::ChildStdout>,
) -> (mpsc::UnboundedSender<String>, mpsc::Receiver<Incoming>) {
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let Some(mut stdin) = stdin else { return };
        while let Some(mut line) = out_rx.recv().await {
            line.push('\n');
            if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
    });
    let (in_tx, in_rx) = mpsc::channel::<Incoming>(256);
    tokio::spawn(async move {
        let Some(stdout) = stdout else { return };
        let mut reader = BufReader::with_capacity(64 * 1024, stdout);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line);
                    if let Some(m) = wire::classify(text.trim_end()) {
                        if in_tx.send(m).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
    });
    (out_tx, in_rx)
}

/// The agent's `Command`: argv as given (never through a shell), its cwd, the spec's
/// environment delta, none of the terminal multiplexer's variables.
fn command(spec: &ProcessInvocationSpec) -> Result<std::process::Command> {
    let (prog, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| HarnessError::InvalidRequest("the ACP agent's command is empty".into()))?;
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args).current_dir(Path::new(&spec.cwd));
    for (k, _) in std::env::vars_os() {
        if crate::runner::is_terminal_var(&k.to_string_lossy()) {
            cmd.env_remove(&k);
        }
    }
    cmd.envs(&spec.env);
    Ok(cmd)
}

fn spawn_error(spec: &ProcessInvocationSpec, e: std::io::Error) -> HarnessError {
    let prog = spec.argv.first().cloned().unwrap_or_default();
    if e.kind() == std::io::ErrorKind::NotFound {
        HarnessError::ProgramNotFound(format!("{prog} (cwd {})", spec.cwd))
    } else {
        HarnessError::io(format!("spawn {prog}"), e)
    }
}

/// How the agent's tree is ended: asked, then forced.
#[derive(Clone, Copy)]
enum Signal {
    Term,
    Kill,
}

#[cfg(unix)]
fn signal_group(pid: Option<u32>, signal: Signal) {
    let sig = match signal {
        Signal::Term => libc::SIGTERM,
        Signal::Kill => libc::SIGKILL,
    };
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) with a negative pid signals the agent's own process group (made by
        // the confinement's setsid, or by `process_group(0)` above).
        unsafe {
            libc::kill(-pid, sig);
        }
    }
}

#[cfg(not(unix))]
fn signal_group(_: Option<u32>, _: Signal) {}
