//! The agent side of metash's agent protocol (seed 002 section 4, `docs/agent-protocol.md`).
//!
//! An agent is a program that reads JSON lines on stdin and writes JSON lines on stdout. This crate
//! hides the framing so the same Rust agent builds natively and for `wasm32-wasip1`/`-wasip2`: it depends on
//! `metash-protocol` and `serde_json` only, and does its I/O through `std::io` (which WASI maps to
//! the host's in-memory pipes).
//!
//! ```no_run
//! metash_agent::run(|session, input| {
//!     let reply = format!("you said: {}", input.prompt);
//!     session.output("text/plain", &reply).map_err(|e| e.to_string())
//! })
//! .ok();
//! ```

use std::io::{self, BufRead, Write};

use metash_protocol::{AgentEvent, ProtocolMessage, EVENT_PROTOCOL_VERSION};
use serde_json::Value;

/// What `start(ctx)` gave the agent.
#[derive(Debug, Clone, Default)]
pub struct Context {
    pub agent_id: String,
    pub workspace: Option<String>,
    pub config: Value,
    pub capabilities: Vec<String>,
}

/// One `invoke(input)`.
#[derive(Debug, Clone)]
pub struct Input {
    pub prompt: String,
    pub context_refs: Vec<String>,
}

/// The host's answer to [`Session::request_consent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Consent {
    /// Allowed; `expires_at` (RFC 3339) is absent for a one-action answer.
    Granted { expires_at: Option<String> },
    /// Refused, with the host's code (`consent_denied`, `consent_revoked`,
    /// `capability_undeclared`, ...) and hint: fall back, do not ask again in a loop.
    Refused {
        code: String,
        message: String,
        hint: Option<String>,
    },
}

/// The agent's handle for one invocation: every method writes one protocol line.
pub struct Session<W: Write> {
    ctx: Context,
    /// The host's lines, shared with the main loop so a request can wait for its answer.
    input: Box<dyn BufRead>,
    out: W,
    stream: u64,
    invocation: u64,
    /// The handler already ended the invocation (`done` or `checkpoint`): do not send another.
    ended: bool,
}

impl<W: Write> Session<W> {
    /// The start context (empty until the host sent `start`).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Whether the host granted `capability` (the host enforces it anyway; this is for fallbacks).
    pub fn granted(&self, capability: &str) -> bool {
        self.ctx.capabilities.iter().any(|c| c == capability)
    }

    /// Write any event, framed with the protocol version.
    ///
    /// # Errors
    /// The host closed stdout (it is shutting the agent down) or serialization failed.
    pub fn send(&mut self, event: AgentEvent) -> io::Result<()> {
        if matches!(
            event,
            AgentEvent::Done { .. } | AgentEvent::Checkpoint { .. }
        ) {
            self.ended = true;
        }
        let line = serde_json::to_string(&ProtocolMessage::new(event)).map_err(io::Error::other)?;
        self.out.write_all(line.as_bytes())?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }

    /// Stream `data` as one output card, split into chunks of at most `CHUNK` bytes with chunk ids
    /// `"<stream>:<seq>"` so the host can reassemble them in order.
    ///
    /// # Errors
    /// As [`Session::send`].
    pub fn output(&mut self, content_type: &str, data: &str) -> io::Result<()> {
        const CHUNK: usize = 16 * 1024;
        self.stream += 1;
        let stream = format!("i{}s{}", self.invocation, self.stream);
        let mut seq = 0u64;
        let mut rest = data;
        loop {
            let mut cut = rest.len().min(CHUNK);
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
            let (head, tail) = rest.split_at(cut);
            self.output_chunk(&stream, seq, content_type, head)?;
            seq += 1;
            rest = tail;
            if rest.is_empty() {
                return Ok(());
            }
        }
    }

    /// Write one chunk of stream `stream` explicitly (for agents that stream as they compute).
    ///
    /// # Errors
    /// As [`Session::send`].
    pub fn output_chunk(
        &mut self,
        stream: &str,
        seq: u64,
        content_type: &str,
        data: &str,
    ) -> io::Result<()> {
        let agent_id = self.ctx.agent_id.clone();
        self.send(AgentEvent::Output {
            agent_id,
            chunk_id: format!("{stream}:{seq}"),
            content_type: content_type.to_string(),
            data: data.to_string(),
        })
    }

    /// Report an error (the invocation still ends with `done`).
    ///
    /// # Errors
    /// As [`Session::send`].
    pub fn error(&mut self, code: &str, message: &str) -> io::Result<()> {
        self.send(AgentEvent::Error {
            code: code.to_string(),
            message: message.to_string(),
            hint: None,
        })
    }

    /// Ask the user, through the host, for `capability` (e.g. `network:api.github.com`) and wait
    /// for the answer. The host answers in order: the next `consent_grant` or `error` on stdin is
    /// the answer.
    ///
    /// # Errors
    /// Writing failed, or stdin ended (the host is shutting the agent down) before an answer.
    pub fn request_consent(
        &mut self,
        capability: &str,
        reason: &str,
        duration_s: Option<u64>,
    ) -> io::Result<Consent> {
        self.send(AgentEvent::ConsentRequest {
            capability: capability.to_string(),
            reason: reason.to_string(),
            duration_s,
        })?;
        while let Some(event) = self.next_event()? {
            match event {
                AgentEvent::ConsentGrant { expires_at, .. } => {
                    return Ok(Consent::Granted { expires_at })
                }
                AgentEvent::Error {
                    code,
                    message,
                    hint,
                } => {
                    return Ok(Consent::Refused {
                        code,
                        message,
                        hint,
                    })
                }
                AgentEvent::Shutdown { .. } => break,
                _ => {}
            }
        }
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the host closed stdin before answering the consent request",
        ))
    }

    /// The host's next message (`None` at end of input): an answer, or a notice such as the
    /// `error` the host sends when it refused one of the agent's actions. Blocks until one comes.
    ///
    /// # Errors
    /// Reading or answering a bad line failed.
    pub fn recv(&mut self) -> io::Result<Option<AgentEvent>> {
        self.next_event()
    }

    /// The next well-formed event from the host (`None` at end of input). Bad lines are answered
    /// with an `error` event and skipped.
    fn next_event(&mut self) -> io::Result<Option<AgentEvent>> {
        loop {
            let mut line = String::new();
            if self.input.read_line(&mut line)? == 0 {
                return Ok(None);
            }
            if line.trim().is_empty() {
                continue;
            }
            let msg: ProtocolMessage = match serde_json::from_str(&line) {
                Ok(m) => m,
                Err(e) => {
                    self.error("bad_message", &e.to_string())?;
                    continue;
                }
            };
            if msg.schema_version != EVENT_PROTOCOL_VERSION {
                self.error(
                    "unsupported_version",
                    &format!(
                        "schema_version {} is not supported (this agent speaks {EVENT_PROTOCOL_VERSION})",
                        msg.schema_version
                    ),
                )?;
                continue;
            }
            self.track_grants(&msg.event);
            return Ok(Some(msg.event));
        }
    }

    /// Keeps [`Session::granted`] current: a `consent_revoke` (the user revoked it, or it
    /// expired) takes the capability away at once, so the agent's next check picks its fallback
    /// instead of meeting a refusal; a `consent_grant` adds one.
    fn track_grants(&mut self, event: &AgentEvent) {
        match event {
            AgentEvent::ConsentRevoke { capability, .. } => {
                self.ctx.capabilities.retain(|c| c != capability);
            }
            AgentEvent::ConsentGrant { capability, .. } if !self.granted(capability) => {
                self.ctx.capabilities.push(capability.clone());
            }
            _ => {}
        }
    }

    /// Persist a value through the host's state (the only way agents persist state).
    ///
    /// # Errors
    /// As [`Session::send`].
    /// Reads back what is stored under `key` in `scope` (`agent`, the default, `scratchpad` or
    /// `session`); an empty key reads the whole namespace. `Ok(None)` when nothing is stored;
    /// an `Err` of kind `PermissionDenied` when the host refuses (no `memory` grant).
    ///
    /// # Errors
    /// The host refused, or closed stdin before answering.
    pub fn state_get(&mut self, key: &str, scope: Option<&str>) -> io::Result<Option<Value>> {
        self.send(AgentEvent::StateGet {
            key: key.to_string(),
            scope: scope.map(str::to_string),
        })?;
        while let Some(event) = self.next_event()? {
            match event {
                AgentEvent::StateValue {
                    key: k,
                    value,
                    found,
                    ..
                } if k == key => return Ok(found.then_some(value)),
                AgentEvent::Error { code, message, .. } if code == "state_denied" => {
                    return Err(io::Error::new(io::ErrorKind::PermissionDenied, message))
                }
                AgentEvent::Shutdown { .. } => break,
                _ => {}
            }
        }
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the host closed stdin before answering the state_get",
        ))
    }

    pub fn state_update(&mut self, key: &str, value: Value, scope: Option<&str>) -> io::Result<()> {
        self.send(AgentEvent::StateUpdate {
            key: key.to_string(),
            value,
            scope: scope.map(str::to_string),
        })
    }
}

/// Run the agent loop on stdin/stdout: `handler` is called once per `input`; `done` is written after
/// it returns (with `status: error` and an `error` event when it fails).
///
/// # Errors
/// Reading stdin or writing stdout failed.
pub fn run<F>(handler: F) -> io::Result<()>
where
    F: FnMut(&mut Session<io::StdoutLock<'static>>, Input) -> Result<(), String>,
{
    let stdin = io::stdin();
    run_with(stdin.lock(), io::stdout().lock(), handler)
}

/// [`run`] with seed 002's `shutdown()` hook: `on_shutdown` runs when the host sends `shutdown`
/// (flush state with `state_update` there). A WASM agent gets it only when its manifest says
/// `hooks = ["shutdown"]`: the host then runs the module once more just for it.
///
/// # Errors
/// Reading stdin or writing stdout failed.
pub fn run_with_shutdown<F, G>(handler: F, on_shutdown: G) -> io::Result<()>
where
    F: FnMut(&mut Session<io::StdoutLock<'static>>, Input) -> Result<(), String>,
    G: FnMut(&mut Session<io::StdoutLock<'static>>) -> Result<(), String>,
{
    let stdin = io::stdin();
    run_hooks(stdin.lock(), io::stdout().lock(), handler, on_shutdown)
}

/// [`run`] over any reader and writer (tests drive it with buffers).
///
/// # Errors
/// Reading or writing failed.
pub fn run_with<R, W, F>(input: R, out: W, handler: F) -> io::Result<()>
where
    R: BufRead + 'static,
    W: Write,
    F: FnMut(&mut Session<W>, Input) -> Result<(), String>,
{
    run_hooks(input, out, handler, |_| Ok(()))
}

/// The loop behind [`run_with`] and [`run_with_shutdown`].
///
/// # Errors
/// Reading or writing failed.
pub fn run_hooks<R, W, F, G>(input: R, out: W, mut handler: F, mut on_shutdown: G) -> io::Result<()>
where
    R: BufRead + 'static,
    W: Write,
    F: FnMut(&mut Session<W>, Input) -> Result<(), String>,
    G: FnMut(&mut Session<W>) -> Result<(), String>,
{
    let mut session = Session {
        ctx: Context::default(),
        input: Box::new(input),
        out,
        stream: 0,
        invocation: 0,
        ended: false,
    };
    while let Some(event) = session.next_event()? {
        match event {
            AgentEvent::Start {
                agent_id,
                workspace,
                config,
                capabilities,
            } => {
                session.ctx = Context {
                    agent_id,
                    workspace,
                    config,
                    capabilities,
                };
            }
            AgentEvent::Input {
                prompt,
                context_refs,
                ..
            } => {
                session.invocation += 1;
                session.stream = 0;
                session.ended = false;
                let result = handler(
                    &mut session,
                    Input {
                        prompt,
                        context_refs,
                    },
                );
                let status = match result {
                    Ok(()) => None,
                    Err(message) => {
                        session.error("agent_error", &message)?;
                        Some("error".to_string())
                    }
                };
                if !session.ended {
                    session.send(AgentEvent::Done {
                        status,
                        summary: None,
                    })?;
                }
            }
            AgentEvent::Shutdown { .. } => {
                if let Err(e) = on_shutdown(&mut session) {
                    session.error("shutdown_failed", &e)?;
                }
                break;
            }
            // Answers that came after their request was given up, notices: nothing to do.
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn echo_round_trip() {
        let input = concat!(
            r#"{"schema_version":"0.1","type":"start","agent_id":"a1","config":null,"capabilities":["files.read"]}"#,
            "\n",
            r#"{"schema_version":"0.1","type":"input","agent_id":"a1","prompt":"hi"}"#,
            "\n",
            r#"{"schema_version":"9.9","type":"input","agent_id":"a1","prompt":"hi"}"#,
            "\n"
        );
        let mut out = Vec::new();
        run_with(input.as_bytes(), &mut out, |s, i| {
            assert!(s.granted("files.read"));
            s.output("text/plain", &i.prompt).map_err(|e| e.to_string())
        })
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].contains(r#""chunk_id":"i1s1:0""#));
        assert!(lines[1].contains(r#""type":"done""#));
        assert!(lines[2].contains("unsupported_version"));
    }

    #[test]
    fn consent_answers_are_read_in_order() {
        let input = concat!(
            r#"{"schema_version":"0.1","type":"input","agent_id":"a1","prompt":"ask"}"#,
            "\n",
            r#"{"schema_version":"0.1","type":"consent_grant","capability":"network:h","expires_at":"2030-01-01T00:00:00Z"}"#,
            "\n",
            r#"{"schema_version":"0.1","type":"error","code":"consent_denied","message":"no","hint":"h"}"#,
            "\n"
        );
        let mut out = Vec::new();
        let mut answers = Vec::new();
        run_with(input.as_bytes(), &mut out, |s, _| {
            answers.push(s.request_consent("network:h", "fetch", Some(60)).unwrap());
            answers.push(s.request_consent("files.write", "save", None).unwrap());
            // Nothing left: the host closed stdin before a third answer.
            assert!(s.request_consent("memory", "x", None).is_err());
            Ok(())
        })
        .unwrap();
        assert_eq!(
            answers,
            vec![
                Consent::Granted {
                    expires_at: Some("2030-01-01T00:00:00Z".into())
                },
                Consent::Refused {
                    code: "consent_denied".into(),
                    message: "no".into(),
                    hint: Some("h".into())
                }
            ]
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.lines().next().unwrap().contains(r#""duration_s":60"#),
            "{text}"
        );
        assert_eq!(text.matches(r#""type":"consent_request""#).count(), 3);
    }
}
