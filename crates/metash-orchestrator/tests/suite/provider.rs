//! A loopback model server speaking the Anthropic Messages streaming protocol. Each request is
//! answered by a closure over its JSON body (so a test scripts the planner, executor and verifier
//! by what they were asked), and every body is kept for assertions.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

type Script = dyn Fn(&Value) -> String + Send + Sync;

pub struct Provider {
    pub base_url: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

impl Provider {
    pub fn start(script: impl Fn(&Value) -> String + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let reqs = Arc::clone(&requests);
        let script: Arc<Script> = Arc::new(script);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let reqs = Arc::clone(&reqs);
                let script = Arc::clone(&script);
                std::thread::spawn(move || serve(stream, &reqs, script.as_ref()));
            }
        });
        Self { base_url, requests }
    }

    pub fn bodies(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, reqs: &Mutex<Vec<Value>>, script: &Script) {
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
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        reqs.lock().unwrap().push(body.clone());
        let text = script(&body);
        let events = [
            (
                "message_start",
                json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"test-model","content":[],"stop_reason":null,"usage":{"input_tokens":20,"output_tokens":1}}}),
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
                json!({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":10}}),
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
