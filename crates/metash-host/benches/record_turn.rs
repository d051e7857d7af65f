//! `cargo bench -p metash-host --bench record_turn`: what recording costs a whole live turn, and
//! what a replayed turn costs (issue 36 asks ≤ 1.05× and ≤ 1.0×). pi runs one turn (a shell tool
//! call, then the answer) through `Host::spawn_agent` against a loopback model, in three projects
//! side by side: `[record] enabled = false`, recording (the default), and replaying (the host's
//! credential proxy answering from the project's own first tape, as `metash replay` runs it:
//! `Host::replay_from`, the loopback model never asked; `benches/replay_turn.rs` compares the
//! two alone, alternating). Rotating order, medians of N (METASH_BENCH_N, default 7); bytes stored per turn
//! printed. Codex and Claude Code are not replayed: their requests differ from run to run
//! (docs/replay.md). Under `cargo test --all-targets` (no `--bench`) one round, as a smoke test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_host::{Host, HostOptions, SpawnRequest, Spawner};
use metash_protocol::AgentStatus;
use metash_runtime::credential::Cassette;
use metash_store::tape::Tapes;
use metash_store::Store;
use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

const CLI: Cli = Cli::Pi;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

/// A project whose role `coder` is pi against `base`, with `extra` config.
fn project(tools: &Path, base: &str, extra: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    Store::init(d.path(), None).unwrap();
    std::os::unix::fs::symlink(tools, d.path().join(".tools")).unwrap();
    let role = CLI.role("coder", base);
    std::fs::write(d.path().join(".meta/config.toml"), format!("{role}{extra}")).unwrap();
    d
}

fn turn(ws: &Path) -> Duration {
    turn_from(ws, None)
}

/// A turn, replaying `cassette` when given.
fn turn_from(ws: &Path, cassette: Option<Arc<Cassette>>) -> Duration {
    let host = Host::open(
        ws,
        HostOptions::silent()
            .with_env("METASH_TEST_CLI_KEY", "sk-bench-key-0123456789")
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

/// A fresh cassette of `tape` in `ws` (each is played once).
fn cassette(ws: &Path, tape: &str) -> Arc<Cassette> {
    let store = Store::open(ws).unwrap();
    Arc::new(metash_host::tape_cassette(&store, tape).unwrap())
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("METASH_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 7 });
    let Some(tools) = CLI.tools() else {
        println!("{} not installed (run scripts/setup)", CLI.name());
        return;
    };
    let tools = std::fs::canonicalize(tools).unwrap();
    let server = ModelServer::start(|c| {
        let body = c.text();
        if !body.contains("Bench turn.") {
            return CLI.text("ok");
        }
        match CLI.results(&body) {
            0 => CLI.shell(0, &body, "echo bench > bench.txt && cat bench.txt"),
            _ => CLI.text("done"),
        }
    });
    let off = project(&tools, &server.base, "\n[record]\nenabled = false\n");
    let on = project(&tools, &server.base, "");
    // The tape every replay answers from, recorded in the project it is replayed in (pi's
    // requests name its working directory).
    let replayed = project(&tools, &server.base, "");
    turn(replayed.path());
    let store = Store::open(replayed.path()).unwrap();
    let first = Tapes::new(&store).list().unwrap();
    let (tape, bytes) = (first[0].id.clone(), first[0].bytes);
    let asked = server.posts().len();
    let mut times: [Vec<Duration>; 3] = Default::default();
    for round in 0..n {
        for step in 0..3 {
            let which = (round + step) % 3;
            let d = match which {
                0 => turn(off.path()),
                1 => turn(on.path()),
                _ => turn_from(replayed.path(), Some(cassette(replayed.path(), &tape))),
            };
            times[which].push(d);
        }
    }
    let live_asks = 2 * n * (asked);
    assert_eq!(
        server.posts().len(),
        asked + live_asks,
        "a replay asked the model"
    );
    let [off_t, on_t, rep_t] = times.map(median);
    println!(
        "{} turn through Host::spawn_agent (one shell tool call, then the answer), median of {n}:",
        CLI.name()
    );
    println!("| turn | median | × not recorded |");
    println!("|---|---|---|");
    for (name, t) in [
        ("live, not recorded", off_t),
        ("live, recorded", on_t),
        ("replayed", rep_t),
    ] {
        println!(
            "| {name} | {} ms | {:.3} |",
            t.as_millis(),
            t.as_secs_f64() / off_t.as_secs_f64()
        );
    }
    println!("bytes stored for the turn (request and response bodies): {bytes}");
}
