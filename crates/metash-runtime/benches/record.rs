//! What recording costs a live exchange, and what a replayed one costs, printed as medians with
//! ratios in one run (`cargo bench -p metash-runtime --bench record`; issue 36 asks ≤ 1.05× and
//! ≤ 1.0×). Three credential proxies on one loopback upstream: plain (the usage tap on, as the
//! host runs it), recording (a recorder that writes each exchange's bodies as blobs into a
//! store, as the host's does), and replaying (answering from the recording, no upstream).
//! Phase 1 samples plain and recording interleaved (the order alternating by round); phase 2
//! plain and replay alike, the replay answering phase 1's recording in order. Cases: a small
//! JSON answer and a 256 KiB chunked (streamed) one, on kept-alive connections. The upstream's
//! bodies repeat, so their blobs are written once and then read back and compared: this
//! measures copying, masking, hashing and the handing over, not a new file per exchange.
//! `METASH_BENCH_N` sets the rounds (300).
//! Not a timed test: it prints, it does not assert.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../tests/suite/upstream.rs"]
mod upstream;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metash_runtime::credential::{
    AuthStyle, Cassette, CredentialProxy, Exchange, Mount, ProxyConfig, Recorded, Route, Secret,
    StaticSource, TapEvent,
};
use metash_runtime::NullSink;
use metash_store::tape::{BlobRef, Tapes};
use upstream::{Client, Upstream};

const BIG: usize = 256 * 1024;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn timed(c: &mut Client, target: &str, want: usize) -> Duration {
    let t = Instant::now();
    let n = c.get(target);
    let d = t.elapsed();
    assert_eq!(n, want);
    d
}

fn start(upstream: String, edit: impl FnOnce(&mut ProxyConfig)) -> CredentialProxy {
    let mut config = ProxyConfig::new(vec![Route {
        id: "model".into(),
        mount: Mount::WholePort,
        upstream,
        auth: AuthStyle::XApiKey,
    }]);
    config.tap = Some(Arc::new(|e: TapEvent<'_>| {
        if let TapEvent::Chunk { bytes, .. } = e {
            std::hint::black_box(bytes.len());
        }
    }));
    config.redact = vec!["placeholder".into()];
    edit(&mut config);
    let source = StaticSource::new().with("model", Secret::new("sk-bench-key"));
    CredentialProxy::start(config, Arc::new(source), Arc::new(NullSink)).expect("proxy")
}

fn row(name: &str, base: &[Duration], other: &[Duration]) {
    let (b, o) = (median(base.to_vec()), median(other.to_vec()));
    println!(
        "| {name} | {} µs | {} µs | {:.3} |",
        b.as_micros(),
        o.as_micros(),
        o.as_secs_f64() / b.as_secs_f64()
    );
}

/// `n` rounds (and a tenth more to warm up) of each case on both connections, the pair's order
/// alternating by round so that work one leaves behind (the recorder's hashing and writing, on
/// its own thread) falls on the other as often as on itself. `out`: [case][connection].
fn sample(conns: &mut [Client; 2], cases: &[(&str, usize)], n: usize, out: &mut [Vec<Duration>]) {
    let warm = n / 10;
    for round in 0..n + warm {
        for (k, (target, want)) in cases.iter().enumerate() {
            for step in 0..2 {
                let i = if round % 2 == 0 { step } else { 1 - step };
                let d = timed(&mut conns[i], target, *want);
                if round >= warm {
                    out[2 * k + i].push(d);
                }
            }
        }
    }
}

fn main() {
    let n: usize = std::env::var("METASH_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let store = metash_store::Store::init(dir.path(), None).unwrap();
    // What the host keeps per exchange: its metadata and its bodies' blob names.
    type Kept = (Exchange, BlobRef, BlobRef);
    let tape: Arc<Mutex<Vec<Kept>>> = Arc::default();
    let (t2, s2) = (Arc::clone(&tape), store.clone());
    let plain = start(up.url(), |_| {});
    let recording = start(up.url(), |c| {
        c.recorder = Some(Arc::new(move |mut ex: Exchange| {
            let tapes = Tapes::new(&s2);
            let req = tapes.put_blob(&std::mem::take(&mut ex.request_body), false);
            let resp = tapes.put_blob(&std::mem::take(&mut ex.response_body), false);
            t2.lock().unwrap().push((ex, req.unwrap(), resp.unwrap()));
        }));
    });
    let big = format!("/big?n={BIG}");
    let cases = [("/v1/messages", 11), (big.as_str(), BIG)];
    // [small, big] x [plain, other]
    let mut rec: Vec<Vec<Duration>> = (0..4).map(|_| Vec::new()).collect();
    let mut conns = [Client::new(plain.addr()), Client::new(recording.addr())];
    sample(&mut conns, &cases, n, &mut rec);
    // Stopping the proxy delivers every recording still being masked.
    drop(conns);
    drop(recording);
    let mut ended = std::mem::take(&mut *tape.lock().unwrap());
    // Delivered as they ended; a replay matches them in the order they were asked.
    ended.sort_by_key(|e| (e.0.started, e.0.exchange));
    let tapes = Tapes::new(&store);
    let exchanges: Vec<Recorded> = ended
        .into_iter()
        .map(|(mut ex, req, resp)| {
            ex.request_body = tapes.blob(&req.sha256).unwrap();
            ex.response_body = tapes.blob(&resp.sha256).unwrap();
            Recorded::from(ex)
        })
        .collect();
    let recorded_bytes: usize = exchanges
        .iter()
        .map(|e| e.request_body.len() + e.chunks.iter().map(|c| c.len()).sum::<usize>())
        .sum();
    let count = exchanges.len();
    let cassette = Arc::new(Cassette::new(exchanges));
    let replay = start("http://127.0.0.1:9".into(), |c| {
        c.replay = Some(Arc::clone(&cassette));
    });
    let mut rep: Vec<Vec<Duration>> = (0..4).map(|_| Vec::new()).collect();
    let mut conns = [Client::new(plain.addr()), Client::new(replay.addr())];
    sample(&mut conns, &cases, n, &mut rep);
    assert!(cassette.finished(), "{:?}", cassette.divergence());
    println!("recording and replay at the credential proxy, {n} rounds interleaved (loopback)");
    println!("| case | live, not recorded | live recorded / replayed | × |");
    println!("|---|---|---|---|");
    row("small answer, recorded", &rec[0], &rec[1]);
    row("256 KiB streamed answer, recorded", &rec[2], &rec[3]);
    row("small answer, replayed", &rep[0], &rep[1]);
    row("256 KiB streamed answer, replayed", &rep[2], &rep[3]);
    println!("{count} exchanges recorded, {recorded_bytes} body bytes (blobs deduplicated)");
}
