//! Recording (issue 36): every exchange the proxy forwards can be handed, once it ends, to a
//! [`Recorder`] the host supplies: the request (method, target, headers, body) and the response
//! (status, headers, the body as received, each chunk's arrival offset). The host stores it as a
//! tape for `metash tape show` and, later, replay.
//!
//! Nothing recorded holds a credential. The request's headers are taken after the agent's auth
//! was dropped and before the real credential is added; cookie and auth headers are dropped both
//! ways; and every byte recorded (headers and bodies, both directions) has each occurrence of the
//! secrets the proxy knows (the grant's credential and its extra header values, plus the strings
//! the host names in [`super::ProxyConfig::redact`], such as the agent's placeholder) overwritten
//! with `*` of the same length. Same length: a streamed body's chunk offsets stay true, and a
//! secret split across two chunks is still found, because the body is masked whole.

use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http_body::{Body, Frame, SizeHint};
use zeroize::Zeroizing;

use super::secret::Grant;
use super::stream_end::StreamEnd;

/// Bodies are recorded up to this many bytes each way; the rest is forwarded, not recorded
/// (the exchange says `*_truncated`).
pub const MAX_RECORDED_BODY: usize = 64 << 20;

/// Headers never recorded, whichever direction: auth and cookies.
const NEVER_RECORDED: [HeaderName; 6] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    header::SET_COOKIE,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
];

/// What the mask writes over a secret.
const MASK: u8 = b'*';

/// Receives each exchange once it ended (the body complete, cut or abandoned), masked. Called
/// on the proxy's recording thread, one exchange at a time in the order they ended, never on the
/// thread that serves the agent; a slow recorder delays other recordings, not the exchanges.
pub trait Recorder: Send + Sync {
    fn exchange(&self, exchange: Exchange);
}

impl<F: Fn(Exchange) + Send + Sync> Recorder for F {
    fn exchange(&self, exchange: Exchange) {
        self(exchange)
    }
}

/// One body chunk as it arrived from the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Milliseconds from the request's arrival at the proxy.
    pub offset_ms: u64,
    pub len: usize,
}

/// One forwarded exchange, redacted.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// The proxy's exchange counter (in arrival order of response heads).
    pub exchange: u64,
    pub route: String,
    pub method: String,
    /// The request target as the agent sent it (path and query).
    pub target: String,
    /// When the request reached the proxy.
    pub started: SystemTime,
    /// Lowercase names, in order; hop-by-hop, auth and cookie headers left out.
    pub request_headers: Vec<(String, String)>,
    pub request_body: Vec<u8>,
    pub request_truncated: bool,
    pub status: u16,
    pub response_headers: Vec<(String, String)>,
    /// Milliseconds from the request's arrival to the upstream's response head.
    pub head_ms: u64,
    /// The response body's chunks in arrival order; their lengths add up to the body's.
    pub chunks: Vec<Chunk>,
    pub response_body: Vec<u8>,
    pub response_truncated: bool,
    pub end: StreamEnd,
    /// Milliseconds from the request's arrival to the body's end.
    pub duration_ms: u64,
}

/// The byte strings masked in everything recorded. Zeroed when dropped, like the secret.
#[derive(Default)]
pub(crate) struct Redactor {
    needles: Vec<Zeroizing<Vec<u8>>>,
}

impl Redactor {
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Self {
        let mut needles: Vec<Zeroizing<Vec<u8>>> = secrets
            .into_iter()
            .filter(|s| !s.is_empty())
            .map(|s| Zeroizing::new(s.as_bytes().to_vec()))
            .collect();
        // Longest first: a secret that contains another is masked whole.
        needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
        Self { needles }
    }

    /// Overwrites every occurrence of every secret in `bytes` with `*`.
    pub fn mask(&self, bytes: &mut [u8]) {
        for needle in &self.needles {
            // Every occurrence, overlapping ones too, found before any is masked.
            let finder = memchr::memmem::Finder::new(&needle[..]);
            let mut hits = Vec::new();
            let mut from = 0;
            while let Some(i) = finder.find(&bytes[from..]) {
                hits.push(from + i);
                from += i + 1;
            }
            for i in hits {
                bytes[i..i + needle.len()].fill(MASK);
            }
        }
    }

    fn headers(&self, headers: &HeaderMap, also_drop: &[HeaderName]) -> Vec<(String, String)> {
        headers
            .iter()
            .filter(|(name, _)| !NEVER_RECORDED.contains(name) && !also_drop.contains(name))
            .map(|(name, value)| {
                let mut v = value.as_bytes().to_vec();
                self.mask(&mut v);
                (
                    name.as_str().to_string(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect()
    }
}

/// A body being recorded, shared by the tee and the exchange: copied as it streams (holding
/// on to the connection's own buffers would make it allocate new ones for every read), up to
/// [`MAX_RECORDED_BODY`] bytes.
#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    truncated: bool,
}

impl Buffer {
    fn push(&mut self, chunk: &[u8]) {
        let room = MAX_RECORDED_BODY.saturating_sub(self.bytes.len());
        if chunk.len() > room {
            self.truncated = true;
        }
        self.bytes
            .extend_from_slice(&chunk[..chunk.len().min(room)]);
    }

    fn into_vec(self) -> Vec<u8> {
        self.bytes
    }
}

/// Where finished exchanges go: a thread of the proxy's own that masks them and calls the host's
/// recorder, so that neither the masking nor the recorder delays the last chunk on its way to
/// the agent. The proxy joins it when it stops, after every exchange ended: a stopped proxy has
/// delivered everything it recorded.
#[derive(Clone)]
pub(crate) struct Delivery(mpsc::Sender<Finished>);

/// Starts the delivery thread for `recorder`.
///
/// # Errors
/// The thread cannot be started.
pub(crate) fn deliver_to(
    recorder: Arc<dyn Recorder>,
) -> std::io::Result<(Delivery, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel::<Finished>();
    let thread = std::thread::Builder::new()
        .name("metash-proxy-recorder".into())
        .spawn(move || {
            // Ends when every sender (the proxy's shared state, each exchange) is gone.
            for finished in rx {
                recorder.exchange(finished.complete());
            }
        })?;
    Ok((Delivery(tx), thread))
}

/// An exchange whose body ended, not yet masked.
pub(crate) struct Finished {
    exchange: Exchange,
    request: Buffer,
    response: Buffer,
    redactor: Redactor,
}

impl Finished {
    /// The bodies joined and every secret masked.
    fn complete(self) -> Exchange {
        let mut ex = self.exchange;
        ex.request_truncated = self.request.truncated;
        ex.request_body = self.request.into_vec();
        self.redactor.mask(&mut ex.request_body);
        ex.response_truncated = self.response.truncated;
        ex.response_body = self.response.into_vec();
        self.redactor.mask(&mut ex.response_body);
        ex
    }
}

/// An exchange being recorded: made when the request is admitted, fed the response as it
/// streams, delivered when the body ends.
pub(crate) struct Pending {
    delivery: Delivery,
    redactor: Redactor,
    at: Instant,
    exchange: Exchange,
    request_body: Arc<Mutex<Buffer>>,
    response_body: Buffer,
}

impl Pending {
    /// Starts a recording of a request with `headers` (the agent's, its auth already dropped,
    /// the credential not yet added). `drop_headers`: the route's credential header and the
    /// grant's extra headers. `secrets`: every value to mask.
    fn start<'a>(
        delivery: Delivery,
        route: &str,
        request: (&http::Method, &http::Uri),
        headers: &HeaderMap,
        drop_headers: &[HeaderName],
        secrets: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let redactor = Redactor::new(secrets);
        let mut target = request.1.to_string().into_bytes();
        redactor.mask(&mut target);
        let mut exchange = empty_exchange();
        exchange.route = route.to_string();
        exchange.method = request.0.as_str().to_string();
        exchange.target = String::from_utf8_lossy(&target).into_owned();
        exchange.started = SystemTime::now();
        exchange.request_headers = redactor.headers(headers, drop_headers);
        Self {
            delivery,
            redactor,
            at: Instant::now(),
            exchange,
            request_body: Arc::default(),
            response_body: Buffer::default(),
        }
    }

    /// A recording of `request` (method, target) with `headers` (the agent's, its auth already
    /// dropped, the credential not yet added), or `None` when the host records nothing. Masks
    /// the grant's secret, its extra header values and `redact`; leaves out the route's
    /// credential header (`route.1`) and the grant's header names.
    pub fn begin(
        delivery: Option<&Delivery>,
        redact: &[String],
        route: (&str, &HeaderName),
        grant: &Grant,
        request: (&http::Method, &http::Uri),
        headers: &HeaderMap,
    ) -> Option<Self> {
        let delivery = delivery?.clone();
        let mut drop_headers = vec![route.1.clone()];
        drop_headers.extend(
            grant
                .headers
                .iter()
                .filter_map(|(n, _)| HeaderName::try_from(n.as_str()).ok()),
        );
        let secrets = std::iter::once(grant.secret.expose())
            .chain(grant.headers.iter().map(|(_, v)| v.expose()))
            .chain(redact.iter().map(String::as_str));
        Some(Self::start(
            delivery,
            route.0,
            request,
            headers,
            &drop_headers,
            secrets,
        ))
    }

    /// What the upstream is sent: `body` as it comes, copied for `record` when there is one.
    pub fn body<B>(record: Option<&Self>, body: B) -> reqwest::Body
    where
        B: Body<Data = Bytes> + Unpin + Send + Sync + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        match record {
            Some(r) => reqwest::Body::wrap(TeeBody {
                inner: body,
                buffer: Arc::clone(&r.request_body),
            }),
            None => reqwest::Body::wrap(body),
        }
    }

    /// The upstream's response head.
    pub fn head(&mut self, exchange: u64, status: u16, headers: &HeaderMap) {
        self.exchange.exchange = exchange;
        self.exchange.status = status;
        self.exchange.response_headers = self.redactor.headers(headers, &[]);
        self.exchange.head_ms = self.elapsed_ms();
    }

    /// A response chunk on its way to the agent.
    pub fn chunk(&mut self, bytes: &Bytes) {
        let offset_ms = self.elapsed_ms();
        self.exchange.chunks.push(Chunk {
            offset_ms,
            len: bytes.len(),
        });
        self.response_body.push(bytes);
    }

    /// The body ended: hands the exchange to the delivery thread (which masks it).
    pub fn finish(mut self, end: StreamEnd) {
        let mut exchange = std::mem::replace(&mut self.exchange, empty_exchange());
        exchange.end = end;
        exchange.duration_ms = self.elapsed_ms();
        let request = std::mem::take(
            &mut *self
                .request_body
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let finished = Finished {
            exchange,
            request,
            response: std::mem::take(&mut self.response_body),
            redactor: std::mem::take(&mut self.redactor),
        };
        // Fails only once the delivery thread is gone, which it never is while senders live.
        let _ = self.delivery.0.send(finished);
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.at.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

fn empty_exchange() -> Exchange {
    Exchange {
        exchange: 0,
        route: String::new(),
        method: String::new(),
        target: String::new(),
        started: SystemTime::UNIX_EPOCH,
        request_headers: Vec::new(),
        request_body: Vec::new(),
        request_truncated: false,
        status: 0,
        response_headers: Vec::new(),
        head_ms: 0,
        chunks: Vec::new(),
        response_body: Vec::new(),
        response_truncated: false,
        end: StreamEnd::Complete,
        duration_ms: 0,
    }
}

/// A request body that copies each data frame into the recording as it passes.
pub(crate) struct TeeBody<B> {
    inner: B,
    buffer: Arc<Mutex<Buffer>>,
}

impl<B> Body for TeeBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                this.buffer
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(data);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_every_secret_same_length_longest_first() {
        let r = Redactor::new(["sk-abc", "sk-abcdef", ""]);
        let mut b = b"x sk-abcdef y sk-abc zsk-ab".to_vec();
        r.mask(&mut b);
        assert_eq!(b, b"x ********* y ****** zsk-ab".to_vec());
    }

    #[test]
    fn auth_and_cookie_headers_are_dropped_and_values_masked() {
        let r = Redactor::new(["s3cret"]);
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer s3cret"),
            ("x-api-key", "s3cret"),
            ("cookie", "a=b"),
            ("set-cookie", "a=b"),
            ("x-echo", "has s3cret inside"),
            ("content-type", "application/json"),
        ] {
            h.append(k, http::HeaderValue::from_static(v));
        }
        let out = r.headers(&h, &[HeaderName::from_static("content-type")]);
        assert_eq!(
            out,
            vec![("x-echo".to_string(), "has ****** inside".to_string())]
        );
    }

    #[test]
    fn a_body_is_recorded_up_to_the_cap() {
        let mut b = Buffer::default();
        b.push(&vec![1u8; MAX_RECORDED_BODY - 1]);
        b.push(&[2, 3]);
        b.push(&[4]);
        assert!(b.truncated);
        let v = b.into_vec();
        assert_eq!(v.len(), MAX_RECORDED_BODY);
        assert_eq!(v[MAX_RECORDED_BODY - 1], 2);
    }

    #[test]
    fn overlapping_occurrences_are_all_masked() {
        let r = Redactor::new(["abab"]);
        let mut b = b"xabababx".to_vec();
        r.mask(&mut b);
        assert_eq!(b, b"x******x".to_vec());
    }
}
