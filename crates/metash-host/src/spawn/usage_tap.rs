//! A CLI's usage, read on the wire as it streams. A coding CLI reports usage in its own stream only
//! at the end of a turn (Codex) or per message (Claude Code, pi); the credential proxy sees every
//! model response as it arrives, so the host reads usage there, the same way for every CLI:
//! Anthropic's `message_start` / `message_delta`, the Responses API's `response.completed`, chat
//! completions' `usage` chunk, or a non-streamed JSON body's `usage`. The turn's running total
//! goes to the caller after every report, which stops the turn when a limit is passed.

use std::collections::HashMap;
use std::sync::Mutex;

use metash_protocol::Usage;
use metash_runtime::credential::{TapEvent, UsageTap};
use serde_json::Value;

/// A non-streamed body larger than this is not parsed for usage (no model answer is).
const MAX_JSON_BODY: usize = 4 * 1024 * 1024;

#[derive(Default)]
struct Exchange {
    /// The bytes of an SSE line not yet ended, or the whole body while it may be plain JSON.
    pending: String,
    sse: bool,
    usage: Usage,
}

/// The running usage of one turn across the CLI's requests.
pub(crate) struct WireUsage {
    state: Mutex<(HashMap<u64, Exchange>, Usage)>,
    on_total: Box<dyn Fn(&Usage) + Send + Sync>,
}

impl WireUsage {
    /// `on_total` receives the turn's cumulative usage after each report.
    pub fn new(on_total: impl Fn(&Usage) + Send + Sync + 'static) -> Self {
        Self {
            state: Mutex::new((HashMap::new(), Usage::default())),
            on_total: Box::new(on_total),
        }
    }
}

impl UsageTap for WireUsage {
    fn event(&self, event: TapEvent<'_>) {
        let total = {
            let Ok(mut guard) = self.state.lock() else {
                return;
            };
            let (open, done) = &mut *guard;
            let changed = match event {
                TapEvent::Response { exchange, .. } => {
                    open.insert(exchange, Exchange::default());
                    false
                }
                TapEvent::Chunk {
                    exchange, bytes, ..
                } => match open.get_mut(&exchange) {
                    Some(x) => x.feed(&String::from_utf8_lossy(bytes)),
                    None => false,
                },
                TapEvent::End { exchange, .. } => match open.remove(&exchange) {
                    Some(mut x) => {
                        let changed = x.finish();
                        add(done, &x.usage);
                        changed
                    }
                    None => false,
                },
            };
            if !changed {
                return;
            }
            let mut total = done.clone();
            for x in open.values() {
                add(&mut total, &x.usage);
            }
            total
        };
        (self.on_total)(&total);
    }
}

impl Exchange {
    /// Takes a chunk; true when the usage changed.
    fn feed(&mut self, text: &str) -> bool {
        if !self.sse && self.pending.len() + text.len() > MAX_JSON_BODY {
            self.pending.clear();
        }
        self.pending.push_str(text);
        let mut changed = false;
        while let Some(nl) = self.pending.find('\n') {
            let line: String = self.pending.drain(..=nl).collect();
            if let Some(data) = line.trim_end().strip_prefix("data:") {
                self.sse = true;
                if let Ok(v) = serde_json::from_str::<Value>(data.trim()) {
                    changed |= self.read(&v);
                }
            }
        }
        // A streamed body never holds more than one unfinished line.
        if self.sse && self.pending.len() > MAX_JSON_BODY {
            self.pending.clear();
        }
        changed
    }

    /// At the end: a non-streamed JSON body.
    fn finish(&mut self) -> bool {
        if self.sse {
            return false;
        }
        match serde_json::from_str::<Value>(self.pending.trim()) {
            Ok(v) => self.read(&v),
            Err(_) => false,
        }
    }

    /// One event (or a whole body) of any of the three wire formats.
    fn read(&mut self, v: &Value) -> bool {
        let before = self.usage.clone();
        let n = |u: &Value, k: &str| u[k].as_u64();
        // Anthropic: the input (and cache) at message_start, output growing in message_delta.
        let (message_usage, delta_usage) = (&v["message"]["usage"], &v["usage"]);
        match v["type"].as_str() {
            Some("message_start") => self.anthropic(message_usage),
            Some("message_delta") => {
                if let Some(o) = n(delta_usage, "output_tokens") {
                    self.usage.output_tokens = self.usage.output_tokens.max(o);
                }
                if let Some(i) = n(delta_usage, "input_tokens") {
                    self.usage.input_tokens = self.usage.input_tokens.max(i);
                }
            }
            Some("response.completed" | "response.incomplete" | "response.failed") => {
                let u = &v["response"]["usage"];
                self.usage.input_tokens = n(u, "input_tokens").unwrap_or(0);
                self.usage.output_tokens = n(u, "output_tokens").unwrap_or(0);
                self.usage.cache_read_tokens = n(&u["input_tokens_details"], "cached_tokens");
            }
            // A non-streamed Anthropic message.
            Some("message") => self.anthropic(delta_usage),
            _ => {
                // Chat completions (streamed or not), and a non-streamed Responses body.
                let u = delta_usage;
                if let (Some(i), Some(o)) = (n(u, "prompt_tokens"), n(u, "completion_tokens")) {
                    self.usage.input_tokens = i;
                    self.usage.output_tokens = o;
                } else if let (Some(i), Some(o)) = (n(u, "input_tokens"), n(u, "output_tokens")) {
                    self.usage.input_tokens = i;
                    self.usage.output_tokens = o;
                }
            }
        }
        self.usage != before
    }

    fn anthropic(&mut self, u: &Value) {
        let n = |k: &str| u[k].as_u64();
        self.usage.input_tokens = n("input_tokens").unwrap_or(0);
        self.usage.output_tokens = self
            .usage
            .output_tokens
            .max(n("output_tokens").unwrap_or(0));
        self.usage.cache_read_tokens = n("cache_read_input_tokens").filter(|t| *t > 0);
        self.usage.cache_creation_tokens = n("cache_creation_input_tokens").filter(|t| *t > 0);
    }
}

fn add(total: &mut Usage, u: &Usage) {
    total.input_tokens += u.input_tokens;
    total.output_tokens += u.output_tokens;
    let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
    total.cache_read_tokens = sum(total.cache_read_tokens, u.cache_read_tokens);
    total.cache_creation_tokens = sum(total.cache_creation_tokens, u.cache_creation_tokens);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;

    fn run(chunks_per_exchange: &[&[&str]]) -> Vec<Usage> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let tap = WireUsage::new(move |u| s.lock().unwrap().push(u.clone()));
        for (i, chunks) in chunks_per_exchange.iter().enumerate() {
            let exchange = i as u64;
            tap.event(TapEvent::Response {
                exchange,
                route: "model",
                status: 200,
            });
            for c in *chunks {
                tap.event(TapEvent::Chunk {
                    exchange,
                    route: "model",
                    bytes: &Bytes::from(c.to_string()),
                });
            }
            tap.event(TapEvent::End {
                exchange,
                route: "model",
                end: metash_runtime::credential::StreamEnd::Complete,
            });
        }
        let v = seen.lock().unwrap().clone();
        v
    }

    #[test]
    fn anthropic_sse_split_anywhere_accumulates_across_requests() {
        let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":100,\"output_tokens\":1,\"cache_read_input_tokens\":7}}}\n\n";
        let delta = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}}\n\n";
        let (a, b) = start.split_at(37);
        let seen = run(&[&[a, b, delta], &[start, delta]]);
        let last = seen.last().unwrap();
        assert_eq!((last.input_tokens, last.output_tokens), (200, 80));
        assert_eq!(last.cache_read_tokens, Some(14));
        // Mid-stream: the first request's output was seen before it ended.
        assert!(seen
            .iter()
            .any(|u| u.output_tokens == 40 && u.input_tokens == 100));
    }

    #[test]
    fn responses_chat_and_plain_json_bodies() {
        let responses = "data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":5,\"input_tokens_details\":{\"cached_tokens\":2}}}}\n\n";
        let chat = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n";
        let json = "{\"type\":\"message\",\"usage\":{\"input_tokens\":3,\"output_tokens\":2}}";
        let seen = run(&[&[responses], &[chat], &[json]]);
        let last = seen.last().unwrap();
        assert_eq!((last.input_tokens, last.output_tokens), (22, 11));
        assert_eq!(last.cache_read_tokens, Some(2));
        // Garbage is no usage, and no panic.
        assert!(run(&[&["data: {not json\n\n", "\u{0}\u{ff}"]]).is_empty());
    }
}
