//! Helpers for the serve tests: a fresh project, an in-process JSON-RPC server on pipes with a
//! small client; the loopback model server and fixtures come from `metash-testkit`.
//! NETWORK RULE: the only server here listens on 127.0.0.1 (ephemeral port); nothing connects
//! anywhere else.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use metash_host::serve::{RpcServer, Service};
use metash_host::{Host, HostError, HostOptions, SpawnRequest, Spawner, Terminal};
use metash_protocol::{AgentResponse, AgentStatus, ResponseMetadata};
use serde_json::{json, Value};

/// A project initialised in a temp dir.
pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        metash_store::Store::init(dir.path(), None).unwrap();
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn host(&self) -> Arc<Host> {
        self.host_with_env(&[])
    }

    /// A host whose agents see `env` (e.g. the API key variable a role names).
    pub fn host_with_env(&self, env: &[(&str, &str)]) -> Arc<Host> {
        Arc::new(
            Host::open(
                self.path(),
                HostOptions {
                    terminal: Terminal::Silent,
                    env: env
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    ..HostOptions::default()
                },
            )
            .unwrap(),
        )
    }

    /// A model-backed role `name` (metash's own Anthropic client) against `base_url`; its key is
    /// read from `METASH_TEST_KEY`.
    pub fn model_role(&self, name: &str, base_url: &str) {
        std::fs::write(
            self.path().join(".meta/config.toml"),
            format!(
                "[roles.{name}]\nfrontend = \"anthropic-api\"\nmodel_fast = \"claude-haiku-4-5\"\n\
                 model_smart = \"claude-sonnet-4-5\"\nbase_url = \"{base_url}\"\n\
                 api_key_env = \"METASH_TEST_KEY\"\nmax_tokens = 256\n"
            ),
        )
        .unwrap();
    }

    /// The kinds (and agents) of every record in the store's log.
    pub fn log(&self) -> Vec<Value> {
        let text =
            std::fs::read_to_string(self.path().join(".meta/events.jsonl")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// Stands in for the host's spawner where a test is about the protocol, not about agents:
/// `echo` answers with its message, `slow` waits until released, `panic` panics (a bug), anything
/// else is unknown.
pub struct FakeSpawner {
    release: Mutex<Option<Receiver<()>>>,
}

impl FakeSpawner {
    pub fn new() -> (Arc<Self>, Sender<()>) {
        let (tx, rx) = channel();
        (
            Arc::new(Self {
                release: Mutex::new(Some(rx)),
            }),
            tx,
        )
    }
}

impl Spawner for FakeSpawner {
    fn spawn_agent(&self, req: &SpawnRequest) -> metash_host::Result<AgentResponse> {
        let data = match req.agent_name.as_str() {
            "echo" => format!(
                "{}|{}|{:?}",
                req.system_prompt, req.user_message, req.options.max_tokens
            ),
            "panic" => panic!("a bug in the spawner"),
            "slow" => {
                let rx = self.release.lock().unwrap().take().unwrap();
                rx.recv_timeout(Duration::from_secs(60)).unwrap();
                "slow done".to_string()
            }
            other => {
                return Err(HostError::UnknownAgent {
                    name: other.to_string(),
                    hint: String::new(),
                })
            }
        };
        Ok(AgentResponse {
            status: AgentStatus::Success,
            data,
            metadata: ResponseMetadata {
                tokens_used: 0,
                duration_ms: 1,
            },
        })
    }
}

/// An in-process `RpcServer` on a pair of pipes, and the client end.
pub struct Rpc {
    to_server: Option<std::io::PipeWriter>,
    lines: Receiver<Value>,
    /// Messages read but not yet asked for.
    backlog: VecDeque<Value>,
    pub events: Vec<Value>,
    next_id: AtomicU64,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

impl Rpc {
    pub fn start(host: Arc<Host>, spawner: Arc<dyn Spawner>) -> Self {
        Self::with_server(RpcServer::from_service(Service::new(host, spawner)))
    }

    pub fn with_server(server: RpcServer) -> Self {
        let (server_in, to_server) = std::io::pipe().unwrap();
        let (from_server, server_out) = std::io::pipe().unwrap();
        let handle =
            std::thread::spawn(move || server.serve(BufReader::new(server_in), server_out));
        let (tx, rx) = channel();
        std::thread::spawn(move || read_lines(from_server, tx));
        Self {
            to_server: Some(to_server),
            lines: rx,
            backlog: VecDeque::new(),
            events: Vec::new(),
            next_id: AtomicU64::new(1),
            server: Some(handle),
        }
    }

    pub fn send_raw(&mut self, line: &str) {
        let w = self.to_server.as_mut().unwrap();
        w.write_all(line.as_bytes()).unwrap();
        w.write_all(b"\n").unwrap();
        w.flush().unwrap();
    }

    /// Sends a request; returns its id.
    pub fn start_call(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_raw(&msg.to_string());
        id
    }

    /// The response (whole message) to `id`, keeping notifications in `events`.
    pub fn response(&mut self, id: u64) -> Value {
        self.next_matching(
            |m| m.get("id") == Some(&json!(id)),
            Duration::from_secs(120),
        )
        .unwrap_or_else(|| panic!("no response to request {id}"))
    }

    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.start_call(method, params);
        self.response(id)
    }

    /// The `result` of a call that must succeed.
    pub fn ok(&mut self, method: &str, params: Value) -> Value {
        let r = self.call(method, params);
        assert!(r.get("error").is_none(), "{method} failed: {r}");
        r["result"].clone()
    }

    /// The `error` of a call that must fail.
    pub fn err(&mut self, method: &str, params: Value) -> Value {
        let r = self.call(method, params);
        assert!(r.get("result").is_none(), "{method} should fail: {r}");
        r["error"].clone()
    }

    /// The next message that is not a notification (e.g. the reply to a raw line).
    pub fn next_reply(&mut self) -> Value {
        self.next_matching(
            |m| m.is_array() || m.get("method").is_none(),
            Duration::from_secs(60),
        )
        .expect("a reply")
    }

    /// Whether a reply arrives within `wait` (for notifications, which must get none).
    pub fn reply_within(&mut self, wait: Duration) -> Option<Value> {
        self.next_matching(|m| m.is_array() || m.get("method").is_none(), wait)
    }

    /// The first event notification whose record matches, waiting up to 30 s.
    pub fn event(&mut self, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        if let Some(e) = self.events.iter().find(|e| pred(e)) {
            return Some(e.clone());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            match self.lines.recv_timeout(Duration::from_millis(50)) {
                Ok(m) => {
                    if self.absorb_event(&m) {
                        let rec = m["params"].clone();
                        if pred(&rec) {
                            return Some(rec);
                        }
                    } else {
                        self.backlog.push_back(m);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        None
    }

    fn absorb_event(&mut self, m: &Value) -> bool {
        if m.get("method") == Some(&json!("event")) && m.get("id").is_none() {
            self.events.push(m["params"].clone());
            true
        } else {
            false
        }
    }

    fn next_matching(&mut self, pred: impl Fn(&Value) -> bool, wait: Duration) -> Option<Value> {
        if let Some(i) = self.backlog.iter().position(&pred) {
            return self.backlog.remove(i);
        }
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(m) => {
                    if self.absorb_event(&m) {
                        continue;
                    }
                    if pred(&m) {
                        return Some(m);
                    }
                    self.backlog.push_back(m);
                }
                Err(_) => return None,
            }
        }
    }

    /// Closes the server's input and waits for it to return; the messages it sent after.
    pub fn close(mut self) -> (std::io::Result<()>, Vec<Value>) {
        drop(self.to_server.take());
        let result = self.server.take().unwrap().join().unwrap();
        let mut rest: Vec<Value> = self.backlog.drain(..).collect();
        while let Ok(m) = self.lines.recv_timeout(Duration::from_secs(5)) {
            rest.push(m);
        }
        (result, rest)
    }
}

fn read_lines(from: impl Read, tx: Sender<Value>) {
    for line in BufReader::new(from).lines() {
        let Ok(line) = line else { break };
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the server wrote a line that is not JSON ({e}): {line}"));
        if tx.send(v).is_err() {
            break;
        }
    }
}

/// The `python3` on PATH, or a printed reason to skip.
pub fn python3() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("python3"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        metash_testkit::skip("python client tests", "python3 is not on PATH");
    }
    found
}

pub fn tools_dir() -> PathBuf {
    std::env::var_os("METASH_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools"))
}

/// The `metash` binary of this build (`cargo test --workspace` builds it next to the test
/// binaries), or `METASH_BIN`.
pub fn metash_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("METASH_BIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let candidate = exe.parent()?.parent()?.join("metash");
    if !candidate.is_file() {
        return None;
    }
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if modified(&candidate) < modified(&exe) {
        eprintln!(
            "note: {} is older than this test binary; `cargo test --workspace` (or cargo build -p metash) rebuilds it",
            candidate.display()
        );
    }
    Some(candidate)
}

pub fn client_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/rpc_client.py")
}

pub use metash_testkit::anthropic::{sse_text, sse_tool_use, Captured, ModelServer};
pub use metash_testkit::procs::live_processes;
pub use metash_testkit::wasm::agent_msg;

// ---- a WASM agent that writes protocol lines ----

impl Project {
    /// Registers a WASM agent `id` that writes `lines` (agent-protocol messages) and exits.
    pub fn wasm_agent(&self, id: &str, lines: &[&str]) {
        let wat = self.path().join(format!("{id}.wat"));
        std::fs::write(&wat, metash_testkit::wasm::wat_agent(lines, false)).unwrap();
        let dir = self.path().join(".meta/agents").join(id);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("manifest.toml"),
            format!(
                "schema_version = \"0.1\"\nname = \"{id}\"\nversion = \"0.1.0\"\nentry = {wat:?}\n\
                 sandbox = \"wasm\"\ncapabilities = []\nresources.mem = \"64Mi\"\n"
            ),
        )
        .unwrap();
    }
}
