//! The WASM sandbox: WASI preview-1 command modules on wasmtime, deny by default.
//!
//! Each invocation is a fresh instance of a pre-linked module (instantiation from the pooling
//! allocator costs microseconds), fed `start` + `input` on an in-memory stdin and read from an
//! in-memory stdout capped at the output limit. Nothing is granted unless the spec says so: no
//! preopens, no environment, no sockets (preview 1 has no outbound socket API at all; a module that
//! imports one is refused at link time). Memory is capped by a store limiter, time by epoch
//! interruption driven by one timer thread per engine.

mod cache;
mod pool;
mod stdin;
mod stdout;

use std::collections::HashMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use metash_protocol::AgentEvent;
use serde_json::json;
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, InstancePre, Linker, Module,
    PoolingAllocationConfig, ResourceLimiter, Store, UpdateDeadline,
};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

pub use cache::CacheHit;

use crate::codec;
use crate::error::{io_err, Result, RuntimeError};
use crate::invocation::{InvocationStatus, Outcome, Step, Tracker};
use crate::pump::{pump, Msg, PumpCfg};
use crate::reply::Replier;
use crate::sink::{kinds, EventSink};
use crate::spec::{caps, AgentSpec};
use crate::stream::TokenBucket;

/// How often the timer thread advances the epoch: the resolution of WASM deadlines.
const TICK: Duration = Duration::from_millis(5);
/// Where the workspace appears inside the guest.
pub const GUEST_WORKSPACE: &str = "/workspace";

/// One wasmtime engine, its module cache and its epoch timer thread. Share it between agents.
pub struct WasmEngine {
    engine: Engine,
    cache_dir: PathBuf,
    modules: Mutex<HashMap<String, Module>>,
    stop: Arc<AtomicBool>,
    workers: pool::Pool,
}

impl WasmEngine {
    /// Create the engine (pooling allocator, epoch interruption) and start its timer thread.
    ///
    /// # Errors
    /// The engine configuration is rejected or the timer thread cannot start.
    pub fn new(cache_dir: impl Into<PathBuf>) -> Result<Arc<Self>> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_core_instances(64)
            .total_memories(64)
            .total_tables(64)
            .max_memory_size(4 << 30);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|e| RuntimeError::Wasm(format!("{e:#}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (e2, s2) = (engine.clone(), Arc::clone(&stop));
        thread::Builder::new()
            .name("metash-wasm-epoch".into())
            .spawn(move || {
                while !s2.load(Ordering::Relaxed) {
                    thread::sleep(TICK);
                    e2.increment_epoch();
                }
            })
            .map_err(io_err("starting the epoch timer thread"))?;
        Ok(Arc::new(Self {
            engine,
            cache_dir: cache_dir.into(),
            modules: Mutex::new(HashMap::new()),
            stop,
            workers: pool::Pool::new(),
        }))
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Load the module at `path` (`.wasm` binary or `.wat` text) through the caches.
    ///
    /// # Errors
    /// Unreadable file, invalid module, unwritable cache.
    pub fn load(&self, path: &Path) -> Result<(Module, CacheHit)> {
        let bytes = std::fs::read(path).map_err(io_err(format!("reading {}", path.display())))?;
        let hash = cache::module_hash(&bytes);
        if let Some(m) = self.modules.lock().ok().and_then(|g| g.get(&hash).cloned()) {
            return Ok((m, CacheHit::Memory));
        }
        let (m, hit) = cache::load_or_compile(&self.engine, &self.cache_dir, &hash, &bytes)?;
        if let Ok(mut g) = self.modules.lock() {
            g.insert(hash, m.clone());
        }
        Ok((m, hit))
    }

    /// Forget the in-process cache (so the next load exercises the disk cache; benchmarks).
    pub fn clear_memory_cache(&self) {
        if let Ok(mut g) = self.modules.lock() {
            g.clear();
        }
    }
}

impl Drop for WasmEngine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Per-store host state.
struct State {
    wasi: WasiP1Ctx,
    limits: Limits,
}

/// Memory/table limiter that remembers a refusal so it can be logged.
struct Limits {
    memory: usize,
    denied: Option<(usize, usize)>,
}

impl ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory {
            self.denied = Some((current, desired));
            return Ok(false);
        }
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

/// A WASM agent ready to be invoked: its module linked against the WASI p1 host functions.
pub struct WasmAgent {
    engine: Arc<WasmEngine>,
    pre: InstancePre<State>,
    memory: usize,
    pub cache: CacheHit,
}

/// Why the epoch callback stopped the guest.
const STOP_NONE: u8 = 0;
const STOP_TIMEOUT: u8 = 1;
const STOP_INTERRUPT: u8 = 2;
const STOP_HALT: u8 = 3;

impl WasmAgent {
    /// Load and link the module. An import the sandbox does not provide (e.g. a socket extension)
    /// is a denial: logged as `sandbox_denied`, and the agent does not start.
    ///
    /// # Errors
    /// Load, compile or link failure.
    pub fn prepare(
        engine: Arc<WasmEngine>,
        spec: &AgentSpec,
        memory: usize,
        sink: &dyn EventSink,
    ) -> Result<Self> {
        let (module, cache) = engine.load(&spec.entry)?;
        let mut linker: Linker<State> = Linker::new(engine.engine());
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut State| &mut s.wasi)
            .map_err(|e| RuntimeError::Wasm(format!("linking WASI: {e:#}")))?;
        let pre = linker.instantiate_pre(&module).map_err(|e| {
            let msg = format!("{e:#}");
            sink.record(
                kinds::DENIED,
                Some(&spec.id),
                json!({"what": "wasm_import", "reason": "import not provided by the sandbox", "detail": msg}),
            );
            RuntimeError::SandboxSetup(format!("module imports what the sandbox does not provide: {msg}"))
        })?;
        Ok(Self {
            engine,
            pre,
            memory,
            cache,
        })
    }

    /// Run one invocation: a fresh instance on its own thread, its stdout streamed live through a
    /// bounded channel into the shared reader, its stdin open to `replier` until the invocation
    /// ends, until `done`/`checkpoint`, exit, deadline, interrupt or the output cap.
    ///
    /// # Errors
    /// Only host-side failures (building the WASI context, the preopen, threads); guest failures
    /// are statuses.
    pub fn invoke(
        &self,
        spec: &AgentSpec,
        sink: &Arc<dyn EventSink>,
        start_line: &[u8],
        input: AgentEvent,
        interrupt: &Arc<AtomicBool>,
        replier: &Replier,
        on_event: &mut dyn FnMut(&AgentEvent),
    ) -> Result<Outcome> {
        let (stdin_tx, stdin) = stdin::channel();
        for line in [start_line.to_vec(), codec::encode(input)?] {
            stdin_tx
                .try_send(line)
                .map_err(|_| RuntimeError::Wasm("queueing the guest's first lines".into()))?;
        }
        replier.attach(stdin_tx);
        // However this invocation ends, the guest's stdin closes with it.
        struct Detach<'a>(&'a Replier);
        impl Drop for Detach<'_> {
            fn drop(&mut self) {
                self.0.detach();
            }
        }
        let _detach = Detach(replier);
        let (stdout, reader) = stdout::channel();
        let stderr = MemoryOutputPipe::new(64 * 1024);
        let mut b = WasiCtxBuilder::new();
        b.stdin(stdin)
            .stdout(stdout)
            .stderr(stderr.clone())
            .arg(&spec.manifest.name)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        for (k, v) in &spec.env {
            b.env(k, v);
        }
        let perms = if spec.has(caps::FILES_WRITE) {
            Some(FsPerms::ReadWrite)
        } else if spec.has(caps::FILES_READ) {
            Some(FsPerms::ReadOnly)
        } else {
            None
        };
        if let Some(perms) = perms {
            b.preopened_dir(&spec.workspace, GUEST_WORKSPACE, perms)
                .map_err(|e| RuntimeError::SandboxSetup(format!("preopen workspace: {e:#}")))?;
        }
        let state = State {
            wasi: b.build_p1(),
            limits: Limits {
                memory: self.memory,
                denied: None,
            },
        };
        let deadline = Instant::now() + spec.timeout;
        let why = Arc::new(AtomicU8::new(STOP_NONE));
        // Set by this thread when the invocation is over (done, cap) so a guest that keeps
        // running is stopped at its next epoch.
        let halt = Arc::new(AtomicBool::new(false));

        // The guest thread.
        let (pre, engine) = (self.pre.clone(), Arc::clone(&self.engine));
        let (why2, int2, halt2) = (Arc::clone(&why), Arc::clone(interrupt), Arc::clone(&halt));
        let (done_tx, done_rx) = mpsc::channel();
        self.engine.workers.run(move || {
            let mut store = Store::new(engine.engine(), state);
            store.limiter(|s| &mut s.limits);
            store.set_epoch_deadline(1);
            store.epoch_deadline_callback(move |_| {
                if int2.load(Ordering::SeqCst) {
                    why2.store(STOP_INTERRUPT, Ordering::SeqCst);
                    return Err(wasmtime::Error::msg("interrupted by host"));
                }
                if halt2.load(Ordering::SeqCst) {
                    why2.store(STOP_HALT, Ordering::SeqCst);
                    return Err(wasmtime::Error::msg("invocation already over"));
                }
                if Instant::now() >= deadline {
                    why2.store(STOP_TIMEOUT, Ordering::SeqCst);
                    return Err(wasmtime::Error::msg("deadline exceeded"));
                }
                Ok(UpdateDeadline::Continue(1))
            });
            let run = pre
                .instantiate(&mut store)
                .and_then(|inst| inst.get_typed_func::<(), ()>(&mut store, "_start"))
                .and_then(|f| f.call(&mut store, ()));
            let exit_code = match &run {
                Ok(()) => Some(0),
                Err(e) => e.downcast_ref::<I32Exit>().map(|c| c.0),
            };
            let err = run.err().map(|e| format!("{e:#}"));
            let denied = store.data().limits.denied;
            // Drop the store (and with it the stdout sender) first: the reader sees EOF.
            drop(store);
            let _ = done_tx.send((exit_code, err, denied));
        })?;

        // The reader thread: framing, version check, log, token bucket, into a bounded channel.
        let (tx, rx) = mpsc::sync_channel::<Msg>(spec.channel_capacity.max(1));
        let cfg = PumpCfg {
            agent: spec.id.clone(),
            sink: Arc::clone(sink),
            max_line: spec.max_line,
        };
        let throttle = spec.throttle;
        self.engine.workers.run(move || {
            let mut bucket = TokenBucket::new(throttle);
            let reader = BufReader::with_capacity(16 * 1024, reader);
            pump(reader, &cfg, &mut bucket, |m| tx.send(m).is_ok());
        })?;

        let mut tracker = Tracker::new(spec.output_cap);
        let mut end: Option<InvocationStatus> = None;
        let mut over_cap = false;
        // Past the deadline plus this, a guest blocked in a host call is abandoned (it stops at its
        // next epoch check or host call) rather than hanging the host.
        let give_up = deadline + spec.shutdown_grace.max(Duration::from_millis(100));
        let mut ignored = |_: &AgentEvent| {};
        loop {
            if Instant::now() >= deadline || interrupt.load(Ordering::SeqCst) {
                // A guest waiting on stdin gets end of input and so reaches its next epoch check.
                replier.detach();
            }
            if Instant::now() >= give_up {
                halt.store(true, Ordering::SeqCst);
                if let Some(st) = end {
                    // It finished its invocation but then blocked in a host call: the answer
                    // stands, the instance is abandoned.
                    return Ok(tracker.finish(st));
                }
                sink.record(
                    kinds::TIMEOUT,
                    Some(&spec.id),
                    json!({"timeout_ms": spec.timeout.as_millis() as u64, "via": "host-deadline",
                           "note": "guest blocked in a host call; abandoned"}),
                );
                return Ok(tracker.finish(InvocationStatus::Timeout));
            }
            let msg = match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => Msg::Eof,
            };
            // After the end (or the cap) the rest is drained to EOF but not delivered.
            let deliver: &mut dyn FnMut(&AgentEvent) = if end.is_some() || over_cap {
                &mut ignored
            } else {
                on_event
            };
            match tracker.step(msg, deliver) {
                Step::Continue => {}
                Step::End(st) => {
                    if end.is_none() && !over_cap {
                        end = Some(st);
                        halt.store(true, Ordering::SeqCst);
                        replier.detach();
                    }
                }
                Step::OverCap => {
                    over_cap = true;
                    halt.store(true, Ordering::SeqCst);
                    replier.detach();
                }
                Step::Eof => break,
            }
        }
        let (exit_code, err, denied) = done_rx
            .recv()
            .map_err(|_| RuntimeError::Wasm("the guest worker panicked".into()))?;
        if let Some((current, desired)) = denied {
            sink.record(
                kinds::LIMIT,
                Some(&spec.id),
                json!({"limit": "memory", "via": "wasm-store-limits", "max": self.memory,
                       "current": current, "requested": desired}),
            );
        }
        let stopped = why.load(Ordering::SeqCst);
        let status = if over_cap {
            sink.record(
                kinds::LIMIT,
                Some(&spec.id),
                json!({"limit": "output_bytes", "max": spec.output_cap}),
            );
            InvocationStatus::LimitExceeded {
                limit: "output_bytes".into(),
            }
        } else if let Some(st) = end {
            st
        } else if stopped == STOP_TIMEOUT {
            sink.record(
                kinds::TIMEOUT,
                Some(&spec.id),
                json!({"timeout_ms": spec.timeout.as_millis() as u64, "via": "wasm-epoch"}),
            );
            InvocationStatus::Timeout
        } else if stopped == STOP_INTERRUPT {
            sink.record(
                kinds::KILLED,
                Some(&spec.id),
                json!({"reason": "host asked it to stop; instance interrupted at the next epoch"}),
            );
            InvocationStatus::Killed {
                reason: "interrupted".into(),
            }
        } else if denied.is_some() {
            InvocationStatus::LimitExceeded {
                limit: "memory".into(),
            }
        } else {
            if let (Some(message), None) = (&err, exit_code) {
                sink.record(
                    "agent_trap",
                    Some(&spec.id),
                    json!({"message": message,
                           "stderr": String::from_utf8_lossy(&stderr.contents()).to_string()}),
                );
            }
            InvocationStatus::Exited {
                code: exit_code,
                signal: None,
            }
        };
        Ok(tracker.finish(status))
    }
}
