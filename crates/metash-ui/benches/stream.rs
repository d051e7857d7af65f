//! `metash ui`'s live stream under a flooding agent (issue 15): an agent's events appended at
//! 1,000/s for a few seconds while a page-like client reads `/events`. Reports the latency from
//! append to the client (median and p99), against a bare follower of the same log (the same
//! `read_from` loop, no HTTP) measured in the same run, and the process's resident memory before
//! and after. `cargo bench -p metash-ui --bench stream` (`METASH_BENCH_SECS`, default 5).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metash_protocol::LogKind;
use metash_store::Store;
use serde_json::json;

#[path = "stream/browser.rs"]
mod browser;
#[path = "../tests/common/mod.rs"]
mod common;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Appends `n` events at `rate`/s; each carries its index; `sent[i]` is when its append returned.
fn flood(root: &std::path::Path, n: usize, rate: u32, base: Instant, sent: Arc<Mutex<Vec<f64>>>) {
    let store = Store::open(root).unwrap();
    common::paced(n, rate, |i| {
        store
            .append(
                LogKind::AgentEvent,
                Some("flood"),
                json!({"type": "output", "agent_id": "flood", "chunk_id": format!("f:{i}"),
                       "content_type": "text/plain", "data": format!("{i}")}),
            )
            .unwrap();
        sent.lock().unwrap()[i] = base.elapsed().as_secs_f64();
    });
}

fn latencies(sent: &[f64], got: &[(usize, f64)]) -> Vec<f64> {
    got.iter()
        .filter(|(i, _)| sent[*i] > 0.0)
        .map(|(i, t)| (t - sent[*i]).max(0.0) * 1e3)
        .collect()
}

/// Reads `/events` after `start_seq` until `n` flood events arrived: (index, arrival time).
fn follow_page(
    addr: std::net::SocketAddr,
    cookie: &str,
    start_seq: u64,
    n: usize,
    base: Instant,
) -> Vec<(usize, f64)> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET /events?after={start_seq} HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let (mut got, mut line) = (Vec::with_capacity(n), String::new());
    while got.len() < n {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if let Some(d) = line.trim_end().strip_prefix("data: ") {
            let v: serde_json::Value = serde_json::from_str(d).unwrap();
            if let Some(i) = v["data"]["data"]
                .as_str()
                .and_then(|x| x.parse::<usize>().ok())
            {
                got.push((i, base.elapsed().as_secs_f64()));
            }
        }
    }
    got
}

/// The same log followed with `read_from` directly, as the stream does, without HTTP.
fn follow_bare(root: &std::path::Path, n: usize, secs: usize, base: Instant) -> Vec<(usize, f64)> {
    let store = Store::open(root).unwrap();
    let (mut got, mut offset) = (Vec::with_capacity(n), 0);
    let until = Instant::now() + Duration::from_secs(secs as u64 + 30);
    while got.len() < n && Instant::now() < until {
        let (recs, next) = store.log().read_from(offset, 256).unwrap();
        offset = next;
        let now = base.elapsed().as_secs_f64();
        for r in &recs {
            if let Some(i) = r.data["data"]
                .as_str()
                .and_then(|x| x.parse::<usize>().ok())
            {
                got.push((i, now));
            }
        }
        if recs.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    got
}

fn main() {
    // `cargo test --benches` runs this without `--bench`: keep that to a second.
    let quick = !std::env::args().any(|a| a == "--bench");
    let secs: usize = std::env::var("METASH_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 5 });
    let rate = 1000u32;
    let n = secs * rate as usize;
    let common::Served {
        dir: _dir,
        root,
        rt,
        served,
    } = common::serve_new_project();
    let start_seq = Store::open(&root).unwrap().log().tail().unwrap().seq;
    let addr = served.addr;
    let cookie = common::client::login(addr, &served.url);

    let base = Instant::now();
    let sent = Arc::new(Mutex::new(vec![0.0f64; n]));
    let rss_before = rss_kib();

    // The page: reads the SSE stream, notes when each event arrives.
    let page = std::thread::spawn(move || follow_page(addr, &cookie, start_seq, n, base));
    // The baseline: a bare follower of the same log, polling as the stream does.
    let bare = {
        let root = root.clone();
        std::thread::spawn(move || follow_bare(&root, n, secs, base))
    };
    let t0 = Instant::now();
    flood(&root, n, rate, base, Arc::clone(&sent));
    let flood_s = t0.elapsed().as_secs_f64();
    let got = page.join().unwrap();
    let bare = bare.join().unwrap();
    let rss_after = rss_kib();

    let sent = sent.lock().unwrap().clone();
    let mut page_ms = latencies(&sent, &got);
    let mut bare_ms = latencies(&sent, &bare);
    let (pm, p99) = (
        percentile(&mut page_ms, 0.5),
        percentile(&mut page_ms, 0.99),
    );
    let (bm, b99) = (
        percentile(&mut bare_ms, 0.5),
        percentile(&mut bare_ms, 0.99),
    );
    println!(
        "flood: {n} events in {flood_s:.2} s ({:.0}/s); the page got {} of {n}",
        n as f64 / flood_s,
        got.len()
    );
    println!(
        "append -> page: median {pm:.1} ms, p99 {p99:.1} ms (target: median <= 100 ms); bare \
         follower of the same log: median {bm:.1} ms, p99 {b99:.1} ms; page/bare median = {:.2}x",
        pm / bm.max(0.001)
    );
    println!(
        "resident memory: {} KiB before the flood, {} KiB after ({:+} KiB) for {n} events streamed",
        rss_before,
        rss_after,
        rss_after as i64 - rss_before as i64
    );

    // The same flood with a real browser showing the run view.
    browser_phase(&root, &served.url, n, rate, bm);
    rt.block_on(served.stop());
}

/// The flood again with Chromium showing the run view; `bare_median` is the baseline's.
fn browser_phase(root: &std::path::Path, url: &str, n: usize, rate: u32, bare_median: f64) {
    let rss_before = rss_kib();
    match browser::run(root, url, n, rate) {
        Ok(mut seen) => {
            let rss_after = rss_kib();
            let (am, a99) = (
                percentile(&mut seen.arrived, 0.5),
                percentile(&mut seen.arrived, 0.99),
            );
            let (dm, d99) = (
                percentile(&mut seen.drawn, 0.5),
                percentile(&mut seen.drawn, 0.99),
            );
            println!(
                "append -> Chromium page: arrived median {am:.1} ms, p99 {a99:.1} ms; drawn \
                 median {dm:.1} ms, p99 {d99:.1} ms over {} of {n} events (target: median <= \
                 100 ms); drawn/bare median = {:.2}x; server memory {:+} KiB",
                seen.count,
                dm / bare_median.max(0.001),
                rss_after as i64 - rss_before as i64
            );
        }
        Err(why) => println!("append -> Chromium page: not measured ({why})"),
    }
}
