//! Replay (issue 36, its first step): with a [`Cassette`] in its config, the proxy answers each
//! request from a recorded turn instead of the upstream, in order, and never asks for a
//! credential nor opens a connection. A request must equal the next recorded one (method, target
//! and body, after the same masking the recording had, and with the recorded CLI's run-varying
//! fields masked on both sides: [`Volatile`], normalize.rs); the first that differs is answered with
//! an error (400, so the agent stops instead of retrying), kept as the cassette's
//! [`Divergence`] with both requests, and every request after it is refused the same way.
//!
//! `metash replay` (crates/metash/src/cmd/replay.rs) runs a task's turn against it. Not built
//! yet: pacing the chunks at their recorded offsets; the answer is sent as fast as the agent reads.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;

use super::normalize::Volatile;
use super::record::{Exchange, Redactor, MAX_RECORDED_BODY};
use super::tap::OutBody;

/// One recorded exchange, as a replay answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub method: String,
    pub target: String,
    pub request_body: Vec<u8>,
    pub status: u16,
    pub response_headers: Vec<(String, String)>,
    /// The response body in the pieces it arrived in (their concatenation is the body).
    pub chunks: Vec<Bytes>,
}

impl Recorded {
    /// `response_body` cut at `chunk_lens` (a rest past them is one more chunk).
    pub fn new(
        request: (String, String, Vec<u8>),
        status: u16,
        response_headers: Vec<(String, String)>,
        response_body: Vec<u8>,
        chunk_lens: &[usize],
    ) -> Self {
        let body = Bytes::from(response_body);
        let mut chunks = Vec::with_capacity(chunk_lens.len());
        let mut at = 0;
        for len in chunk_lens {
            let end = (at + len).min(body.len());
            chunks.push(body.slice(at..end));
            at = end;
        }
        if at < body.len() {
            chunks.push(body.slice(at..));
        }
        let (method, target, request_body) = request;
        Self {
            method,
            target,
            request_body,
            status,
            response_headers,
            chunks,
        }
    }
}

impl From<Exchange> for Recorded {
    fn from(ex: Exchange) -> Self {
        let lens: Vec<usize> = ex.chunks.iter().map(|c| c.len).collect();
        Self::new(
            (ex.method, ex.target, ex.request_body),
            ex.status,
            ex.response_headers,
            ex.response_body,
            &lens,
        )
    }
}

/// The first request that did not match the recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// 1-based: the request's place in the turn.
    pub seq: usize,
    /// What was recorded there (`None`: the recording had ended).
    pub expected: Option<(String, String, Vec<u8>)>,
    /// What came: method, target, body (masked).
    pub got: (String, String, Vec<u8>),
    /// One line: what differs (method, target, or the body's first differing byte).
    pub reason: String,
}

#[derive(Debug, Default)]
struct Progress {
    next: usize,
    diverged: Option<Divergence>,
}

/// A recorded turn the proxy answers from, in order.
#[derive(Debug)]
pub struct Cassette {
    exchanges: Vec<Recorded>,
    progress: Mutex<Progress>,
    /// The run-varying request fields masked on both sides before bodies are compared.
    volatile: Volatile,
}

impl Cassette {
    pub fn new(exchanges: Vec<Recorded>) -> Self {
        Self {
            exchanges,
            progress: Mutex::default(),
            volatile: Volatile::None,
        }
    }

    /// This cassette, comparing request bodies with `volatile`'s fields masked on both sides
    /// (the recorded CLI's; docs/replay.md, "What a replay masks").
    pub fn with_volatile(mut self, volatile: Volatile) -> Self {
        self.volatile = volatile;
        self
    }

    /// The conversation id a replay pins in the CLI so that its requests carry the recorded one
    /// (Claude Code's `--session-id`; docs/replay.md "What a replay masks"). `None` for a CLI
    /// whose ids cannot be pinned, or a tape without one.
    pub fn pinned_session(&self) -> Option<String> {
        match self.volatile {
            Volatile::ClaudeCode => self
                .exchanges
                .iter()
                .find_map(|e| super::normalize::claude_session_id(&e.request_body)),
            Volatile::Codex | Volatile::None => None,
        }
    }

    /// Requests answered from the recording so far.
    pub fn served(&self) -> usize {
        self.lock().next
    }

    /// Whether every recorded exchange was asked for, in order, and nothing else.
    pub fn finished(&self) -> bool {
        let p = self.lock();
        p.diverged.is_none() && p.next == self.exchanges.len()
    }

    /// The first request that differed, if one did.
    pub fn divergence(&self) -> Option<Divergence> {
        self.lock().diverged.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The recorded answer to this request, or why there is none (kept as the divergence).
    fn take(
        &self,
        method: &str,
        target: &str,
        body: Vec<u8>,
    ) -> Result<&Recorded, Box<Divergence>> {
        let mut p = self.lock();
        if let Some(d) = &p.diverged {
            return Err(Box::new(d.clone()));
        }
        let seq = p.next + 1;
        let expected = self.exchanges.get(p.next);
        let reason = match expected {
            None => Some(format!(
                "the recording has {} requests; this is request {seq}",
                self.exchanges.len()
            )),
            Some(e) if e.method != method => Some(format!(
                "method {method} where the recording has {}",
                e.method
            )),
            Some(e) if e.target != target => Some(format!(
                "target {target} where the recording has {}",
                e.target
            )),
            Some(e) => self.body_difference(&e.request_body, &body),
        };
        match (reason, expected) {
            (None, Some(e)) => {
                p.next += 1;
                Ok(e)
            }
            (reason, expected) => {
                let d = Divergence {
                    seq,
                    expected: expected
                        .map(|e| (e.method.clone(), e.target.clone(), e.request_body.clone())),
                    got: (method.to_string(), target.to_string(), body),
                    reason: reason.unwrap_or_default(),
                };
                p.diverged = Some(d.clone());
                Err(Box::new(d))
            }
        }
    }
}

impl Cassette {
    /// Where the recorded and the sent body differ once the run-varying fields are masked, or
    /// `None` when they match.
    fn body_difference(&self, expected: &[u8], got: &[u8]) -> Option<String> {
        if expected == got {
            return None;
        }
        let (e, g) = (
            self.volatile.normalize(expected),
            self.volatile.normalize(got),
        );
        let d = first_difference(&e, &g)?;
        Some(match self.volatile {
            Volatile::None => d,
            _ => format!("with the run-varying fields masked, {d}"),
        })
    }
}

/// Where two bodies first differ, with a few bytes of each from there.
fn first_difference(expected: &[u8], got: &[u8]) -> Option<String> {
    if expected == got {
        return None;
    }
    let at = expected
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(expected.len().min(got.len()));
    let show = |b: &[u8]| {
        let end = (at + 40).min(b.len());
        String::from_utf8_lossy(&b[at.min(end)..end])
            .escape_debug()
            .to_string()
    };
    Some(format!(
        "the body differs at byte {at} ({} bytes recorded, {} sent): recorded \"{}\", sent \"{}\"",
        expected.len(),
        got.len(),
        show(expected),
        show(got)
    ))
}

/// Why a replayed request got no recorded answer: the status and message to answer with.
pub(crate) type Refusal = (StatusCode, String);

/// Answers `req` from the cassette: the recorded status, headers and body, or the status and
/// message naming the divergence. `redact`: what the recording masked besides the credential.
pub(crate) async fn answer<B>(
    cassette: &Cassette,
    redact: &[String],
    req: Request<B>,
) -> Result<Response<OutBody>, Refusal>
where
    B: Body<Data = Bytes> + Unpin,
{
    let redactor = Redactor::new(redact.iter().map(String::as_str));
    let (parts, mut body) = req.into_parts();
    let mut bytes = Vec::new();
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => break,
            Some(Err(_)) => {
                return Err((
                    StatusCode::BAD_REQUEST,
                    "replay: the request body broke".into(),
                ))
            }
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    bytes.extend_from_slice(d);
                }
            }
        }
        if bytes.len() > MAX_RECORDED_BODY {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                "replay: request too large".into(),
            ));
        }
    }
    redactor.mask(&mut bytes);
    let mut target = parts.uri.to_string().into_bytes();
    redactor.mask(&mut target);
    let target = String::from_utf8_lossy(&target);
    match cassette.take(parts.method.as_str(), &target, bytes) {
        Ok(rec) => Ok(recorded_response(rec)),
        Err(d) => Err((
            StatusCode::BAD_REQUEST,
            format!(
                "replay stopped at request {}: it differs from the recording: {}",
                d.seq, d.reason
            ),
        )),
    }
}

fn recorded_response(rec: &Recorded) -> Response<OutBody> {
    let mut out = Response::new(OutBody::Chunks(
        rec.chunks.iter().cloned().collect::<VecDeque<_>>(),
    ));
    *out.status_mut() = StatusCode::from_u16(rec.status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (name, value) in &rec.response_headers {
        let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::from_str(value),
        ) else {
            continue;
        };
        // The body is framed anew by the server side.
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        out.headers_mut().append(name, value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(body: &str) -> Recorded {
        Recorded {
            method: "POST".into(),
            target: "/v1/messages".into(),
            request_body: body.as_bytes().to_vec(),
            status: 200,
            response_headers: vec![],
            chunks: vec![Bytes::from_static(b"ok")],
        }
    }

    #[test]
    fn in_order_then_the_first_difference_stops_everything() {
        let c = Cassette::new(vec![rec("one"), rec("two")]);
        assert!(c.take("POST", "/v1/messages", b"one".to_vec()).is_ok());
        let d = c
            .take("POST", "/v1/messages", b"twX".to_vec())
            .expect_err("differs");
        assert_eq!(d.seq, 2);
        assert!(d.reason.contains("byte 2"), "{}", d.reason);
        // Even the right request is refused after a divergence.
        assert!(c.take("POST", "/v1/messages", b"two".to_vec()).is_err());
        assert_eq!(c.served(), 1);
        assert!(!c.finished());
    }

    #[test]
    fn past_the_end_and_other_targets_diverge() {
        let c = Cassette::new(vec![rec("one")]);
        let d = c
            .take("POST", "/v1/other", b"one".to_vec())
            .expect_err("target");
        assert!(d.reason.contains("/v1/other"));
        let c = Cassette::new(vec![]);
        let d = c.take("GET", "/", Vec::new()).expect_err("ended");
        assert_eq!(d.expected, None);
    }

    #[test]
    fn a_codex_cassette_masks_ids_but_stops_at_a_changed_prompt() {
        let body = |id: &str, text: &str| {
            format!(
                r#"{{"prompt_cache_key":"{id}","input":[{{"type":"message","id":"msg_{id}","content":"{text}"}}]}}"#
            )
        };
        let a = "01a21c33-86af-79c1-a055-0911b5f4aa6c";
        let b = "01a21c33-8fd8-7c02-85ce-41dadd86abe5";
        let c = Cassette::new(vec![rec(&body(a, "one")), rec(&body(a, "two"))])
            .with_volatile(Volatile::Codex);
        assert!(c
            .take("POST", "/v1/messages", body(b, "one").into_bytes())
            .is_ok());
        let d = c
            .take("POST", "/v1/messages", body(b, "TWO").into_bytes())
            .expect_err("the prompt changed");
        assert_eq!(d.seq, 2);
        assert!(
            d.reason.starts_with("with the run-varying fields masked"),
            "{}",
            d.reason
        );
        // Without the mask, the ids alone stop it.
        let plain = Cassette::new(vec![rec(&body(a, "one"))]);
        assert!(plain
            .take("POST", "/v1/messages", body(b, "one").into_bytes())
            .is_err());
    }
}
