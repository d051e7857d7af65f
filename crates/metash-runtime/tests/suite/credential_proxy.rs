//! The credential proxy against a loopback upstream the test starts (`upstream.rs`): the real
//! key replaces the agent's placeholder, SSE streams through as it comes, everything else is
//! refused and logged, and the key is never in an event or a Debug string.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_protocol::LogKind;

use metash_runtime::credential::{
    AuthStyle, CredentialProxy, Mount, ProxyConfig, Route, Secret, StaticSource, StreamEnd,
    TapEvent,
};
use metash_runtime::MemorySink;

use super::common::Fixture;
use super::upstream::{read_body, read_chunk, read_headers, Upstream, SSE_FIRST, SSE_REST};

const REAL: &str = "sk-real-KEY-0f9e8d7c6b5a";
const PLACEHOLDER: &str = "metash-placeholder";

struct Setup {
    up: Upstream,
    proxy: CredentialProxy,
    sink: Arc<MemorySink>,
    /// A shared turn: the flood test measures the process's RSS alone.
    _turn: Fixture,
}

fn route(id: &str, mount: Mount, upstream: String, auth: AuthStyle) -> Route {
    Route {
        id: id.into(),
        mount,
        upstream,
        auth,
    }
}

/// Routes: `/anthropic` (x-api-key), `/openai` onto `/v1` (bearer), `/custom` (`api-key`), and
/// `/nokey`, which has no credential in the source.
fn setup_with(edit: impl FnOnce(&mut ProxyConfig)) -> Setup {
    let up = Upstream::start();
    let mut config = ProxyConfig::new(vec![
        route(
            "anthropic",
            Mount::Prefix("/anthropic".into()),
            up.url(),
            AuthStyle::XApiKey,
        ),
        route(
            "openai",
            Mount::Prefix("/openai".into()),
            format!("{}/v1", up.url()),
            AuthStyle::Bearer,
        ),
        route(
            "custom",
            Mount::Prefix("/custom".into()),
            up.url(),
            AuthStyle::Header("api-key".into()),
        ),
        route(
            "nokey",
            Mount::Prefix("/nokey".into()),
            up.url(),
            AuthStyle::Bearer,
        ),
    ]);
    config.agent = Some("executor".into());
    edit(&mut config);
    let source = ["anthropic", "openai", "custom"]
        .into_iter()
        .fold(StaticSource::new(), |s, r| s.with(r, Secret::new(REAL)));
    let turn = Fixture::new();
    let sink = Arc::clone(&turn.sink);
    let proxy =
        CredentialProxy::start(config, Arc::new(source), sink.clone()).expect("proxy starts");
    Setup {
        up,
        proxy,
        sink,
        _turn: turn,
    }
}

fn setup() -> Setup {
    setup_with(|_| {})
}

/// A raw HTTP/1.1 connection to the proxy.
struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Client {
    fn new(s: &Setup) -> Self {
        let w = TcpStream::connect(s.proxy.addr()).expect("connect to the proxy");
        w.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        Self {
            r: BufReader::new(w.try_clone().expect("clone")),
            w,
        }
    }

    fn send(&mut self, raw: &str) {
        self.w.write_all(raw.as_bytes()).expect("write request");
    }

    fn head(&mut self) -> (u16, Vec<(String, String)>) {
        let mut line = String::new();
        self.r.read_line(&mut line).expect("status line");
        let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok());
        let headers = read_headers(&mut self.r).expect("response headers");
        (status.expect("a status code"), headers)
    }

    fn answer(&mut self) -> Answer {
        let (status, headers) = self.head();
        let h = headers.clone();
        let body = read_body(&mut self.r, |n| {
            h.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str())
        })
        .expect("response body");
        Answer {
            status,
            headers,
            body,
        }
    }

    fn get(&mut self, s: &Setup, target: &str, extra: &str) -> Answer {
        self.send(&format!(
            "GET {target} HTTP/1.1\r\nhost: {}\r\n{extra}\r\n",
            s.proxy.addr()
        ));
        self.answer()
    }
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The events of `kind` once there are `n` (the proxy logs a limit after it has answered).
fn events_of(s: &Setup, kind: LogKind, n: usize) -> Vec<metash_runtime::Recorded> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let got = s.sink.of_kind(kind.clone());
        if got.len() >= n || std::time::Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn real_key_replaces_the_placeholder_in_each_style() {
    let s = setup();
    let mut c = Client::new(&s);
    let agent_auth = format!("x-api-key: {PLACEHOLDER}\r\nauthorization: Bearer {PLACEHOLDER}\r\n");
    for target in [
        "/anthropic/v1/messages?beta=true",
        "/openai/responses",
        "/custom/x",
    ] {
        // A custom header is stripped on its own route (elsewhere it is just a header).
        let own = if target == "/custom/x" {
            format!("api-key: {PLACEHOLDER}\r\n")
        } else {
            String::new()
        };
        let a = c.get(&s, target, &format!("{agent_auth}{own}"));
        assert_eq!(
            a.status,
            200,
            "{target}: {}",
            String::from_utf8_lossy(&a.body)
        );
        assert_eq!(a.body, b"{\"ok\":true}");
    }
    let seen = s.up.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0].target, "/v1/messages?beta=true");
    assert_eq!(seen[0].header("x-api-key"), Some(REAL));
    assert_eq!(seen[1].target, "/v1/responses");
    assert_eq!(
        seen[1].header("authorization"),
        Some(format!("Bearer {REAL}").as_str())
    );
    assert_eq!(seen[2].target, "/x");
    assert_eq!(seen[2].header("api-key"), Some(REAL));
    for req in &seen {
        // (1) and (2): only the route's header, only the real key; the Host is the upstream's.
        let auth: Vec<_> = ["x-api-key", "authorization", "api-key"]
            .into_iter()
            .filter(|h| req.header(h).is_some())
            .collect();
        assert_eq!(auth.len(), 1, "{req:?}");
        assert!(
            !format!("{:?}", req.headers).contains(PLACEHOLDER),
            "{req:?}"
        );
        assert_eq!(req.header("host"), Some(s.up.addr.to_string().as_str()));
    }
}

#[test]
fn hop_by_hop_headers_stop_and_a_chunked_body_passes() {
    let s = setup();
    let mut c = Client::new(&s);
    c.send(&format!(
        "POST /anthropic/v1/messages HTTP/1.1\r\nhost: {}\r\nconnection: keep-alive, x-hop\r\nx-hop: 1\r\n\
         proxy-authorization: Basic {PLACEHOLDER}\r\nx-kept: yes\r\ntransfer-encoding: chunked\r\n\r\n\
         5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        s.proxy.addr()
    ));
    let a = c.answer();
    assert_eq!(a.status, 200);
    let seen = s.up.seen();
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].body, b"hello world");
    assert_eq!(seen[0].header("x-kept"), Some("yes"));
    for h in ["x-hop", "proxy-authorization", "keep-alive"] {
        assert_eq!(
            seen[0].header(h),
            None,
            "{h} forwarded: {:?}",
            seen[0].headers
        );
    }
}

#[test]
fn sse_chunks_arrive_before_the_upstream_sends_the_last() {
    let s = setup();
    let mut c = Client::new(&s);
    c.send(&format!(
        "POST /anthropic/sse-gated HTTP/1.1\r\nhost: {}\r\ncontent-length: 2\r\n\r\n{{}}",
        s.proxy.addr()
    ));
    let (status, headers) = c.head();
    assert_eq!(status, 200);
    assert!(headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v == "chunked"));
    // The upstream holds the rest of the stream until this first chunk has reached us.
    let first = read_chunk(&mut c.r).expect("first chunk");
    assert_eq!(String::from_utf8_lossy(&first), SSE_FIRST);
    s.up.release();
    let mut rest = Vec::new();
    while let Some(ch) = read_chunk(&mut c.r) {
        rest.extend(ch);
    }
    assert_eq!(String::from_utf8_lossy(&rest), SSE_REST.concat());
    assert_eq!(
        s.up.released(),
        vec![true],
        "the stream was held back by the proxy"
    );
}

#[test]
fn other_hosts_connect_and_unknown_paths_are_refused_and_logged() {
    let s = setup();
    let port = s.proxy.addr().port();
    let cases = [
        format!("GET /elsewhere/v1 HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\r\n"),
        format!("GET /anthropicx HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\r\n"),
        "GET http://example.com/anthropic/v1 HTTP/1.1\r\nhost: example.com\r\n\r\n".to_string(),
        format!(
            "GET http://127.0.0.1:{}/anthropic/v1 HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n",
            s.up.addr.port()
        ),
        "CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n".to_string(),
        format!("GET /anthropic/v1 HTTP/1.1\r\nhost: rebound.example:{port}\r\n\r\n"),
        format!("GET /anthropic/v1/../../admin HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\r\n"),
        format!("GET /anthropic/%2e%2E/admin HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\r\n"),
    ];
    for raw in &cases {
        let mut c = Client::new(&s);
        c.send(raw);
        let a = c.answer();
        assert_eq!(a.status, 403, "{raw}");
        assert_eq!(a.header("content-type"), Some("application/json"));
        let body: serde_json::Value = serde_json::from_slice(&a.body).expect("JSON error body");
        assert!(body["error"]["message"].is_string(), "{body}");
    }
    let denied = s.sink.of_kind(LogKind::SandboxDenied);
    assert_eq!(denied.len(), cases.len(), "{denied:?}");
    for d in &denied {
        assert_eq!(d.data["what"], "credential_proxy");
        assert!(d.data["reason"].as_str().is_some_and(|r| !r.is_empty()));
        assert_eq!(d.agent.as_deref(), Some("executor"));
    }
    assert!(s.up.seen().is_empty(), "the upstream saw {:?}", s.up.seen());
}

#[test]
fn the_secret_is_in_no_event_and_no_debug_string() {
    let taps = Arc::new(Mutex::new(Vec::new()));
    let t = Arc::clone(&taps);
    let s = setup_with(|c| {
        c.tap = Some(Arc::new(move |e: TapEvent<'_>| {
            t.lock().expect("tap").push(format!("{e:?}"))
        }));
    });
    let mut c = Client::new(&s);
    let a = c.get(&s, "/nokey/v1/x", "");
    assert_eq!(a.status, 503, "a route without a credential fails closed");
    assert!(s.up.seen().is_empty());
    let mut c = Client::new(&s);
    assert_eq!(c.get(&s, "/nowhere", "").status, 403);
    assert_eq!(c.get(&s, "/anthropic/ok", "").status, 200);
    let events = format!("{:?}", s.sink.events());
    assert!(
        events.contains("no credential for route `nokey`"),
        "{events}"
    );
    let debug = format!("{:?}", s.proxy);
    for text in [&events, &debug, &format!("{:?}", taps.lock().expect("tap"))] {
        assert!(!text.contains(REAL), "secret leaked: {text}");
    }
    let src = StaticSource::new().with("r", Secret::new(REAL));
    assert!(!format!("{src:?}").contains(REAL));
}

#[test]
fn keep_alive_serves_two_requests_on_one_connection() {
    let s = setup();
    let mut c = Client::new(&s);
    for target in ["/anthropic/one", "/openai/two"] {
        let a = c.get(&s, target, "");
        assert_eq!(a.status, 200, "{target}");
        assert_eq!(a.body, b"{\"ok\":true}");
    }
    let targets: Vec<_> = s.up.seen().into_iter().map(|r| r.target).collect();
    assert_eq!(targets, ["/one", "/v1/two"]);
}

#[test]
fn the_tap_sees_the_stream_as_it_passes() {
    let taps = Arc::new(Mutex::new(Vec::new()));
    let t = Arc::clone(&taps);
    let s = setup_with(|c| {
        c.tap = Some(Arc::new(move |e: TapEvent<'_>| {
            let line = match e {
                TapEvent::Response { route, status, .. } => format!("response {route} {status}"),
                TapEvent::Chunk { bytes, .. } => String::from_utf8_lossy(bytes).into_owned(),
                TapEvent::End { end, .. } => format!("end {:?}", end == StreamEnd::Complete),
            };
            t.lock().expect("tap").push(line);
        }));
    });
    s.up.release();
    let mut c = Client::new(&s);
    let a = c.get(&s, "/anthropic/sse-gated", "");
    assert_eq!(a.status, 200);
    let seen = taps.lock().expect("tap").clone();
    assert_eq!(
        seen.first().map(String::as_str),
        Some("response anthropic 200")
    );
    assert_eq!(seen.last().map(String::as_str), Some("end true"));
    let body: String = seen[1..seen.len() - 1].concat();
    assert_eq!(body.as_bytes(), a.body.as_slice());
    assert!(body.contains("output_tokens"));
}

#[test]
fn oversized_heads_and_extra_connections_hit_the_limits() {
    let s = setup_with(|c| {
        c.max_connections = 1;
        c.max_header_bytes = 8 * 1024;
    });
    let mut c = Client::new(&s);
    let huge = format!("x-big: {}\r\n", "a".repeat(12 * 1024));
    let a = c.get(&s, "/anthropic/x", &huge);
    assert_eq!(a.status, 431);
    let limits = events_of(&s, LogKind::LimitExceeded, 1);
    assert_eq!(limits.len(), 1, "{limits:?}");
    assert_eq!(limits[0].data["limit"], "credential_proxy_header_bytes");
    assert!(s.up.seen().is_empty());

    // One connection held open (keep-alive); the next is turned away.
    let mut held = Client::new(&s);
    assert_eq!(held.get(&s, "/anthropic/a", "").status, 200);
    let mut extra = Client::new(&s);
    extra.send("GET /anthropic/b HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n");
    assert_eq!(extra.answer().status, 503);
    let limits = events_of(&s, LogKind::LimitExceeded, 2);
    assert_eq!(limits.len(), 2, "{limits:?}");
    assert_eq!(limits[1].data["limit"], "credential_proxy_connections");
    assert_eq!(
        held.get(&s, "/anthropic/c", "").status,
        200,
        "the held one still works"
    );
}

#[test]
fn a_reqwest_client_works_end_to_end_and_the_proxy_stops_on_drop() {
    let s = setup();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let base = s.proxy.base_url("anthropic").expect("route");
    assert_eq!(base, format!("http://{}/anthropic", s.proxy.addr()));
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let r = client
            .post(format!("{base}/v1/messages"))
            .header("x-api-key", PLACEHOLDER)
            .body("{\"model\":\"m\"}")
            .send()
            .await
            .expect("request through the proxy");
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.expect("body"), "{\"ok\":true}");
        let mut r = client
            .post(format!("{base}/sse-gated"))
            .header("x-api-key", PLACEHOLDER)
            .send()
            .await
            .expect("stream through the proxy");
        let first = r.chunk().await.expect("first chunk").expect("some bytes");
        assert_eq!(first.as_ref(), SSE_FIRST.as_bytes());
        s.up.release();
        let mut rest = Vec::new();
        while let Some(c) = r.chunk().await.expect("next chunk") {
            rest.extend_from_slice(&c);
        }
        assert_eq!(rest, SSE_REST.concat().as_bytes());
    });
    let seen = s.up.seen();
    assert_eq!(seen[0].body, b"{\"model\":\"m\"}");
    assert!(seen.iter().all(|r| r.header("x-api-key") == Some(REAL)));
    assert_eq!(s.up.released(), vec![true]);
    let addr = s.proxy.addr();
    drop(s.proxy);
    assert!(
        TcpStream::connect(addr).is_err(),
        "still listening after drop"
    );
}

#[test]
fn an_idle_connection_gives_its_slot_back_after_the_header_timeout() {
    let s = setup_with(|c| {
        c.max_connections = 1;
        c.header_timeout = Duration::from_millis(300);
    });
    let mut idle = Client::new(&s);
    assert_eq!(idle.get(&s, "/anthropic/a", "").status, 200);
    std::thread::sleep(Duration::from_millis(800));
    // The proxy closed the idle keep-alive connection, so a new one is served.
    let mut line = String::new();
    let n = idle
        .r
        .read_line(&mut line)
        .expect("read the closed connection");
    assert_eq!(n, 0, "idle connection still open: {line}");
    let mut next = Client::new(&s);
    assert_eq!(next.get(&s, "/anthropic/b", "").status, 200);
}
