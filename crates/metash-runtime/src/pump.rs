//! Reading an agent's stdout: bounded line framing, protocol decoding, logging to the sink, and
//! the token bucket. Shared by both sandboxes: the native reader thread pumps its pipe into a
//! bounded channel; the WASM invocation feeds its guest's stdout chunks to a [`Framer`] itself.

use std::io::{BufRead, ErrorKind};
use std::sync::Arc;
use std::time::Duration;

use metash_protocol::LogKind;

use metash_protocol::AgentEvent;
use serde_json::json;

use crate::codec;
use crate::reply::Replier;
use crate::sink::EventSink;
use crate::spec::AgentSpec;
use crate::stream::TokenBucket;

/// What the reader hands the invocation.
#[derive(Debug)]
pub(crate) enum Msg {
    /// A decoded event, its line length, and how long the token bucket held it.
    Event(AgentEvent, usize, Duration),
    /// A line that is not a valid message (already logged).
    Bad,
    /// The agent closed stdout (exited, or closed it).
    Eof,
}

/// Reader settings.
pub(crate) struct PumpCfg {
    pub agent: String,
    pub sink: Arc<dyn EventSink>,
    pub max_line: usize,
    /// Where the agent is told that a message was refused (its stdin).
    pub replier: Replier,
}

impl PumpCfg {
    /// The pump of one spawn, WASM or native alike.
    pub(crate) fn new(spec: &AgentSpec, sink: &Arc<dyn EventSink>, replier: &Replier) -> Self {
        Self {
            agent: spec.id.clone(),
            sink: Arc::clone(sink),
            max_line: spec.max_line,
            replier: replier.clone(),
        }
    }
}

/// Read lines from `reader` until EOF or until `deliver` returns false. Lines longer than
/// `max_line` are discarded up to their newline and reported (never buffered whole), so host
/// memory per agent stays within `max_line` times the channel capacity.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))] // only the Linux native reader pumps a pipe
pub(crate) fn pump<R: BufRead>(
    mut reader: R,
    cfg: &PumpCfg,
    bucket: &mut TokenBucket,
    mut deliver: impl FnMut(Msg) -> bool,
) {
    let mut framer = Framer::default();
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if buf.is_empty() {
            break;
        }
        let n = buf.len();
        let go_on = framer.feed(buf, cfg, bucket, &mut deliver);
        reader.consume(n);
        if !go_on {
            return;
        }
    }
    // Best effort: the consumer may already be gone.
    let _ = deliver(Msg::Eof);
}

/// Line framing over chunks as they arrive, for a caller that reads the chunks itself (the WASM
/// invocation reads its guest's stdout on its own thread, with a timeout).
#[derive(Default)]
pub(crate) struct Framer {
    line: Vec<u8>,
    too_long: bool,
}

impl Framer {
    /// Frames `buf`: each complete line becomes one [`Msg`] for `deliver`; a partial line waits
    /// for the next chunk. Returns false as soon as `deliver` does.
    pub(crate) fn feed(
        &mut self,
        mut buf: &[u8],
        cfg: &PumpCfg,
        bucket: &mut TokenBucket,
        deliver: &mut impl FnMut(Msg) -> bool,
    ) -> bool {
        while !buf.is_empty() {
            let (take, complete) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            if !self.too_long {
                let room = cfg.max_line.saturating_sub(self.line.len());
                if take > room + usize::from(complete) {
                    self.too_long = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(&buf[..take]);
                }
            }
            buf = &buf[take..];
            if complete {
                if let Some(msg) = self.finish_line(cfg, bucket) {
                    if !deliver(msg) {
                        return false;
                    }
                }
            }
        }
        true
    }

    /// A line's newline arrived: what it says, if anything (blank lines say nothing).
    fn finish_line(&mut self, cfg: &PumpCfg, bucket: &mut TokenBucket) -> Option<Msg> {
        if std::mem::take(&mut self.too_long) {
            let msg = format!("line longer than {} bytes discarded", cfg.max_line);
            cfg.sink.record(
                LogKind::LimitExceeded,
                Some(&cfg.agent),
                json!({"limit": "line_bytes", "max": cfg.max_line, "message": msg}),
            );
            return Some(Msg::Bad);
        }
        let len = self.line.len();
        let text = self.line.strip_suffix(b"\n").unwrap_or(&self.line);
        let msg = if text.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            Some(decode_line(cfg, bucket, text, len))
        };
        self.line.clear();
        msg
    }
}

/// One complete line: an event (logged once, paced by the token bucket), a host-only event
/// (refused), or a protocol error (logged).
fn decode_line(cfg: &PumpCfg, bucket: &mut TokenBucket, text: &[u8], len: usize) -> Msg {
    match codec::decode(text) {
        Ok(event) if event.is_host_only() => {
            reject_host_only(cfg, &event);
            Msg::Bad
        }
        Ok(event) => {
            let waited = bucket.take();
            cfg.sink.record(
                LogKind::AgentEvent,
                Some(&cfg.agent),
                serde_json::to_value(&event).unwrap_or_default(),
            );
            Msg::Event(event, len, waited)
        }
        Err(e) => {
            cfg.sink.record(
                LogKind::ProtocolError,
                Some(&cfg.agent),
                json!({"code": e.code(), "message": e.to_string()}),
            );
            Msg::Bad
        }
    }
}

/// An agent spoke for the host (`consent_grant`, `consent_revoke`, `input`, `start`,
/// `shutdown`). The event goes no further: the log records a `protocol_violation` under the
/// agent's id (with what it sent, for the audit trail, but never under the kind it claimed), and
/// the agent gets an `error` saying why.
fn reject_host_only(cfg: &PumpCfg, event: &AgentEvent) {
    let ty = event.type_name();
    let message = format!("`{ty}` is an event only the host sends; an agent may not emit it");
    cfg.sink.record(
        LogKind::ProtocolViolation,
        Some(&cfg.agent),
        json!({"code": HOST_ONLY, "type": ty, "message": message,
               "event": serde_json::to_value(event).unwrap_or_default()}),
    );
    cfg.replier.send(AgentEvent::Error {
        code: HOST_ONLY.into(),
        message,
        hint: Some(
            "ask for a capability with a `consent_request` event; only the host grants or revokes"
                .into(),
        ),
    });
}

/// The error code of [`reject_host_only`].
pub const HOST_ONLY: &str = "host_only_event";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::io::{BufReader, Cursor, Read};

    use super::*;
    use crate::sink::MemorySink;
    use crate::stream::Throttle;

    /// `left` bytes of one line with no newline, produced as they are read (the test never holds
    /// them), then `tail`.
    struct Endless {
        left: u64,
        tail: Cursor<Vec<u8>>,
    }

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.left == 0 {
                return self.tail.read(buf);
            }
            let n = usize::try_from(self.left)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            buf[..n].fill(b'x');
            self.left -= n as u64;
            Ok(n)
        }
    }

    #[test]
    fn a_100_mib_line_is_discarded_and_reported_and_the_next_line_still_arrives() {
        let sink = Arc::new(MemorySink::new());
        let cfg = PumpCfg {
            agent: "a".into(),
            sink: sink.clone(),
            max_line: 256 * 1024,
            replier: Replier::default(),
        };
        let after = AgentEvent::Output {
            agent_id: "a".into(),
            chunk_id: "1".into(),
            content_type: "text/plain".into(),
            data: "after".into(),
        };
        let mut tail = b"\n".to_vec();
        tail.extend(crate::codec::encode(after).unwrap());
        let reader = BufReader::new(Endless {
            left: 100 << 20,
            tail: Cursor::new(tail),
        });
        let mut got = Vec::new();
        pump(
            reader,
            &cfg,
            &mut TokenBucket::new(Throttle::default()),
            |m| {
                got.push(m);
                true
            },
        );
        assert!(matches!(got[0], Msg::Bad), "{got:?}");
        assert!(
            matches!(&got[1], Msg::Event(AgentEvent::Output { data, .. }, _, _) if data == "after"),
            "{got:?}"
        );
        assert!(matches!(got[2], Msg::Eof), "{got:?}");
        let limits = sink.events();
        let limits: Vec<_> = limits
            .iter()
            .filter(|r| r.kind == LogKind::LimitExceeded)
            .collect();
        assert_eq!(limits.len(), 1);
        assert_eq!(limits[0].data["max"], 256 * 1024);
    }
}
