//! `permissions = "ask"` for a Claude Code role: Claude Code's own permission prompts go to
//! metash's consent flow. Claude Code calls its permission-prompt tool (`--permission-prompt-tool
//! mcp__metash__approve`) before each tool use; that tool is served here, in the host, over MCP's
//! streamable HTTP on a loopback port the sandbox may reach. Each call becomes a capability
//! request (a shell command is `process.spawn:<program>`, a file edit `files.write:<path>`…)
//! answered like any agent's: by a grant, the policy file, `--yes-to`, or the user, once or for a
//! time, all in the ledger. The sandbox can only *ask* through this port; answers come from the
//! user's side.

use std::net::TcpListener;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use metash_policy::{Authorization, CapabilityRequest};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::error::{HostError, Result};

/// The MCP server's name in Claude Code's config, and the tool's full name there.
pub(crate) const SERVER: &str = "metash";
pub(crate) const TOOL: &str = "mcp__metash__approve";

/// Decides one tool call (blocking: it may ask the user).
pub(crate) type Ask = Arc<dyn Fn(&CapabilityRequest) -> Authorization + Send + Sync>;

/// What Claude Code sends its permission-prompt tool.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct ApproveParams {
    /// The tool Claude Code wants to use (`Bash`, `Write`, `Edit`, `Read`, `WebFetch`…).
    pub tool_name: String,
    /// Its input, as the model wrote it.
    #[serde(default)]
    pub input: Value,
}

#[derive(Clone)]
struct Approver {
    ask: Ask,
    workspace: std::path::PathBuf,
}

#[tool_router]
impl Approver {
    #[tool(
        description = "metash's consent for a tool use: answers {behavior: allow, updatedInput} or {behavior: deny, message}."
    )]
    async fn approve(
        &self,
        Parameters(p): Parameters<ApproveParams>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let req = request_for(&self.workspace, &p.tool_name, &p.input);
        let ask = Arc::clone(&self.ask);
        let verdict = tokio::task::spawn_blocking(move || ask(&req))
            .await
            .map_err(|_| ErrorData::internal_error("the consent prompt failed", None))?;
        let answer = match verdict {
            Authorization::Allowed { .. } => json!({"behavior": "allow", "updatedInput": p.input}),
            Authorization::Denied { message, .. } => json!({
                "behavior": "deny",
                "message": format!("metash refused `{}`: {message}", p.tool_name),
            }),
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(
            answer.to_string(),
        )]))
    }
}

#[tool_handler]
impl ServerHandler for Approver {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("metash-consent", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// The capability a Claude Code tool use needs. Closed by tool family: shell commands start a
/// program, edits write a file, reads read one, fetches reach a host; anything else (an MCP tool,
/// a sub-agent) is asked as starting that tool.
pub(crate) fn request_for(
    workspace: &std::path::Path,
    tool: &str,
    input: &Value,
) -> CapabilityRequest {
    let s = |k: &str| input[k].as_str().unwrap_or("").to_string();
    let clip = |t: String| t.chars().take(200).collect::<String>();
    let path = |k: &str| {
        let p = std::path::PathBuf::from(s(k));
        if p.is_absolute() {
            p
        } else {
            workspace.join(p)
        }
    };
    match tool {
        "Bash" => {
            let command = s("command");
            let program = command
                .split_whitespace()
                .next()
                .unwrap_or("sh")
                .to_string();
            CapabilityRequest::process_spawn(&program, clip(format!("Bash: {command}")))
        }
        "Write" | "Edit" | "MultiEdit" | "NotebookEdit" => {
            let p = path(if tool == "NotebookEdit" {
                "notebook_path"
            } else {
                "file_path"
            });
            CapabilityRequest::files_write(workspace, &p, format!("{tool} {}", p.display()))
        }
        "Read" | "Glob" | "Grep" | "LS" => {
            let key = if tool == "Read" { "file_path" } else { "path" };
            let p = if s(key).is_empty() {
                workspace.to_path_buf()
            } else {
                path(key)
            };
            CapabilityRequest::files_read(workspace, &p, format!("{tool} {}", p.display()))
        }
        "WebFetch" => {
            let url = s("url");
            let host = url
                .split("://")
                .nth(1)
                .and_then(|r| r.split(['/', ':', '?']).next())
                .unwrap_or("")
                .to_string();
            CapabilityRequest::network(&host, false, clip(format!("WebFetch {url}")))
        }
        other => CapabilityRequest::process_spawn(other, clip(format!("{other}: {input}"))),
    }
}

/// A running permission server for one spawn; stops when dropped.
pub(crate) struct PermissionServer {
    port: u16,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PermissionServer {
    /// Listens on 127.0.0.1 (an ephemeral port).
    ///
    /// # Errors
    /// The listener or its runtime cannot start.
    pub fn start(workspace: &std::path::Path, ask: Ask) -> Result<Self> {
        let io = |e: std::io::Error| HostError::Other(format!("the consent server: {e}"));
        let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(io)?;
        let port = listener.local_addr().map_err(io)?.port();
        listener.set_nonblocking(true).map_err(io)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(io)?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(io)?
        };
        let approver = Approver {
            ask,
            workspace: workspace.to_path_buf(),
        };
        let service = StreamableHttpService::new(
            move || Ok(approver.clone()),
            Arc::new(NeverSessionManager::default()),
            StreamableHttpServerConfig::default()
                .with_legacy_session_mode(false)
                .with_json_response(true),
        );
        let (stop, mut stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("metash-consent-mcp".into())
            .spawn(move || {
                runtime.block_on(async move {
                    loop {
                        let conn = tokio::select! {
                            _ = &mut stopped => break,
                            c = listener.accept() => c,
                        };
                        let Ok((sock, _)) = conn else { continue };
                        let service = service.clone();
                        tokio::spawn(async move {
                            let svc = hyper::service::service_fn(move |req| {
                                let service = service.clone();
                                async move {
                                    Ok::<_, std::convert::Infallible>(service.handle(req).await)
                                }
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(sock), svc)
                                .await;
                        });
                    }
                });
            })
            .map_err(io)?;
        Ok(Self {
            port,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Claude Code's `mcpServers` entry for it.
    pub fn mcp_servers(&self) -> Value {
        json!({SERVER: {"type": "http", "url": format!("http://127.0.0.1:{}/mcp", self.port)}})
    }
}

impl Drop for PermissionServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The permission server for one spawn of the role `role`: each tool use is authorized by the
/// host's policy under the host's prompter, as `role`, within the role's cap and rate of
/// questions (see [`super::gate`]).
///
/// # Errors
/// The policy cannot be read or the server cannot start.
pub(crate) fn start_for(
    host: &crate::host::Host,
    role: &str,
    workspace: &std::path::Path,
) -> Result<PermissionServer> {
    let gate = super::gate::PolicyGate::new(host, host.policy()?);
    let role = role.to_string();
    let ask: Ask = Arc::new(move |req: &CapabilityRequest| gate.authorize_asked(&role, req));
    PermissionServer::start(workspace, ask)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::io::{Read, Write};

    use super::*;
    use metash_protocol::LogKind;

    fn post(port: u16, body: &Value) -> String {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let body = body.to_string();
        write!(
            s,
            "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\nmcp-protocol-version: 2025-06-18\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// A project whose role `coder` asks metash for Claude Code's tool uses, each question
    /// waiting up to 30 s for any client; its permission server.
    fn asking_role() -> (tempfile::TempDir, crate::host::Host, PermissionServer) {
        let dir = tempfile::tempdir().unwrap();
        metash_store::Store::init(dir.path(), None).unwrap();
        std::fs::write(
            dir.path().join(".meta/config.toml"),
            "[host]\nconsent_wait_seconds = 30\n\
             [roles.coder]\nfrontend = \"agent-sdk\"\npermissions = \"ask\"\n",
        )
        .unwrap();
        let host = crate::host::Host::open(dir.path(), crate::host::HostOptions::silent()).unwrap();
        let server = start_for(&host, "coder", dir.path()).unwrap();
        (dir, host, server)
    }

    /// `n` Bash tool uses at once (`cmd(i)`), answered by a client once `ready` holds for the
    /// calls (`answer`, for every question it finds waiting): each reply, and how many questions
    /// the client saw. `ready` must say when every call has reached the server: a call still on
    /// its way when the first answer is given would be a question of its own.
    fn at_once(
        ws: &std::path::Path,
        port: u16,
        n: usize,
        cmd: fn(usize) -> String,
        answer: metash_policy::Answer,
        ready: &dyn Fn(&[std::thread::JoinHandle<String>]) -> bool,
    ) -> (Vec<String>, usize) {
        let calls: Vec<_> = (0..n)
            .map(|i| {
                std::thread::spawn(move || {
                    post(
                        port,
                        &json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"approve","arguments":{"tool_name":"Bash","input":{"command":cmd(i)}}}}),
                    )
                })
            })
            .collect();
        let store = metash_store::Store::open(ws).unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !ready(&calls) {
            assert!(
                std::time::Instant::now() < until,
                "the {n} calls did not all reach the server within 10 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut seen = std::collections::BTreeSet::new();
        while calls.iter().any(|c| !c.is_finished()) {
            for ask in crate::asks::pending(&store).unwrap() {
                seen.insert(ask.id.clone());
                let _ = crate::asks::reply(&store, &ask.id, answer, "test");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        (
            calls.into_iter().map(|c| c.join().unwrap()).collect(),
            seen.len(),
        )
    }

    /// How many callers wait on the question the Bash command `cmd` of role `coder` is (the one
    /// asking it and those who joined it); 0 while nobody has posted a question yet. Counted by
    /// joining it once more, for a moment.
    fn waiting_on(host: &crate::host::Host, cmd: &str) -> usize {
        if crate::asks::pending(host.store()).unwrap().is_empty() {
            return 0;
        }
        let req = request_for(host.store().workspace(), "Bash", &json!({"command": cmd}));
        let meta = host.store().meta_dir().to_path_buf();
        let limits = host.config().host.consent_limits();
        let capability = req.capability.to_string();
        match super::super::gate::questions_of(meta).enter(
            "coder",
            &capability,
            &req.reason,
            limits,
        ) {
            // Held by the waiting questions' map, by this probe, and by each caller.
            crate::asks::Turn::Join(slot) => Arc::strong_count(&slot) - 2,
            _ => panic!("a question is posted but `{cmd}` is not waiting"),
        }
    }

    #[test]
    fn the_same_tool_use_asked_five_times_at_once_is_one_question() {
        let (dir, host, server) = asking_role();
        let (replies, asked) = at_once(
            dir.path(),
            server.port(),
            5,
            |_| "echo same".into(),
            metash_policy::Answer::AllowOnce,
            &|_| waiting_on(&host, "echo same") == 5,
        );
        assert_eq!(asked, 1, "{replies:?}");
        for r in &replies {
            assert!(r.contains(r#"\"behavior\":\"allow\""#), "{r}");
        }
        let store = metash_store::Store::open(dir.path()).unwrap();
        let log = store.log().read_all().unwrap();
        let requests = log.iter().filter(|r| r.kind == LogKind::ConsentRequest);
        assert_eq!(requests.count(), 1, "one question in the ledger");
    }

    #[test]
    fn past_the_cap_of_waiting_questions_a_tool_use_is_refused_at_once() {
        let (dir, _host, server) = asking_role();
        // Nothing is answered before one call came back: the refused one, once 3 wait.
        let (replies, asked) = at_once(
            dir.path(),
            server.port(),
            4,
            |i| format!("echo {i}"),
            metash_policy::Answer::Deny,
            &|calls| calls.iter().any(std::thread::JoinHandle::is_finished),
        );
        assert_eq!(asked, 3, "{replies:?}");
        let capped: Vec<_> = replies
            .iter()
            .filter(|r| r.contains("3 consent questions waiting"))
            .collect();
        assert_eq!(capped.len(), 1, "{replies:?}");
        assert!(
            capped[0].contains(r#"\"behavior\":\"deny\""#),
            "{}",
            capped[0]
        );
    }

    #[test]
    fn the_tool_answers_from_the_ask_function() {
        let ask: Ask = Arc::new(|req: &CapabilityRequest| {
            if req.capability.to_string() == "process.spawn:echo" {
                Authorization::Allowed { expires_at: None }
            } else {
                Authorization::Denied {
                    code: metash_policy::DenyCode::ConsentDenied,
                    message: "no".into(),
                    hint: None,
                    event: metash_protocol::AgentEvent::Error {
                        code: "consent_denied".into(),
                        message: "no".into(),
                        hint: None,
                    },
                }
            }
        });
        let server = PermissionServer::start(std::path::Path::new("/ws"), ask).unwrap();
        let init = post(
            server.port(),
            &json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}),
        );
        assert!(init.contains("metash-consent"), "{init}");
        let list = post(
            server.port(),
            &json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}),
        );
        assert!(list.contains("\"approve\""), "{list}");
        let call = |cmd: &str| {
            post(
                server.port(),
                &json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"approve","arguments":{"tool_name":"Bash","input":{"command":cmd}}}}),
            )
        };
        assert!(call("echo hi").contains(r#"\"behavior\":\"allow\""#));
        let denied = call("rm -rf /");
        assert!(denied.contains(r#"\"behavior\":\"deny\""#), "{denied}");
    }
}
