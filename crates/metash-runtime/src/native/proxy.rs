//! The host-side HTTP proxy through which an agent with `network` + an allowlist reaches the
//! outside. The sandbox lets the agent connect to this proxy's port only; the proxy checks the
//! requested host against the allowlist before it resolves or connects anything and, when the host
//! plugged in a live [`Gate`], asks it per connection (that is where consent for network writes is
//! asked, per action). Two forms are served: `CONNECT host:port` (a tunnel, usually TLS: the proxy
//! cannot see what goes through, so it counts as a write) and plain HTTP in absolute form
//! (`GET http://host/path`), where the method tells reads from writes. Every refusal is logged as
//! `sandbox_denied` and, with a gate, also reaches the agent as an `error` event.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use metash_protocol::LogKind;

use metash_protocol::AgentEvent;
use serde_json::json;

use crate::reply::Replier;
use crate::sink::EventSink;
use crate::spec::{domain_allowed, Gate, GateVerdict, GatedAction};

/// Connections served at once; more are refused (and logged) instead of queueing without bound.
const MAX_CONNECTIONS: usize = 32;
const MAX_HEAD: usize = 8 * 1024;

/// Who the proxy serves and who it asks.
#[derive(Clone)]
pub struct ProxyCfg {
    pub agent: String,
    pub allowlist: Vec<String>,
    pub sink: Arc<dyn EventSink>,
    pub gate: Gate,
    pub replier: Replier,
}

/// A running proxy; stops accepting when dropped.
pub struct ConnectProxy {
    port: u16,
    stop: Arc<AtomicBool>,
}

/// The variables that send HTTP clients through the proxy on `port`.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
    ]
    .into_iter()
    .map(|k| (k.to_string(), url.clone()))
    .collect()
}

impl ConnectProxy {
    /// Listen on 127.0.0.1 (an ephemeral port) and serve `cfg.allowlist` for `cfg.agent`.
    ///
    /// # Errors
    /// The listener could not be bound.
    pub fn start(cfg: ProxyCfg) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicUsize::new(0));
        let stop2 = Arc::clone(&stop);
        thread::Builder::new()
            .name(format!("metash-proxy-{}", cfg.agent))
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                        cfg.sink.record(
                            LogKind::LimitExceeded,
                            Some(&cfg.agent),
                            json!({"limit": "proxy_connections", "max": MAX_CONNECTIONS}),
                        );
                        let _ = (&conn).write_all(b"HTTP/1.1 503 Too Many Connections\r\n\r\n");
                        continue;
                    }
                    active.fetch_add(1, Ordering::SeqCst);
                    let (cfg, active) = (cfg.clone(), Arc::clone(&active));
                    let _ = thread::Builder::new()
                        .name("metash-proxy-conn".into())
                        .spawn(move || {
                            let _ = serve(conn, &cfg);
                            active.fetch_sub(1, Ordering::SeqCst);
                        });
                }
            })?;
        Ok(Self { port, stop })
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_millis(100),
        );
    }
}

/// Methods that only read: everything else through the proxy is a network write.
fn is_read_method(method: &str) -> bool {
    ["GET", "HEAD", "OPTIONS", "TRACE"]
        .iter()
        .any(|m| m.eq_ignore_ascii_case(method))
}

/// `host:port` (brackets allowed around IPv6) with a default port.
fn split_host_port(authority: &str, default: Option<u16>) -> Option<(String, u16)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (h, tail) = rest.split_once(']')?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => default?,
        };
        return Some((h.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((authority.to_string(), default?)),
    }
}

/// What the client asked for.
struct Target {
    host: String,
    port: u16,
    /// `None` for CONNECT; the origin-form path for plain HTTP.
    path: Option<String>,
}

fn parse_target(method: &str, target: &str) -> Option<Target> {
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_host_port(target, None)?;
        return Some(Target {
            host,
            port,
            path: None,
        });
    }
    let rest = target.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = split_host_port(authority, Some(80))?;
    Some(Target {
        host,
        port,
        path: Some(path.to_string()),
    })
}

/// The request head rewritten for the origin: origin-form request line, no proxy headers, and
/// `Connection: close` so one proxied connection carries one checked request.
fn origin_head(req: &Head, path: &str) -> Vec<u8> {
    let mut out = format!("{} {path} {}\r\n", req.method, req.version).into_bytes();
    for (name, value) in &req.headers {
        if name.eq_ignore_ascii_case("proxy-connection")
            || name.eq_ignore_ascii_case("proxy-authorization")
            || name.eq_ignore_ascii_case("connection")
        {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// A parsed request head.
struct Head {
    method: String,
    target: String,
    version: &'static str,
    headers: Vec<(String, Vec<u8>)>,
}

/// Parses a complete head with `httparse`; `None` when it is not an HTTP/1 request.
fn parse_head(bytes: &[u8]) -> Option<Head> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(bytes) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return None,
    }
    Some(Head {
        method: req.method?.to_string(),
        target: req.path?.to_string(),
        version: if req.version == Some(0) {
            "HTTP/1.0"
        } else {
            "HTTP/1.1"
        },
        headers: req
            .headers
            .iter()
            .map(|h| (h.name.to_string(), h.value.to_vec()))
            .collect(),
    })
}

/// Reads the request head up to its blank line, bounded by `MAX_HEAD`; `None` when the client
/// closed first or sent more. What follows the head stays in `reader`.
fn read_head(reader: &mut BufReader<TcpStream>) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        let n = (&mut *reader)
            .take(MAX_HEAD as u64)
            .read_until(b'\n', &mut line)?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return Ok(None);
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" || line == b"\n" {
            return Ok(Some(head));
        }
    }
}

/// Refuse: log it, tell the agent (when someone is listening), answer 403.
fn refuse(
    out: &mut TcpStream,
    cfg: &ProxyCfg,
    t: &Target,
    method: &str,
    code: &str,
    message: &str,
    hint: Option<String>,
) -> io::Result<()> {
    cfg.sink.record(
        LogKind::SandboxDenied,
        Some(&cfg.agent),
        json!({"what": "network", "reason": message, "code": code, "host": t.host,
               "port": t.port, "method": method}),
    );
    if cfg.gate.0.is_some() {
        cfg.replier.send(AgentEvent::Error {
            code: code.to_string(),
            message: format!("connection to {}:{} refused: {message}", t.host, t.port),
            hint,
        });
    }
    out.write_all(
        format!("HTTP/1.1 403 Forbidden (metash: {code})\r\nContent-Length: 0\r\n\r\n").as_bytes(),
    )
}

fn serve(conn: TcpStream, cfg: &ProxyCfg) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let Some(bytes) = read_head(&mut reader)? else {
        return Ok(());
    };
    let mut out = conn.try_clone()?;
    let head = parse_head(&bytes);
    let method = head.as_ref().map_or("", |h| h.method.as_str());
    let Some(t) = head
        .as_ref()
        .and_then(|h| parse_target(&h.method, &h.target))
    else {
        cfg.sink.record(
            LogKind::SandboxDenied,
            Some(&cfg.agent),
            json!({"what": "network", "reason": "not a CONNECT or absolute-form HTTP request",
                   "method": method}),
        );
        out.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")?;
        return Ok(());
    };
    let write = t.path.is_none() || !is_read_method(method);
    if let Some((code, message, hint)) = check(cfg, &t, method, write) {
        return refuse(&mut out, cfg, &t, method, &code, &message, hint);
    }
    let upstream = (t.host.as_str(), t.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| {
            addrs.find_map(|a| TcpStream::connect_timeout(&a, Duration::from_secs(10)).ok())
        });
    let Some(upstream) = upstream else {
        out.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")?;
        return Ok(());
    };
    cfg.sink.record(
        LogKind::NetworkConnect,
        Some(&cfg.agent),
        json!({"host": t.host, "port": t.port, "method": method, "write": write}),
    );
    let mut up_w = upstream.try_clone()?;
    match (&t.path, &head) {
        (Some(path), Some(h)) => up_w.write_all(&origin_head(h, path))?,
        _ => out.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")?,
    }
    conn.set_read_timeout(None)?;
    // Bytes the client sent after the head are still in the BufReader: forward them first.
    let pending = reader.buffer().to_vec();
    up_w.write_all(&pending)?;
    relay(reader.into_inner(), out, upstream, up_w);
    Ok(())
}

/// The allowlist, then the gate (a write is asked per action): why the connection is refused.
fn check(
    cfg: &ProxyCfg,
    t: &Target,
    method: &str,
    write: bool,
) -> Option<(String, String, Option<String>)> {
    if !domain_allowed(&cfg.allowlist, &t.host) {
        return Some((
            "domain_not_allowed".into(),
            "domain not in allowlist".into(),
            Some(format!("declare `network:{}` in the manifest", t.host)),
        ));
    }
    let action = GatedAction::Connect {
        host: &t.host,
        port: t.port,
        method,
        write,
    };
    match cfg.gate.decide(&cfg.agent, &action) {
        Some(GateVerdict::Deny {
            code,
            message,
            hint,
        }) => Some((code, message, hint)),
        _ => None,
    }
}

/// Copies both ways until each side closes its half.
fn relay(
    mut client_r: TcpStream,
    mut client_w: TcpStream,
    mut up_r: TcpStream,
    mut up_w: TcpStream,
) {
    let t = thread::spawn(move || {
        let _ = io::copy(&mut up_r, &mut client_w);
        let _ = client_w.shutdown(Shutdown::Write);
    });
    let _ = io::copy(&mut client_r, &mut up_w);
    let _ = up_w.shutdown(Shutdown::Write);
    let _ = t.join();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        let t = parse_target("CONNECT", "api.github.com:443").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path),
            ("api.github.com", 443, None)
        );
        let t = parse_target("POST", "http://localhost:8080/v1/x?q=1").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("localhost", 8080));
        assert_eq!(t.path.as_deref(), Some("/v1/x?q=1"));
        let t = parse_target("GET", "http://[::1]").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_deref()),
            ("::1", 80, Some("/"))
        );
        assert!(parse_target("GET", "/relative").is_none());
        assert!(parse_target("CONNECT", "nohost").is_none());
        assert!(is_read_method("get") && !is_read_method("DELETE"));
    }

    #[test]
    fn origin_head_drops_proxy_headers() {
        let head = "GET http://h/x HTTP/1.1\r\nHost: h\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\nX-A: 1\r\n\r\n";
        let parsed = parse_head(head.as_bytes()).unwrap();
        assert_eq!(parsed.target, "http://h/x");
        assert_eq!(
            String::from_utf8(origin_head(&parsed, "/x")).unwrap(),
            "GET /x HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nConnection: close\r\n\r\n"
        );
        // Not HTTP at all, or a head cut short: no request.
        assert!(parse_head(b"\x16\x03\x01 hello\r\n\r\n").is_none());
        assert!(parse_head(b"GET http://h/ HTTP/1.1\r\nHost: h\r\n").is_none());
    }
}
