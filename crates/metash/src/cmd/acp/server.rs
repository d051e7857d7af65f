//! The connection: newline-delimited JSON-RPC on stdin/stdout, the editor's sessions, and the
//! requests metash sends the editor (permission questions, file reads) waiting for their answers.
//! Each prompt runs on its own thread, so `session/cancel` and the answers to metash's own
//! requests are read while it runs.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use metash_harness::acp::wire::{self, agent, method, Incoming, RpcError};
use serde_json::{json, Value};

use super::conn::{Cancel, Config, Conn, Mode, Session};
use super::{prompt, turn};

/// JSON-RPC error code for a `cwd` that is not a metash project (an application error).
pub(super) const NOT_A_PROJECT: i64 = -32000;

/// Reads the editor's messages until stdin ends; on the end, running prompts are cancelled.
pub(super) fn serve(config: Config) -> anyhow::Result<()> {
    let conn = Arc::new(Conn::new());
    let mut sessions: HashMap<String, Arc<Session>> = HashMap::new();
    let mut threads = Vec::new();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Some(msg) = wire::classify(&line?) else {
            continue;
        };
        match msg {
            Incoming::Response { id, result } => conn.answered(&id, result),
            Incoming::Notification { method, params } => {
                if method == method::SESSION_CANCEL {
                    if let Some(s) = session_of(&sessions, &params) {
                        s.cancel.cancel();
                    }
                }
            }
            Incoming::Request { id, method, params } => {
                if method == method::SESSION_PROMPT {
                    threads.push(start_prompt(&conn, &config, &sessions, id, params));
                } else {
                    let answer = handle(&conn, &mut sessions, &method, &params);
                    conn.send(&match answer {
                        Ok(v) => wire::result(&id, &v),
                        Err(e) => wire::error(&id, e.code, &e.message),
                    });
                }
            }
        }
    }
    for s in sessions.values() {
        s.cancel.cancel();
    }
    conn.drop_waiting();
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

fn session_of(sessions: &HashMap<String, Arc<Session>>, params: &Value) -> Option<Arc<Session>> {
    let id = params.get("sessionId")?.as_str()?;
    sessions.get(id).cloned()
}

fn rpc_error(code: i64, message: impl Into<String>) -> RpcError {
    RpcError {
        code,
        message: message.into(),
        data: None,
    }
}

/// Answers every request but `session/prompt`.
fn handle(
    conn: &Conn,
    sessions: &mut HashMap<String, Arc<Session>>,
    name: &str,
    params: &Value,
) -> Result<Value, RpcError> {
    match name {
        method::INITIALIZE => {
            let offered = params
                .pointer("/clientCapabilities/fs/readTextFile")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            conn.fs_read.store(offered, Ordering::Relaxed);
            Ok(agent::initialize_result(
                "metash",
                env!("CARGO_PKG_VERSION"),
            ))
        }
        agent::AUTHENTICATE => Ok(json!({})),
        method::SESSION_NEW => {
            let s = new_session(params)?;
            let modes = Mode::ALL.map(Mode::describe);
            let answer = agent::new_session_result(&s.id, s.mode().describe().id, &modes);
            sessions.insert(s.id.clone(), Arc::new(s));
            Ok(answer)
        }
        agent::SESSION_SET_MODE => {
            let session = session_of(sessions, params)
                .ok_or_else(|| rpc_error(wire::INVALID_PARAMS, "no such session"))?;
            let asked = params.get("modeId").and_then(Value::as_str);
            match asked.and_then(Mode::from_id) {
                Some(m) => {
                    session.set_mode(m);
                    Ok(json!({}))
                }
                None => Err(rpc_error(
                    wire::INVALID_PARAMS,
                    format!(
                        "unknown mode `{}`: metash offers `turn` and `run`",
                        asked.unwrap_or_default()
                    ),
                )),
            }
        }
        other => Err(rpc_error(
            wire::METHOD_NOT_FOUND,
            format!("metash acp does not offer `{other}`"),
        )),
    }
}

/// Sessions made so far (their ids are unique in this process).
static SESSIONS: AtomicU64 = AtomicU64::new(1);

/// A session in `cwd`, which must be an absolute path to a metash project.
fn new_session(params: &Value) -> Result<Session, RpcError> {
    let cwd = params
        .get("cwd")
        .and_then(Value::as_str)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .ok_or_else(|| rpc_error(wire::INVALID_PARAMS, "`cwd` must be an absolute path"))?;
    if let Err(e) = metash_store::Store::open(&cwd) {
        return Err(rpc_error(
            NOT_A_PROJECT,
            format!("not a metash project: {e}"),
        ));
    }
    Ok(Session {
        id: format!(
            "metash-{}-{}",
            std::process::id(),
            SESSIONS.fetch_add(1, Ordering::Relaxed)
        ),
        cwd,
        cancel: Arc::new(Cancel::default()),
        busy: AtomicBool::new(false),
        mode: std::sync::Mutex::new(Mode::default()),
    })
}

/// Runs a prompt on its own thread; its answer is sent when the turn ends.
fn start_prompt(
    conn: &Arc<Conn>,
    config: &Config,
    sessions: &HashMap<String, Arc<Session>>,
    id: Value,
    params: Value,
) -> std::thread::JoinHandle<()> {
    let conn = Arc::clone(conn);
    let config = config.clone();
    let session = session_of(sessions, &params);
    std::thread::spawn(move || {
        let Some(session) = session else {
            conn.send(&wire::error(&id, wire::INVALID_PARAMS, "no such session"));
            return;
        };
        if session.busy.swap(true, Ordering::SeqCst) {
            conn.send(&wire::error(
                &id,
                wire::INVALID_PARAMS,
                "this session already runs a prompt",
            ));
            return;
        }
        let ran = match session.mode() {
            Mode::Turn => turn::run(&conn, &config, &session, &params),
            Mode::Run => prompt::run(&conn, &config, &session, &params),
        };
        let line = match ran {
            Ok(stop) => wire::result(&id, &agent::prompt_result(stop)),
            Err(e) => wire::error(&id, wire::INTERNAL_ERROR, &format!("{e:#}")),
        };
        session.busy.store(false, Ordering::SeqCst);
        conn.send(&line);
    })
}
