//! One invocation of a WASM agent: the WASI context (stdio, preopens), the guest on a worker
//! thread, the driver reading its stdout and watching deadline, interrupt and output cap, and the
//! status the invocation ends with.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use metash_protocol::{AgentEvent, LogKind};
use serde_json::json;
use wasmtime::component::ResourceTable;
use wasmtime::{Store, Trap, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use super::{
    net, stdin, stdout, GuestCtl, GuestEnd, Limits, Pre, State, Stops, WasmAgent, GUEST_WORKSPACE,
    P2, STOP_HALT, STOP_INTERRUPT, STOP_NONE, STOP_QUOTA, STOP_TIMEOUT,
};
use crate::codec;
use crate::error::{Result, RuntimeError};
use crate::invocation::{InvocationStatus, Outcome, Step, Tracker};
use crate::pump::{Framer, Msg, PumpCfg};
use crate::reply::Replier;
use crate::sink::EventSink;
use crate::spec::{AgentSpec, Category};
use crate::stream::TokenBucket;

/// However an invocation ends, the guest's stdin closes with it.
struct Detach<'a>(&'a Replier);

impl Drop for Detach<'_> {
    fn drop(&mut self) {
        self.0.detach();
    }
}

/// What the driver loop watches, for one invocation.
struct Watch<'a> {
    pump: PumpCfg,
    spec: &'a AgentSpec,
    sink: &'a Arc<dyn EventSink>,
    interrupt: &'a AtomicBool,
    replier: &'a Replier,
    halt: &'a AtomicBool,
    /// Set when the agent passed a write quota.
    quota: &'a AtomicBool,
    net_log: &'a net::NetLog,
    deadline: Instant,
}

/// Where the guest's worker leaves how the guest ended.
type GuestSlot = Arc<Mutex<Option<GuestEnd>>>;

/// What the agent's output has settled so far.
#[derive(Default)]
struct Ended {
    /// What the agent said (`done`, a checkpoint), first word wins.
    end: Option<InvocationStatus>,
    over_cap: bool,
}

/// How the driver loop ended.
enum Drained {
    /// The guest's stdout reached EOF: `end` is what the agent said, if anything.
    Eof {
        end: Option<InvocationStatus>,
        over_cap: bool,
    },
    /// The guest blocked in a host call past the grace period and was abandoned.
    Abandoned(InvocationStatus),
}

impl WasmAgent {
    /// Run one invocation: a fresh instance on its own thread, its stdout streamed live through a
    /// bounded channel into the shared reader, its stdin open to `replier` until the invocation
    /// ends, until `done`/`checkpoint`, exit, deadline, interrupt, fuel or the output cap.
    ///
    /// # Errors
    /// Only host-side failures (building the WASI context, the preopen, threads); guest failures
    /// are statuses.
    // The pieces `Agent` owns for one invocation; a struct would only move the list.
    #[allow(clippy::too_many_arguments)]
    pub fn invoke(
        &self,
        spec: &AgentSpec,
        sink: &Arc<dyn EventSink>,
        start_line: &[u8],
        input: AgentEvent,
        stops: &Stops,
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
        let _detach = Detach(replier);
        let (stdout, reader) = stdout::channel();
        let stderr = MemoryOutputPipe::new(64 * 1024);
        let mut b = WasiCtxBuilder::new();
        b.stdin(stdin).stdout(stdout).stderr(stderr.clone());
        self.configure(&mut b, spec)?;
        let deadline = Instant::now() + spec.timeout;
        let why = Arc::new(AtomicU8::new(STOP_NONE));
        // Set by this thread when the invocation is over (done, cap) so a guest that keeps
        // running is stopped at its next epoch.
        let halt = Arc::new(AtomicBool::new(false));
        let ctl = GuestCtl {
            deadline,
            why: Arc::clone(&why),
            interrupt: Arc::clone(&stops.interrupt),
            paused: Arc::clone(&stops.paused),
            halt: Arc::clone(&halt),
            quota: self.quota.stop_flag(),
            fuel: self.fuel,
        };
        let quota = self.quota.stop_flag();
        let net_log = net::NetLog::new(&spec.id, sink, self.net.policy());
        let guest_end = self.start_guest(b, ctl, &net_log)?;
        let watch = Watch {
            pump: PumpCfg::new(spec, sink, replier),
            spec,
            sink,
            interrupt: &stops.interrupt,
            replier,
            halt: &halt,
            quota: &quota,
            net_log: &net_log,
            deadline,
        };
        let mut tracker = Tracker::new(spec.output_cap);
        let (end, over_cap) = match watch.drain(&reader, &mut tracker, on_event) {
            Drained::Abandoned(status) => return Ok(tracker.finish(status)),
            Drained::Eof { end, over_cap } => (end, over_cap),
        };
        // Set before the guest's store (and with it its stdout) was dropped, so it is there now
        // that stdout has closed; missing only when the worker panicked.
        let guest = guest_end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| RuntimeError::Wasm("the guest worker panicked".into()))?;
        net_log.finish();
        let stopped = why.load(Ordering::SeqCst);
        let status = self.final_status(spec, sink.as_ref(), guest, stopped, end, over_cap, &stderr);
        Ok(tracker.finish(status))
    }

    /// The WASI context's sandbox: the agent's name as argv, no sockets, its environment, and
    /// the preopens its file grants allow.
    fn configure(&self, b: &mut WasiCtxBuilder, spec: &AgentSpec) -> Result<()> {
        b.arg(&spec.manifest.name)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        for (k, v) in spec.env.iter().chain(self.net.env().iter()) {
            b.env(k, v);
        }
        let perms = if spec.has(Category::FilesWrite) {
            Some(FsPerms::ReadWrite)
        } else if spec.has(Category::FilesRead) {
            Some(FsPerms::ReadOnly)
        } else {
            None
        };
        if let Some(perms) = perms {
            b.preopened_dir(
                self.preopen(&spec.workspace, GUEST_WORKSPACE),
                GUEST_WORKSPACE,
                perms,
            )
            .map_err(|e| RuntimeError::SandboxSetup(format!("preopen workspace: {e:#}")))?;
        }
        // Scoped grants: directories only (WASI preopens are directories; a file grant is
        // reported as skipped by the start report's `paths`).
        for p in spec.split_paths().0 {
            if !p.path.is_dir() {
                continue;
            }
            let perms = if p.write {
                FsPerms::ReadWrite
            } else {
                FsPerms::ReadOnly
            };
            let guest = p.guest_path(&spec.workspace, GUEST_WORKSPACE);
            b.preopened_dir(self.preopen(&p.path, &guest), &guest, perms)
                .map_err(|e| {
                    RuntimeError::SandboxSetup(format!("preopen {}: {e:#}", p.path.display()))
                })?;
        }
        Ok(())
    }

    /// What to preopen for a grant: on Linux its bind in the agent's revocable view (see
    /// [`super::view`]), elsewhere the path itself.
    fn preopen(&self, host: &std::path::Path, guest: &str) -> std::path::PathBuf {
        #[cfg(target_os = "linux")]
        if let Some(view) = &self.view {
            return view.preopen_path().join(guest.trim_start_matches('/'));
        }
        let _ = guest;
        host.to_path_buf()
    }

    /// The guest thread: only instantiate-and-run differs between modules and components.
    fn start_guest(
        &self,
        mut b: WasiCtxBuilder,
        ctl: GuestCtl,
        net_log: &Arc<net::NetLog>,
    ) -> Result<GuestSlot> {
        let limits = Limits {
            memory: self.memory,
            used: 0,
            denied: None,
        };
        match &self.pre {
            Pre::Module(pre) => {
                let pre = pre.clone();
                let state = State {
                    wasi: b.build_p1(),
                    limits,
                    net: None,
                };
                self.spawn_guest(state, ctl, move |store| {
                    let instance = pre.instantiate(&mut *store)?;
                    let start = instance.get_typed_func::<(), ()>(&mut *store, "_start")?;
                    start.call(&mut *store, ())?;
                    Ok(0)
                })
            }
            Pre::Component(pre) => {
                let pre = pre.clone();
                self.net.apply(&mut b, net_log);
                let mut table = ResourceTable::new();
                table.set_max_capacity(net::MAX_HANDLES);
                let state = State {
                    wasi: P2 {
                        ctx: b.build(),
                        table,
                    },
                    limits,
                    net: Some(Arc::clone(net_log)),
                };
                self.spawn_guest(state, ctl, move |store| {
                    let command = pre.instantiate(&mut *store)?;
                    // `wasi:cli/run` returns `result`: an error is exit status 1.
                    Ok(match command.wasi_cli_run().call_run(&mut *store)? {
                        Ok(()) => 0,
                        Err(()) => 1,
                    })
                })
            }
        }
    }

    /// How the invocation ended, in order of precedence: the output cap, a write quota (measured
    /// once more now; the watcher logged the hit), what the agent said, fuel, the deadline, an
    /// interrupt, memory, else the guest's exit (a trap is logged).
    // The pieces of one invocation's end, each from a different thread.
    #[allow(clippy::too_many_arguments)]
    fn final_status(
        &self,
        spec: &AgentSpec,
        sink: &dyn EventSink,
        guest: GuestEnd,
        stopped: u8,
        end: Option<InvocationStatus>,
        over_cap: bool,
        stderr: &MemoryOutputPipe,
    ) -> InvocationStatus {
        let id = Some(spec.id.as_str());
        if let Some((current, desired)) = guest.denied {
            sink.record(
                LogKind::LimitExceeded,
                id,
                json!({"limit": "memory", "via": "wasm-store-limits", "max": self.memory,
                       "current": current, "requested": desired}),
            );
        }
        let limit = |name: &str, data: serde_json::Value| {
            sink.record(LogKind::LimitExceeded, id, data);
            InvocationStatus::LimitExceeded { limit: name.into() }
        };
        let quota_hit = if over_cap {
            None
        } else {
            self.quota.check_now()
        };
        if over_cap {
            limit(
                "output_bytes",
                json!({"limit": "output_bytes", "max": spec.output_cap}),
            )
        } else if let Some(hit) = quota_hit {
            hit.status()
        } else if let Some(st) = end {
            st
        } else if guest.out_of_fuel {
            limit(
                "fuel",
                json!({"limit": "fuel", "via": "wasm-fuel", "max": self.fuel}),
            )
        } else if stopped == STOP_TIMEOUT {
            sink.record(
                LogKind::AgentTimeout,
                id,
                json!({"timeout_ms": spec.timeout.as_millis() as u64, "via": "wasm-epoch"}),
            );
            InvocationStatus::Timeout
        } else if stopped == STOP_INTERRUPT {
            sink.record(
                LogKind::AgentKilled,
                id,
                json!({"reason": "host asked it to stop; instance interrupted at the next epoch"}),
            );
            InvocationStatus::Killed {
                reason: "interrupted".into(),
            }
        } else if guest.denied.is_some() {
            InvocationStatus::LimitExceeded {
                limit: "memory".into(),
            }
        } else {
            if let (Some(message), None) = (&guest.err, guest.exit_code) {
                sink.record(
                    LogKind::AgentTrap,
                    id,
                    json!({"message": message,
                           "stderr": String::from_utf8_lossy(&stderr.contents()).to_string()}),
                );
            }
            InvocationStatus::Exited {
                code: guest.exit_code,
                signal: None,
            }
        }
    }

    /// Run the guest on a worker: a store with the limiter, the fuel and the epoch callback
    /// (deadline, interrupt, halt, a write quota), then `run` (instantiate and call the entry
    /// point; the exit code). How it ended goes into the returned slot before the store, and with
    /// it the guest's stdout, is dropped: the host finds it there once stdout has closed.
    fn spawn_guest<W: Send + 'static>(
        &self,
        state: State<W>,
        ctl: GuestCtl,
        run: impl FnOnce(&mut Store<State<W>>) -> wasmtime::Result<i32> + Send + 'static,
    ) -> Result<GuestSlot> {
        let engine = self.code_engine.clone();
        let slot: GuestSlot = Arc::new(Mutex::new(None));
        let guest_end = Arc::clone(&slot);
        self.engine.workers.run(move || {
            let GuestCtl {
                deadline,
                why,
                interrupt,
                paused,
                halt,
                quota,
                fuel,
            } = ctl;
            let mut store = Store::new(&engine, state);
            store.limiter(|s| &mut s.limits);
            let fueled = match fuel {
                Some(f) => store.set_fuel(f),
                None => Ok(()),
            };
            // Already past a quota (an earlier invocation): stopped at its first check.
            store.set_epoch_deadline(u64::from(!quota.load(Ordering::SeqCst)));
            store.epoch_deadline_callback(move |_| {
                // Paused: the guest waits here, its memory as it was, until resumed (or stopped).
                while paused.load(Ordering::SeqCst)
                    && !interrupt.load(Ordering::SeqCst)
                    && !quota.load(Ordering::SeqCst)
                    && !halt.load(Ordering::SeqCst)
                    && Instant::now() < deadline
                {
                    std::thread::sleep(super::TICK);
                }
                if interrupt.load(Ordering::SeqCst) {
                    why.store(STOP_INTERRUPT, Ordering::SeqCst);
                    return Err(wasmtime::Error::msg("interrupted by host"));
                }
                if quota.load(Ordering::SeqCst) {
                    why.store(STOP_QUOTA, Ordering::SeqCst);
                    return Err(wasmtime::Error::msg("past a write quota"));
                }
                if halt.load(Ordering::SeqCst) {
                    why.store(STOP_HALT, Ordering::SeqCst);
                    return Err(wasmtime::Error::msg("invocation already over"));
                }
                if Instant::now() >= deadline {
                    why.store(STOP_TIMEOUT, Ordering::SeqCst);
                    return Err(wasmtime::Error::msg("deadline exceeded"));
                }
                Ok(UpdateDeadline::Continue(1))
            });
            let result = fueled.and_then(|()| run(&mut store));
            let (exit_code, out_of_fuel) = match &result {
                Ok(code) => (Some(*code), false),
                Err(e) => (
                    e.downcast_ref::<I32Exit>().map(|c| c.0),
                    matches!(e.downcast_ref::<Trap>(), Some(Trap::OutOfFuel)),
                ),
            };
            let end = GuestEnd {
                exit_code,
                err: result.err().map(|e| format!("{e:#}")),
                denied: store.data().limits.denied,
                out_of_fuel,
            };
            // The end first, then the store (and with it the guest's stdout): the host reads the
            // end when it sees stdout close, with no second hand-off between the threads.
            *guest_end.lock().unwrap_or_else(PoisonError::into_inner) = Some(end);
            drop(store);
        })?;
        Ok(slot)
    }
}

impl Watch<'_> {
    /// Delivers the agent's events until its stdout ends, stopping the guest at the end of the
    /// invocation, at the output cap, at the deadline or on interrupt; past the deadline plus the
    /// grace period a guest blocked in a host call is abandoned rather than hanging the host.
    fn drain(
        &self,
        out: &stdout::ChannelReader,
        tracker: &mut Tracker,
        on_event: &mut dyn FnMut(&AgentEvent),
    ) -> Drained {
        let mut ended = Ended::default();
        let mut framer = Framer::default();
        let mut bucket = TokenBucket::new(self.spec.throttle);
        let give_up = self.deadline + self.spec.shutdown_grace.max(Duration::from_millis(100));
        loop {
            if Instant::now() >= self.deadline
                || self.interrupt.load(Ordering::SeqCst)
                || self.quota.load(Ordering::SeqCst)
            {
                // A guest waiting on stdin gets end of input and so reaches its next epoch check.
                self.replier.detach();
            }
            if Instant::now() >= give_up {
                return Drained::Abandoned(self.abandon(ended.end));
            }
            match out.recv_timeout(Duration::from_millis(20)) {
                stdout::Recv::Data(chunk) => {
                    framer.feed(&chunk, &self.pump, &mut bucket, &mut |msg| {
                        self.step(msg, tracker, &mut ended, on_event);
                        true
                    });
                }
                stdout::Recv::Timeout => {}
                stdout::Recv::Closed => {
                    self.step(Msg::Eof, tracker, &mut ended, on_event);
                    return Drained::Eof {
                        end: ended.end,
                        over_cap: ended.over_cap,
                    };
                }
            }
        }
    }

    /// One message through the tracker: after the end (or the cap) the rest is drained to EOF
    /// but not delivered.
    fn step(
        &self,
        msg: Msg,
        tracker: &mut Tracker,
        ended: &mut Ended,
        on_event: &mut dyn FnMut(&AgentEvent),
    ) {
        let mut ignored = |_: &AgentEvent| {};
        let deliver: &mut dyn FnMut(&AgentEvent) = if ended.end.is_some() || ended.over_cap {
            &mut ignored
        } else {
            on_event
        };
        match tracker.step(msg, deliver) {
            Step::Continue | Step::Eof => {}
            Step::End(st) => {
                if ended.end.is_none() && !ended.over_cap {
                    ended.end = Some(st);
                    self.stop();
                }
            }
            Step::OverCap => {
                ended.over_cap = true;
                self.stop();
            }
        }
    }

    /// The invocation is over: stop the guest at its next epoch, close its stdin.
    fn stop(&self) {
        self.halt.store(true, Ordering::SeqCst);
        self.replier.detach();
    }

    /// Gives up on a guest blocked in a host call: an answer it already gave stands; otherwise
    /// it timed out.
    fn abandon(&self, end: Option<InvocationStatus>) -> InvocationStatus {
        self.halt.store(true, Ordering::SeqCst);
        self.net_log.finish();
        if let Some(st) = end {
            return st;
        }
        self.sink.record(
            LogKind::AgentTimeout,
            Some(&self.spec.id),
            json!({"timeout_ms": self.spec.timeout.as_millis() as u64, "via": "host-deadline",
                   "note": "guest blocked in a host call; abandoned"}),
        );
        InvocationStatus::Timeout
    }
}
