//! The usage hook: every response body passes through [`TappedBody`], which shows each chunk to
//! the host's [`UsageTap`] as it is forwarded (the host parses SSE usage events from it for budget
//! enforcement). The tap sees bytes, never request headers, so it never sees the secret. The
//! same body feeds the exchange's recording, when the host records (`record.rs`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::record::Pending;
use super::stream_end::StreamEnd;

/// What the tap is shown, per exchange (one forwarded request).
#[derive(Debug)]
pub enum TapEvent<'a> {
    /// The upstream answered; the body follows.
    Response {
        exchange: u64,
        route: &'a str,
        status: u16,
    },
    /// A body chunk, as it is passed on (an SSE stream arrives in pieces that need not align
    /// with events).
    Chunk {
        exchange: u64,
        route: &'a str,
        bytes: &'a Bytes,
    },
    /// The body ended (exactly once per `Response`).
    End {
        exchange: u64,
        route: &'a str,
        end: StreamEnd,
    },
}

/// Sees every response as it streams. Called on the proxy's runtime thread while the chunk is in
/// flight: keep it cheap (append to a buffer, send on a channel).
pub trait UsageTap: Send + Sync {
    fn event(&self, event: TapEvent<'_>);
}

impl<F: Fn(TapEvent<'_>) + Send + Sync> UsageTap for F {
    fn event(&self, event: TapEvent<'_>) {
        self(event)
    }
}

/// An upstream body that reports to the tap.
pub(crate) struct TappedBody {
    inner: reqwest::Body,
    tap: Option<Arc<dyn UsageTap>>,
    exchange: u64,
    route: Arc<str>,
    ended: bool,
    /// Ready when the route's credential is withdrawn: the body is cut there.
    cut: Option<Cut>,
    /// The exchange's recording, handed to the recorder when the body ends (boxed: most
    /// exchanges of a proxy that records nothing carry none).
    record: Option<Box<Pending>>,
}

/// Resolves when a withdrawal signal turns `true`.
pub(crate) type Cut = Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The future that resolves when `rx` says the credential was withdrawn (never, if its sender
/// is gone without saying so).
pub(crate) fn cut_when(mut rx: tokio::sync::watch::Receiver<bool>) -> Cut {
    Box::pin(async move {
        if rx.wait_for(|w| *w).await.is_err() {
            std::future::pending::<()>().await;
        }
    })
}

/// What the server's body fails with: the upstream's error, or a cut.
pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;

impl TappedBody {
    pub fn new(
        inner: reqwest::Body,
        tap: Option<Arc<dyn UsageTap>>,
        exchange: u64,
        route: Arc<str>,
        status: u16,
        cut: Option<Cut>,
        record: Option<Pending>,
    ) -> Self {
        if let Some(t) = &tap {
            t.event(TapEvent::Response {
                exchange,
                route: &route,
                status,
            });
        }
        Self {
            inner,
            tap,
            exchange,
            route,
            ended: false,
            cut,
            record: record.map(Box::new),
        }
    }

    fn end(&mut self, end: StreamEnd) {
        if self.ended {
            return;
        }
        self.ended = true;
        if let Some(t) = &self.tap {
            t.event(TapEvent::End {
                exchange: self.exchange,
                route: &self.route,
                end,
            });
        }
        if let Some(record) = self.record.take() {
            (*record).finish(end);
        }
    }
}

/// Not a `Body` of its own: [`OutBody`] is the one body the server sends, and polls this.
impl TappedBody {
    /// The next frame from upstream; each data chunk is shown to the tap on its way through.
    fn poll_tapped(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(cut) = &mut self.cut {
            if cut.as_mut().poll(cx).is_ready() {
                self.cut = None;
                self.end(StreamEnd::Withdrawn);
                let why = format!("the credential for route `{}` was withdrawn", self.route);
                return Poll::Ready(Some(Err(why.into())));
            }
        }
        let polled = Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map(|o| o.map(|r| r.map_err(BodyError::from)));
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(t), Some(bytes)) = (&self.tap, frame.data_ref()) {
                    t.event(TapEvent::Chunk {
                        exchange: self.exchange,
                        route: &self.route,
                        bytes,
                    });
                }
                if let (Some(r), Some(bytes)) = (&mut self.record, frame.data_ref()) {
                    r.chunk(bytes);
                }
            }
            Poll::Ready(Some(Err(_))) => self.end(StreamEnd::UpstreamError),
            Poll::Ready(None) => self.end(StreamEnd::Complete),
            Poll::Pending => {}
        }
        polled
    }
}

impl Drop for TappedBody {
    fn drop(&mut self) {
        if !self.ended && self.inner.is_end_stream() {
            self.end(StreamEnd::Complete);
        }
        self.end(StreamEnd::ClientGone);
    }
}

/// What the server side sends back: the proxy's own short answers, an upstream stream, or a
/// recorded answer replayed chunk by chunk.
pub(crate) enum OutBody {
    Full(Option<Bytes>),
    Stream(TappedBody),
    Chunks(std::collections::VecDeque<Bytes>),
}

impl Body for OutBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            OutBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            OutBody::Stream(s) => s.poll_tapped(cx),
            OutBody::Chunks(c) => Poll::Ready(c.pop_front().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            OutBody::Full(b) => b.is_none(),
            OutBody::Stream(s) => s.inner.is_end_stream(),
            OutBody::Chunks(c) => c.is_empty(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            OutBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            OutBody::Full(None) => SizeHint::with_exact(0),
            OutBody::Stream(s) => s.inner.size_hint(),
            OutBody::Chunks(c) => SizeHint::with_exact(c.iter().map(|b| b.len() as u64).sum()),
        }
    }
}
