//! The guest's stdout as a bounded channel, so a WASM agent streams live and a slow consumer slows
//! it down: `check_write` grants nothing while the channel is full and `ready` waits for room, so
//! the guest's `fd_write` blocks, exactly like a native agent on a full pipe. Host memory per agent
//! is bounded by `CAPACITY` writes of at most `PERMIT` bytes.

use std::io::{self, Read};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use tokio::sync::mpsc::{self, error::TrySendError, Receiver, Sender};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// Writes buffered between guest and reader.
const CAPACITY: usize = 16;
/// Largest single write accepted.
const PERMIT: usize = 64 * 1024;

/// The `StdoutStream` given to the WASI context.
pub struct ChannelStdout {
    tx: Sender<Bytes>,
}

/// A new channel: the stdout half for the guest, the reader half for the host.
pub fn channel() -> (ChannelStdout, ChannelReader) {
    let (tx, rx) = mpsc::channel(CAPACITY);
    (
        ChannelStdout { tx },
        ChannelReader {
            rx,
            cur: Bytes::new(),
        },
    )
}

impl IsTerminal for ChannelStdout {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for ChannelStdout {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(ChannelOut {
            tx: self.tx.clone(),
        })
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        // Only preview 3 uses this path; preview-1 modules and preview-2 components write
        // through `p2_stream`.
        Box::new(Unsupported)
    }
}

struct ChannelOut {
    tx: Sender<Bytes>,
}

#[wasmtime_wasi::async_trait]
impl Pollable for ChannelOut {
    async fn ready(&mut self) {
        // Resolves when there is room (the permit is released at once) or the reader is gone.
        let _ = self.tx.reserve().await;
    }
}

impl OutputStream for ChannelOut {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        match self.tx.try_send(bytes) {
            Ok(()) => Ok(()),
            Err(TrySendError::Closed(_)) => Err(StreamError::Closed),
            Err(TrySendError::Full(_)) => Err(StreamError::trap("stdout written past its permit")),
        }
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        if self.tx.is_closed() {
            return Err(StreamError::Closed);
        }
        Ok(if self.tx.capacity() > 0 { PERMIT } else { 0 })
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

/// The host's end: a blocking `Read` (use it on a plain thread, never inside a tokio runtime).
pub struct ChannelReader {
    rx: Receiver<Bytes>,
    cur: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur.split_to(n));
        Ok(n)
    }
}
