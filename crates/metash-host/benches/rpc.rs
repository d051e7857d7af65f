//! JSON-RPC round-trip latency of `getState` against calling `Host::get_state` in-process, in the
//! same run on the same project: median and p99 of each, and their ratio. The server runs as
//! `metash serve --stdio` does (request thread per line, one writer), over OS pipes to a client
//! thread that sends one request and waits for its response before the next.
//!
//! `cargo bench -p metash-host --bench rpc` (ROUNDS=N to change the sample size).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_host::serve::RpcServer;
use metash_host::{Host, HostOptions};
use serde_json::json;

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this too, as a quick check.
    let benching = std::env::args().any(|a| a == "--bench");
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if benching { 3000 } else { 100 });
    let dir = tempfile::tempdir().unwrap();
    metash_store::Store::init(dir.path(), None).unwrap();
    let host = Arc::new(Host::open(dir.path(), HostOptions::silent()).unwrap());
    host.update_state(None, "variables.retry_count", json!(3))
        .unwrap();

    // Baseline: the host call itself.
    let mut direct = Vec::with_capacity(rounds);
    for i in 0..rounds + rounds / 10 {
        let t = Instant::now();
        let v = host.get_state("variables.retry_count").unwrap();
        let d = t.elapsed();
        assert_eq!(v, json!(3));
        if i >= rounds / 10 {
            direct.push(d);
        }
    }

    // The same call through the JSON-RPC server.
    let (server_in, mut to_server) = std::io::pipe().unwrap();
    let (from_server, server_out) = std::io::pipe().unwrap();
    let server = RpcServer::new(host.clone(), host.clone());
    let served = std::thread::spawn(move || server.serve(BufReader::new(server_in), server_out));
    let mut replies = BufReader::new(from_server);
    let mut rpc = Vec::with_capacity(rounds);
    let mut line = String::new();
    for i in 0..rounds + rounds / 10 {
        let req = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"getState\",\"params\":{{\"key\":\"variables.retry_count\"}}}}\n"
        );
        let t = Instant::now();
        to_server.write_all(req.as_bytes()).unwrap();
        line.clear();
        replies.read_line(&mut line).unwrap();
        let d = t.elapsed();
        assert!(line.contains("\"result\":3"), "{line}");
        if i >= rounds / 10 {
            rpc.push(d);
        }
    }
    drop(to_server);
    served.join().unwrap().unwrap();

    let (dm, dp) = stats(&mut direct);
    let (rm, rp) = stats(&mut rpc);
    println!(
        "getState latency, {rounds} rounds each (after {} warm-up)",
        rounds / 10
    );
    println!(
        "  Host::get_state in-process   median {:>9.1} us   p99 {:>9.1} us",
        us(dm),
        us(dp)
    );
    println!(
        "  JSON-RPC round trip (pipes)  median {:>9.1} us   p99 {:>9.1} us",
        us(rm),
        us(rp)
    );
    println!(
        "  ratio JSON-RPC / in-process  median {:>9.2} x    p99 {:>9.2} x   (protocol overhead: median {:.1} us)",
        us(rm) / us(dm),
        us(rp) / us(dp),
        us(rm) - us(dm)
    );
}

/// Median and p99 (nearest rank).
fn stats(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i]
    };
    (at(0.5), at(0.99))
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
