//! `cargo bench -p metash-host --bench replay_turn`: a replayed turn against the same turn live,
//! in the same run (issue 36 asks ≤ 1.0×). Two roles, each through `Host::spawn_agent` against a
//! loopback model:
//!
//! - pi (one shell tool call, then the answer): live (recorded, the default) in one project, and
//!   replayed in another from that project's own first tape, the way `metash replay` runs it
//!   (`Host::replay_from`: the role's credential proxy answers from the cassette, no upstream);
//! - an API role (`anthropic-api`, one request), the same way.
//!
//! Rounds alternate live and replay, the order swapped every round (live, replay, replay, live,
//! ...); each replay gets a fresh cassette, loaded from the tape before the turn is timed (its
//! load time is reported apart: `metash replay` pays it once per replay). Printed: medians, the
//! median of the per-round replay/live ratios with its quartiles and extremes (the spread), the
//! bytes stored per turn, and the load average before and after. METASH_BENCH_N rounds (default
//! 15 for pi, 10× that for the API role); under `cargo test --all-targets` one round, as a smoke
//! test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_host::{Host, HostOptions, SpawnRequest, Spawner};
use metash_protocol::AgentStatus;
use metash_runtime::credential::Cassette;
use metash_store::tape::Tapes;
use metash_store::Store;
use metash_testkit::anthropic::{sse_text, ModelServer};
use metash_testkit::cli::Cli;

const CLI: Cli = Cli::Pi;
const KEY: &str = "sk-bench-key-0123456789";

fn project(tools: Option<&Path>, config: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    Store::init(d.path(), None).unwrap();
    if let Some(tools) = tools {
        std::os::unix::fs::symlink(tools, d.path().join(".tools")).unwrap();
    }
    std::fs::write(d.path().join(".meta/config.toml"), config).unwrap();
    d
}

fn api_role(base: &str) -> String {
    format!(
        "[roles.coder]\nfrontend = \"anthropic-api\"\nmodel_smart = \"bench-model\"\n\
         base_url = \"{base}\"\napi_key_env = \"METASH_TEST_CLI_KEY\"\nmax_tokens = 64\n"
    )
}

/// One turn of `coder`, timed from the spawn to its answer (the host opened before), replaying
/// `cassette` when given.
fn turn(ws: &Path, cassette: Option<Arc<Cassette>>) -> Duration {
    let host = Host::open(
        ws,
        HostOptions::silent()
            .with_env("METASH_TEST_CLI_KEY", KEY)
            .with_yes_to(["native".parse().unwrap()]),
    )
    .unwrap();
    if let Some(c) = cassette {
        host.replay_from(c);
    }
    let mut req = SpawnRequest::new("coder", "You are a test.", "Bench turn.");
    req.options.timeout_seconds = Some(120.0);
    let t = Instant::now();
    let r = host.spawn_agent(&req).unwrap();
    let wall = t.elapsed();
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(r.data.contains("done"), "{}", r.data);
    wall
}

/// The first tape of `ws`: its id and the body bytes it stored.
fn first_tape(ws: &Path) -> (String, u64) {
    let store = Store::open(ws).unwrap();
    let list = Tapes::new(&store).list().unwrap();
    (list[0].id.clone(), list[0].bytes)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn median_ms(xs: &[Duration]) -> f64 {
    let mut v: Vec<f64> = xs.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    v.sort_by(f64::total_cmp);
    quantile(&v, 0.5)
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// `n` rounds of live (in `live`) and replayed (in `replayed`, from its tape `tape`) turns,
/// alternating; prints the figures under `name`.
fn compare(name: &str, n: usize, live: &Path, replayed: &Path, tape: &str, bytes: u64) {
    let store = Store::open(replayed).unwrap();
    let (mut l, mut r, mut loads, mut ratios) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..n {
        let t = Instant::now();
        let cassette = Arc::new(metash_host::tape_cassette(&store, tape).unwrap());
        loads.push(t.elapsed());
        let (a, b) = if round % 2 == 0 {
            let a = turn(live, None);
            (a, turn(replayed, Some(cassette)))
        } else {
            let b = turn(replayed, Some(cassette));
            (turn(live, None), b)
        };
        ratios.push(b.as_secs_f64() / a.as_secs_f64());
        if std::env::var_os("METASH_BENCH_ROUNDS").is_some() {
            eprintln!("{name} round {round}: live {a:?}, replay {b:?}");
        }
        l.push(a);
        r.push(b);
    }
    ratios.sort_by(f64::total_cmp);
    let (lm, rm) = (median_ms(&l), median_ms(&r));
    println!("{name}, {n} rounds alternating:");
    println!("| turn | median |");
    println!("|---|---|");
    println!("| live against the loopback model (recorded) | {lm:.2} ms |");
    println!("| replayed from its tape (model never asked) | {rm:.2} ms |");
    println!(
        "replay/live: {:.3} (medians); per-round ratio median {:.3}, quartiles {:.3}–{:.3}, \
         extremes {:.3}–{:.3}",
        rm / lm,
        quantile(&ratios, 0.5),
        quantile(&ratios, 0.25),
        quantile(&ratios, 0.75),
        ratios[0],
        ratios[ratios.len() - 1],
    );
    println!(
        "loading the cassette (not in the turn): median {:.3} ms; bytes stored per turn: {bytes}\n",
        median_ms(&loads)
    );
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("METASH_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 15 });
    println!("load average before: {}", load());
    let server = ModelServer::start(|c| {
        let body = c.text();
        if !body.contains("Bench turn.") {
            return CLI.text("ok");
        }
        if body.contains("\"bench-model\"") {
            return sse_text("done");
        }
        match CLI.results(&body) {
            0 => CLI.shell(0, &body, "echo bench > bench.txt && cat bench.txt"),
            _ => CLI.text("done"),
        }
    });
    // An API role: a one-request turn of a few milliseconds, so 10× the rounds.
    let live = project(None, &api_role(&server.base));
    let replayed = project(None, &api_role(&server.base));
    turn(replayed.path(), None);
    let (tape, bytes) = first_tape(replayed.path());
    let api_n = if quick { 1 } else { n * 10 };
    compare(
        "anthropic-api turn (one request)",
        api_n,
        live.path(),
        replayed.path(),
        &tape,
        bytes,
    );
    assert_eq!(server.posts().len(), 1 + api_n, "a replay asked the model");
    let Some(tools) = CLI.tools() else {
        println!("{} not installed (run scripts/setup)", CLI.name());
        return;
    };
    let tools = std::fs::canonicalize(tools).unwrap();
    let role = CLI.role("coder", &server.base);
    let live = project(Some(&tools), &role);
    // Replayed in the project it was recorded in: pi's requests name its working directory.
    let replayed = project(Some(&tools), &role);
    turn(replayed.path(), None);
    let (tape, bytes) = first_tape(replayed.path());
    let asked = server.posts().len();
    compare(
        &format!("{} turn (one shell tool call, then the answer)", CLI.name()),
        n,
        live.path(),
        replayed.path(),
        &tape,
        bytes,
    );
    // Each live pi turn asks what the recorded one asked; no replay asks anything.
    let per_turn = asked - 1 - api_n;
    assert_eq!(
        server.posts().len(),
        asked + n * per_turn,
        "a replay asked the model"
    );
    println!("load average after: {}", load());
}
