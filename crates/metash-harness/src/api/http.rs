//! The HTTP side every API client shares: one POST that streams SSE, retried with backoff on 429
//! and 5xx (honouring `retry-after` / `retry-after-ms`), bounded by a total deadline and an idle
//! timeout between chunks, cancellable, with provider error bodies turned into their message.

use std::time::Duration;

use reqwest::header::HeaderMap;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::sse::{SseEvent, SseParser};
use crate::error::{HarnessError, Result};

/// Retries of a request that failed before any of its stream was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(60),
        }
    }
}

/// What an event handler tells the stream loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    /// The provider's terminal event arrived: the response is complete.
    Done,
}

pub(crate) struct StreamLimits<'a> {
    pub deadline: Option<Instant>,
    pub idle: Duration,
    pub cancel: &'a CancellationToken,
    pub retry: RetryPolicy,
}

/// POSTs `body` to `url` and feeds the SSE events to `on_event` until it returns `Done`.
///
/// # Errors
/// `Api` with the provider's status and message (after retries for 429/5xx), or for a stream
/// that ends before the terminal event; `Timeout`; `Cancelled`.
pub(crate) async fn post_sse(
    client: &reqwest::Client,
    url: &str,
    headers: HeaderMap,
    body: &serde_json::Value,
    limits: &StreamLimits<'_>,
    on_retry: &mut (dyn FnMut(u32, Duration, Option<u16>) + Send),
    on_event: &mut (dyn FnMut(SseEvent) -> Result<Flow> + Send),
) -> Result<()> {
    let bytes =
        serde_json::to_vec(body).map_err(|e| HarnessError::InvalidRequest(e.to_string()))?;
    let resp = send_with_retries(client, url, &headers, &bytes, limits, on_retry).await?;
    read_events(resp, limits, on_event).await
}

/// POSTs until a success status, retrying 429, 5xx and transport errors with backoff (or the
/// server's `retry-after`) while attempts and the deadline allow.
async fn send_with_retries(
    client: &reqwest::Client,
    url: &str,
    headers: &HeaderMap,
    bytes: &[u8],
    limits: &StreamLimits<'_>,
    on_retry: &mut (dyn FnMut(u32, Duration, Option<u16>) + Send),
) -> Result<reqwest::Response> {
    let mut attempt = 0u32;
    loop {
        let send = client
            .post(url)
            .headers(headers.clone())
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(bytes.to_vec())
            .send();
        let result = guard(limits, send).await?;
        let (status, retry_after, err) = match result {
            Ok(r) if r.status().is_success() => return Ok(r),
            Ok(r) => {
                let status = r.status().as_u16();
                let retry_after = retry_after(r.headers());
                let text = guard(limits, r.text()).await?.unwrap_or_default();
                (Some(status), retry_after, error_message(status, &text))
            }
            Err(e) => (None, None, format!("request failed: {e}")),
        };
        let retryable = status.is_none_or(|s| s == 429 || s >= 500);
        let give_up = HarnessError::Api {
            status,
            message: err,
        };
        if !retryable || attempt >= limits.retry.max_retries {
            return Err(give_up);
        }
        let backoff = limits.retry.base_delay.saturating_mul(1 << attempt.min(16));
        let delay = retry_after.unwrap_or(backoff).min(limits.retry.max_delay);
        if limits.deadline.is_some_and(|d| Instant::now() + delay > d) {
            return Err(give_up);
        }
        attempt += 1;
        on_retry(attempt, delay, status);
        guard(limits, tokio::time::sleep(delay)).await?;
    }
}

/// Feeds the body's SSE events to `on_event` until it returns `Done`, within the idle bound,
/// the deadline and cancellation. A body that ends first is a cut connection.
async fn read_events(
    mut resp: reqwest::Response,
    limits: &StreamLimits<'_>,
    on_event: &mut (dyn FnMut(SseEvent) -> Result<Flow> + Send),
) -> Result<()> {
    let mut parser = SseParser::new();
    let mut done = false;
    let mut failure: Option<HarnessError> = None;
    while !done {
        let idle_deadline = Instant::now() + limits.idle;
        let chunk = tokio::select! {
            c = resp.chunk() => c,
            () = tokio::time::sleep_until(idle_deadline) => {
                return Err(HarnessError::Timeout(format!("no data from the provider for {:?}", limits.idle)));
            }
            () = sleep_opt(limits.deadline) => return Err(HarnessError::Timeout("the request ran past its deadline".into())),
            () = limits.cancel.cancelled() => return Err(HarnessError::Cancelled),
        };
        let chunk = match chunk {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => {
                return Err(HarnessError::Api {
                    status: None,
                    message: format!("the stream broke: {e}"),
                })
            }
        };
        parser.feed(&chunk, &mut |ev| {
            if done || failure.is_some() {
                return;
            }
            match on_event(ev) {
                Ok(Flow::Done) => done = true,
                Ok(Flow::Continue) => {}
                Err(e) => failure = Some(e),
            }
        });
        if let Some(e) = failure.take() {
            return Err(e);
        }
    }
    if !done {
        return Err(HarnessError::Api {
            status: None,
            message: "the stream ended before the response completed (connection cut)".into(),
        });
    }
    Ok(())
}

async fn sleep_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Races a future against the deadline and the cancellation token.
async fn guard<F: std::future::Future>(limits: &StreamLimits<'_>, f: F) -> Result<F::Output> {
    tokio::select! {
        v = f => Ok(v),
        () = sleep_opt(limits.deadline) => Err(HarnessError::Timeout("the request ran past its deadline".into())),
        () = limits.cancel.cancelled() => Err(HarnessError::Cancelled),
    }
}

/// `retry-after-ms` (OpenAI) or `retry-after` in seconds; HTTP dates fall back to backoff, and
/// so does anything that is not a finite number (`NaN`, `inf`: the server is not trusted to send
/// a sane one). A negative wait is no wait; the caller caps the wait at its `max_delay`.
fn retry_after(h: &HeaderMap) -> Option<Duration> {
    let get = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).map(str::trim);
    let seconds = |v: &str| v.parse::<f64>().ok().filter(|s| s.is_finite());
    let wait = |s: f64| Duration::from_secs_f64(s.clamp(0.0, 3600.0));
    if let Some(ms) = get("retry-after-ms").and_then(seconds) {
        return Some(wait(ms / 1000.0));
    }
    get("retry-after").and_then(seconds).map(wait)
}

/// The provider's own message: Anthropic `{"type":"error","error":{"type","message"}}`, OpenAI
/// `{"error":{"message","type","code"}}`, else the body itself (bounded).
pub(crate) fn error_message(status: u16, body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let msg = parsed.as_ref().and_then(|v| {
        let e = v.get("error").unwrap_or(v);
        let m = e.get("message").and_then(|m| m.as_str())?;
        let kind = e.get("type").and_then(|t| t.as_str());
        Some(match kind {
            Some(k) => format!("{k}: {m}"),
            None => m.to_string(),
        })
    });
    let msg = msg.unwrap_or_else(|| body.chars().take(500).collect());
    format!("HTTP {status}: {msg}")
}

#[cfg(test)]
mod retry_after_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn with(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, value.parse().unwrap());
        h
    }

    #[test]
    fn hostile_retry_after_values_fall_back_instead_of_panicking() {
        for v in ["NaN", "nan", "inf", "-inf", "1e400", "soon"] {
            assert_eq!(retry_after(&with("retry-after", v)), None, "{v}");
            assert_eq!(retry_after(&with("retry-after-ms", v)), None, "{v}");
        }
        assert_eq!(
            retry_after(&with("retry-after", "-5")),
            Some(Duration::ZERO)
        );
        assert_eq!(
            retry_after(&with("retry-after", "1e300")),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(
            retry_after(&with("retry-after-ms", "250")),
            Some(Duration::from_millis(250))
        );
    }
}
