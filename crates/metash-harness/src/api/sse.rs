//! An incremental Server-Sent Events parser (the WHATWG event-stream format): bytes in, whole
//! events out, whatever the chunking. Handles `\n`, `\r\n` and `\r` line ends, comments, multi-line
//! `data`, `event`, `id` and `retry` fields. It scans with slice searches and copies each data line
//! once, so parsing keeps up with any network (the bench measures it).

/// One dispatched event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty means the default type `message`.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    pub id: Option<String>,
    pub retry_ms: Option<u64>,
}

#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    /// Where unparsed bytes start in `buf`.
    pos: usize,
    /// A `\r` ended the last chunk: a `\n` starting the next one belongs to it.
    skip_lf: bool,
    cur: SseEvent,
    has_data: bool,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; calls `on_event` for each event completed by them.
    pub fn feed(&mut self, chunk: &[u8], on_event: &mut dyn FnMut(SseEvent)) {
        let mut chunk = chunk;
        if self.skip_lf && !chunk.is_empty() {
            // Only the first byte after the `\r` can be its `\n`; an empty chunk changes nothing.
            self.skip_lf = false;
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
            }
        }
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        // Fast path: nothing buffered, parse straight from the chunk.
        if self.buf.is_empty() {
            let used = self.parse_lines(chunk, on_event);
            self.buf.extend_from_slice(&chunk[used..]);
            return;
        }
        self.buf.extend_from_slice(chunk);
        let buf = std::mem::take(&mut self.buf);
        let used = self.parse_lines(&buf[self.pos..], on_event);
        self.buf = buf;
        self.pos += used;
        if self.pos > 64 * 1024 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }

    /// Parses complete lines of `bytes`; returns how many bytes were consumed.
    fn parse_lines(&mut self, bytes: &[u8], on_event: &mut dyn FnMut(SseEvent)) -> usize {
        let mut start = 0;
        while start < bytes.len() {
            let rest = &bytes[start..];
            let Some(end) = rest.iter().position(|&b| b == b'\n' || b == b'\r') else {
                break;
            };
            let line = &rest[..end];
            let mut next = start + end + 1;
            if rest[end] == b'\r' {
                match rest.get(end + 1) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            self.line(line, on_event);
            start = next;
        }
        start
    }

    fn line(&mut self, line: &[u8], on_event: &mut dyn FnMut(SseEvent)) {
        if line.is_empty() {
            self.dispatch(on_event);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.cur.data.push('\n');
                }
                self.cur.data.push_str(&String::from_utf8_lossy(value));
                self.has_data = true;
            }
            b"event" => self.cur.event = String::from_utf8_lossy(value).into_owned(),
            b"id" => self.cur.id = Some(String::from_utf8_lossy(value).into_owned()),
            b"retry" => {
                self.cur.retry_ms = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, on_event: &mut dyn FnMut(SseEvent)) {
        if self.has_data {
            on_event(std::mem::take(&mut self.cur));
        } else {
            self.cur = SseEvent::default();
        }
        self.has_data = false;
    }

    /// True when a partial line or event is pending (a stream that ends here was cut).
    pub fn has_pending(&self) -> bool {
        self.pos < self.buf.len() || self.has_data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_chunks(input: &[u8], size: usize) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in input.chunks(size) {
            p.feed(c, &mut |e| out.push(e));
        }
        out
    }

    #[test]
    fn any_chunking_gives_the_same_events() {
        let input = b": comment\r\nevent: message_start\r\ndata: {\"a\":1}\r\n\r\nevent: delta\ndata: x\ndata: y\n\ndata:z\rid: 7\rretry: 10\r\r";
        let whole = parse_in_chunks(input, input.len());
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[0].event, "message_start");
        assert_eq!(whole[0].data, "{\"a\":1}");
        assert_eq!(whole[1].data, "x\ny");
        assert_eq!(whole[2].data, "z");
        assert_eq!(whole[2].id.as_deref(), Some("7"));
        assert_eq!(whole[2].retry_ms, Some(10));
        for size in 1..input.len() {
            assert_eq!(parse_in_chunks(input, size), whole, "chunk size {size}");
        }
    }

    /// Found by the property test in CI: a `\r` ending one chunk, its `\n` alone in the next, then a
    /// blank line. The `\n` was taken as the `\r`'s and the flag stayed set, so the blank line's
    /// `\n` was swallowed too and the event never dispatched.
    #[test]
    fn a_crlf_cut_between_its_two_bytes_ends_one_line_only() {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for chunk in [&b"data: x\r"[..], b"\n", b"", b"\ndata: y\n\n"] {
            p.feed(chunk, &mut |e| out.push(e));
        }
        let data: Vec<&str> = out.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(data, ["x", "y"]);
    }

    #[test]
    fn an_event_without_data_is_not_dispatched_and_a_cut_is_visible() {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.feed(b"event: ping\n\ndata: partial", &mut |e| out.push(e));
        assert!(out.is_empty());
        assert!(p.has_pending());
    }
}
