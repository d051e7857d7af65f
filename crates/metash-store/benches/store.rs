//! `cargo bench -p metash-store`: the store's figures in one run, each against the physical
//! baseline measured on the same disk in the same run.
//!
//! - baseline: write a temp file + fsync + rename (what any durable file update costs)
//! - update_state ops/s with 1 and with 8 concurrent writers (own handles, one lock)
//! - event appends/s, single (one fsync each) and batched (100 per fsync)
//! - state rebuild events/s over a 100,000-event log
//!
//! Each figure is the median of 3 runs. Set `METASH_BENCH_DIR` to measure another disk.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use metash_store::{EventLog, NewEvent, Store};
use serde_json::json;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn baseline(dir: &Path, n: u64) -> f64 {
    let target = dir.join("baseline.json");
    let payload = vec![b'x'; 600];
    let t = Instant::now();
    for i in 0..n {
        let tmp = dir.join(format!(".baseline.tmp.{i}"));
        let mut f = std::fs::File::create(&tmp).unwrap();
        f.write_all(&payload).unwrap();
        f.sync_data().unwrap();
        drop(f);
        std::fs::rename(&tmp, &target).unwrap();
    }
    rate(n, t.elapsed())
}

fn update_state(dir: &Path, writers: u64, per_writer: u64) -> f64 {
    let ws = tempfile::tempdir_in(dir).unwrap();
    Store::init(ws.path(), Some("# bench\n")).unwrap();
    let t = Instant::now();
    std::thread::scope(|s| {
        for w in 0..writers {
            let ws = ws.path();
            s.spawn(move || {
                let store = Store::open(ws).unwrap();
                for i in 0..per_writer {
                    store
                        .update_state(&format!("variables.w{w}"), json!(i))
                        .unwrap();
                }
            });
        }
    });
    rate(writers * per_writer, t.elapsed())
}

fn appends(dir: &Path, n: u64, batch: u64) -> f64 {
    let ws = tempfile::tempdir_in(dir).unwrap();
    let store = Store::init(ws.path(), Some("# bench\n")).unwrap();
    let t = Instant::now();
    for b in 0..n / batch {
        let events: Vec<_> = (0..batch)
            .map(|i| NewEvent::new("output", Some("bench"), json!({"chunk": b * batch + i, "data": "some output text"})))
            .collect();
        store.append_batch(&events).unwrap();
    }
    rate(n, t.elapsed())
}

fn rebuild(dir: &Path, n: u64) -> (f64, u64) {
    let ws = tempfile::tempdir_in(dir).unwrap();
    let store = Store::init(ws.path(), Some("# bench\n")).unwrap();
    // Write the log directly, 1,000 state events per fsync: generating it through update_state
    // would measure update_state again.
    let log = EventLog::new(ws.path().join(".meta/events.jsonl"));
    let keys = ["variables.counter", "gapCount", "currentPhase", "variables.notes.last"];
    let mut written = 1;
    while written < n {
        let tail = log.tail().unwrap();
        let events: Vec<_> = (0..1000.min(n - written))
            .map(|i| {
                let k = keys[(i % 4) as usize];
                let v = if k == "variables.notes.last" { json!(format!("note {i}")) } else { json!(i % 100) };
                NewEvent::new("state_update", None, json!({"key": k, "value": v, "scope": "session"}))
            })
            .collect();
        written += events.len() as u64;
        log.append(&tail, &events).unwrap();
    }
    let runs: Vec<f64> = (0..3)
        .map(|_| {
            let t = Instant::now();
            let state = store.rebuild().unwrap();
            assert_eq!(state.revision, n);
            rate(n, t.elapsed())
        })
        .collect();
    (median(runs), n)
}

fn main() {
    // `cargo test --benches` runs this with `--bench` absent: keep that quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let scale = if quick { 20 } else { 1 };
    let base = std::env::var_os("METASH_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    let dir = dir.path();

    let b = median((0..3).map(|_| baseline(dir, 2000 / scale)).collect());
    let u1 = median((0..3).map(|_| update_state(dir, 1, 1000 / scale)).collect());
    let u8 = median((0..3).map(|_| update_state(dir, 8, 250 / scale)).collect());
    let a1 = median((0..3).map(|_| appends(dir, 2000 / scale, 1)).collect());
    let a100 = median((0..3).map(|_| appends(dir, 100_000 / scale, 100)).collect());
    let (r, n) = rebuild(dir, 100_000 / scale);

    println!("metash-store benchmark (disk under {}; medians of 3 runs)", base.display());
    println!("  baseline temp-write+fsync+rename   {b:>12.0} ops/s   1.00x");
    println!("  update_state, 1 writer             {u1:>12.0} ops/s   {:.2}x baseline", u1 / b);
    println!("  update_state, 8 writers            {u8:>12.0} ops/s   {:.2}x baseline", u8 / b);
    println!("  event append, single (1 fsync each){a1:>12.0} ev/s    {:.2}x baseline", a1 / b);
    println!("  event append, batched (100/fsync)  {a100:>12.0} ev/s    {:.2}x baseline", a100 / b);
    println!("  state rebuild over {n} events  {r:>12.0} ev/s");
    if quick {
        println!("  (quick mode: run `cargo bench -p metash-store` for full-size figures)");
    }
}
