//! The WASM sandbox: WASI preview-1 command modules and WASI preview-2 command components on
//! wasmtime, deny by default.
//!
//! Each invocation is a fresh instance of pre-linked code (instantiation from the pooling
//! allocator costs microseconds), fed `start` + `input` on a stdin channel and read from a bounded
//! stdout channel capped at the output limit. Both kinds share one invocation body; only the
//! instantiate-and-run step differs (`_start` of a module, `wasi:cli/run` of a component). Nothing
//! is granted unless the spec says so: no preopens, no environment, no sockets. Preview 1 has no
//! outbound socket API at all (a module importing a socket extension is refused at link time);
//! components have preview-2 sockets, confined by [`net`] (the allowlist proxy plus a socket
//! address check). Memory is capped by a store limiter, time by epoch interruption driven by one
//! timer thread per engine, and, when the spec asks for it, CPU work by fuel on a second engine
//! that meters it (created on first use: metering slows every guest down). What it may write is
//! measured against its disk and file quotas by a watcher that stops the guest at its next epoch
//! ([`quota`]).

pub mod cache;
mod invoke;
mod net;
mod pool;
mod quota;
mod spin;
mod stdin;
mod stdout;
#[cfg(target_os = "linux")]
mod view;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use metash_protocol::LogKind;
use serde_json::{json, Value};
use wasmtime::component::ResourceTable;
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, InstancePre, Linker, PoolingAllocationConfig,
    ResourceLimiter,
};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::sync::CommandPre;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

pub use cache::{CacheHit, Compiled, Kind};

use crate::error::{io_err, Result, RuntimeError};
use crate::reply::Replier;
use crate::sink::EventSink;
use crate::spec::AgentSpec;

/// How often the timer thread advances the epoch: the resolution of WASM deadlines.
const TICK: Duration = Duration::from_millis(5);
/// Where the workspace appears inside the guest.
pub const GUEST_WORKSPACE: &str = "/workspace";

/// The engine configuration: pooling allocator, epoch interruption, and fuel metering for the
/// second engine only.
fn config(fuel: bool) -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.consume_fuel(fuel);
    let mut pool = PoolingAllocationConfig::default();
    // A component is several core instances (the program plus the shims and fix-ups the
    // component tooling adds), each with its tables, but usually one memory.
    pool.total_core_instances(256)
        .total_memories(64)
        .total_tables(256)
        .max_memory_size(4 << 30)
        // Reset the first MiB of a freed slot by memset instead of madvise: a madvise in a
        // threaded process is a TLB shootdown on every core, which cost more than the rest of
        // instantiating a small agent.
        .linear_memory_keep_resident(1 << 20)
        .table_keep_resident(1 << 16);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    config
}

/// One wasmtime engine (plus, on demand, its fuel-metering twin), the compiled-code cache and the
/// epoch timer thread. Share it between agents.
pub struct WasmEngine {
    engine: Engine,
    /// Created the first time a spec asks for fuel; the timer thread ticks it too.
    fuel_engine: Arc<OnceLock<Engine>>,
    cache_dir: PathBuf,
    cache_key: cache::CacheKey,
    /// Where a rejected cache entry is reported.
    sink: Option<Arc<dyn EventSink>>,
    compiled: Mutex<HashMap<String, Compiled>>,
    stop: Arc<AtomicBool>,
    workers: pool::Pool,
}

impl WasmEngine {
    /// Create the engine (pooling allocator, epoch interruption) and start its timer thread.
    ///
    /// # Errors
    /// The engine configuration is rejected or the timer thread cannot start.
    pub fn new(
        cache_dir: impl Into<PathBuf>,
        cache_key: cache::CacheKey,
        sink: Option<Arc<dyn EventSink>>,
    ) -> Result<Arc<Self>> {
        let engine =
            Engine::new(&config(false)).map_err(|e| RuntimeError::Wasm(format!("{e:#}")))?;
        let fuel_engine: Arc<OnceLock<Engine>> = Arc::new(OnceLock::new());
        let stop = Arc::new(AtomicBool::new(false));
        let (e2, f2, s2) = (engine.clone(), Arc::clone(&fuel_engine), Arc::clone(&stop));
        thread::Builder::new()
            .name("metash-wasm-epoch".into())
            .spawn(move || {
                while !s2.load(Ordering::Relaxed) {
                    thread::sleep(TICK);
                    e2.increment_epoch();
                    if let Some(f) = f2.get() {
                        f.increment_epoch();
                    }
                }
            })
            .map_err(io_err("starting the epoch timer thread"))?;
        Ok(Arc::new(Self {
            engine,
            fuel_engine,
            cache_dir: cache_dir.into(),
            cache_key,
            sink,
            compiled: Mutex::new(HashMap::new()),
            stop,
            workers: pool::Pool::new(),
        }))
    }

    /// The default engine (no fuel metering).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine for a spec: the fuel-metering one (created now if needed) when `fuel`.
    ///
    /// # Errors
    /// The fuel engine's configuration is rejected.
    pub fn engine_for(&self, fuel: bool) -> Result<Engine> {
        if !fuel {
            return Ok(self.engine.clone());
        }
        if let Some(e) = self.fuel_engine.get() {
            return Ok(e.clone());
        }
        let e = Engine::new(&config(true)).map_err(|e| RuntimeError::Wasm(format!("{e:#}")))?;
        // Two first users may race; one engine wins and both use it.
        let _ = self.fuel_engine.set(e);
        self.fuel_engine
            .get()
            .cloned()
            .ok_or_else(|| RuntimeError::Wasm("the fuel engine could not be installed".into()))
    }

    /// Load the code at `path` (`.wasm` binary or `.wat` text, a core module or a component) for
    /// the default engine or, with `fuel`, the fuel engine, through the caches.
    ///
    /// # Errors
    /// Unreadable file, invalid code, unwritable cache.
    pub fn load(&self, path: &Path, fuel: bool) -> Result<(Compiled, CacheHit, Engine)> {
        let engine = self.engine_for(fuel)?;
        let bytes = std::fs::read(path).map_err(io_err(format!("reading {}", path.display())))?;
        let hash = cache::module_hash(&bytes);
        // Code compiled for one engine never runs on the other.
        let key = format!("{hash}-{}", if fuel { "fuel" } else { "plain" });
        if let Some(c) = self.compiled.lock().ok().and_then(|g| g.get(&key).cloned()) {
            return Ok((c, CacheHit::Memory, engine));
        }
        let loaded =
            cache::load_or_compile(&engine, &self.cache_dir, &self.cache_key, &hash, &bytes)?;
        if let (Some(r), Some(sink)) = (&loaded.rejected, &self.sink) {
            sink.record(
                LogKind::CacheRejected,
                None,
                json!({"file": r.file.display().to_string(), "reason": r.reason,
                       "source": path.display().to_string(), "action": "deleted and recompiled"}),
            );
        }
        let c = loaded.compiled;
        if let Ok(mut g) = self.compiled.lock() {
            g.insert(key, c.clone());
        }
        Ok((c, loaded.hit, engine))
    }

    /// Forget the in-process cache (so the next load exercises the disk cache; benchmarks).
    pub fn clear_memory_cache(&self) {
        if let Ok(mut g) = self.compiled.lock() {
            g.clear();
        }
    }
}

impl Drop for WasmEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Per-store host state: the WASI context of either kind, the limiter, and (components) the
/// invocation's network-denial log.
struct State<W> {
    wasi: W,
    limits: Limits,
    net: Option<Arc<net::NetLog>>,
}

/// A component's WASI context and handle table.
struct P2 {
    ctx: WasiCtx,
    table: ResourceTable,
}

impl WasiView for P2 {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

impl WasiView for State<P2> {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        self.wasi.ctx()
    }
}

/// Memory/table limiter that remembers a refusal so it can be logged. The memory cap is for all
/// of a store's memories together (a component may have several): wasmtime asks the limiter for
/// each memory's initial size too, so `used` sees every byte.
struct Limits {
    memory: usize,
    used: usize,
    denied: Option<(usize, usize)>,
}

impl ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.used.saturating_sub(current).saturating_add(desired);
        if total > self.memory {
            self.denied = Some((current, desired));
            return Ok(false);
        }
        self.used = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// Pre-linked code of either kind.
enum Pre {
    /// A WASI preview-1 command module (`_start`).
    Module(InstancePre<State<WasiP1Ctx>>),
    /// A WASI preview-2 command component (`wasi:cli/run`).
    Component(CommandPre<State<P2>>),
}

/// A WASM agent ready to be invoked: its code linked against the WASI host functions, its network
/// (and proxy) set up for its whole life.
pub struct WasmAgent {
    engine: Arc<WasmEngine>,
    /// The engine the code was compiled for (the fuel engine when the spec sets fuel).
    code_engine: Engine,
    pre: Pre,
    memory: usize,
    fuel: Option<u64>,
    net: net::Net,
    /// Its disk and file quotas over its read-write preopens (boxed: an agent is moved around
    /// in an enum with the native backend, which is boxed too).
    quota: Box<quota::WriteGuard>,
    pub cache: CacheHit,
    /// The file grants as one revocable preopen (Linux); `None`: preopened one by one.
    #[cfg(target_os = "linux")]
    view: Option<Box<view::View>>,
}

/// Why the epoch callback stopped the guest.
const STOP_NONE: u8 = 0;
const STOP_TIMEOUT: u8 = 1;
const STOP_INTERRUPT: u8 = 2;
const STOP_HALT: u8 = 3;
const STOP_QUOTA: u8 = 4;

/// What stops or holds a running guest from another thread: the agent's interrupt and its
/// pause (see [`crate::Pauser`]).
pub struct Stops {
    pub interrupt: Arc<AtomicBool>,
    pub paused: Arc<AtomicBool>,
}

/// What the guest thread needs to stop itself, shared with the invocation's driver.
struct GuestCtl {
    deadline: Instant,
    why: Arc<AtomicU8>,
    interrupt: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    halt: Arc<AtomicBool>,
    /// Set when the agent passed a write quota.
    quota: Arc<AtomicBool>,
    fuel: Option<u64>,
}

/// How the guest's run ended.
struct GuestEnd {
    exit_code: Option<i32>,
    err: Option<String>,
    /// A refused memory growth (current, requested).
    denied: Option<(usize, usize)>,
    out_of_fuel: bool,
}

/// An import the linker could not satisfy: the agent asked for something the sandbox withholds.
fn link_denied(sink: &dyn EventSink, spec: &AgentSpec, e: &wasmtime::Error) -> RuntimeError {
    let msg = format!("{e:#}");
    sink.record(
        LogKind::SandboxDenied,
        Some(&spec.id),
        json!({"what": "wasm_import", "reason": "import not provided by the sandbox", "detail": msg}),
    );
    RuntimeError::SandboxSetup(format!(
        "the agent imports what the sandbox does not provide: {msg}"
    ))
}

impl WasmAgent {
    /// Load and link the code, and set up the agent's network (its allowlist proxy, which lives
    /// as long as the agent). An import the sandbox does not provide (e.g. a preview-1 socket
    /// extension) is a denial: logged as `sandbox_denied`, and the agent does not start.
    ///
    /// # Errors
    /// Load, compile or link failure; a component that is not a WASI command; the proxy cannot
    /// start.
    pub fn prepare(
        engine: Arc<WasmEngine>,
        spec: &AgentSpec,
        memory: usize,
        sink: &Arc<dyn EventSink>,
        replier: &Replier,
    ) -> Result<Self> {
        let (code, cache, code_engine) = engine.load(&spec.entry, spec.fuel.is_some())?;
        let (pre, kind) = match code {
            Compiled::Module(module) => {
                let mut linker: Linker<State<WasiP1Ctx>> = Linker::new(&code_engine);
                wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s| &mut s.wasi)
                    .map_err(|e| RuntimeError::Wasm(format!("linking WASI: {e:#}")))?;
                let pre = linker
                    .instantiate_pre(&module)
                    .map_err(|e| link_denied(sink.as_ref(), spec, &e))?;
                (Pre::Module(pre), Kind::Module)
            }
            Compiled::Component(component) => {
                let linker = component_linker(&code_engine)?;
                let pre = linker
                    .instantiate_pre(&component)
                    .map_err(|e| link_denied(sink.as_ref(), spec, &e))?;
                let pre = CommandPre::new(pre).map_err(|e| {
                    RuntimeError::Wasm(format!(
                        "the component is not a WASI command (no wasi:cli/run export): {e:#}"
                    ))
                })?;
                (Pre::Component(pre), Kind::Component)
            }
        };
        refuse_inside_hidden(spec)?;
        #[cfg(target_os = "linux")]
        let view = view::View::create(spec)?.map(Box::new);
        // Without a view (no mount namespaces), a preopen cannot hide the host's state.
        #[cfg(target_os = "linux")]
        if view.is_none() {
            refuse_hidden(spec)?;
        }
        #[cfg(not(target_os = "linux"))]
        refuse_hidden(spec)?;
        let net = net::Net::prepare(spec, kind, sink, replier)?;
        let quota = Box::new(quota::WriteGuard::start(spec, sink)?);
        Ok(Self {
            engine,
            code_engine,
            pre,
            memory,
            fuel: spec.fuel,
            net,
            quota,
            cache,
            #[cfg(target_os = "linux")]
            view,
        })
    }

    /// Takes file grants back while the agent runs, when its grants are one revocable view.
    pub fn withdrawer(&self, spec: &AgentSpec) -> Option<crate::Withdrawer> {
        #[cfg(target_os = "linux")]
        {
            let v = self.view.as_ref()?;
            Some(crate::Withdrawer::wasm(
                std::sync::Arc::clone(&v.holder.ns),
                v.root(),
                spec,
            ))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = spec;
            None
        }
    }

    /// How the file grants were given, for `agent_started`.
    pub fn paths_revocable(&self) -> Value {
        #[cfg(target_os = "linux")]
        if self.view.is_some() {
            return json!("mount-namespace");
        }
        json!(false)
    }

    /// What its view keeps read-only (`.git` inside a writable grant), for `agent_started`.
    pub fn protected_report(&self) -> Value {
        #[cfg(target_os = "linux")]
        if let Some(v) = self.view.as_ref().filter(|v| !v.protected.is_empty()) {
            return json!({"paths": v.protected, "via": "mount-namespace", "as": "read-only bind"});
        }
        Value::Null
    }

    /// Whether the agent is a core module or a component.
    pub fn kind(&self) -> Kind {
        match self.pre {
            Pre::Module(_) => Kind::Module,
            Pre::Component(_) => Kind::Component,
        }
    }

    /// The network as applied (for `agent_started`).
    pub fn network_report(&self) -> Value {
        self.net.report()
    }

    /// `limits` (for `agent_started`) with the write quotas as applied: `disk_bytes` and
    /// `files`, `via: "disk-watch+wasm-epoch"`, or `"none"` when nothing is writable.
    pub fn limits_report(&self, limits: &crate::limits::AppliedLimits) -> Value {
        self.quota.with_limits(limits)
    }
}

/// The component linker: WASI preview 2 (sync bindings), with name lookup going through the
/// logging layer in [`net`].
fn component_linker(engine: &Engine) -> Result<wasmtime::component::Linker<State<P2>>> {
    use wasmtime_wasi::p2::bindings::sockets::ip_name_lookup;
    let link = |e: wasmtime::Error| RuntimeError::Wasm(format!("linking WASI preview 2: {e:#}"));
    let mut linker = wasmtime::component::Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(link)?;
    // Replace wasmtime-wasi's `ip-name-lookup` with the same plus a log line for refusals.
    linker.allow_shadowing(true);
    ip_name_lookup::add_to_linker::<State<P2>, net::LoggedLookup>(&mut linker, |s| {
        net::lookup_view(&mut s.wasi, s.net.as_ref())
    })
    .map_err(link)?;
    linker.allow_shadowing(false);
    Ok(linker)
}

/// The paths that exist, canonical.
fn canonical(paths: &[PathBuf]) -> Vec<PathBuf> {
    paths
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect()
}

/// A grant inside the host's state (a file in `.meta/`, another task's worktree) is never given;
/// only the workspace may lie there (a task worktree).
fn refuse_inside_hidden(spec: &AgentSpec) -> Result<()> {
    let granted: Vec<crate::spec::PathAccess> = spec
        .granted_access()
        .into_iter()
        .filter_map(|g| {
            Some(crate::spec::PathAccess {
                path: std::fs::canonicalize(&g.path).ok()?,
                write: g.write,
            })
        })
        .collect();
    let workspace = std::fs::canonicalize(&spec.workspace).ok();
    crate::spec::refuse_inside_hidden(&canonical(&spec.hidden), &granted, workspace.as_deref())
}

/// A preopen is a whole directory, and wasmtime-wasi's cap-std layer cannot subtract a
/// subdirectory from it or make one read-only; a writable one would even let the guest rename the
/// host's state away and plant its own. So without a view a WASM agent is never given a
/// directory that holds a hidden one (the project root, which holds `.meta/`), nor a writable one
/// that holds (or lies in) a protected one (`.git`): it runs in a task worktree or on a
/// subdirectory. Fail closed, before anything runs.
fn refuse_hidden(spec: &AgentSpec) -> Result<()> {
    let (hidden, protected) = (canonical(&spec.hidden), canonical(&spec.protected));
    for g in spec.granted_access() {
        let Ok(path) = std::fs::canonicalize(&g.path) else {
            continue;
        };
        if let Some(h) = hidden.iter().find(|h| h.starts_with(&path)) {
            return Err(RuntimeError::SandboxSetup(format!(
                "{} holds {}, metash's own state, which no agent may see: a WASM agent cannot be \
                 given it (WASI preopens cannot hide a subdirectory); run it in a task worktree \
                 or grant a subdirectory (files.read:src/)",
                path.display(),
                h.display()
            )));
        }
        let reach = |p: &&PathBuf| p.starts_with(&path) || path.starts_with(p);
        if let Some(p) = protected.iter().find(reach).filter(|_| g.write) {
            return Err(RuntimeError::SandboxSetup(format!(
                "{} is writable and reaches {}, which no agent may change: without mount \
                 namespaces a WASM preopen cannot keep it read-only; grant it read-only or a \
                 subdirectory",
                path.display(),
                p.display()
            )));
        }
    }
    Ok(())
}
