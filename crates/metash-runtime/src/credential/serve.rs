//! The accept loop and one connection: a bounded number of connections at once, each served by
//! hyper's HTTP/1.1 server (keep-alive, chunked bodies both ways, `Expect: 100-continue`) with a
//! bounded request head and a deadline to send it.

use std::sync::Arc;
use std::time::Duration;

use metash_protocol::LogKind;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};

use super::handle::{handle, Shared};

/// The bounds a connection is served under (from [`super::ProxyConfig`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_connections: usize,
    pub max_header_bytes: usize,
    pub header_timeout: Duration,
}

const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
content-length: 85\r\nconnection: close\r\n\r\n\
{\"type\":\"error\",\"error\":{\"type\":\"credential_proxy\",\"message\":\"too many connections\"}}";

/// Accepts until `stop` fires (or its sender is dropped).
pub(crate) async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    limits: Limits,
    mut stop: oneshot::Receiver<()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let stream = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors or similar: back off instead of spinning.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            shared.sink.record(
                LogKind::LimitExceeded,
                shared.agent.as_deref(),
                json!({"limit": "credential_proxy_connections", "max": limits.max_connections}),
            );
            // A fresh socket's send buffer takes this without blocking; if not, it is dropped.
            let _ = stream.try_write(BUSY);
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            serve_connection(stream, shared, limits).await;
            drop(slot);
        });
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>, limits: Limits) {
    let _ = stream.set_nodelay(true);
    let svc_shared = Arc::clone(&shared);
    let svc = service_fn(move |req| handle(Arc::clone(&svc_shared), req));
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_header_bytes)
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), svc)
        .await;
    // hyper has already answered 431 to an oversized head; the log gets the limit.
    if let Err(e) = served {
        if e.is_parse_too_large() {
            shared.sink.record(
                LogKind::LimitExceeded,
                shared.agent.as_deref(),
                json!({"limit": "credential_proxy_header_bytes", "max": limits.max_header_bytes}),
            );
        }
    }
}
