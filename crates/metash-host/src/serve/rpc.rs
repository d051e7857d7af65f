//! JSON-RPC 2.0 over NDJSON (one JSON value per line) on any byte streams; `metash serve --stdio`
//! uses stdin and stdout. Why this shape:
//! - Each request runs on a worker thread of its own (idle workers are reused), so a spawn that
//!   takes minutes does not hold up `getState`. At most [`MAX_IN_FLIGHT`] run at once; past that
//!   the reader waits (backpressure, not memory).
//! - One lock around the output, and one `write` per line, so responses and notifications never
//!   interleave inside a line.
//! - Every event the host makes durable goes out as a notification `{"method":"event","params":
//!   LogRecord}` (no `id`), from one thread reading the host's bus.
//! - Bad input of any kind gets a JSON-RPC error and the server reads the next line. End of input
//!   ends the server once the requests in flight have answered.

use std::io::{self, BufRead, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use metash_store::StoreError;
use serde_json::{json, Value};

use super::params::positional;
use super::service::{positional_names, CallError, Service, METHODS};
use crate::{Host, HostError, Spawner};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// Application errors (the implementation-defined server range): a host error of no finer kind.
pub const HOST_ERROR: i64 = -32000;
/// `spawnAgent` named neither a registered agent nor a configured role.
pub const UNKNOWN_AGENT: i64 = -32001;
/// The store refused the change: an unknown key path, an invalid value, a checkpoint that is not
/// pending, a stale write.
pub const REJECTED: i64 = -32002;
/// `.meta/config.toml` is wrong.
pub const CONFIG_ERROR: i64 = -32003;
/// The store failed (I/O, lock timeout, broken log).
pub const STORE_ERROR: i64 = -32004;
/// The policy layer refused (a capability not granted, a bad manifest).
pub const POLICY_ERROR: i64 = -32005;
/// A checkpoint is waiting for an answer: nothing is spawned until `answerCheckpoint`.
pub const CHECKPOINT_PENDING: i64 = -32006;

/// The method of event notifications.
pub const EVENT_METHOD: &str = "event";
/// Requests running at once before the reader stops reading.
pub const MAX_IN_FLIGHT: usize = 64;
/// The longest request line accepted; longer ones are skipped with an error.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    /// `{"kind": ...}` naming the error for programs (e.g. `unknown_agent`, `invalid_params`).
    pub data: Option<Value>,
}

impl RpcError {
    fn new(code: i64, kind: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: Some(json!({ "kind": kind })),
        }
    }

    fn to_json(&self) -> Value {
        let mut e = json!({ "code": self.code, "message": self.message });
        if let Some(d) = &self.data {
            e["data"] = d.clone();
        }
        e
    }
}

impl From<&CallError> for RpcError {
    fn from(e: &CallError) -> Self {
        let message = e.to_string();
        match e {
            CallError::Params(_) => Self::new(INVALID_PARAMS, "invalid_params", message),
            CallError::Internal(_) => Self::new(INTERNAL_ERROR, "internal", message),
            CallError::Host(h) => match h {
                HostError::UnknownAgent { .. } => {
                    Self::new(UNKNOWN_AGENT, "unknown_agent", message)
                }
                HostError::InvalidRequest(_) => {
                    Self::new(INVALID_PARAMS, "invalid_request", message)
                }
                HostError::Config(_) => Self::new(CONFIG_ERROR, "config", message),
                HostError::Policy(_) => Self::new(POLICY_ERROR, "policy", message),
                HostError::ConsentRefused { .. } => {
                    Self::new(POLICY_ERROR, "consent_refused", message)
                }
                HostError::CheckpointPending { .. } => {
                    Self::new(CHECKPOINT_PENDING, "checkpoint_pending", message)
                }
                HostError::Store(s) => match s {
                    StoreError::Rejected(_)
                    | StoreError::UnknownKey { .. }
                    | StoreError::InvalidValue { .. }
                    | StoreError::InvalidName { .. }
                    | StoreError::Fenced { .. } => Self::new(REJECTED, "rejected", message),
                    _ => Self::new(STORE_ERROR, "store", message),
                },
                _ => Self::new(HOST_ERROR, "host", message),
            },
        }
    }
}

/// A response object for `id`.
pub fn response(id: Value, result: Result<Value, RpcError>) -> Value {
    match result {
        Ok(r) => json!({ "jsonrpc": "2.0", "id": id, "result": r }),
        Err(e) => json!({ "jsonrpc": "2.0", "id": id, "error": e.to_json() }),
    }
}

/// The output stream, shared by request threads and the notification thread.
struct Output {
    writer: Mutex<Box<dyn Write + Send>>,
    /// Every message is redacted on its way out (responses and notifications alike).
    host: Arc<Host>,
    /// Set when a write failed (the client went away): the reader stops.
    broken: AtomicBool,
}

impl Output {
    /// Writes one message, redacted (it is the caller's: redacting it in place costs no copy).
    fn send(&self, mut msg: Value) {
        self.host.redactor().redact_value(&mut msg);
        let Ok(mut line) = serde_json::to_vec(&msg) else {
            return;
        };
        line.push(b'\n');
        let Ok(mut w) = self.writer.lock() else {
            self.broken.store(true, Ordering::SeqCst);
            return;
        };
        if w.write_all(&line).and_then(|()| w.flush()).is_err() {
            self.broken.store(true, Ordering::SeqCst);
        }
    }
}

/// Counts requests in flight; the reader waits at the limit and, at the end, for all of them.
#[derive(Default)]
struct InFlight {
    count: Mutex<usize>,
    changed: Condvar,
}

impl InFlight {
    fn acquire(&self, max: usize) {
        if let Ok(mut n) = self.count.lock() {
            while *n >= max {
                match self.changed.wait(n) {
                    Ok(g) => n = g,
                    Err(_) => return,
                }
            }
            *n += 1;
        }
    }

    fn release(&self) {
        if let Ok(mut n) = self.count.lock() {
            *n = n.saturating_sub(1);
            self.changed.notify_all();
        }
    }

    fn wait_idle(&self) {
        if let Ok(mut n) = self.count.lock() {
            while *n > 0 {
                match self.changed.wait(n) {
                    Ok(g) => n = g,
                    Err(_) => return,
                }
            }
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Worker threads that grow on demand: a job goes to an idle worker when one is reserved for it,
/// otherwise to a new thread, so a request never waits behind another (a long spawn) and the hot
/// path creates no thread. At most [`MAX_IN_FLIGHT`] jobs exist at once, so at most that many
/// workers. They end when the pool is dropped.
struct Pool {
    jobs: Mutex<Option<Sender<Job>>>,
    queue: Arc<Mutex<Receiver<Job>>>,
    /// Workers waiting for a job and not yet promised one.
    idle: Arc<AtomicUsize>,
    in_flight: Arc<InFlight>,
}

impl Pool {
    fn new(in_flight: Arc<InFlight>) -> Self {
        let (tx, rx) = channel();
        Self {
            jobs: Mutex::new(Some(tx)),
            queue: Arc::new(Mutex::new(rx)),
            idle: Arc::new(AtomicUsize::new(0)),
            in_flight,
        }
    }

    fn submit(&self, job: Job) {
        let reserved = self
            .idle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if reserved {
            let sent = match self.jobs.lock() {
                Ok(g) => match g.as_ref() {
                    Some(tx) => tx.send(job).map_err(|e| e.0),
                    None => Err(job),
                },
                Err(_) => Err(job),
            };
            match sent {
                Ok(()) => return,
                Err(job) => return self.start_worker(job),
            }
        }
        self.start_worker(job);
    }

    fn start_worker(&self, first: Job) {
        let (queue, idle, in_flight) = (
            self.queue.clone(),
            self.idle.clone(),
            self.in_flight.clone(),
        );
        let started = std::thread::Builder::new()
            .name("metash-rpc".into())
            .spawn(move || {
                let mut job = first;
                loop {
                    job();
                    // Idle before the slot is released, so the next request finds this worker.
                    idle.fetch_add(1, Ordering::SeqCst);
                    in_flight.release();
                    let next = match queue.lock() {
                        Ok(q) => q.recv(),
                        Err(_) => break,
                    };
                    match next {
                        Ok(j) => job = j,
                        Err(_) => break,
                    }
                }
            });
        if started.is_err() {
            self.in_flight.release();
        }
    }

    /// Lets idle workers end.
    fn close(&self) {
        if let Ok(mut g) = self.jobs.lock() {
            g.take();
        }
    }
}

/// The JSON-RPC server for one host.
#[derive(Debug, Clone)]
pub struct RpcServer {
    service: Service,
    max_line_bytes: usize,
}

impl RpcServer {
    pub fn new(host: Arc<Host>, spawner: Arc<dyn Spawner>) -> Self {
        Self::from_service(Service::new(host, spawner))
    }

    pub fn from_service(service: Service) -> Self {
        Self {
            service,
            max_line_bytes: MAX_LINE_BYTES,
        }
    }

    /// Changes the longest request line accepted (default [`MAX_LINE_BYTES`]).
    #[must_use]
    pub fn with_max_line_bytes(mut self, max: usize) -> Self {
        self.max_line_bytes = max;
        self
    }

    /// Serves `stdin`/`stdout` until stdin ends.
    ///
    /// # Errors
    /// Reading stdin failed.
    pub fn serve_stdio(&self) -> io::Result<()> {
        self.serve(io::stdin().lock(), io::stdout())
    }

    /// Reads requests from `input` line by line and writes responses and event notifications to
    /// `output` until `input` ends (or `output` breaks), then waits for the requests in flight.
    ///
    /// # Errors
    /// Reading `input` failed.
    pub fn serve<R: BufRead, W: Write + Send + 'static>(
        &self,
        mut input: R,
        output: W,
    ) -> io::Result<()> {
        let out = Arc::new(Output {
            writer: Mutex::new(Box::new(output)),
            host: Arc::clone(self.service.host()),
            broken: AtomicBool::new(false),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let events = self.spawn_notifier(out.clone(), stop.clone());
        let in_flight = Arc::new(InFlight::default());
        let pool = Pool::new(in_flight.clone());
        let mut line = Vec::new();
        let result = loop {
            if out.broken.load(Ordering::SeqCst) {
                break Ok(());
            }
            match read_line(&mut input, &mut line, self.max_line_bytes) {
                Ok(Line::Eof) => break Ok(()),
                Ok(Line::TooLong) => out.send(response(
                    Value::Null,
                    Err(RpcError::new(
                        INVALID_REQUEST,
                        "too_large",
                        format!(
                            "request line longer than {} bytes; skipped",
                            self.max_line_bytes
                        ),
                    )),
                )),
                Ok(Line::Text) => self.accept(&line, &out, &in_flight, &pool),
                Err(e) => break Err(e),
            }
        };
        in_flight.wait_idle();
        pool.close();
        stop.store(true, Ordering::SeqCst);
        let _ = events.join();
        result
    }

    /// Parses one line and hands it to a worker thread.
    fn accept(&self, line: &[u8], out: &Arc<Output>, in_flight: &InFlight, pool: &Pool) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let msg: Value = match serde_json::from_slice(line) {
            Ok(v) => v,
            Err(e) => {
                out.send(response(
                    Value::Null,
                    Err(RpcError::new(
                        PARSE_ERROR,
                        "parse_error",
                        format!("parse error: {e}"),
                    )),
                ));
                return;
            }
        };
        if matches!(&msg, Value::Array(items) if items.is_empty()) {
            out.send(response(
                Value::Null,
                Err(RpcError::new(
                    INVALID_REQUEST,
                    "invalid_request",
                    "an empty batch is not a request",
                )),
            ));
            return;
        }
        in_flight.acquire(MAX_IN_FLIGHT);
        let (service, out) = (self.service.clone(), out.clone());
        // Kept for the error reply should the handler panic.
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        pool.submit(Box::new(move || {
            let reply = catch_unwind(AssertUnwindSafe(|| handle_message(&service, msg)))
                .unwrap_or_else(|_| {
                    Some(response(
                        id,
                        Err(RpcError::new(
                            INTERNAL_ERROR,
                            "internal",
                            "internal error: the request handler panicked",
                        )),
                    ))
                });
            if let Some(r) = reply {
                out.send(r);
            }
        }));
    }

    /// Forwards every durable event as a notification until `stop` is set and the queue is empty.
    fn spawn_notifier(
        &self,
        out: Arc<Output>,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        let rx = self.service.host().subscribe();
        std::thread::spawn(move || loop {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(record) => out.send(json!({
                    "jsonrpc": "2.0",
                    "method": EVENT_METHOD,
                    "params": record,
                })),
                Err(RecvTimeoutError::Timeout) if !stop.load(Ordering::SeqCst) => {}
                Err(_) => break,
            }
        })
    }
}

/// A request or a batch; `None` when nothing is to be sent back (notifications only).
pub fn handle_message(service: &Service, msg: Value) -> Option<Value> {
    match msg {
        Value::Array(items) => {
            let replies: Vec<Value> = items
                .into_iter()
                .filter_map(|m| handle_request(service, m))
                .collect();
            (!replies.is_empty()).then_some(Value::Array(replies))
        }
        other => handle_request(service, other),
    }
}

/// One request object. Notifications (no `id`) that are valid run and get no reply; an invalid
/// request always gets an error (with `id` null when it could not be read).
pub fn handle_request(service: &Service, msg: Value) -> Option<Value> {
    let invalid = |id: Value, msg: &str| {
        Some(response(
            id,
            Err(RpcError::new(INVALID_REQUEST, "invalid_request", msg)),
        ))
    };
    let Value::Object(obj) = msg else {
        return invalid(Value::Null, "a request must be a JSON object");
    };
    let id = match obj.get("id") {
        None => None,
        Some(v @ (Value::String(_) | Value::Number(_) | Value::Null)) => Some(v.clone()),
        Some(_) => return invalid(Value::Null, "`id` must be a string, a number or null"),
    };
    let reply_id = id.clone().unwrap_or(Value::Null);
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid(reply_id, "`jsonrpc` must be \"2.0\"");
    }
    let Some(method) = obj.get("method").and_then(Value::as_str) else {
        return invalid(reply_id, "`method` must be a string");
    };
    let Some(names) = positional_names(method) else {
        return id.map(|id| {
            response(
                id,
                Err(RpcError::new(
                    METHOD_NOT_FOUND,
                    "method_not_found",
                    format!(
                        "method not found: `{method}` (methods: {})",
                        METHODS.join(", ")
                    ),
                )),
            )
        });
    };
    let params = match obj.get("params") {
        None => Value::Object(Default::default()),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(Value::Array(items)) => match positional(names, items) {
            Ok(p) => p,
            Err(e) => return id.map(|id| response(id, Err((&CallError::from(e)).into()))),
        },
        Some(_) => return invalid(reply_id, "`params` must be an object or an array"),
    };
    let result = match service.call(method, &params) {
        Some(r) => r.map_err(|e| RpcError::from(&e)),
        None => Err(RpcError::new(
            METHOD_NOT_FOUND,
            "method_not_found",
            format!("method not found: `{method}`"),
        )),
    };
    id.map(|id| response(id, result))
}

enum Line {
    Text,
    TooLong,
    Eof,
}

/// Reads one line into `buf` (newline included), refusing to hold more than `max` bytes of it in
/// memory.
fn read_line<R: BufRead>(input: &mut R, buf: &mut Vec<u8>, max: usize) -> io::Result<Line> {
    buf.clear();
    let n = input.by_ref().take(max as u64 + 1).read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(Line::Eof);
    }
    if buf.len() > max && buf.last() != Some(&b'\n') {
        // Skip the rest of the line in bounded pieces.
        let mut rest = Vec::new();
        loop {
            rest.clear();
            let m = input.by_ref().take(1 << 20).read_until(b'\n', &mut rest)?;
            if m == 0 || rest.last() == Some(&b'\n') {
                break;
            }
        }
        buf.clear();
        return Ok(Line::TooLong);
    }
    Ok(Line::Text)
}
