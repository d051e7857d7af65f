//! Recording at the credential proxy (issue 36): an exchange reaches the host's recorder with
//! its request (body, headers without auth or cookies) and its streamed response (each chunk's
//! arrival offset), and no recorded byte holds the key or the placeholder, even when a hostile
//! upstream echoes the key back split across two chunks.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_runtime::credential::{
    AuthStyle, CredentialProxy, Exchange, Mount, ProxyConfig, Route, Secret, StaticSource,
    StreamEnd,
};
use metash_runtime::MemorySink;

pub(super) const REAL: &str = "sk-real-RECORDED-5e4d3c2b1a";
pub(super) const PLACEHOLDER: &str = "metash-placeholder-for-the-tape";
const GAP_MS: u64 = 60;

/// An upstream that answers every request with a chunked SSE stream in two chunks, `GAP_MS`
/// apart, echoing the key it was sent split between them. Returns its address.
pub(super) fn echoing_upstream() -> SocketAddr {
    let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind the test upstream");
    let addr = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || serve(conn));
        }
    });
    addr
}

fn serve(conn: TcpStream) {
    let mut r = BufReader::new(conn.try_clone().expect("clone"));
    let mut w = conn;
    loop {
        let mut key = String::new();
        let mut len = 0usize;
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (n, v) = l.split_once(':').unwrap_or((l, ""));
            match n.to_ascii_lowercase().as_str() {
                "x-api-key" => key = v.trim().to_string(),
                "content-length" => len = v.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let (a, b) = key.split_at(key.len() / 2);
        let first = format!("event: message_start\ndata: {{\"echo\":\"{a}");
        let second = format!("{b}\"}}\n\n");
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                    set-cookie: session=abc\r\ntransfer-encoding: chunked\r\n\r\n";
        let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
        let _ = w.write_all(format!("{head}{}", chunk(&first)).as_bytes());
        let _ = w.flush();
        std::thread::sleep(Duration::from_millis(GAP_MS));
        let _ = w.write_all(format!("{}0\r\n\r\n", chunk(&second)).as_bytes());
        let _ = w.flush();
    }
}

pub(super) fn proxy(recorded: Arc<Mutex<Vec<Exchange>>>) -> CredentialProxy {
    let up = echoing_upstream();
    let mut config = ProxyConfig::new(vec![Route {
        id: "model".into(),
        mount: Mount::WholePort,
        upstream: format!("http://{up}"),
        auth: AuthStyle::XApiKey,
    }]);
    config.recorder = Some(Arc::new(move |ex: Exchange| {
        recorded.lock().expect("lock").push(ex);
    }));
    config.redact = vec![PLACEHOLDER.into()];
    let source = StaticSource::new().with("model", Secret::new(REAL));
    CredentialProxy::start(config, Arc::new(source), Arc::new(MemorySink::new()))
        .expect("proxy starts")
}

/// Sends one request and reads the whole (chunked) answer.
pub(super) fn exchange(proxy: &CredentialProxy, body: &str) -> String {
    let mut s = TcpStream::connect(proxy.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let req = format!(
        "POST /v1/messages?beta=true HTTP/1.1\r\nhost: {}\r\nx-api-key: {PLACEHOLDER}\r\n\
         authorization: Bearer {PLACEHOLDER}\r\ncookie: c=1\r\nanthropic-version: 2023-06-01\r\n\
         content-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        proxy.addr(),
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

pub(super) fn recorded_after(recorded: &Arc<Mutex<Vec<Exchange>>>, n: usize) -> Vec<Exchange> {
    // Generous: the delivery thread may be descheduled on a loaded machine.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = recorded.lock().expect("lock").clone();
        if got.len() >= n || std::time::Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

#[test]
fn an_sse_exchange_is_recorded_whole_with_offsets_and_no_key() {
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let proxy = proxy(Arc::clone(&recorded));
    let body = format!("{{\"messages\":[{{\"content\":\"hello {PLACEHOLDER}\"}}]}}");
    let answer = exchange(&proxy, &body);
    // The agent got the upstream's echo of the real key: the proxy forwards, it does not edit.
    assert!(answer.contains("sk-real-"), "{answer}");
    let got = recorded_after(&recorded, 1);
    assert_eq!(got.len(), 1);
    let ex = &got[0];
    assert_eq!((ex.method.as_str(), ex.route.as_str()), ("POST", "model"));
    assert_eq!(ex.target, "/v1/messages?beta=true");
    assert_eq!(ex.status, 200);
    assert_eq!(ex.end, StreamEnd::Complete);
    // The request as sent, the placeholder masked to the same length.
    let masked = body.replace(PLACEHOLDER, &"*".repeat(PLACEHOLDER.len()));
    assert_eq!(String::from_utf8_lossy(&ex.request_body), masked);
    for h in ["x-api-key", "authorization", "cookie", "connection"] {
        assert_eq!(header(&ex.request_headers, h), None, "{h} recorded");
    }
    assert_eq!(
        header(&ex.request_headers, "anthropic-version"),
        Some("2023-06-01")
    );
    assert_eq!(header(&ex.response_headers, "set-cookie"), None);
    assert_eq!(
        header(&ex.response_headers, "content-type"),
        Some("text/event-stream")
    );
    // Streamed as it came: the upstream's two HTTP chunks stay separate records (a chunked
    // decoder never joins two chunks into one frame), in arrival order. The recording's clock
    // starts before the request is forwarded, and the upstream writes its second chunk only
    // `GAP_MS` after it has read that request, so the last chunk's offset is at least the gap.
    // How late the proxy saw the first chunk is scheduling, so the gap between the two is not
    // asserted.
    assert!(ex.chunks.len() >= 2, "{:?}", ex.chunks);
    let (first, last) = (ex.chunks[0], ex.chunks[ex.chunks.len() - 1]);
    assert!(last.offset_ms >= GAP_MS, "{:?}", ex.chunks);
    assert!(
        ex.chunks
            .windows(2)
            .all(|w| w[0].offset_ms <= w[1].offset_ms),
        "{:?}",
        ex.chunks
    );
    assert!(ex.head_ms <= first.offset_ms && last.offset_ms <= ex.duration_ms);
    let total: usize = ex.chunks.iter().map(|c| c.len).sum();
    assert_eq!(total, ex.response_body.len());
    // The echoed key, split across the chunks, is masked whole.
    let text = String::from_utf8_lossy(&ex.response_body);
    assert!(
        text.contains(&format!("\"echo\":\"{}\"", "*".repeat(REAL.len()))),
        "{text}"
    );
    // Nowhere in what was recorded.
    let all = format!("{ex:?}");
    for secret in [
        REAL,
        PLACEHOLDER,
        &REAL[..REAL.len() / 2],
        &REAL[REAL.len() / 2..],
    ] {
        assert!(!all.contains(secret), "`{secret}` recorded");
    }
}

#[test]
fn each_exchange_of_a_turn_is_recorded_in_order() {
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let proxy = proxy(Arc::clone(&recorded));
    for i in 0..3 {
        exchange(&proxy, &format!("{{\"turn\":{i}}}"));
    }
    let got = recorded_after(&recorded, 3);
    let bodies: Vec<String> = got
        .iter()
        .map(|e| String::from_utf8_lossy(&e.request_body).into_owned())
        .collect();
    assert_eq!(bodies, ["{\"turn\":0}", "{\"turn\":1}", "{\"turn\":2}"]);
    let ids: Vec<u64> = got.iter().map(|e| e.exchange).collect();
    assert_eq!(ids, [0, 1, 2]);
}
