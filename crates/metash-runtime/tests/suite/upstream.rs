//! A loopback HTTP/1.1 upstream for the credential proxy's tests and benchmark (the bench includes
//! this file by path). It records every request it gets (line, headers, body) and answers:
//! `/sse-gated` with an SSE stream whose first chunk goes out at once and the rest only after
//! [`Upstream::release`] (or 5 s), `/big?n=BYTES` with a chunked body of that size, anything else
//! with a small JSON body. Keep-alive and chunked request bodies are served. [`Client`] is the
//! benchmarks' side: one kept-alive connection.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    /// Names lowercased, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

pub const SSE_FIRST: &str = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n";
pub const SSE_REST: [&str; 2] = [
    "event: content_block_delta\ndata: {\"delta\":\"hi\"}\n\n",
    "event: message_delta\ndata: {\"usage\":{\"output_tokens\":7}}\n\n",
];

pub struct Upstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    release: Sender<()>,
    /// Whether each gated stream was released by the test (true) or by the 5 s timeout (false).
    released: Arc<Mutex<Vec<bool>>>,
    stop: Arc<AtomicBool>,
}

struct State {
    seen: Arc<Mutex<Vec<Seen>>>,
    release: Mutex<Receiver<()>>,
    released: Arc<Mutex<Vec<bool>>>,
}

impl Upstream {
    pub fn start() -> Self {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind the test upstream");
        let addr = listener.local_addr().expect("upstream address");
        let (release, rx) = mpsc::channel();
        let state = Arc::new(State {
            seen: Arc::default(),
            release: Mutex::new(rx),
            released: Arc::default(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let up = Self {
            addr,
            seen: Arc::clone(&state.seen),
            release,
            released: Arc::clone(&state.released),
            stop: Arc::clone(&stop),
        };
        thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let state = Arc::clone(&state);
                thread::spawn(move || serve(conn, &state));
            }
        });
        up
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen lock").clone()
    }

    /// Lets a gated SSE stream send its remaining chunks.
    pub fn release(&self) {
        let _ = self.release.send(());
    }

    pub fn released(&self) -> Vec<bool> {
        self.released.lock().expect("released lock").clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(conn: TcpStream, state: &State) {
    // Each answer goes out in whole writes with Nagle off: no delayed-ACK stalls in the bench.
    let _ = conn.set_nodelay(true);
    let mut reader = BufReader::new(conn.try_clone().expect("clone upstream socket"));
    let mut out = conn;
    while let Some(req) = read_request(&mut reader) {
        let close = req.header("connection") == Some("close");
        let target = req.target.clone();
        state.seen.lock().expect("seen lock").push(req);
        let ok = if target == "/sse-gated" || target.ends_with("/sse-gated") {
            answer_sse(&mut out, state)
        } else if let Some(n) = target.split("/big?n=").nth(1) {
            answer_big(&mut out, n.parse().unwrap_or(0))
        } else {
            let body = "{\"ok\":true}";
            let whole = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            out.write_all(whole.as_bytes())
        };
        if ok.is_err() || close {
            return;
        }
    }
}

fn chunk(out: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    let mut whole = format!("{:x}\r\n", data.len()).into_bytes();
    whole.extend_from_slice(data);
    whole.extend_from_slice(b"\r\n");
    out.write_all(&whole)
}

const CHUNKED_HEAD: &str = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n";

fn answer_sse(out: &mut TcpStream, state: &State) -> std::io::Result<()> {
    out.write_all(format!("{CHUNKED_HEAD}content-type: text/event-stream\r\n\r\n").as_bytes())?;
    chunk(out, SSE_FIRST.as_bytes())?;
    let released = {
        let rx = state.release.lock().expect("release lock");
        rx.recv_timeout(Duration::from_secs(5)).is_ok()
    };
    state.released.lock().expect("released lock").push(released);
    for part in SSE_REST {
        thread::sleep(Duration::from_millis(30));
        chunk(out, part.as_bytes())?;
    }
    out.write_all(b"0\r\n\r\n")
}

fn answer_big(out: &mut TcpStream, n: usize) -> std::io::Result<()> {
    out.write_all(
        format!("{CHUNKED_HEAD}content-type: application/octet-stream\r\n\r\n").as_bytes(),
    )?;
    let piece = vec![b'x'; 64 * 1024];
    let mut left = n;
    while left > 0 {
        let k = left.min(piece.len());
        chunk(out, &piece[..k])?;
        left -= k;
    }
    out.write_all(b"0\r\n\r\n")
}

/// A request head and body (by `content-length` or chunked); `None` at end of stream.
pub fn read_request(r: &mut impl BufRead) -> Option<Seen> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let headers = read_headers(r)?;
    let seen = Seen {
        method,
        target,
        headers,
        body: Vec::new(),
    };
    let body = read_body(r, |n| seen.header(n))?;
    Some(Seen { body, ..seen })
}

/// Header lines up to the blank line, names lowercased.
pub fn read_headers(r: &mut impl BufRead) -> Option<Vec<(String, String)>> {
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            return Some(headers);
        }
        let (n, v) = line.split_once(':')?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
}

/// A message body framed by `content-length` or `transfer-encoding: chunked` (else empty).
pub fn read_body<'h>(
    r: &mut impl BufRead,
    header: impl Fn(&str) -> Option<&'h str>,
) -> Option<Vec<u8>> {
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut body = Vec::new();
        while let Some(c) = read_chunk(r) {
            body.extend_from_slice(&c);
        }
        return Some(body);
    }
    let n: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; n];
    r.read_exact(&mut body).ok()?;
    Some(body)
}

/// One chunk of a chunked body; `None` after the last (and its trailer).
pub fn read_chunk(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
    if size == 0 {
        read_headers(r)?;
        return None;
    }
    let mut data = vec![0; size + 2];
    r.read_exact(&mut data).ok()?;
    data.truncate(size);
    Some(data)
}

/// A kept-alive HTTP/1.1 client connection, as the benchmarks use: Nagle off, whole writes.
#[allow(dead_code)] // the test suite includes this file too, and uses only the server
pub struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
    addr: SocketAddr,
}

#[allow(dead_code)]
impl Client {
    pub fn new(addr: SocketAddr) -> Self {
        let w = TcpStream::connect(addr).expect("connect");
        w.set_nodelay(true).expect("nodelay");
        Self {
            r: BufReader::new(w.try_clone().expect("clone")),
            w,
            addr,
        }
    }

    /// One GET carrying a placeholder credential of each usual kind (a proxy must replace them);
    /// the body's length. Panics unless the answer is 200.
    pub fn get(&mut self, target: &str) -> usize {
        let req = format!(
            "GET {target} HTTP/1.1\r\nhost: {}\r\nx-api-key: placeholder\r\n\
             authorization: Bearer placeholder\r\n\r\n",
            self.addr
        );
        self.w.write_all(req.as_bytes()).expect("write");
        let mut line = String::new();
        self.r.read_line(&mut line).expect("status");
        assert!(line.starts_with("HTTP/1.1 200"), "{line}");
        let h = read_headers(&mut self.r).expect("headers");
        read_body(&mut self.r, |n| {
            h.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str())
        })
        .expect("body")
        .len()
    }
}
