//! Loopback model servers for the tests: a tiny HTTP/1.1 server on 127.0.0.1 (ephemeral port) that
//! captures every request and answers with scripted responses in the exact wire formats of the
//! Anthropic Messages SSE, OpenAI Responses SSE and chat completions SSE protocols.
//! NETWORK RULE: nothing here ever connects anywhere; it only listens on loopback.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone)]
pub struct Captured {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Captured {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone)]
pub enum Reply {
    /// An SSE body; `cut_after` closes the connection after that many events.
    Sse {
        events: Vec<(Option<String>, String)>,
        cut_after: Option<usize>,
    },
    Status {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Sends headers, then stays silent (for idle timeouts and cancellation).
    Stall,
    /// A prebuilt SSE body written in large writes (for the benchmark).
    #[allow(dead_code)]
    RawSse(Arc<Vec<u8>>),
}

type Responder = dyn Fn(&Captured) -> Reply + Send + Sync;

pub struct MockServer {
    pub base: String,
    pub requests: Arc<Mutex<Vec<Captured>>>,
    queue: Arc<Mutex<VecDeque<Reply>>>,
}

impl MockServer {
    /// Starts a server; POSTs get the queued replies in order, then `fallback`.
    pub async fn start(fallback: impl Fn(&Captured) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let queue: Arc<Mutex<VecDeque<Reply>>> = Arc::new(Mutex::new(VecDeque::new()));
        let fallback: Arc<Responder> = Arc::new(fallback);
        let (r, q) = (requests.clone(), queue.clone());
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    break;
                };
                let (r, q, f) = (r.clone(), q.clone(), fallback.clone());
                tokio::spawn(async move {
                    let _ = serve(sock, r, q, f).await;
                });
            }
        });
        Self {
            base: format!("http://{addr}"),
            requests,
            queue,
        }
    }

    pub fn push(&self, reply: Reply) {
        self.queue.lock().unwrap().push_back(reply);
    }

    /// The captured model requests (POSTs), in order.
    pub fn posts(&self) -> Vec<Captured> {
        let all = self.requests.lock().unwrap();
        all.iter().filter(|c| c.method == "POST").cloned().collect()
    }

    pub fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

async fn serve(
    mut sock: TcpStream,
    requests: Arc<Mutex<Vec<Captured>>>,
    queue: Arc<Mutex<VecDeque<Reply>>>,
    fallback: Arc<Responder>,
) -> std::io::Result<()> {
    loop {
        let Some(req) = read_request(&mut sock).await? else {
            return Ok(());
        };
        requests.lock().unwrap().push(req.clone());
        if req.method != "POST" {
            let body = if req.method == "HEAD" { "" } else { "{}" };
            let resp = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", if req.method == "HEAD" { 0 } else { body.len() });
            sock.write_all(resp.as_bytes()).await?;
            continue;
        }
        let reply = queue
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| fallback(&req));
        match reply {
            Reply::Status {
                status,
                headers,
                body,
            } => {
                let mut head = format!("HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
                for (k, v) in headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                sock.write_all(head.as_bytes()).await?;
                sock.write_all(body.as_bytes()).await?;
                sock.flush().await?;
                return Ok(());
            }
            Reply::Sse { events, cut_after } => {
                sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n").await?;
                for (i, (name, data)) in events.iter().enumerate() {
                    if cut_after == Some(i) {
                        // Half an event, then the connection drops.
                        sock.write_all(b"data: {\"type\":\"cont").await?;
                        sock.flush().await?;
                        return Ok(());
                    }
                    let mut frame = String::new();
                    if let Some(n) = name {
                        frame.push_str(&format!("event: {n}\n"));
                    }
                    frame.push_str(&format!("data: {data}\n\n"));
                    sock.write_all(frame.as_bytes()).await?;
                }
                sock.flush().await?;
                return Ok(());
            }
            Reply::RawSse(bytes) => {
                sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n").await?;
                sock.write_all(&bytes).await?;
                sock.flush().await?;
                return Ok(());
            }
            Reply::Stall => {
                sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n").await?;
                sock.flush().await?;
                tokio::time::sleep(Duration::from_secs(30)).await;
                return Ok(());
            }
        }
    }
}

async fn read_request(sock: &mut TcpStream) -> std::io::Result<Option<Captured>> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let n = sock.read(&mut tmp).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or("");
    let mut parts = first.split(' ');
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect();
    let mut body = buf[head_end + 4..].to_vec();
    let get = |k: &str| headers.iter().find(|(h, _)| h == k).map(|(_, v)| v.clone());
    if let Some(len) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while body.len() < len {
            let n = sock.read(&mut tmp).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&tmp[..n]);
        }
        body.truncate(len);
    } else if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut raw = body;
        let mut out = Vec::new();
        loop {
            if let Some(p) = raw.windows(2).position(|w| w == b"\r\n") {
                let size = usize::from_str_radix(String::from_utf8_lossy(&raw[..p]).trim(), 16)
                    .unwrap_or(0);
                if size == 0 {
                    break;
                }
                if raw.len() >= p + 2 + size + 2 {
                    out.extend_from_slice(&raw[p + 2..p + 2 + size]);
                    raw.drain(..p + 2 + size + 2);
                    continue;
                }
            }
            let n = sock.read(&mut tmp).await?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&tmp[..n]);
        }
        body = out;
    }
    Ok(Some(Captured {
        method,
        path,
        headers,
        body,
    }))
}

// ---- Anthropic Messages SSE ----

fn ev(name: &str, data: Value) -> (Option<String>, String) {
    (Some(name.to_string()), data.to_string())
}

pub fn anthropic_start(model: &str) -> (Option<String>, String) {
    ev(
        "message_start",
        json!({"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","model":model,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":11,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}),
    )
}

pub fn anthropic_text(text: &str) -> Reply {
    let mut events = vec![
        anthropic_start("claude-sonnet-4-5"),
        ev(
            "content_block_start",
            json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
        ),
        ev("ping", json!({"type":"ping"})),
    ];
    for piece in split_pieces(text) {
        events.push(ev("content_block_delta", json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":piece}})));
    }
    events.push(ev(
        "content_block_stop",
        json!({"type":"content_block_stop","index":0}),
    ));
    events.push(ev("message_delta", json!({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7}})));
    events.push(ev("message_stop", json!({"type":"message_stop"})));
    Reply::Sse {
        events,
        cut_after: None,
    }
}

pub fn anthropic_tool_use(id: &str, name: &str, input: Value) -> Reply {
    let s = input.to_string();
    let (a, b) = s.split_at(s.len() / 2);
    let events = vec![
        anthropic_start("claude-sonnet-4-5"),
        ev(
            "content_block_start",
            json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
        ),
        ev(
            "content_block_delta",
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Checking."}}),
        ),
        ev(
            "content_block_stop",
            json!({"type":"content_block_stop","index":0}),
        ),
        ev(
            "content_block_start",
            json!({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":id,"name":name,"input":{}}}),
        ),
        ev(
            "content_block_delta",
            json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":a}}),
        ),
        ev(
            "content_block_delta",
            json!({"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":b}}),
        ),
        ev(
            "content_block_stop",
            json!({"type":"content_block_stop","index":1}),
        ),
        ev(
            "message_delta",
            json!({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":20}}),
        ),
        ev("message_stop", json!({"type":"message_stop"})),
    ];
    Reply::Sse {
        events,
        cut_after: None,
    }
}

pub fn anthropic_error(status: u16, kind: &str, message: &str) -> Reply {
    Reply::Status {
        status,
        headers: vec![],
        body: json!({"type":"error","error":{"type":kind,"message":message}}).to_string(),
    }
}

pub fn too_many(retry_after: &str) -> Reply {
    Reply::Status {
        status: 429,
        headers: vec![("retry-after".into(), retry_after.into())],
        body: json!({"type":"error","error":{"type":"rate_limit_error","message":"slow down"}})
            .to_string(),
    }
}

fn split_pieces(text: &str) -> Vec<String> {
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    if words.is_empty() {
        vec![String::new()]
    } else {
        words.into_iter().map(str::to_string).collect()
    }
}

// ---- OpenAI Responses SSE ----

fn rev(data: Value) -> (Option<String>, String) {
    let name = data["type"].as_str().unwrap_or("").to_string();
    (Some(name), data.to_string())
}

fn responses_completed(id: &str) -> (Option<String>, String) {
    rev(
        json!({"type":"response.completed","response":{"id":id,"object":"response","status":"completed","output":[],"usage":{"input_tokens":13,"input_tokens_details":{"cached_tokens":0},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":18}}}),
    )
}

pub fn responses_text(text: &str) -> Reply {
    let item = json!({"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":text,"annotations":[]}]});
    let mut events = vec![
        rev(
            json!({"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}),
        ),
        rev(
            json!({"type":"response.in_progress","response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}),
        ),
        rev(
            json!({"type":"response.output_item.added","output_index":0,"item":{"type":"message","id":"msg_1","status":"in_progress","role":"assistant","content":[]}}),
        ),
        rev(
            json!({"type":"response.content_part.added","item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}),
        ),
    ];
    for piece in split_pieces(text) {
        events.push(rev(json!({"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":piece})));
    }
    events.push(rev(json!({"type":"response.output_text.done","item_id":"msg_1","output_index":0,"content_index":0,"text":text})));
    events.push(rev(json!({"type":"response.content_part.done","item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":text,"annotations":[]}})));
    events.push(rev(
        json!({"type":"response.output_item.done","output_index":0,"item":item}),
    ));
    events.push(responses_completed("resp_1"));
    Reply::Sse {
        events,
        cut_after: None,
    }
}

pub fn responses_function_call(call_id: &str, name: &str, args: &str) -> Reply {
    let item = json!({"type":"function_call","id":"fc_1","status":"completed","call_id":call_id,"name":name,"arguments":args});
    let events = vec![
        rev(
            json!({"type":"response.created","response":{"id":"resp_2","object":"response","status":"in_progress","output":[]}}),
        ),
        rev(
            json!({"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc_1","status":"in_progress","call_id":call_id,"name":name,"arguments":""}}),
        ),
        rev(
            json!({"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":args}),
        ),
        rev(
            json!({"type":"response.function_call_arguments.done","item_id":"fc_1","output_index":0,"arguments":args}),
        ),
        rev(json!({"type":"response.output_item.done","output_index":0,"item":item})),
        responses_completed("resp_2"),
    ];
    Reply::Sse {
        events,
        cut_after: None,
    }
}

pub fn openai_error(status: u16, message: &str) -> Reply {
    Reply::Status { status, headers: vec![], body: json!({"error":{"message":message,"type":"invalid_request_error","param":null,"code":null}}).to_string() }
}

// ---- chat completions SSE ----

fn chunk(delta: Value, finish: Option<&str>) -> (Option<String>, String) {
    (None, json!({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"test-model","choices":[{"index":0,"delta":delta,"finish_reason":finish}]}).to_string())
}

fn usage_chunk() -> (Option<String>, String) {
    (None, json!({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"test-model","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}).to_string())
}

pub fn chat_text(text: &str) -> Reply {
    let mut events = vec![chunk(json!({"role":"assistant","content":""}), None)];
    for piece in split_pieces(text) {
        events.push(chunk(json!({"content":piece}), None));
    }
    events.push(chunk(json!({}), Some("stop")));
    events.push(usage_chunk());
    events.push((None, "[DONE]".to_string()));
    Reply::Sse {
        events,
        cut_after: None,
    }
}

pub fn chat_tool_call(id: &str, name: &str, args: &str) -> Reply {
    let (a, b) = args.split_at(args.len() / 2);
    let events = vec![
        chunk(
            json!({"role":"assistant","content":null,"tool_calls":[{"index":0,"id":id,"type":"function","function":{"name":name,"arguments":""}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls":[{"index":0,"function":{"arguments":a}}]}),
            None,
        ),
        chunk(
            json!({"tool_calls":[{"index":0,"function":{"arguments":b}}]}),
            None,
        ),
        chunk(json!({}), Some("tool_calls")),
        usage_chunk(),
        (None, "[DONE]".to_string()),
    ];
    Reply::Sse {
        events,
        cut_after: None,
    }
}

pub fn cut(reply: Reply, after: usize) -> Reply {
    match reply {
        Reply::Sse { events, .. } => Reply::Sse {
            events,
            cut_after: Some(after),
        },
        other => other,
    }
}

// ---- the real CLIs ----

/// `.tools/` of the workspace (or `METASH_TOOLS_DIR`), where `scripts/setup` installs the CLIs.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("METASH_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools"))
}

pub fn programs() -> metash_harness::Programs {
    metash_harness::Programs::in_tools_dir(&tools_dir())
}

/// Prints why a real-CLI test is skipped (never passes silently) and returns None.
pub fn require(p: metash_harness::Program) -> Option<PathBuf> {
    let found = programs().get(p).map(|p| p.to_path_buf());
    if found.is_none() {
        metash_testkit::skip(
            p.name(),
            &format!(
                "not installed under {} (run scripts/setup, which installs the harness CLIs from the npm registry)",
                tools_dir().display()
            ),
        );
    }
    found
}

/// Runs one turn to its end: the response and its events, whose `seq` must be gapless from 1.
pub async fn run_turn(
    h: &metash_harness::Harness,
    req: &metash_harness::RunTurnNonInteractiveRequest,
) -> (
    metash_protocol::RunTurnNonInteractiveResponse,
    Vec<metash_protocol::HarnessEventEnvelope>,
) {
    let mut events = Vec::new();
    let resp = h
        .run_turn_non_interactive(req, &metash_harness::CancellationToken::new(), &mut |e| {
            events.push(e)
        })
        .await
        .unwrap();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "seq is gapless");
    }
    (resp, events)
}
