//! The SDKs' round trip (issue 20), side by side in one run: one `input` to its first `output`
//! chunk, for the smallest agent in Rust (`metash-agent`'s `echo` example), TypeScript
//! (`examples/sdk-typescript/echo.mjs`) and Python (`examples/sdk-python/echo.py`, as built by
//! their `build.sh`). Each runs natively in metash's sandbox, started once; the invocations are
//! interleaved (one of each per round) so a load change on this shared machine hits all alike.
//! Also the cold start (start + first invocation) of each. `cargo bench -p metash-runtime --bench
//! sdk_round_trip`; under `cargo test --all-targets` a few rounds as a smoke test. Not a timed
//! test: it prints, it asserts only that every round trip happened.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_protocol::{AgentEvent, Manifest, SandboxKind};
use metash_runtime::{Agent, AgentSpec, EventSink, NullSink, Runtime, RuntimeConfig};
use metash_testkit::sdk::{self, Lang};

struct Case {
    name: &'static str,
    entry: PathBuf,
    package: Option<PathBuf>,
}

fn spec(case: &Case, ws: &Path) -> AgentSpec {
    let mut m = Manifest::new("bench", "x", SandboxKind::Native);
    m.resources.mem = Some("512Mi".into());
    let mut s = AgentSpec::new(format!("rt-{}", case.name), m, &case.entry, ws);
    s.allow_native = true;
    s.package = case.package.clone();
    s.timeout = Duration::from_secs(60);
    // The event rate limit is policy, not SDK cost: at this pace (Rust's echo writes three events
    // a round) the default 2,000/s would be what is measured.
    s.throttle = metash_runtime::Throttle {
        rate: 1e9,
        burst: 1e9,
    };
    s
}

/// One invocation: (time to the first output chunk, time to the end).
fn round_trip(agent: &mut Agent) -> (Duration, Duration) {
    let t = Instant::now();
    let mut first = None;
    agent
        .invoke("ping", &[], &mut |e| {
            if matches!(e, AgentEvent::Output { .. }) && first.is_none() {
                first = Some(t.elapsed());
            }
        })
        .unwrap();
    let end = t.elapsed();
    (first.expect("an output chunk"), end)
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn cases(dir: &Path) -> Result<Vec<Case>, String> {
    let rust = metash_testkit::build_example("echo", None)?;
    let mut out = vec![Case {
        name: "rust",
        entry: rust,
        package: None,
    }];
    for lang in Lang::ALL {
        let dest = dir.join(lang.name());
        sdk::build(lang, &dest)?;
        out.push(Case {
            name: lang.name(),
            entry: dest.join(lang.entry("echo")),
            package: Some(dest),
        });
    }
    Ok(out)
}

fn main() {
    if let Some(why) = sdk::missing() {
        return metash_testkit::skip("sdk round-trip bench", &why);
    }
    if metash_runtime::native::isolate::landlock_abi() < 4 {
        return metash_testkit::skip("sdk round-trip bench", "no Landlock ABI >= 4 here");
    }
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("METASH_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 10 } else { 2000 });
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let cases = cases(dir.path()).unwrap();
    let sink: Arc<dyn EventSink> = Arc::new(NullSink);
    let rt = Runtime::new(
        RuntimeConfig {
            cache_dir: dir.path().join("cache"),
            cache_key: metash_runtime::CacheKey::ephemeral().expect("cache key"),
        },
        sink,
    )
    .unwrap();
    // Cold: a fresh agent each time, start + first invocation (a few, interleaved).
    let mut cold: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    for _ in 0..if quick { 1 } else { 15 } {
        for (i, c) in cases.iter().enumerate() {
            let t = Instant::now();
            let mut a = rt.register(spec(c, &ws)).unwrap();
            a.start().unwrap();
            round_trip(&mut a);
            cold[i].push(t.elapsed());
            a.shutdown().unwrap();
        }
    }
    let mut agents: Vec<Agent> = cases
        .iter()
        .map(|c| {
            let mut a = rt.register(spec(c, &ws)).unwrap();
            a.start().unwrap();
            a
        })
        .collect();
    let mut first: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    let mut whole: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    for round in 0..n + 20 {
        for (i, a) in agents.iter_mut().enumerate() {
            let (f, w) = round_trip(a);
            if round >= 20 {
                first[i].push(f);
                whole[i].push(w);
            }
        }
    }
    report(&cases, &mut first, &mut whole, &mut cold, n);
    for a in &mut agents {
        a.shutdown().unwrap();
    }
}

fn report(
    cases: &[Case],
    first: &mut [Vec<Duration>],
    whole: &mut [Vec<Duration>],
    cold: &mut [Vec<Duration>],
    n: usize,
) {
    let base = percentile(&mut first[0], 0.5);
    println!("\n{n} round trips per agent, interleaved; native sandbox; 'x rust' is the median against Rust's");
    println!(
        "{:<12} {:>14} {:>10} {:>12} {:>16} {:>16}",
        "agent", "input->chunk", "x rust", "p99", "input->done", "cold start"
    );
    for (i, c) in cases.iter().enumerate() {
        let med = percentile(&mut first[i], 0.5);
        println!(
            "{:<12} {:>11.1} us {:>9.2}x {:>9.1} us {:>13.1} us {:>13.1} ms",
            c.name,
            us(med),
            med.as_secs_f64() / base.as_secs_f64(),
            us(percentile(&mut first[i], 0.99)),
            us(percentile(&mut whole[i], 0.5)),
            percentile(&mut cold[i], 0.5).as_secs_f64() * 1e3,
        );
    }
}
