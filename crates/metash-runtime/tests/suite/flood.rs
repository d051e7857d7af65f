//! Backpressure: an agent writing as fast as it can for 10 s into a slow consumer. The host's RSS
//! must stay bounded (the bound: 64 MiB over the RSS before the flood; the design bound is
//! channel_capacity x max_line = 64 x 256 KiB = 16 MiB of queued lines plus the pipe), every chunk
//! must arrive, in order, and the agent must have been slowed (it produced only what was consumed).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_protocol::AgentEvent;
use metash_runtime::{
    ChunkAssembler, EventSink, InvocationStatus, Runtime, RuntimeConfig, Throttle,
};
use serde_json::Value;

use super::common::*;

/// A sink that only counts (the real store writes to disk; a memory sink would be the leak).
#[derive(Default)]
struct CountingSink(AtomicU64);

impl EventSink for CountingSink {
    fn record(&self, _: &str, _: Option<&str>, _: Value) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn flood_with_slow_consumer_stays_bounded_and_ordered() {
    require_native!();
    let f = Fixture::new();
    let sink = Arc::new(CountingSink::default());
    let rt = Runtime::new(
        RuntimeConfig {
            cache_dir: f.dir.path().join("cache2"),
        },
        Arc::clone(&sink) as Arc<dyn EventSink>,
    )
    .unwrap();
    let mut spec = f.native("flood", &[], None);
    spec.timeout = Duration::from_secs(60);
    spec.output_cap = u64::MAX;
    spec.throttle = Throttle {
        rate: 20_000.0,
        burst: 500.0,
    };
    let mut a = rt.register(spec).unwrap();
    a.start().unwrap();
    let before = rss_kib();
    let mut peak = before;
    // Check order as chunks stream by (keeping the assembled card would itself be the memory use
    // we are measuring).
    let mut next_seq = 0u64;
    let mut received = 0u64;
    let mut summary = None;
    let t = Instant::now();
    let outcome = a
        .invoke("flood 10", &[], &mut |e| {
            if let AgentEvent::Output { chunk_id, .. } = e {
                let (stream, seq) = ChunkAssembler::parse_id(chunk_id).unwrap();
                assert_eq!((stream, seq), ("flood", next_seq), "chunk out of order");
                next_seq += 1;
                received += 1;
                // The slow consumer: ~5k events/s at most, far below what the agent can write.
                std::thread::sleep(Duration::from_micros(200));
                if received.is_multiple_of(1000) {
                    peak = peak.max(rss_kib());
                }
            }
            if let AgentEvent::Done { summary: s, .. } = e {
                summary = s.clone();
            }
        })
        .unwrap();
    let took = t.elapsed();
    assert!(
        matches!(outcome.status, InvocationStatus::Done { .. }),
        "{outcome:?}"
    );
    let produced: u64 = summary
        .as_deref()
        .and_then(|s| s.strip_prefix("chunks="))
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert_eq!(produced, received, "every chunk arrives");
    assert_eq!(next_seq, received);
    let growth_mib = peak.saturating_sub(before) / 1024;
    println!(
        "flood: {received} chunks of 1 KiB in {took:?}, RSS before {} MiB, peak {} MiB (+{growth_mib} MiB), sink events {}",
        before / 1024,
        peak / 1024,
        sink.0.load(Ordering::Relaxed)
    );
    assert!(growth_mib < 64, "host RSS grew by {growth_mib} MiB");
    // The agent was held back by the consumer: it wrote at most what 10 s of consuming allows
    // (plus what fits in the pipe and the channel), far from its free-running rate.
    assert!(received < 10 * 5_000 + 10_000, "{received}");
    a.shutdown().unwrap();
}
