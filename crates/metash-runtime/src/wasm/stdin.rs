//! The guest's stdin as a channel that stays open for the whole invocation, so the host can answer
//! the agent mid-run (a `consent_request` gets its `consent_grant` or `error`) just as it writes to
//! a native agent's pipe. `start` and `input` are queued before the guest runs; closing the host's
//! end (the invocation is over, or its deadline passed) is end of input, which also frees a guest
//! blocked in `fd_read`.
//!
//! The stream reads the channel directly (no background task: wasmtime-wasi's `AsyncStdinStream`
//! spawns one per stream, a cost every invocation would pay even when the guest never reads).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc::{self, error::TryRecvError, Receiver, Sender};
use tokio::sync::Mutex;
use wasmtime_wasi::cli::{IsTerminal, StdinStream};
use wasmtime_wasi::p2::{InputStream, Pollable, StreamError, StreamResult};

/// Lines buffered towards the guest.
const CAPACITY: usize = 16;

/// A new channel: the sender for the host, the stdin stream for the WASI context.
pub fn channel() -> (Sender<Vec<u8>>, ChannelStdin) {
    let (tx, rx) = mpsc::channel(CAPACITY);
    (
        tx,
        ChannelStdin(Arc::new(Mutex::new(Inner {
            rx,
            cur: Bytes::new(),
            closed: false,
        }))),
    )
}

struct Inner {
    rx: Receiver<Vec<u8>>,
    /// What was received and not yet read.
    cur: Bytes,
    closed: bool,
}

/// Every handle the guest opens on stdin shares one position (WASI requires it).
#[derive(Clone)]
pub struct ChannelStdin(Arc<Mutex<Inner>>);

impl IsTerminal for ChannelStdin {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdinStream for ChannelStdin {
    fn p2_stream(&self) -> Box<dyn InputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncRead + Send + Sync> {
        // Only preview 3 uses this path; preview 1 and 2 guests read through `p2_stream`.
        Box::new(NoAsync)
    }
}

#[wasmtime_wasi::async_trait]
impl InputStream for ChannelStdin {
    fn read(&mut self, size: usize) -> StreamResult<Bytes> {
        // The guest's calls are sequential: the lock is only held across `ready`, which the guest
        // is not in while it reads.
        let Ok(mut g) = self.0.try_lock() else {
            return Ok(Bytes::new());
        };
        if g.cur.is_empty() {
            match g.rx.try_recv() {
                Ok(line) => g.cur = Bytes::from(line),
                Err(TryRecvError::Empty) => return Ok(Bytes::new()),
                Err(TryRecvError::Disconnected) => {
                    g.closed = true;
                    return Err(StreamError::Closed);
                }
            }
        }
        let n = size.min(g.cur.len());
        Ok(g.cur.split_to(n))
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for ChannelStdin {
    async fn ready(&mut self) {
        let mut g = self.0.lock().await;
        if g.cur.is_empty() && !g.closed {
            match g.rx.recv().await {
                Some(line) => g.cur = Bytes::from(line),
                None => g.closed = true,
            }
        }
    }
}

struct NoAsync;

impl AsyncRead for NoAsync {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Err(io::Error::other(
            "async stdin is not supported by metash",
        )))
    }
}
