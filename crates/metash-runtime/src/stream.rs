//! Streaming pieces shared by both sandboxes: the per-agent token bucket that paces event
//! acceptance, and the chunk reassembler that turns `output` chunks back into cards.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use metash_protocol::AgentEvent;

/// Token-bucket settings: `rate` events per second on average, bursts of up to `burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throttle {
    pub rate: f64,
    pub burst: f64,
}

impl Default for Throttle {
    fn default() -> Self {
        Self {
            rate: 2_000.0,
            burst: 200.0,
        }
    }
}

/// A token bucket. [`TokenBucket::take`] blocks the calling reader thread instead of dropping: the
/// agent's pipe then fills and the agent itself is slowed, which is the backpressure we want.
#[derive(Debug)]
pub struct TokenBucket {
    cfg: Throttle,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(cfg: Throttle) -> Self {
        Self {
            cfg,
            tokens: cfg.burst,
            last: Instant::now(),
        }
    }

    /// Take one token, sleeping until one is available. Returns how long it waited.
    pub fn take(&mut self) -> Duration {
        let rate = self.cfg.rate.max(0.001);
        let now = Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * rate).min(self.cfg.burst.max(1.0));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Duration::ZERO;
        }
        let wait = Duration::from_secs_f64((1.0 - self.tokens) / rate);
        std::thread::sleep(wait);
        self.last = Instant::now();
        self.tokens = 0.0;
        wait
    }
}

/// A reassembled output card.
#[derive(Debug, Clone, PartialEq)]
pub struct Card {
    pub stream: String,
    pub content_type: String,
    pub data: String,
    pub chunks: u64,
}

/// Why a chunk was not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChunkError {
    #[error("chunk {chunk_id} out of order: expected seq {expected}")]
    OutOfOrder { chunk_id: String, expected: u64 },
    #[error("chunk id {0:?} is not <stream>:<seq>")]
    BadId(String),
}

/// Reassembles `output` chunks per stream. A chunk id is `"<stream>:<seq>"` with `seq` counting from
/// 0; an id without `:` is a one-chunk stream. Out-of-order or duplicate chunks are errors, never
/// silently merged.
#[derive(Debug, Default)]
pub struct ChunkAssembler {
    open: BTreeMap<String, Card>,
}

impl ChunkAssembler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Split a chunk id into stream and sequence number.
    ///
    /// # Errors
    /// [`ChunkError::BadId`] when the part after the last `:` is not a number.
    pub fn parse_id(chunk_id: &str) -> Result<(&str, u64), ChunkError> {
        match chunk_id.rsplit_once(':') {
            None => Ok((chunk_id, 0)),
            Some((stream, seq)) => seq
                .parse()
                .map(|n| (stream, n))
                .map_err(|_| ChunkError::BadId(chunk_id.to_string())),
        }
    }

    /// Feed one event; non-output events are ignored.
    ///
    /// # Errors
    /// A chunk that is not the next one of its stream.
    pub fn push(&mut self, event: &AgentEvent) -> Result<(), ChunkError> {
        let AgentEvent::Output {
            chunk_id,
            content_type,
            data,
            ..
        } = event
        else {
            return Ok(());
        };
        let (stream, seq) = Self::parse_id(chunk_id)?;
        let card = self.open.entry(stream.to_string()).or_insert_with(|| Card {
            stream: stream.to_string(),
            content_type: content_type.clone(),
            data: String::new(),
            chunks: 0,
        });
        if seq != card.chunks {
            return Err(ChunkError::OutOfOrder {
                chunk_id: chunk_id.clone(),
                expected: card.chunks,
            });
        }
        card.data.push_str(data);
        card.chunks += 1;
        Ok(())
    }

    /// All cards assembled so far, by stream name.
    pub fn cards(&self) -> impl Iterator<Item = &Card> {
        self.open.values()
    }

    /// Take the cards out.
    pub fn finish(self) -> Vec<Card> {
        self.open.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn chunk(id: &str, data: &str) -> AgentEvent {
        AgentEvent::Output {
            agent_id: "a".into(),
            chunk_id: id.into(),
            content_type: "text/plain".into(),
            data: data.into(),
        }
    }

    #[test]
    fn assembles_in_order_and_rejects_gaps() {
        let mut a = ChunkAssembler::new();
        a.push(&chunk("s:0", "he")).unwrap();
        a.push(&chunk("t", "x")).unwrap();
        a.push(&chunk("s:1", "llo")).unwrap();
        assert!(matches!(
            a.push(&chunk("s:3", "!")),
            Err(ChunkError::OutOfOrder { expected: 2, .. })
        ));
        let cards = a.finish();
        assert_eq!(cards[0].data, "hello");
        assert_eq!(cards[1].data, "x");
    }

    #[test]
    fn bucket_paces() {
        let mut b = TokenBucket::new(Throttle {
            rate: 1000.0,
            burst: 10.0,
        });
        let start = Instant::now();
        for _ in 0..60 {
            b.take();
        }
        // 10 free, 50 at 1 ms each.
        assert!(start.elapsed() >= Duration::from_millis(40));
    }
}
