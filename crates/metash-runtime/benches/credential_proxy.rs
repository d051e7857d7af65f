//! The credential proxy's own cost, printed as medians with ratios in one run
//! (`cargo bench -p metash-runtime --bench credential_proxy`): a small request and a streamed
//! 1 MiB chunked response, each on a kept-alive connection and the small one also on a fresh
//! connection per request, sent directly to a loopback upstream and through the proxy to the same
//! upstream, sampled interleaved (one of each per round) so load on a shared machine hits them
//! alike. `METASH_BENCH_N` sets the rounds (300). Not a timed test: it prints, it does not assert.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../tests/suite/upstream.rs"]
mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_runtime::credential::{
    AuthStyle, CredentialProxy, Mount, ProxyConfig, Route, Secret, StaticSource, TapEvent,
};
use metash_runtime::NullSink;
use upstream::{Client, Upstream};

const MIB: usize = 1024 * 1024;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn timed(f: impl FnOnce() -> usize, want: usize) -> Duration {
    let t = Instant::now();
    let n = f();
    let d = t.elapsed();
    assert_eq!(n, want);
    d
}

fn main() {
    let n: usize = std::env::var("METASH_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let up = Upstream::start();
    let mut config = ProxyConfig::new(vec![Route {
        id: "model".into(),
        mount: Mount::WholePort,
        upstream: up.url(),
        auth: AuthStyle::XApiKey,
    }]);
    // A tap that touches every chunk, as the budget parser will.
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let s2 = Arc::clone(&seen);
    config.tap = Some(Arc::new(move |e: TapEvent<'_>| {
        if let TapEvent::Chunk { bytes, .. } = e {
            s2.fetch_add(bytes.len(), std::sync::atomic::Ordering::Relaxed);
        }
    }));
    let source = StaticSource::new().with("model", Secret::new("sk-bench"));
    let proxy =
        CredentialProxy::start(config, Arc::new(source), Arc::new(NullSink)).expect("proxy");
    let (direct, via) = (up.addr, proxy.addr());
    let mut conns = [Client::new(direct), Client::new(via)];
    let small = "/v1/messages";
    let big = format!("/big?n={MIB}");
    // [small keep-alive, small new connection, 1 MiB keep-alive] x [direct, proxy]
    let mut samples: Vec<Vec<Duration>> = (0..6).map(|_| Vec::with_capacity(n)).collect();
    for round in 0..n + n / 10 {
        let warm = round < n / 10;
        for (i, addr) in [direct, via].into_iter().enumerate() {
            let ka = timed(|| conns[i].get(small), 11);
            let fresh = timed(|| Client::new(addr).get(small), 11);
            let stream = timed(|| conns[i].get(&big), MIB);
            if !warm {
                samples[i].push(ka);
                samples[2 + i].push(fresh);
                samples[4 + i].push(stream);
            }
        }
    }
    println!("credential proxy, {n} rounds interleaved (loopback upstream, tap on)");
    println!("| case | direct | through proxy | × direct | added |");
    println!("|---|---|---|---|---|");
    let names = [
        "small request, kept-alive connection",
        "small request, new connection each",
        "1 MiB chunked response, kept-alive",
    ];
    for (k, name) in names.iter().enumerate() {
        let d = median(samples[2 * k].clone());
        let p = median(samples[2 * k + 1].clone());
        println!(
            "| {name} | {} µs | {} µs | {:.2} | {} µs |",
            d.as_micros(),
            p.as_micros(),
            p.as_secs_f64() / d.as_secs_f64(),
            p.as_micros() as i128 - d.as_micros() as i128
        );
    }
    assert!(seen.load(std::sync::atomic::Ordering::Relaxed) >= n * MIB);
}
