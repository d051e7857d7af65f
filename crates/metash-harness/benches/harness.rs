//! Figures for the harness layer, in one run against the same loopback server (not a timed test):
//!
//! 1. Wall time of a turn through `run_turn_non_interactive` versus the same CLI run directly with
//!    the same argv/env/cwd (Claude Code via `agent-sdk`, Codex via `codex-cli`): the overhead
//!    ratio (target ≤ 1.05).
//! 2. A long Anthropic SSE stream: time to first token and tokens/s through the full client,
//!    versus reading the raw bytes of the same response; and the SSE parser alone in memory
//!    (target ≥ 100 MB/s).
//!
//! `cargo bench -p metash-harness` (set `METASH_BENCH_RUNS` for more turns per side).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/suite/support.rs"]
#[allow(dead_code)]
mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_harness::api::sse::SseParser;
use metash_harness::{
    build_process_invocation_spec, CancellationToken, Endpoint, Harness, Program,
    RunTurnNonInteractiveRequest,
};
use metash_protocol::{HarnessEvent, HarnessFrontend};
use serde_json::json;
use support::*;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn turn_request(
    server: &MockServer,
    frontend: HarnessFrontend,
    asp: &std::path::Path,
    cwd: &std::path::Path,
) -> RunTurnNonInteractiveRequest {
    let mut req = RunTurnNonInteractiveRequest::new(frontend, asp, cwd, "bench prompt");
    req.options.isolated_home = true;
    req.options.skip_permissions = true;
    if frontend == HarnessFrontend::CodexCli {
        req.model = Some("gpt-5.1-codex".into());
        req.options.endpoint = Some(Endpoint {
            base_url: format!("{}/v1", server.base),
            api_key_env: Some("BENCH_KEY".into()),
            provider_name: Some("loopback".into()),
        });
        req.env.insert("BENCH_KEY".into(), "sk".into());
    } else {
        req.model = Some("claude-sonnet-4-5".into());
        req.options.endpoint = Some(Endpoint {
            base_url: server.base.clone(),
            api_key_env: None,
            provider_name: None,
        });
        req.env.insert("ANTHROPIC_API_KEY".into(), "sk".into());
    }
    req
}

/// Alternates harness and direct runs so machine noise hits both alike.
async fn overhead(
    h: &Harness,
    server: &MockServer,
    frontend: HarnessFrontend,
    runs: usize,
) -> Option<(f64, f64)> {
    let root = tempfile::tempdir().unwrap();
    let cwd = root.path().join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    let asp = root.path().join("asp");
    let req = turn_request(server, frontend, &asp, &cwd);
    let spec = build_process_invocation_spec(&req.invocation_request(), &h.programs)
        .ok()?
        .spec;
    let (mut via, mut direct) = (Vec::new(), Vec::new());
    let through_harness = || async {
        let t = Instant::now();
        let r = h
            .run_turn_non_interactive(&req, &CancellationToken::new(), &mut |_| {})
            .await
            .unwrap();
        assert!(r.result.success, "{:?}", r.result);
        t.elapsed().as_secs_f64()
    };
    let run_directly = || {
        let t = Instant::now();
        let mut child = Command::new(&spec.argv[0])
            .args(&spec.argv[1..])
            .current_dir(&spec.cwd)
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let _out = std::io::read_to_string(child.stdout.take().unwrap()).unwrap();
        assert!(child.wait().unwrap().success());
        t.elapsed().as_secs_f64()
    };
    for i in 0..=runs {
        // Alternate which goes first so drift in machine load hits both alike.
        let (a, b) = if i % 2 == 0 {
            let a = through_harness().await;
            (a, run_directly())
        } else {
            let b = run_directly();
            (through_harness().await, b)
        };
        if i > 0 {
            // The first pair warms caches (page cache of the binary, first-run setup).
            via.push(a);
            direct.push(b);
        }
    }
    Some((median(via), median(direct)))
}

fn long_anthropic_stream(deltas: usize) -> Vec<u8> {
    let mut s = String::new();
    let mut ev = |name: &str, data: serde_json::Value| {
        s.push_str(&format!("event: {name}\ndata: {data}\n\n"))
    };
    ev(
        "message_start",
        json!({"type":"message_start","message":{"id":"msg_b","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}),
    );
    ev(
        "content_block_start",
        json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
    );
    for i in 0..deltas {
        ev(
            "content_block_delta",
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":format!("token{i} ")}}),
        );
    }
    ev(
        "content_block_stop",
        json!({"type":"content_block_stop","index":0}),
    );
    ev(
        "message_delta",
        json!({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":deltas}}),
    );
    ev("message_stop", json!({"type":"message_stop"}));
    s.into_bytes()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = std::env::var("METASH_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    let deltas = 200_000;
    let body = Arc::new(long_anthropic_stream(deltas));
    let mb = body.len() as f64 / 1e6;
    let b2 = body.clone();
    let server = MockServer::start(move |c| {
        if c.path.starts_with("/v1/responses") {
            responses_text("bench answer")
        } else if String::from_utf8_lossy(&c.body).contains("LONG-STREAM") {
            Reply::RawSse(b2.clone())
        } else {
            anthropic_text("bench answer")
        }
    })
    .await;
    let mut h = Harness::new(programs()).unwrap();
    h.idle_timeout = Duration::from_secs(60);
    println!(
        "metash-harness bench (loopback server {}, {runs} turns per side)",
        server.base
    );

    for (frontend, program) in [
        (HarnessFrontend::AgentSdk, Program::Claude),
        (HarnessFrontend::CodexCli, Program::Codex),
    ] {
        if require(program).is_none() {
            continue;
        }
        match overhead(&h, &server, frontend, runs).await {
            Some((via, direct)) => println!(
                "turn {:<10} via run_turn_non_interactive {:>7.1} ms | direct same argv {:>7.1} ms | overhead ratio {:.3} (target <= 1.05)",
                frontend.as_str(),
                via * 1e3,
                direct * 1e3,
                via / direct
            ),
            None => println!("turn {}: could not build the spec", frontend.as_str()),
        }
    }

    // Raw bytes of the long response, same server, same request shape.
    let client = reqwest::Client::new();
    let t = Instant::now();
    let mut resp = client
        .post(format!("{}/v1/messages", server.base))
        .body(r#"{"messages":[{"role":"user","content":"LONG-STREAM"}]}"#)
        .send()
        .await
        .unwrap();
    let mut first_byte = None;
    let mut n = 0usize;
    while let Some(c) = resp.chunk().await.unwrap() {
        first_byte.get_or_insert_with(|| t.elapsed());
        n += c.len();
    }
    let raw = t.elapsed().as_secs_f64();
    assert_eq!(n, body.len());

    // The full client on the same stream: SSE + JSON + events.
    let root = tempfile::tempdir().unwrap();
    let mut req = RunTurnNonInteractiveRequest::new(
        HarnessFrontend::AnthropicApi,
        root.path(),
        root.path(),
        "LONG-STREAM",
    );
    req.model = Some("claude-sonnet-4-5".into());
    req.options.endpoint = Some(Endpoint {
        base_url: server.base.clone(),
        api_key_env: Some("BENCH_KEY".into()),
        provider_name: None,
    });
    let t = Instant::now();
    let mut first_token = None;
    let mut tokens = 0usize;
    let r = h
        .run_turn_non_interactive(&req, &CancellationToken::new(), &mut |e| {
            if let Some(HarnessEvent::TextDelta { .. }) = e.payload {
                first_token.get_or_insert_with(|| t.elapsed());
                tokens += 1;
            }
        })
        .await
        .unwrap();
    let full = t.elapsed().as_secs_f64();
    assert!(r.result.success, "{:?}", r.result);
    assert_eq!(tokens, deltas);
    println!(
        "long SSE stream {mb:.1} MB, {deltas} text deltas: raw bytes {:.1} ms ({:.0} MB/s, first byte {:.2} ms) | full client {:.1} ms ({:.0} tokens/s, {:.0} MB/s, first token {:.2} ms) | client/raw time ratio {:.2}",
        raw * 1e3,
        mb / raw,
        first_byte.unwrap_or_default().as_secs_f64() * 1e3,
        full * 1e3,
        tokens as f64 / full,
        mb / full,
        first_token.unwrap_or_default().as_secs_f64() * 1e3,
        full / raw
    );

    // The SSE parser alone, in memory, in 16 KiB chunks as a socket delivers them.
    let mut best = f64::MAX;
    let mut events = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let mut p = SseParser::new();
        events = 0;
        for c in body.chunks(16 * 1024) {
            p.feed(c, &mut |_| events += 1);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    let mut json_best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let mut p = SseParser::new();
        for c in body.chunks(16 * 1024) {
            p.feed(c, &mut |e| {
                let _v: serde_json::Value = serde_json::from_str(&e.data).unwrap();
            });
        }
        json_best = json_best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "SSE parser alone: {:.0} MB/s ({events} events; target >= 100 MB/s) | parser + JSON decode: {:.0} MB/s",
        mb / best,
        mb / json_best
    );
}
