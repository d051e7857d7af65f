//! `metash ui`: the web UI of seed 002 §8 for one project, on loopback. A front end like the CLI:
//! it reads the project's store and log, and changes things only through the functions the CLI
//! calls, so a UI and a terminal (and a JSON-RPC client) can answer the same run, first come
//! first served. Nothing below it knows it exists.
//!
//! - [`guard`]: who may use it (loopback Host and Origin, a start token exchanged for a cookie,
//!   CSRF on every POST, a strict Content-Security-Policy);
//! - [`pages`]: server-rendered HTML, everything escaped, no inline script; [`dag`]: the plan as
//!   an SVG graph;
//! - [`live`]: the log as Server-Sent Events, resumable by `Last-Event-ID`;
//! - [`server`]: the routes; [`app`]: what their handlers share, below them all.

pub mod app;
pub mod artifacts;
pub mod dag;
pub mod diffview;
pub mod error;
pub mod guard;
pub mod html;
pub mod live;
pub mod model;
pub mod notify;
pub mod owners;
pub mod pages;
pub mod projects;
pub mod queue;
pub mod review;
pub mod server;
pub mod sessions;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

pub use error::{Result, UiError};

/// How to serve.
#[derive(Debug, Clone, Default)]
pub struct UiOptions {
    /// 0: any free port.
    pub port: u16,
    /// Listen there instead of 127.0.0.1 (`--listen`: the caller warns).
    pub listen: Option<IpAddr>,
    /// How long one live stream lasts before the browser reconnects (resuming by
    /// `Last-Event-ID`); `None`: ten minutes.
    pub stream_seconds: Option<u64>,
}

/// A running UI: where it is and how to stop it.
pub struct Served {
    pub addr: SocketAddr,
    /// The URL to open (it carries the start token).
    pub url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    /// Ends the notifier's thread.
    watching: Arc<std::sync::atomic::AtomicBool>,
}

impl Served {
    /// Stops serving and waits for the server to end.
    pub async fn stop(mut self) {
        self.watching
            .store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// Serves until the server ends (it does not on its own).
    pub async fn wait(mut self) {
        let _ = (&mut self.task).await;
    }
}

/// Starts serving the project at `root` on the current tokio runtime.
///
/// # Errors
/// Not a metash project (the store cannot be opened), a wrong `[ui]` section, or the address
/// cannot be bound.
pub async fn serve(root: &Path, options: &UiOptions) -> Result<Served> {
    metash_store::Store::open(root)?;
    let (listener, addr, guard) = bind(options).await?;
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let app = app_for(root, String::new(), &guard, options, addr, &watching)?;
    start(listener, addr, &guard, server::single(app), watching)
}

/// Starts serving every project in `dir` and one level below (`metash ui --under DIR`): an index
/// at `/`, each project under `/p/NAME`.
///
/// # Errors
/// A project whose `[ui]` section is wrong, or the address cannot be bound.
pub async fn serve_under(dir: &Path, options: &UiOptions) -> Result<Served> {
    let (listener, addr, guard) = bind(options).await?;
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut apps = Vec::new();
    for (name, root) in projects::discover(dir) {
        let app = app_for(
            &root,
            format!("/p/{name}"),
            &guard,
            options,
            addr,
            &watching,
        )?;
        apps.push((name, app));
    }
    start(
        listener,
        addr,
        &guard,
        server::many(Arc::clone(&guard), apps),
        watching,
    )
}

async fn bind(
    options: &UiOptions,
) -> Result<(tokio::net::TcpListener, SocketAddr, Arc<guard::Guard>)> {
    let ip = options.listen.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, options.port))
        .await
        .map_err(|e| UiError::io(format!("binding {ip}:{}", options.port), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| UiError::io("the listening address", e))?;
    let extra = options.listen.map(|_| addr.to_string());
    Ok((
        listener,
        addr,
        Arc::new(guard::Guard::new(addr.port(), extra)),
    ))
}

/// One project's handlers' state, and its notifier started.
fn app_for(
    root: &Path,
    base: String,
    guard: &Arc<guard::Guard>,
    options: &UiOptions,
    addr: SocketAddr,
    watching: &Arc<std::sync::atomic::AtomicBool>,
) -> Result<app::App> {
    let store = metash_store::Store::open(root)?;
    // A config that does not parse still gets every token shape redacted.
    let config = metash_host::config::HostConfig::load(root).unwrap_or_default();
    let redactor = Arc::new(metash_host::redaction::output_redactor(
        &store,
        &config,
        &|v: &str| std::env::var(v).ok(),
        Vec::new(),
    ));
    // A wrong `[ui]` stops the start: a notifier that silently never runs is worse.
    if let Some(argv) = notify::load(root)?.notify_command {
        let url = format!("http://{addr}{base}/");
        notify::watch(
            store.clone(),
            argv,
            Arc::clone(&redactor),
            url,
            Arc::clone(watching),
        );
    }
    Ok(app::App {
        root: root.to_path_buf(),
        store,
        guard: Arc::clone(guard),
        redactor,
        stream_lasts: std::time::Duration::from_secs(options.stream_seconds.unwrap_or(600).max(1)),
        base,
        owners: Arc::default(),
    })
}

fn start(
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    guard: &guard::Guard,
    router: axum::Router,
    watching: Arc<std::sync::atomic::AtomicBool>,
) -> Result<Served> {
    let url = format!("http://{addr}/login?token={}", guard.token);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .await;
    });
    Ok(Served {
        addr,
        url,
        stop: Some(stop_tx),
        task,
        watching,
    })
}
