//! Backpressure: an agent writing as fast as it can for 10 s into a slow consumer (native), and a
//! WASM guest writing 30 MiB into a slow consumer. The host's RSS
//! must stay bounded (the bound: 64 MiB over the RSS before the flood; the design bound is
//! channel_capacity x max_line = 64 x 256 KiB = 16 MiB of queued lines plus the pipe), every chunk
//! must arrive, in order, and the agent must have been slowed (it produced only what was consumed).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_protocol::LogKind;

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
    fn record(&self, _: LogKind, _: Option<&str>, _: Value) {
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
    let f = Fixture::exclusive();
    let sink = Arc::new(CountingSink::default());
    let rt = Runtime::new(
        RuntimeConfig {
            cache_dir: f.dir.path().join("cache2"),
            cache_key: metash_runtime::CacheKey::ephemeral().expect("cache key"),
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

/// A WASM guest writing `n` numbered 1 KiB chunks as fast as it can.
fn wat_flood(n: u32) -> String {
    let prefix = r#"{"schema_version":"0.1","type":"output","agent_id":"w","chunk_id":"f:"#;
    let suffix = format!(
        "{}{}{}\n",
        r#"","content_type":"text/plain","data":""#,
        "x".repeat(1000),
        r#""}"#
    );
    let done = "{\"schema_version\":\"0.1\",\"type\":\"done\"}\n";
    let esc = |s: &str| s.bytes().map(|b| format!("\\{b:02x}")).collect::<String>();
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 1024) "{p}")
  (data (i32.const 4096) "{s}")
  (data (i32.const 8192) "{d}")
  (func $itoa (param $n i32) (param $ptr i32) (result i32)
    (local $len i32) (local $tmp i32) (local $i i32)
    (local.set $tmp (local.get $n)) (local.set $len (i32.const 1))
    (block $b (loop $l
      (br_if $b (i32.lt_u (local.get $tmp) (i32.const 10)))
      (local.set $tmp (i32.div_u (local.get $tmp) (i32.const 10)))
      (local.set $len (i32.add (local.get $len) (i32.const 1)))
      (br $l)))
    (local.set $i (local.get $len)) (local.set $tmp (local.get $n))
    (loop $l2
      (local.set $i (i32.sub (local.get $i) (i32.const 1)))
      (i32.store8 (i32.add (local.get $ptr) (local.get $i))
        (i32.add (i32.const 48) (i32.rem_u (local.get $tmp) (i32.const 10))))
      (local.set $tmp (i32.div_u (local.get $tmp) (i32.const 10)))
      (br_if $l2 (i32.gt_u (local.get $i) (i32.const 0))))
    (local.get $len))
  (func $write (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func (export "_start")
    (local $seq i32) (local $len i32)
    (block $end (loop $l
      (br_if $end (i32.ge_u (local.get $seq) (i32.const {n})))
      (memory.copy (i32.const 16384) (i32.const 1024) (i32.const {pl}))
      (local.set $len (i32.add (i32.const {pl}) (call $itoa (local.get $seq) (i32.const {num_at}))))
      (memory.copy (i32.add (i32.const 16384) (local.get $len)) (i32.const 4096) (i32.const {sl}))
      (call $write (i32.const 16384) (i32.add (local.get $len) (i32.const {sl})))
      (local.set $seq (i32.add (local.get $seq) (i32.const 1)))
      (br $l)))
    (call $write (i32.const 8192) (i32.const {dl}))))
"#,
        p = esc(prefix),
        s = esc(&suffix),
        d = esc(done),
        pl = prefix.len(),
        num_at = 16384 + prefix.len(),
        sl = suffix.len(),
        dl = done.len(),
    )
}

#[test]
fn wasm_flood_streams_live_with_bounded_memory() {
    let f = Fixture::exclusive();
    let n = 30_000u32;
    let mut spec = f.wasm("wflood", &wat_flood(n), &[], None);
    spec.timeout = Duration::from_secs(60);
    spec.output_cap = u64::MAX;
    spec.throttle = Throttle {
        rate: 100_000.0,
        burst: 1000.0,
    };
    // A counting sink: the memory sink would keep all 30 MiB, which is what we measure.
    let rt = Runtime::new(
        RuntimeConfig {
            cache_dir: f.dir.path().join("cache2"),
            cache_key: metash_runtime::CacheKey::ephemeral().expect("cache key"),
        },
        Arc::new(CountingSink::default()),
    )
    .unwrap();
    let mut a = rt.register(spec).unwrap();
    a.start().unwrap();
    let before = rss_kib();
    let mut peak = before;
    let mut next_seq = 0u64;
    let t = Instant::now();
    let mut first_at = None;
    let outcome = a
        .invoke("go", &[], &mut |e| {
            if let AgentEvent::Output { chunk_id, .. } = e {
                first_at.get_or_insert_with(|| t.elapsed());
                let (stream, seq) = ChunkAssembler::parse_id(chunk_id).unwrap();
                assert_eq!((stream, seq), ("f", next_seq), "chunk out of order");
                next_seq += 1;
                std::thread::sleep(Duration::from_micros(50));
                if next_seq.is_multiple_of(1000) {
                    peak = peak.max(rss_kib());
                }
            }
        })
        .unwrap();
    let took = t.elapsed();
    assert!(
        matches!(outcome.status, InvocationStatus::Done { .. }),
        "{outcome:?}"
    );
    assert_eq!(next_seq, u64::from(n), "every chunk arrives");
    let growth_mib = peak.saturating_sub(before) / 1024;
    let first = first_at.unwrap();
    println!(
        "wasm flood: {n} chunks (~{} MiB) in {took:?}, first chunk after {first:?}, RSS +{growth_mib} MiB",
        n / 1024
    );
    // Live: the first chunk arrived long before the guest could have finished.
    assert!(first < took / 4, "first chunk at {first:?} of {took:?}");
    // Bounded: ~30 MiB went through; the host held a few MiB at most.
    assert!(growth_mib < 16, "host RSS grew by {growth_mib} MiB");
}
