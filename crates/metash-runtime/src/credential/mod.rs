//! The credential proxy: the one place a secret is added to an agent's outbound request (the model
//! key for a CLI executor, later an OAuth token for a handle). The agent gets a placeholder key and
//! a base URL on this proxy (`http://127.0.0.1:PORT/prefix`); the proxy drops whatever auth the
//! agent sent, asks the host's [`CredentialSource`] for the route's secret, adds it in the route's
//! style and forwards to the route's upstream (TLS with the system roots for `https`, plain HTTP only
//! to loopback). The response streams back as it arrives (SSE), through an optional [`UsageTap`];
//! each exchange can also be handed, redacted, to the host's [`Recorder`] (its tapes, issue 36).
//! Anything else (another host in absolute form, `CONNECT`, a path under no route, a non-loopback
//! `Host`) is refused with 403 and logged as `sandbox_denied` (`what: "credential_proxy"`). No
//! secret is ever in the agent's environment, files or arguments, nor in any event.
//!
//! The proxy runs on its own thread and tokio runtime; [`CredentialProxy::start`] returns once it
//! listens, and dropping the proxy stops it (open connections are cut).
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use metash_runtime::credential::*;
//! # use metash_runtime::MemorySink;
//! # fn demo(key_from_vault: String) -> Result<(), CredentialError> {
//! let routes = vec![Route {
//!     id: "executor-model".into(),
//!     mount: Mount::Prefix("/anthropic".into()),
//!     upstream: "https://api.anthropic.com".into(),
//!     auth: AuthStyle::XApiKey,
//! }];
//! let source = StaticSource::new().with("executor-model", Secret::new(key_from_vault));
//! let mut config = ProxyConfig::new(routes);
//! config.agent = Some("executor".into());
//! config.tap = Some(Arc::new(|event: TapEvent<'_>| {
//!     if let TapEvent::Chunk { bytes, .. } = event { /* feed the SSE usage parser */ let _ = bytes; }
//! }));
//! let proxy = CredentialProxy::start(config, Arc::new(source), Arc::new(MemorySink::new()))?;
//! // In the sandbox's environment: the placeholder and the loopback URL, never the key.
//! let base = proxy.base_url("executor-model").expect("route exists");
//! let env = [("ANTHROPIC_BASE_URL", base), ("ANTHROPIC_API_KEY", "metash-placeholder".into())];
//! # let _ = env;
//! drop(proxy); // stops serving
//! # Ok(()) }
//! ```

mod handle;
mod headers;
pub mod normalize;
pub mod record;
pub mod replay;
mod route;
mod secret;
mod serve;
pub mod signin;
mod stream_end;
mod tap;

use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::oneshot;

pub use normalize::Volatile;
pub use record::{Chunk, Exchange, Recorder};
pub use replay::{Cassette, Divergence, Recorded};
pub use route::{AuthStyle, Mount, Route};
pub use secret::{CredentialSource, Grant, GrantFuture, Secret, SourceError, StaticSource};
pub use stream_end::StreamEnd;
pub use tap::{TapEvent, UsageTap};

use crate::sink::EventSink;

/// hyper's smallest allowed read buffer, which is what bounds the request head.
const MIN_HEADER_BYTES: usize = 8 * 1024;

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// A route is unusable (bad prefix or upstream, clear-text upstream off the machine...).
    #[error("credential proxy: {0}")]
    Route(String),
    #[error("credential proxy: cannot listen on 127.0.0.1: {0}")]
    Bind(std::io::Error),
    #[error("credential proxy: cannot start its runtime: {0}")]
    Runtime(std::io::Error),
    #[error("credential proxy: cannot build the upstream client: {0}")]
    Client(String),
}

/// What the proxy serves and under which bounds.
#[derive(Clone)]
pub struct ProxyConfig {
    pub routes: Vec<Route>,
    /// The agent named in events (the role's agent id).
    pub agent: Option<String>,
    /// Connections served at once; more are answered 503 and logged as `limit_exceeded`.
    pub max_connections: usize,
    /// Bound on a request head (request line and headers); at least 8 KiB (hyper's minimum).
    /// Over it: 431 and `limit_exceeded`.
    pub max_header_bytes: usize,
    /// Time allowed to send a request head; a kept-alive connection idle this long is closed too,
    /// so slow or idle clients do not hold a connection slot.
    pub header_timeout: Duration,
    /// Connecting to the upstream.
    pub connect_timeout: Duration,
    /// Longest silence inside an upstream response (a stalled stream is cut).
    pub read_timeout: Duration,
    /// Sees every forwarded response body as it streams.
    pub tap: Option<Arc<dyn UsageTap>>,
    /// Receives every forwarded exchange once it ends, redacted (`record.rs`): the host's tape.
    pub recorder: Option<Arc<dyn Recorder>>,
    /// Strings masked in recordings besides the credential the proxy adds: what the agent was
    /// given in its place (the placeholder), and anything else the host knows to be secret.
    pub redact: Vec<String>,
    /// Replay: answer every request from this recorded turn, in order, and reach no upstream
    /// (`replay.rs`). The first request that differs stops the replay.
    pub replay: Option<Arc<Cassette>>,
}

impl ProxyConfig {
    /// `routes` with the default bounds: 64 connections, 16 KiB heads, 30 s to send a head, 30 s
    /// to connect upstream, 300 s of silence in a stream.
    pub fn new(routes: Vec<Route>) -> Self {
        Self {
            routes,
            agent: None,
            max_connections: 64,
            max_header_bytes: 16 * 1024,
            header_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(300),
            tap: None,
            recorder: None,
            redact: Vec::new(),
            replay: None,
        }
    }
}

impl fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("routes", &self.routes)
            .field("agent", &self.agent)
            .field("max_connections", &self.max_connections)
            .field("max_header_bytes", &self.max_header_bytes)
            .field("tap", &self.tap.is_some())
            .field("recorder", &self.recorder.is_some())
            .field("replay", &self.replay.is_some())
            .finish_non_exhaustive()
    }
}

/// A running proxy on 127.0.0.1 (an ephemeral port). Stops when dropped.
pub struct CredentialProxy {
    addr: SocketAddr,
    /// Route id and its prefix (`None`: the whole port), for [`Self::base_url`].
    mounts: Vec<(String, Option<String>)>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Masks and delivers recordings; joined after `thread`, once every exchange has ended.
    recording: Option<JoinHandle<()>>,
}

impl CredentialProxy {
    /// Validates the routes, builds the upstream client, binds `127.0.0.1:0` and serves on a
    /// thread of its own. Returns once the port accepts connections.
    ///
    /// # Errors
    /// A route is invalid, or the listener, runtime or HTTP client cannot be made.
    pub fn start(
        config: ProxyConfig,
        source: Arc<dyn CredentialSource>,
        sink: Arc<dyn EventSink>,
    ) -> Result<Self, CredentialError> {
        let routes = route::resolve(&config.routes)?;
        let (delivery, recording) = match config.recorder.clone() {
            Some(r) => {
                let (d, t) = record::deliver_to(r).map_err(CredentialError::Runtime)?;
                (Some(d), Some(t))
            }
            None => (None, None),
        };
        let client = upstream_client(&config)?;
        let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(CredentialError::Bind)?;
        let addr = listener.local_addr().map_err(CredentialError::Bind)?;
        listener
            .set_nonblocking(true)
            .map_err(CredentialError::Bind)?;
        // One thread: measured no faster with two workers (see docs/runtime.md, Benchmark).
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(CredentialError::Runtime)?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(CredentialError::Bind)?
        };
        let mounts = routes
            .iter()
            .map(|r| (r.id.clone(), r.prefix.clone()))
            .collect();
        let shared = Arc::new(handle::Shared {
            routes,
            source,
            sink,
            agent: config.agent.clone(),
            client,
            tap: config.tap.clone(),
            recorder: delivery,
            redact: config.redact.clone(),
            replay: config.replay.clone(),
            port: addr.port(),
            exchanges: AtomicU64::new(0),
        });
        let limits = serve::Limits {
            max_connections: config.max_connections.max(1),
            max_header_bytes: config.max_header_bytes.max(MIN_HEADER_BYTES),
            header_timeout: config.header_timeout,
        };
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("metash-credential-proxy".into())
            .spawn(move || {
                runtime.block_on(serve::accept_loop(listener, shared, limits, stopped));
                // Dropping the runtime cancels the connection tasks still running.
                drop(runtime);
            })
            .map_err(CredentialError::Runtime)?;
        Ok(Self {
            addr,
            mounts,
            stop: Some(stop),
            thread: Some(thread),
            recording,
        })
    }

    /// Where the proxy listens (always 127.0.0.1).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/prefix` (no trailing slash) for the route `id`: what the agent's
    /// base URL should be (add `/v1` where the CLI expects it, see `HARNESSES.md`).
    pub fn base_url(&self, id: &str) -> Option<String> {
        let (_, prefix) = self.mounts.iter().find(|(r, _)| r == id)?;
        Some(format!(
            "http://{}{}",
            self.addr,
            prefix.as_deref().unwrap_or("")
        ))
    }
}

impl fmt::Debug for CredentialProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialProxy")
            .field("addr", &self.addr)
            .field("mounts", &self.mounts)
            .finish_non_exhaustive()
    }
}

impl Drop for CredentialProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // The runtime is gone with every exchange and its sender: the recorder has all of them.
        if let Some(recording) = self.recording.take() {
            let _ = recording.join();
        }
    }
}

/// The harness's choice (reqwest over rustls with ring, system roots), so the workspace has one
/// TLS stack. No redirects (a 3xx goes back to the agent; the credential is never replayed to
/// another URL) and no proxy from the environment (the key goes straight to the endpoint).
fn upstream_client(config: &ProxyConfig) -> Result<reqwest::Client, CredentialError> {
    // Idempotent: an already installed provider is kept.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(config.connect_timeout)
        .read_timeout(config.read_timeout)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| CredentialError::Client(e.to_string()))
}
