//! The live stream: one Server-Sent Events response per page, following the project's event log
//! from another process. Each record is one event whose id is its `seq`, so a browser that
//! reconnects (it sends `Last-Event-ID`) resumes exactly after the last record it got: nothing
//! missed, nothing twice. What leaves is redacted like every other output (seed 002 §9).
//!
//! A stream ends after [`UiOptions::stream_seconds`](crate::UiOptions) (ten minutes unless set),
//! and the browser reconnects at once (`retry`) with its `Last-Event-ID`: a forgotten or stuck
//! connection is renewed, and the resume path is the everyday one, not a rare one.
//!
//! The log is read from a byte offset in batches of at most [`BATCH`] records, and the next batch
//! is read only when the connection has taken the previous one, so a flooding agent costs the
//! server one batch of memory per page, whatever the browser's speed.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use metash_policy::Redactor;
use metash_protocol::LogRecord;
use metash_store::Store;
use serde_json::json;

/// Records read (and held) at once per connection.
pub const BATCH: usize = 256;

/// How often the log is looked at when nothing is new.
const POLL: Duration = Duration::from_millis(20);

/// Where one connection is in the log.
struct Cursor {
    store: Store,
    redactor: Arc<Redactor>,
    offset: u64,
    /// The last seq sent (or the client's `Last-Event-ID`).
    sent: u64,
    pending: std::collections::VecDeque<LogRecord>,
    /// When this response ends (the browser reconnects).
    until: tokio::time::Instant,
    /// Whether the reconnect delay was sent.
    told_retry: bool,
}

impl Cursor {
    /// The next batch after `sent`: reads on from the offset, from the start again when the log
    /// was cut back.
    async fn fill(&mut self) {
        while tokio::time::Instant::now() < self.until {
            let (store, offset) = (self.store.clone(), self.offset);
            let read =
                tokio::task::spawn_blocking(move || store.log().read_from(offset, BATCH)).await;
            match read {
                Ok(Ok((recs, next))) => {
                    self.offset = next;
                    let sent = self.sent;
                    self.pending
                        .extend(recs.into_iter().filter(|r| r.seq > sent));
                    if !self.pending.is_empty() {
                        return;
                    }
                    if next == offset {
                        tokio::time::sleep(POLL).await;
                    }
                }
                Ok(Err(_)) | Err(_) => {
                    self.offset = 0;
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }

    fn event(&mut self, rec: &LogRecord) -> Event {
        let r = self.redactor.redact_record(rec);
        let data =
            json!({"seq": r.seq, "ts": r.ts, "kind": r.kind, "agent": r.agent, "data": r.data});
        let ev = Event::default()
            .id(r.seq.to_string())
            .data(data.to_string());
        if std::mem::replace(&mut self.told_retry, true) {
            ev
        } else {
            ev.retry(RETRY)
        }
    }
}

/// How soon the browser reconnects after a stream ends.
const RETRY: Duration = Duration::from_millis(250);

/// The stream for one page, starting after `after` (its `Last-Event-ID`, or 0), for at most
/// `lasts`.
pub fn stream(
    store: Store,
    redactor: Arc<Redactor>,
    after: u64,
    lasts: Duration,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let cursor = Cursor {
        store,
        redactor,
        offset: 0,
        sent: after,
        pending: std::collections::VecDeque::new(),
        until: tokio::time::Instant::now() + lasts,
        told_retry: false,
    };
    let events = futures_util::stream::unfold(cursor, |mut c| async move {
        if c.pending.is_empty() {
            c.fill().await;
        }
        let rec = c.pending.pop_front()?;
        c.sent = rec.seq;
        let ev = c.event(&rec);
        Some((Ok(ev), c))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
