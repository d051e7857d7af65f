//! A network probe agent, for the runtime's sandbox tests. The prompt says what to try:
//!
//! - `connect ADDR`: a direct TCP connection to `ADDR` (`127.0.0.1:PORT`); on success it sends
//!   `ping\n` and reports the line it got back.
//! - `proxy HOST:PORT`: an HTTP `CONNECT HOST:PORT` through the proxy named in `$HTTPS_PROXY`
//!   (`http://127.0.0.1:PORT`, set by the host when `network` is granted with an allowlist), then
//!   the same `ping` exchange through the tunnel.
//! - `udp ADDR`: binds a UDP socket and sends one datagram to `ADDR` (reported `sent` or the
//!   error).
//! - `handle VAR PATH`: a plain-HTTP GET of PATH under the URL in `$VAR` (an OAuth handle's base,
//!   `http://127.0.0.1:PORT/prefix`; or VAR itself when it is such a URL), reported `STATUS BODY`.
//! - anything else is echoed.
//!
//! Each outcome is one `output` line (`connected: ...`, `proxied: ...`) or an `error` event with
//! code `denied` carrying the reason, so the tests can tell a refusal from a broken fixture. Built
//! for `wasm32-wasip2` (a WASI preview-2 command component, which has sockets); it also builds
//! natively.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpStream, UdpSocket};

/// Send `ping`, read one line back.
fn ping(stream: &TcpStream) -> Result<String, String> {
    let mut w = stream;
    w.write_all(b"ping\n")
        .map_err(|e| format!("write failed: {e}"))?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| format!("read failed: {e}"))?;
    Ok(line.trim_end().to_string())
}

fn direct(addr: &str) -> Result<String, String> {
    let stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr} failed: {e}"))?;
    Ok(format!("connected: {}", ping(&stream)?))
}

fn udp(addr: &str) -> Result<String, String> {
    let socket = UdpSocket::bind("0.0.0.0:0").map_err(|e| format!("udp bind failed: {e}"))?;
    socket
        .send_to(b"ping\n", addr)
        .map_err(|e| format!("udp send to {addr} failed: {e}"))?;
    Ok(format!("sent: {addr}"))
}

/// `CONNECT target` through `$HTTPS_PROXY` (or `$https_proxy`), then `ping` through the tunnel.
fn proxied(target: &str) -> Result<String, String> {
    let proxy = std::env::var("HTTPS_PROXY")
        .or_else(|_| std::env::var("https_proxy"))
        .map_err(|_| "no HTTPS_PROXY in the environment".to_string())?;
    let authority = proxy
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let stream = TcpStream::connect(&authority)
        .map_err(|e| format!("connect to the proxy {authority} failed: {e}"))?;
    let mut w = &stream;
    w.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .map_err(|e| format!("write to the proxy failed: {e}"))?;
    let mut reader = BufReader::new(&stream);
    let mut status = String::new();
    reader
        .read_line(&mut status)
        .map_err(|e| format!("read from the proxy failed: {e}"))?;
    loop {
        let mut header = String::new();
        let n = reader
            .read_line(&mut header)
            .map_err(|e| format!("read from the proxy failed: {e}"))?;
        if n == 0 || header == "\r\n" || header == "\n" {
            break;
        }
    }
    let status = status.trim_end().to_string();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("proxy refused: {status}"));
    }
    // The proxy answered the head only; the reader holds nothing past it, so the tunnel's bytes
    // are read fresh from the stream.
    Ok(format!("proxied: {}", ping(&stream)?))
}

/// A GET of `path` under `base`, sent directly: `STATUS BODY`.
fn handle(var: &str, path: &str) -> Result<String, String> {
    let base = if var.starts_with("http://") {
        var.to_string()
    } else {
        std::env::var(var).map_err(|_| format!("no ${var}"))?
    };
    let rest = base.trim_start_matches("http://");
    let (addr, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr} failed: {e}"))?;
    let mut target = String::new();
    if !prefix.is_empty() {
        target.push('/');
        target.push_str(prefix.trim_end_matches('/'));
    }
    target.push_str(path);
    let mut w = &stream;
    write!(
        w,
        "GET {target} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer made-up\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write failed: {e}"))?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut &stream, &mut out)
        .map_err(|e| format!("read failed: {e}"))?;
    let status = out.split_whitespace().nth(1).unwrap_or("?").to_string();
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.trim())
        .unwrap_or("");
    Ok(format!("{status} {body}"))
}

fn main() {
    let result = metash_agent::run(|session, input| {
        let prompt = input.prompt.trim();
        let attempt = if let Some(addr) = prompt.strip_prefix("connect ") {
            Some(direct(addr.trim()))
        } else if let Some(addr) = prompt.strip_prefix("udp ") {
            Some(udp(addr.trim()))
        } else if let Some(rest) = prompt.strip_prefix("handle ") {
            let (var, path) = rest.trim().split_once(' ').unwrap_or((rest.trim(), "/"));
            Some(handle(var, path))
        } else {
            prompt
                .strip_prefix("proxy ")
                .map(|target| proxied(target.trim()))
        };
        match attempt {
            Some(Ok(report)) => session.output("text/plain", &report),
            Some(Err(why)) => session.error("denied", &why),
            None => session.output("text/plain", &format!("echo: {prompt}")),
        }
        .map_err(|e| e.to_string())
    });
    if let Err(e) = result {
        eprintln!("net agent: {e}");
        std::process::exit(1);
    }
}
