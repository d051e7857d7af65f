//! The host-side HTTP CONNECT proxy through which a native agent with `network` + an allowlist
//! reaches the outside. Landlock lets the agent connect to this proxy's port only; the proxy checks
//! the requested host against the allowlist before it resolves or connects anything, and logs every
//! refusal as `sandbox_denied`.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use serde_json::json;

use crate::sink::{kinds, EventSink};
use crate::spec::domain_allowed;

/// Connections served at once; more are refused (and logged) instead of queueing without bound.
const MAX_CONNECTIONS: usize = 32;
const MAX_HEAD: usize = 8 * 1024;

/// A running proxy; stops accepting when dropped.
pub struct ConnectProxy {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl ConnectProxy {
    /// Listen on 127.0.0.1 (an ephemeral port) and serve `allowlist` for `agent`.
    ///
    /// # Errors
    /// The listener could not be bound.
    pub fn start(
        agent: String,
        allowlist: Vec<String>,
        sink: Arc<dyn EventSink>,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicUsize::new(0));
        let stop2 = Arc::clone(&stop);
        thread::Builder::new()
            .name(format!("metash-proxy-{agent}"))
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                        sink.record(
                            kinds::LIMIT,
                            Some(&agent),
                            json!({"limit": "proxy_connections", "max": MAX_CONNECTIONS}),
                        );
                        let _ = (&conn).write_all(b"HTTP/1.1 503 Too Many Connections\r\n\r\n");
                        continue;
                    }
                    active.fetch_add(1, Ordering::SeqCst);
                    let (agent, list, sink, active) = (
                        agent.clone(),
                        allowlist.clone(),
                        Arc::clone(&sink),
                        Arc::clone(&active),
                    );
                    let _ = thread::Builder::new()
                        .name("metash-proxy-conn".into())
                        .spawn(move || {
                            let _ = serve(conn, &agent, &list, sink.as_ref());
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

fn serve(
    conn: TcpStream,
    agent: &str,
    allowlist: &[String],
    sink: &dyn EventSink,
) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut head = String::new();
    let mut request_line = String::new();
    loop {
        let mut line = String::new();
        let n = (&mut reader).take(MAX_HEAD as u64).read_line(&mut line)?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return Ok(());
        }
        if request_line.is_empty() {
            request_line = line.trim().to_string();
        }
        head.push_str(&line);
        if line == "\r\n" || line == "\n" {
            break;
        }
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let mut out = conn.try_clone()?;
    if !method.eq_ignore_ascii_case("CONNECT") {
        sink.record(
            kinds::DENIED,
            Some(agent),
            json!({"what": "network", "reason": "only CONNECT is proxied", "method": method}),
        );
        out.write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")?;
        return Ok(());
    }
    let (host, port) = match target.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_matches(|c| c == '[' || c == ']'),
            p.parse::<u16>().ok(),
        ),
        None => (target, None),
    };
    let Some(port) = port else {
        out.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")?;
        return Ok(());
    };
    if !domain_allowed(allowlist, host) {
        sink.record(
            kinds::DENIED,
            Some(agent),
            json!({"what": "network", "reason": "domain not in allowlist", "host": host, "port": port}),
        );
        out.write_all(b"HTTP/1.1 403 Forbidden (metash: domain not in allowlist)\r\n\r\n")?;
        return Ok(());
    }
    let upstream = (host, port).to_socket_addrs().ok().and_then(|mut addrs| {
        addrs.find_map(|a| TcpStream::connect_timeout(&a, Duration::from_secs(10)).ok())
    });
    let Some(upstream) = upstream else {
        out.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")?;
        return Ok(());
    };
    sink.record(
        "network_connect",
        Some(agent),
        json!({"host": host, "port": port}),
    );
    out.write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")?;
    conn.set_read_timeout(None)?;
    // Bytes the client sent after the head are still in the BufReader: forward them first.
    let pending = reader.buffer().to_vec();
    let mut up_w = upstream.try_clone()?;
    up_w.write_all(&pending)?;
    let mut up_r = upstream;
    let mut client_w = out;
    let t = thread::spawn(move || {
        let _ = io::copy(&mut up_r, &mut client_w);
        let _ = client_w.shutdown(Shutdown::Write);
    });
    let mut client_r = reader.into_inner();
    let _ = io::copy(&mut client_r, &mut up_w);
    let _ = up_w.shutdown(Shutdown::Write);
    let _ = t.join();
    Ok(())
}
