//! The guest's stdin as a channel that stays open for the whole invocation, so the host can answer
//! the agent mid-run (a `consent_request` gets its `consent_grant` or `error`) just as it writes to
//! a native agent's pipe. `start` and `input` are queued before the guest runs; closing the host's
//! end (the invocation is over, or its deadline passed) is end of input, which also frees a guest
//! blocked in `fd_read`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc::{self, Receiver, Sender};
use wasmtime_wasi::cli::AsyncStdinStream;

/// Lines buffered towards the guest.
const CAPACITY: usize = 16;

/// A new channel: the sender for the host, the stdin stream for the WASI context.
pub fn channel() -> (Sender<Vec<u8>>, AsyncStdinStream) {
    let (tx, rx) = mpsc::channel(CAPACITY);
    (
        tx,
        AsyncStdinStream::new(ChannelStdin {
            rx,
            cur: Bytes::new(),
        }),
    )
}

struct ChannelStdin {
    rx: Receiver<Vec<u8>>,
    cur: Bytes,
}

impl AsyncRead for ChannelStdin {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        while self.cur.is_empty() {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(line)) => self.cur = Bytes::from(line),
                // All senders gone: end of input.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = buf.remaining().min(self.cur.len());
        let chunk = self.cur.split_to(n);
        buf.put_slice(&chunk);
        Poll::Ready(Ok(()))
    }
}
