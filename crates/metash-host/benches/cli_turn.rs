//! `cargo bench -p metash-host --bench cli_turn`: one turn of each real coding CLI (Claude Code,
//! Codex, pi) under metash's native sandbox (the host's own `RoleConfiner`: Landlock, seccomp,
//! cleared environment, cgroup quotas, `.meta/` masked) against the same CLI run bare, side by
//! side in one run, against the same loopback model. Each turn runs one shell tool call and
//! answers. Alternating runs, medians of N (METASH_BENCH_N, default 7). The bar:
//! sandboxed / bare ≤ 1.05.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_harness::{
    CancellationToken, ConfinerHandle, Endpoint, Harness, Programs, RunTurnNonInteractiveRequest,
};
use metash_host::config::HostConfig;
use metash_host::sandbox::RoleConfiner;
use metash_protocol::HarnessFrontend;
use metash_runtime::NullSink;
use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn turn(
    h: &Harness,
    rt: &tokio::runtime::Runtime,
    cli: Cli,
    base: &str,
    ws: &Path,
    sandboxed: bool,
) -> Duration {
    let spawn = tempfile::tempdir().unwrap();
    let role_toml = cli.role("coder", base);
    let config = HostConfig::parse(&role_toml, Path::new("bench.toml")).unwrap();
    let role = &config.roles["coder"];
    let mut req = RunTurnNonInteractiveRequest::new(role.frontend, spawn.path(), ws, "Bench turn.");
    req.cp_session_id = "bench".into();
    req.model = role.model(None);
    req.timeout_ms = Some(120_000);
    req.options.isolated_home = true;
    req.options.skip_permissions = true;
    let url = role.base_url.clone().unwrap();
    req.options.endpoint = Some(Endpoint {
        base_url: url.clone(),
        api_key_env: Some(match role.frontend {
            HarnessFrontend::AgentSdk => "ANTHROPIC_API_KEY".into(),
            _ => "METASH_TEST_CLI_KEY".into(),
        }),
        provider_name: None,
    });
    for k in ["ANTHROPIC_API_KEY", "METASH_TEST_CLI_KEY"] {
        req.env.insert(k.into(), "sk-bench".into());
    }
    if sandboxed {
        let mut c = RoleConfiner::new(
            "coder",
            role,
            spawn.path(),
            Duration::from_secs(120),
            |k| std::env::var(k).ok(),
            Arc::new(NullSink),
        );
        c.fence.hidden = vec![ws.join(".meta")];
        c.fence.connect_ports = vec![url
            .trim_start_matches("http://")
            .split(['/', ':'])
            .nth(1)
            .unwrap()
            .parse()
            .unwrap()];
        req.confiner = ConfinerHandle::new(Arc::new(c));
    }
    let t = Instant::now();
    let r = rt
        .block_on(h.run_turn_non_interactive(&req, &CancellationToken::new(), &mut |_| {}))
        .unwrap();
    let wall = t.elapsed();
    assert!(r.result.success, "{:?}", r.result);
    wall
}

fn main() {
    // Under `cargo test --all-targets` (no `--bench`): one round, as a smoke test of the setup.
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("METASH_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 7 });
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools");
    let h = Harness::new(Programs::discover(Some(tools.parent().unwrap()))).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("cli turn (one shell tool call, then the answer), median of {n}:");
    println!(
        "{:<12} {:>10} {:>12} {:>8}",
        "cli", "bare", "sandboxed", "ratio"
    );
    for cli in [Cli::Claude, Cli::Codex, Cli::Pi] {
        if cli.tools().is_none() {
            println!("{:<12} not installed (run scripts/setup)", cli.name());
            continue;
        }
        let server = ModelServer::start(move |c| {
            let body = c.text();
            if !body.contains("Bench turn.") {
                return cli.text("ok");
            }
            match cli.results(&body) {
                0 => cli.shell(0, &body, "echo bench > bench.txt && cat bench.txt"),
                _ => cli.text("done"),
            }
        });
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ws.path().join(".meta")).unwrap();
        if !quick {
            // Warm-up: page cache, node's compile cache.
            turn(&h, &rt, cli, &server.base, ws.path(), false);
            turn(&h, &rt, cli, &server.base, ws.path(), true);
        }
        let (mut bare, mut boxed) = (Vec::new(), Vec::new());
        for _ in 0..n {
            bare.push(turn(&h, &rt, cli, &server.base, ws.path(), false));
            boxed.push(turn(&h, &rt, cli, &server.base, ws.path(), true));
        }
        let (b, s) = (median(bare), median(boxed));
        println!(
            "{:<12} {:>8.0}ms {:>10.0}ms {:>7.3}x",
            cli.name(),
            b.as_secs_f64() * 1e3,
            s.as_secs_f64() * 1e3,
            s.as_secs_f64() / b.as_secs_f64()
        );
    }
}
