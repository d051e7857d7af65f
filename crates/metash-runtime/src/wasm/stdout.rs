//! The guest's stdout as a bounded queue, so a WASM agent streams live and a slow consumer slows
//! it down: `check_write` grants nothing while the queue is full and `ready` waits for room, so
//! the guest's `fd_write` blocks, exactly like a native agent on a full pipe. Host memory per agent
//! is bounded by `CAPACITY` writes of at most `PERMIT` bytes.
//!
//! The host's end is read by the invocation's own thread with a timeout (so the same loop watches
//! the deadline): no reader thread sits between guest and host. Each hand-off between threads cost
//! more than instantiating the module, so an invocation now wakes one worker, not two.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use tokio::sync::Notify;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// Writes buffered between guest and reader.
const CAPACITY: usize = 16;
/// Largest single write accepted.
const PERMIT: usize = 64 * 1024;

/// What guest and host share.
struct Shared {
    queue: Mutex<Queue>,
    /// The host waits here for data or for the last writer to go.
    data: Condvar,
    /// Counts writes and the last writer's going: the host watches it before it sleeps.
    changes: AtomicUsize,
    /// Writers wait here (asynchronously, inside wasmtime-wasi) for room or for the host to go.
    room: Notify,
}

struct Queue {
    chunks: VecDeque<Bytes>,
    /// Live writer handles: at zero the guest's stdout is closed (its store was dropped).
    writers: usize,
    reader_gone: bool,
    /// The host sleeps on `data`: only then is there anyone to wake.
    waiting: bool,
}

impl Shared {
    /// Something the host waits for happened (under `q`): a host watching sees it, a sleeping
    /// one is woken.
    fn changed(&self, q: MutexGuard<'_, Queue>) {
        self.changes.fetch_add(1, Ordering::Release);
        let asleep = q.waiting;
        drop(q);
        if asleep {
            self.data.notify_all();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A poisoned lock only means a holder panicked; the queue itself is still consistent.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One writer handle; the count of live ones is how the host learns the guest's stdout closed.
struct Writer(Arc<Shared>);

impl Writer {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.lock().writers += 1;
        Self(Arc::clone(shared))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let mut q = self.0.lock();
        q.writers = q.writers.saturating_sub(1);
        if q.writers == 0 {
            self.0.changed(q);
        }
    }
}

/// The `StdoutStream` given to the WASI context.
pub struct ChannelStdout(Writer);

/// A new channel: the stdout half for the guest, the reader half for the host.
pub fn channel() -> (ChannelStdout, ChannelReader) {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue {
            chunks: VecDeque::with_capacity(CAPACITY),
            writers: 0,
            reader_gone: false,
            waiting: false,
        }),
        data: Condvar::new(),
        changes: AtomicUsize::new(0),
        room: Notify::new(),
    });
    (ChannelStdout(Writer::new(&shared)), ChannelReader(shared))
}

impl IsTerminal for ChannelStdout {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for ChannelStdout {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(ChannelOut(Writer::new(&self.0 .0)))
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        // Only preview 3 uses this path; preview-1 modules and preview-2 components write
        // through `p2_stream`.
        Box::new(Unsupported)
    }
}

struct ChannelOut(Writer);

#[wasmtime_wasi::async_trait]
impl Pollable for ChannelOut {
    async fn ready(&mut self) {
        let shared = &self.0 .0;
        loop {
            // Registered before the check, so a wake-up between check and await is not lost.
            let notified = shared.room.notified();
            {
                let q = shared.lock();
                if q.reader_gone || q.chunks.len() < CAPACITY {
                    return;
                }
            }
            notified.await;
        }
    }
}

impl OutputStream for ChannelOut {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        let shared = &self.0 .0;
        let mut q = shared.lock();
        if q.reader_gone {
            return Err(StreamError::Closed);
        }
        if q.chunks.len() >= CAPACITY {
            return Err(StreamError::trap("stdout written past its permit"));
        }
        q.chunks.push_back(bytes);
        shared.changed(q);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        let q = self.0 .0.lock();
        if q.reader_gone {
            return Err(StreamError::Closed);
        }
        Ok(if q.chunks.len() < CAPACITY { PERMIT } else { 0 })
    }
}

struct Unsupported;

impl AsyncWrite for Unsupported {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::Error::other(
            "async stdout is not supported by metash",
        )))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// What one wait on the host's end brought.
pub enum Recv {
    Data(Bytes),
    /// Nothing within the timeout; the guest's stdout is still open.
    Timeout,
    /// Every writer is gone and everything written was read.
    Closed,
}

/// The host's end, read by the invocation's thread.
pub struct ChannelReader(Arc<Shared>);

impl ChannelReader {
    /// The next chunk the guest wrote, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Recv {
        let until = Instant::now() + timeout;
        let mut q = self.0.lock();
        loop {
            if let Some(chunk) = q.chunks.pop_front() {
                drop(q);
                self.0.room.notify_waiters();
                return Recv::Data(chunk);
            }
            if q.writers == 0 {
                return Recv::Closed;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Recv::Timeout;
            }
            // The guest is usually a few microseconds from its next write: watch for it before
            // sleeping, so that it need not wake this thread (see `super::spin`).
            let seen = self.0.changes.load(Ordering::Acquire);
            drop(q);
            let moved = super::spin::until(|| self.0.changes.load(Ordering::Acquire) != seen);
            q = self.0.lock();
            // Checked again under the lock, which writers count under: a write between the
            // watch and the lock saw no sleeper and woke no one.
            if moved || self.0.changes.load(Ordering::Acquire) != seen {
                continue;
            }
            q.waiting = true;
            q = match self.0.data.wait_timeout(q, left) {
                Ok((q, _)) => q,
                Err(poisoned) => poisoned.into_inner().0,
            };
            q.waiting = false;
        }
    }
}

impl Drop for ChannelReader {
    /// The host stopped reading: a guest still writing gets `Closed`, and one waiting for room
    /// wakes to see it.
    fn drop(&mut self) {
        let mut q = self.0.lock();
        q.reader_gone = true;
        q.chunks.clear();
        drop(q);
        self.0.room.notify_waiters();
    }
}
