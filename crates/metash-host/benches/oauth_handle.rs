//! Issue 16's figure: a request through an OAuth handle (metash's credential proxy checking the
//! agent's grant and putting the person's real token in) against the same request straight to
//! the loopback API, side by side in one run (`cargo bench -p metash-host --bench oauth_handle`).
//! The token is a real one, from a device login against a real OIDC server (`oidc-provider`,
//! Chromium confirming the code). Small requests, on a kept-alive connection and on a new
//! connection each, interleaved one of each per round so load on a shared machine hits both
//! alike. `METASH_BENCH_N` sets the rounds (2,000). It prints; it does not assert a speed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/oauth_world.rs"]
mod oauth_world;
#[allow(dead_code)]
#[path = "../../metash-runtime/tests/suite/upstream.rs"]
mod upstream;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use upstream::{Client, Upstream};

fn timed(f: impl FnOnce() -> usize) -> Duration {
    let t = Instant::now();
    let n = f();
    let d = t.elapsed();
    assert_eq!(n, 11, "the API's answer, whole");
    d
}

fn quantile(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * q) as usize]
}

/// `n` rounds (after a tenth more to warm up), each a request on a kept-alive connection and on
/// a new one, straight (`direct`) and through the handle (`via`): [kept-alive, new] x [direct, handle].
fn measure(
    n: usize,
    direct: SocketAddr,
    via: SocketAddr,
    targets: [&String; 2],
) -> Vec<Vec<Duration>> {
    let mut conns = [Client::new(direct), Client::new(via)];
    let mut samples: Vec<Vec<Duration>> = (0..4).map(|_| Vec::with_capacity(n)).collect();
    for round in 0..n + n / 10 {
        let warm = round < n / 10;
        for (i, addr) in [direct, via].into_iter().enumerate() {
            let ka = timed(|| conns[i].get(targets[i]));
            let fresh = timed(|| Client::new(addr).get(targets[i]));
            if !warm {
                samples[i].push(ka);
                samples[2 + i].push(fresh);
            }
        }
    }
    samples
}

fn main() {
    let (tools, chromium) = match metash_testkit::oidc::prerequisites() {
        Ok(p) => p,
        Err(why) => return metash_testkit::skip("oauth handle bench", &why),
    };
    // Under `cargo test --all-targets` (no `--bench`): a few rounds, as a smoke test.
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("METASH_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 20 } else { 2000 });
    let api = Upstream::start();
    let w = oauth_world::world_on(
        &tools,
        &chromium,
        3600,
        7200,
        (api.addr, Default::default()),
    );
    let cap: metash_policy::Capability = "oauth:test.repo".parse().unwrap();
    let registry = metash_policy::Registry::discover(&metash_policy::AgentDirs::new(&w.root, None));
    metash_policy::Policy::new(w.host.store().clone(), registry)
        .grant("fetcher", &cap, 3600, false, "bench")
        .unwrap();
    let handles = metash_host::oauth::start(&w.host, "fetcher", std::slice::from_ref(&cap))
        .unwrap()
        .expect("a handle for a live grant");
    let base = &handles.handles[0].base_url;
    let rest = base.trim_start_matches("http://");
    let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let via: SocketAddr = authority.parse().unwrap();
    let (direct_target, via_target) = ("/v1/repos".to_string(), format!("{prefix}/v1/repos"));

    let samples = measure(n, api.addr, via, [&direct_target, &via_target]);
    // Every request through the handle reached the API with the real token, never the guess.
    let seen = api.seen();
    let through: Vec<_> = seen.iter().filter(|s| s.target == "/v1/repos").collect();
    let bearer = format!("Bearer {}", w.real.expose());
    let with_token = through
        .iter()
        .filter(|s| s.header("authorization") == Some(bearer.as_str()))
        .count();
    assert_eq!(
        with_token * 2,
        through.len(),
        "half the requests went through the handle"
    );

    println!("OAuth handle vs straight to the API, {n} rounds interleaved (loopback)");
    println!(
        "| case | direct median | handle median | added | × direct | direct p99 | handle p99 |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (k, name) in ["kept-alive connection", "new connection each"]
        .iter()
        .enumerate()
    {
        let (d, h) = (&mut samples[2 * k].clone(), &mut samples[2 * k + 1].clone());
        let (dm, hm) = (quantile(d, 0.5), quantile(h, 0.5));
        println!(
            "| {name} | {} µs | {} µs | {} µs | {:.2} | {} µs | {} µs |",
            dm.as_micros(),
            hm.as_micros(),
            hm.as_micros() as i128 - dm.as_micros() as i128,
            hm.as_secs_f64() / dm.as_secs_f64(),
            quantile(d, 0.99).as_micros(),
            quantile(h, 0.99).as_micros(),
        );
    }
}
