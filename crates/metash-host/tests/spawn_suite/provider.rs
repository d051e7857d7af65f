//! A loopback server speaking the Anthropic Messages streaming protocol, scripted per request,
//! capturing every request body so a test can assert what the model received.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

#[derive(Clone)]
pub enum Reply {
    /// Streams `text` with this usage and stop reason.
    Text {
        text: String,
        input_tokens: u64,
        output_tokens: u64,
        stop: &'static str,
    },
    /// Waits before answering at all.
    Slow(Duration),
}

impl Reply {
    pub fn text(t: &str) -> Self {
        Self::Text {
            text: t.into(),
            input_tokens: 11,
            output_tokens: 7,
            stop: "end_turn",
        }
    }
}

pub struct Provider {
    pub base_url: String,
    pub requests: Arc<Mutex<Vec<Value>>>,
}

impl Provider {
    /// Serves `replies` in order (the last one repeats).
    pub fn start(replies: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let reqs = Arc::clone(&requests);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let reqs = Arc::clone(&reqs);
                let replies = replies.clone();
                std::thread::spawn(move || serve(stream, &reqs, &replies));
            }
        });
        Self { base_url, requests }
    }

    pub fn bodies(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, reqs: &Mutex<Vec<Value>>, replies: &[Reply]) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if !request_line.starts_with("POST") {
            let _ = out.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
            continue;
        }
        let n = {
            let mut r = reqs.lock().unwrap();
            r.push(serde_json::from_slice(&body).unwrap_or(Value::Null));
            r.len()
        };
        let reply = replies[(n - 1).min(replies.len() - 1)].clone();
        match reply {
            Reply::Slow(d) => {
                std::thread::sleep(d);
                return;
            }
            Reply::Text {
                text,
                input_tokens,
                output_tokens,
                stop,
            } => {
                let events = [
                    (
                        "message_start",
                        json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"test-model","content":[],"stop_reason":null,"usage":{"input_tokens":input_tokens,"output_tokens":1}}}),
                    ),
                    (
                        "content_block_start",
                        json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
                    ),
                    (
                        "content_block_delta",
                        json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":text}}),
                    ),
                    (
                        "content_block_stop",
                        json!({"type":"content_block_stop","index":0}),
                    ),
                    (
                        "message_delta",
                        json!({"type":"message_delta","delta":{"stop_reason":stop},"usage":{"output_tokens":output_tokens}}),
                    ),
                    ("message_stop", json!({"type":"message_stop"})),
                ];
                let mut sse = String::new();
                for (name, data) in events {
                    sse.push_str(&format!("event: {name}\ndata: {data}\n\n"));
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
                    sse.len()
                );
                if out
                    .write_all(head.as_bytes())
                    .and_then(|_| out.write_all(sse.as_bytes()))
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}
