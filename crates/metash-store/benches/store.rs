//! `cargo bench -p metash-store`: the store's figures in one run, each against the physical
//! baseline measured on the same disk in the same run.
//!
//! - baseline: write a temp file + fsync + rename + fsync of the directory (what any durable file
//!   update costs: the last fsync makes the rename itself survive a power cut)
//! - update_state ops/s with 1 and with 8 concurrent writers (own handles, one lock), each run
//!   checked for zero lost updates
//! - event appends/s, single (one fsync each) and batched (100 per fsync)
//! - state rebuild events/s over a 100,000-event log
//!
//! Figures are medians over interleaved rounds. Set `METASH_BENCH_DIR` to measure another disk.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use metash_protocol::LogKind;

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
        std::fs::File::open(dir).unwrap().sync_all().unwrap();
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
    let rate = rate(writers * per_writer, t.elapsed());
    // Zero lost updates: every writer's last value is there, and each update is one event.
    let store = Store::open(ws.path()).unwrap();
    let state = store.state().unwrap();
    for w in 0..writers {
        assert_eq!(state.variables[&format!("w{w}")], json!(per_writer - 1));
    }
    let updates = store
        .log()
        .read_all()
        .unwrap()
        .iter()
        .filter(|r| r.kind == LogKind::StateUpdate)
        .count() as u64;
    assert_eq!(
        updates,
        writers * per_writer,
        "an update was lost or doubled"
    );
    assert_eq!(state, store.rebuild().unwrap());
    rate
}

fn appends(dir: &Path, n: u64, batch: u64) -> f64 {
    let ws = tempfile::tempdir_in(dir).unwrap();
    let store = Store::init(ws.path(), Some("# bench\n")).unwrap();
    let t = Instant::now();
    for b in 0..n / batch {
        let events: Vec<_> = (0..batch)
            .map(|i| {
                NewEvent::new(
                    LogKind::parse("output"),
                    Some("bench"),
                    json!({"chunk": b * batch + i, "data": "some output text"}),
                )
            })
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
    let keys = [
        "variables.counter",
        "gapCount",
        "currentPhase",
        "variables.notes.last",
    ];
    let mut written = 1;
    while written < n {
        let tail = log.tail().unwrap();
        let events: Vec<_> = (0..1000.min(n - written))
            .map(|i| {
                let k = keys[(i % 4) as usize];
                let v = if k == "variables.notes.last" {
                    json!(format!("note {i}"))
                } else {
                    json!(i % 100)
                };
                NewEvent::new(
                    LogKind::StateUpdate,
                    None,
                    json!({"key": k, "value": v, "scope": "session"}),
                )
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
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target")
        });
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    let dir = dir.path();

    // Rounds interleave the baseline with what is compared to it, and each ratio is taken within
    // its round, so load from elsewhere on the machine hits both sides alike.
    let rounds = 5;
    let (mut bs, mut u1s, mut u8s, mut a1s, mut a100s) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut r1, mut r8, mut ra1, mut ra100) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let b = baseline(dir, 400 / scale);
        let u1 = update_state(dir, 1, 300 / scale);
        let u8 = update_state(dir, 8, 40 / scale);
        let a1 = appends(dir, 400 / scale, 1);
        let a100 = appends(dir, 20_000 / scale, 100);
        r1.push(u1 / b);
        r8.push(u8 / b);
        ra1.push(a1 / b);
        ra100.push(a100 / b);
        bs.push(b);
        u1s.push(u1);
        u8s.push(u8);
        a1s.push(a1);
        a100s.push(a100);
    }
    let (b, u1, u8, a1, a100) = (
        median(bs),
        median(u1s),
        median(u8s),
        median(a1s),
        median(a100s),
    );
    let (r1, r8, ra1, ra100) = (median(r1), median(r8), median(ra1), median(ra100));
    let (r, n) = rebuild(dir, 100_000 / scale);

    println!(
        "metash-store benchmark (disk under {}; medians of {rounds} interleaved rounds, ratios per round)",
        base.display()
    );
    println!("  baseline temp+fsync+rename+dirsync {b:>12.0} ops/s   1.00x");
    println!("  update_state, 1 writer             {u1:>12.0} ops/s   {r1:.2}x baseline");
    println!("  update_state, 8 writers            {u8:>12.0} ops/s   {r8:.2}x baseline");
    println!("  event append, single (1 fsync each){a1:>12.0} ev/s    {ra1:.2}x baseline");
    println!("  event append, batched (100/fsync)  {a100:>12.0} ev/s    {ra100:.2}x baseline");
    println!("  state rebuild over {n} events  {r:>12.0} ev/s");
    if quick {
        println!("  (quick mode: run `cargo bench -p metash-store` for full-size figures)");
    }
}
