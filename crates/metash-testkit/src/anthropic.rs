//! A loopback server speaking the Anthropic Messages streaming protocol (SSE), std only. Each
//! request is captured (method and body) for assertions; each POST is answered with the SSE body
//! the test's responder returns for it (a responder may also sleep, to play a slow provider).
//! NETWORK RULE: it listens on 127.0.0.1 (ephemeral port) only.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

#[derive(Debug, Clone)]
pub struct Captured {
    pub method: String,
    /// The request target (path and query).
    pub path: String,
    /// Header names lowercased, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Captured {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Each POST is answered with the SSE body `reply` returns for it.
pub struct ModelServer {
    pub base: String,
    pub requests: Arc<Mutex<Vec<Captured>>>,
}

type Responder = dyn Fn(&Captured) -> String + Send + Sync;

impl ModelServer {
    pub fn start(reply: impl Fn(&Captured) -> String + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let reply: Arc<Responder> = Arc::new(reply);
        let reqs = requests.clone();
        std::thread::spawn(move || {
            for sock in listener.incoming() {
                let Ok(sock) = sock else { break };
                let (reqs, reply) = (reqs.clone(), reply.clone());
                std::thread::spawn(move || {
                    let _ = serve_conn(sock, &reqs, &*reply);
                });
            }
        });
        Self { base, requests }
    }

    pub fn posts(&self) -> Vec<Captured> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.method == "POST")
            .cloned()
            .collect()
    }
}

fn serve_conn(
    mut sock: TcpStream,
    reqs: &Mutex<Vec<Captured>>,
    reply: &Responder,
) -> std::io::Result<()> {
    sock.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut reader = BufReader::new(sock.try_clone()?);
    loop {
        let mut first = String::new();
        if reader.read_line(&mut first)? == 0 {
            return Ok(());
        }
        let mut parts = first.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let mut len = 0usize;
        let mut chunked = false;
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h)? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                headers.push((k.clone(), v.to_string()));
                if k == "content-length" {
                    len = v.parse().unwrap_or(0);
                } else if k == "transfer-encoding" && v.contains("chunked") {
                    chunked = true;
                }
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                reader.read_line(&mut size)?;
                let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                let mut chunk = vec![0; n + 2];
                reader.read_exact(&mut chunk)?;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else {
            body = vec![0; len];
            reader.read_exact(&mut body)?;
        }
        let captured = Captured {
            method,
            path,
            headers,
            body,
        };
        reqs.lock().unwrap().push(captured.clone());
        if captured.method != "POST" {
            let resp = if captured.method == "HEAD" {
                "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_string()
            } else {
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
                    .to_string()
            };
            sock.write_all(resp.as_bytes())?;
            continue;
        }
        let sse = reply(&captured);
        sock.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n",
        )?;
        sock.write_all(sse.as_bytes())?;
        sock.flush()?;
        return Ok(());
    }
}

fn frame(out: &mut String, data: Value) {
    let name = data["type"].as_str().unwrap_or("").to_string();
    out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
}

fn message_start(out: &mut String, model: &str, input_tokens: u64) {
    frame(
        out,
        json!({"type":"message_start","message":{"id":"msg_loop","type":"message","role":"assistant","model":model,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":input_tokens,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}),
    );
}

/// A complete streamed text answer.
pub fn sse_text(text: &str) -> String {
    sse_text_with(text, 12, 9, "end_turn")
}

/// A streamed text answer with this usage and stop reason.
pub fn sse_text_with(text: &str, input_tokens: u64, output_tokens: u64, stop: &str) -> String {
    let mut s = String::new();
    message_start(&mut s, "claude-sonnet-4-5", input_tokens);
    frame(
        &mut s,
        json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
    );
    frame(
        &mut s,
        json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":text}}),
    );
    frame(&mut s, json!({"type":"content_block_stop","index":0}));
    frame(
        &mut s,
        json!({"type":"message_delta","delta":{"stop_reason":stop,"stop_sequence":null},"usage":{"output_tokens":output_tokens}}),
    );
    frame(&mut s, json!({"type":"message_stop"}));
    s
}

/// A complete streamed `tool_use` of `name` with `input`.
pub fn sse_tool_use(id: &str, name: &str, input: &Value) -> String {
    sse_tool_use_with(id, name, input, 20)
}

/// [`sse_tool_use`] reporting `output_tokens` of usage.
pub fn sse_tool_use_with(id: &str, name: &str, input: &Value, output_tokens: u64) -> String {
    let mut s = String::new();
    message_start(&mut s, "claude-sonnet-4-5", 12);
    frame(
        &mut s,
        json!({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":id,"name":name,"input":{}}}),
    );
    frame(
        &mut s,
        json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":input.to_string()}}),
    );
    frame(&mut s, json!({"type":"content_block_stop","index":0}));
    frame(
        &mut s,
        json!({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":output_tokens}}),
    );
    frame(&mut s, json!({"type":"message_stop"}));
    s
}
