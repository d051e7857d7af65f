//! The host's native test agent: the prompt picks a behaviour, so one binary covers every
//! `AgentResponse` status and the cleanup cases.
//!
//! - `echo TEXT`: outputs TEXT
//! - `config`: outputs the start context's `config` (system prompt, resume data) as JSON
//! - `checkpoint`: asks seed 000's decision_required question with options `a`, `b`
//! - `fail`: ends with an error
//! - `state KEY JSON`: a `state_update` of the session, then outputs `ok`
//! - `hang [N]`: outputs `partial`, starts a grandchild `sleep 300[.N]` holding stdout, ignores SIGTERM,
//!   and sleeps forever (the host must kill the whole group at the timeout)
//! - `consent CAPABILITY`: asks for it mid-run; outputs `granted EXPIRES` or `refused CODE HINT`
//! - `consents N CAPABILITY`: asks for it N times in a row (reasons `ask 0`, `ask 1`…); outputs
//!   how many answers of each kind (`granted:G consent_denied:D consent_rate_limited:R …`)
//! - `fetch METHOD URL [WAIT_FILE]`: a plain-HTTP request through `$HTTP_PROXY`; outputs the status
//!   line and body, or the status and the `error` event the host sent. With WAIT_FILE, waits (at
//!   most 20 s) for that file to exist and then does the same request again.
//! - `write PATH`: writes `written` to PATH; outputs `wrote` or `refused ERR`
//! - `run PROGRAM [ARGS...]`: starts PROGRAM; outputs `exit CODE`, or `refused ERR` plus the host's
//!   `error` event
//! - `try OP PATH [PATH2]`: one filesystem attempt, answered `OK …` or `DENIED …`: `ls` (lists),
//!   `read`, `write`, `symlink-read` (PATH2 -> PATH, then read PATH2), `hardlink` (PATH to PATH2),
//!   `rename` (PATH to PATH2)
//! - `remember KEY JSON`: stores JSON under KEY in its own KV namespace (`state_update`, scope
//!   `agent`), then reads it back; outputs `got VALUE`, or `denied MESSAGE`
//! - `recall [SCOPE] KEY`: reads KEY back (`state_get`; an empty KEY is the whole namespace);
//!   outputs `got VALUE`, `missing` or `denied MESSAGE`
//! - `refs`: outputs the `context_refs` of its input, joined by `,`
//! - `artifact ID PATH`: announces PATH as artifact ID (an `artifact` event); outputs `sent`
//! - `claim CAPABILITY`: sends a `consent_grant` of CAPABILITY as if it were the host (it is not
//!   allowed to), then outputs the host's answer (`error CODE HINT`)
//! - `handle VAR PATH`: a plain-HTTP GET of PATH under the URL in `$VAR` (an OAuth handle's base;
//!   or VAR itself when it is a URL), with its own made-up `Authorization`; outputs `STATUS BODY`,
//!   or `refused ERR`
//! - `env`: outputs its whole environment, one `NAME=VALUE` per line

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use metash_agent::{Consent, Session};
use metash_protocol::{AgentEvent, CheckpointReason};

/// The host's `error` event that follows a refusal (it is written before the refusal itself).
fn host_error<W: Write>(s: &mut Session<W>) -> String {
    match s.recv() {
        Ok(Some(AgentEvent::Error { code, hint, .. })) => {
            format!("error {code} {}", hint.unwrap_or_default())
        }
        other => format!("no error event: {other:?}"),
    }
}

/// A GET of `path` under `base` (`http://127.0.0.1:PORT/prefix`), sent directly: `STATUS BODY`.
fn handle_get(base: &str, path: &str) -> String {
    let rest = base.trim_start_matches("http://");
    let (addr, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let mut conn = match TcpStream::connect(addr) {
        Ok(c) => c,
        Err(e) => return format!("refused {e}"),
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let mut target = String::new();
    if !prefix.is_empty() {
        target.push('/');
        target.push_str(prefix.trim_end_matches('/'));
    }
    target.push_str(path);
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer made-up\r\nConnection: close\r\n\r\n"
    );
    if let Err(e) = conn.write_all(req.as_bytes()) {
        return format!("refused {e}");
    }
    let mut out = String::new();
    let _ = conn.read_to_string(&mut out);
    let status = out.split_whitespace().nth(1).unwrap_or("?").to_string();
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.trim())
        .unwrap_or("");
    format!("{status} {body}")
}

/// `state_get` of `key`, as the test reads it.
fn recall<W: Write>(s: &mut Session<W>, scope: Option<&str>, key: &str) -> String {
    match s.state_get(key, scope) {
        Ok(Some(v)) => format!("got {v}"),
        Ok(None) => "missing".to_string(),
        Err(e) => format!("denied {e}"),
    }
}

/// One request through the proxy in `$HTTP_PROXY`: the status line and the body.
fn http(method: &str, url: &str) -> Result<(String, String), String> {
    let proxy = std::env::var("HTTP_PROXY").map_err(|_| "no HTTP_PROXY".to_string())?;
    let addr = proxy.trim_start_matches("http://").trim_end_matches('/');
    let mut conn = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    let host = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap_or("");
    write!(
        conn,
        "{method} {url} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    conn.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

fn fetch<W: Write>(s: &mut Session<W>, method: &str, url: &str) -> String {
    match http(method, url) {
        Ok((status, body)) if status.contains(" 200") => format!("{status} {body}"),
        Ok((status, _)) => format!("{status} | {}", host_error(s)),
        Err(e) => format!("failed {e}"),
    }
}

/// One filesystem attempt for the isolation tests.
fn attempt(arg: &str) -> String {
    let mut w = arg.split_whitespace();
    let (op, a, b) = (
        w.next().unwrap_or(""),
        w.next().unwrap_or(""),
        w.next().unwrap_or(""),
    );
    let r: std::io::Result<String> = match op {
        "ls" => std::fs::read_dir(a).map(|d| {
            let names: Vec<String> = d
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.join(",")
        }),
        "read" => std::fs::read_to_string(a).map(|t| t.chars().take(40).collect()),
        "write" => std::fs::write(a, "forged").map(|()| String::new()),
        #[cfg(unix)]
        "symlink-read" => std::os::unix::fs::symlink(a, b)
            .and_then(|()| std::fs::read_to_string(b))
            .map(|t| t.chars().take(40).collect()),
        "hardlink" => std::fs::hard_link(a, b).map(|()| String::new()),
        "rename" => std::fs::rename(a, b).map(|()| String::new()),
        other => return format!("DENIED unknown op {other}"),
    };
    match r {
        Ok(t) if op == "ls" && t.is_empty() => "DENIED empty".into(),
        Ok(t) => format!("OK {t}"),
        Err(e) => format!("DENIED {e}"),
    }
}

/// Test fixture: one arm per behaviour the host's tests ask for. Long on purpose: each arm is a
/// few lines and reading them side by side is the point.
fn main() {
    let result = metash_agent::run(|s, input| {
        let (cmd, arg) = input.prompt.split_once(' ').unwrap_or((&input.prompt, ""));
        let io = |e: std::io::Error| e.to_string();
        match cmd {
            "echo" => s.output("text/plain", arg).map_err(io),
            "refs" => s
                .output("text/plain", &input.context_refs.join(","))
                .map_err(io),
            "config" => {
                let cfg = s.context().config.to_string();
                s.output("application/json", &cfg).map_err(io)
            }
            "checkpoint" => s
                .send(AgentEvent::Checkpoint {
                    reason: CheckpointReason::DecisionRequired,
                    message: "Pick one".into(),
                    options: vec!["a".into(), "b".into()],
                    resume_id: Some("pick".into()),
                })
                .map_err(io),
            "fail" => Err("boom".into()),
            // Dies the way a script does when something is missing: stderr, then exit.
            "die" => {
                eprintln!("fatal: {arg}");
                std::process::exit(9)
            }
            "state" => {
                let (key, value) = arg.split_once(' ').unwrap_or((arg, "null"));
                let value = serde_json::from_str(value).map_err(|e| e.to_string())?;
                s.state_update(key, value, None).map_err(io)?;
                s.output("text/plain", "ok").map_err(io)
            }
            "hang" => {
                s.output("text/plain", "partial").map_err(io)?;
                // SAFETY: installing SIG_IGN has no preconditions.
                unsafe {
                    libc::signal(libc::SIGTERM, libc::SIG_IGN);
                }
                // `hang N` makes it `sleep 300.N`: a test can tell its grandchild from others.
                let secs = if arg.is_empty() {
                    "300".to_string()
                } else {
                    format!("300.{arg}")
                };
                let _child = std::process::Command::new("sleep").arg(secs).spawn();
                loop {
                    std::thread::sleep(Duration::from_secs(60));
                }
            }
            "consent" => {
                let text = match s
                    .request_consent(arg, "the test asks", Some(60))
                    .map_err(io)?
                {
                    Consent::Granted { expires_at } => {
                        format!("granted {}", expires_at.unwrap_or_else(|| "once".into()))
                    }
                    Consent::Refused { code, hint, .. } => {
                        format!("refused {code} {}", hint.unwrap_or_default())
                    }
                };
                s.output("text/plain", &text).map_err(io)
            }
            "consents" => {
                let (n, cap) = arg.split_once(' ').unwrap_or((arg, "codegen"));
                let mut tally = std::collections::BTreeMap::<String, u32>::new();
                for i in 0..n.parse::<u32>().unwrap_or(1) {
                    let reason = format!("ask {i}");
                    let kind = match s.request_consent(cap, &reason, None).map_err(io)? {
                        Consent::Granted { .. } => "granted".to_string(),
                        Consent::Refused { code, .. } => code,
                    };
                    *tally.entry(kind).or_default() += 1;
                }
                let text: Vec<String> = tally.iter().map(|(k, n)| format!("{k}:{n}")).collect();
                s.output("text/plain", &text.join(" ")).map_err(io)
            }
            "fetch" => {
                let mut words = arg.split_whitespace();
                let (method, url) = (words.next().unwrap_or("GET"), words.next().unwrap_or(""));
                let mut text = fetch(s, method, url);
                if let Some(wait) = words.next() {
                    let until = Instant::now() + Duration::from_secs(20);
                    while !std::path::Path::new(wait).exists() && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    text = format!("{text}\n{}", fetch(s, method, url));
                }
                s.output("text/plain", &text).map_err(io)
            }
            "write" => {
                let text = match std::fs::write(arg, "written") {
                    Ok(()) => "wrote".to_string(),
                    Err(e) => format!("refused {e}"),
                };
                s.output("text/plain", &text).map_err(io)
            }
            "run" => {
                let mut words = arg.split_whitespace();
                let program = words.next().unwrap_or("");
                let text = match std::process::Command::new(program).args(words).status() {
                    Ok(st) => format!("exit {}", st.code().unwrap_or(-1)),
                    Err(e) => format!("refused {e} | {}", host_error(s)),
                };
                s.output("text/plain", &text).map_err(io)
            }
            "try" => {
                let text = attempt(arg);
                s.output("text/plain", &text).map_err(io)
            }
            "remember" => {
                let (key, value) = arg.split_once(' ').unwrap_or((arg, "null"));
                let value = serde_json::from_str(value).map_err(|e| e.to_string())?;
                s.state_update(key, value, Some("agent")).map_err(io)?;
                let text = recall(s, Some("agent"), key);
                s.output("text/plain", &text).map_err(io)
            }
            "recall" => {
                let (scope, key) = match arg.split_once(' ') {
                    Some((scope, key)) => (Some(scope), key),
                    None => (None, arg),
                };
                let text = recall(s, scope, key);
                s.output("text/plain", &text).map_err(io)
            }
            "artifact" => {
                let (id, path) = arg.split_once(' ').unwrap_or((arg, ""));
                s.send(AgentEvent::Artifact {
                    id: id.to_string(),
                    kind: "file".into(),
                    path: path.to_string(),
                    preview_hint: None,
                })
                .map_err(io)?;
                s.output("text/plain", "sent").map_err(io)
            }
            "claim" => {
                s.send(AgentEvent::ConsentGrant {
                    capability: arg.to_string(),
                    expires_at: None,
                })
                .map_err(io)?;
                let text = host_error(s);
                s.output("text/plain", &text).map_err(io)
            }
            "handle" => {
                let (var, path) = arg.split_once(' ').unwrap_or((arg, "/"));
                // A URL instead of a variable: straight there, not through a handle.
                let base = if var.starts_with("http://") {
                    Ok(var.to_string())
                } else {
                    std::env::var(var)
                };
                let text = match base {
                    Ok(base) => handle_get(&base, path),
                    Err(_) => format!("refused no ${var}"),
                };
                s.output("text/plain", &text).map_err(io)
            }
            "env" => {
                let all: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
                s.output("text/plain", &all.join("\n")).map_err(io)
            }
            other => Err(format!("unknown command `{other}`")),
        }
    });
    if let Err(e) = result {
        eprintln!("host-test-agent: {e}");
        std::process::exit(1);
    }
}
