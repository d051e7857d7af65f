//! `cargo bench -p metash-host --bench acp_turn`: one turn of each real ACP agent
//! (claude-code-acp, codex-acp) as a metash role (`Host::spawn_agent`: the user's consent, the
//! credential proxy with its usage tap, the native sandbox, every event to the log) against the
//! same agent driven by a bare ACP client (metash's ACP client with no sandbox, no proxy, no
//! host: the agent talks to the model directly), side by side in one run, against the same
//! loopback model. Each turn runs one shell tool call and answers. Alternating runs, medians of
//! N (METASH_BENCH_N, default 7). The bar: under metash / bare ≤ 1.05.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_harness::acp::{self, AcpHost, End, StopReason, Subject};
use metash_harness::CancellationToken;
use metash_host::config::HostConfig;
use metash_host::sandbox::RoleConfiner;
use metash_host::{Host, HostOptions, SpawnRequest, Spawner};
use metash_protocol::{
    AgentStatus, HarnessFrontend, InteractionMode, IoMode, ProcessInvocationSpec, ProviderDomain,
};
use metash_runtime::NullSink;
use metash_testkit::acp::AcpAgent;
use metash_testkit::anthropic::ModelServer;

const KEY: &str = "sk-bench-acp";

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

/// The bare client's side: every permission allowed, files read and written as asked (what an
/// editor with no sandbox does).
struct Bare;

impl AcpHost for Bare {
    fn permission(&self, _subject: &Subject) -> bool {
        true
    }
    fn read_text_file(&self, path: &str) -> Result<String, String> {
        std::fs::read_to_string(path).map_err(|e| e.to_string())
    }
    fn write_text_file(&self, path: &str, content: &str) -> Result<(), String> {
        std::fs::write(path, content).map_err(|e| e.to_string())
    }
}

/// One turn of `agent` by the bare client, in `ws`, its HOME a fresh directory, talking to the
/// model at `base` itself; with `sandboxed`, confined as a metash spawn confines it (the host's
/// `RoleConfiner`) but with no proxy, consent or log: what the sandbox alone costs.
fn bare_turn(
    rt: &tokio::runtime::Runtime,
    agent: AcpAgent,
    bin: &Path,
    base: &str,
    sandboxed: bool,
) -> Duration {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let mut env = BTreeMap::new();
    if !sandboxed {
        // The sandbox gives the agent a HOME of its own in the spawn directory.
        env.insert("HOME".to_string(), home.path().display().to_string());
    }
    let (provider, frontend, argv) = match agent {
        AcpAgent::ClaudeCode => {
            env.insert("ANTHROPIC_API_KEY".into(), KEY.into());
            env.insert("ANTHROPIC_BASE_URL".into(), base.into());
            env.insert("ANTHROPIC_MODEL".into(), "claude-sonnet-4-5".into());
            // Run as root (as the bench may be), Claude Code refuses to skip its permission
            // prompts unless told it is in a sandbox (under metash's sandbox it starts without).
            env.insert("IS_SANDBOX".into(), "1".into());
            for k in [
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
                "DISABLE_TELEMETRY",
                "DISABLE_AUTOUPDATER",
                "DISABLE_ERROR_REPORTING",
                "DISABLE_INSTALLATION_CHECKS",
            ] {
                env.insert(k.into(), "1".into());
            }
            let argv = agent.command(bin, base);
            (ProviderDomain::Anthropic, HarnessFrontend::AgentSdk, argv)
        }
        AcpAgent::Codex => {
            env.insert("OPENAI_API_KEY".into(), KEY.into());
            let argv = agent.command(bin, &format!("{base}/v1"));
            (ProviderDomain::Openai, HarnessFrontend::PiSdk, argv)
        }
    };
    let spec = ProcessInvocationSpec {
        provider,
        frontend,
        argv,
        cwd: ws.path().display().to_string(),
        env,
        interaction_mode: InteractionMode::Headless,
        io_mode: IoMode::Pipes,
        continuation: None,
        display_command: None,
    };
    let confiner = sandboxed.then(|| confiner(agent, bin, base, home.path()));
    let cancel = CancellationToken::new();
    let turn = acp::AcpTurn {
        spec: &spec,
        confiner: confiner
            .as_ref()
            .map(|c| c as &dyn metash_harness::Confiner),
        prompt: "You are a bench.\n\nBench turn.",
        mcp_servers: Vec::new(),
        timeout: Some(Duration::from_secs(120)),
        cancel: &cancel,
        host: Arc::new(Bare),
    };
    let t = Instant::now();
    let out = rt.block_on(acp::run_turn(turn, &mut |_| {})).unwrap();
    let wall = t.elapsed();
    assert_eq!(
        out.end,
        End::Stopped(StopReason::EndTurn),
        "{}",
        out.stderr_tail
    );
    assert!(out.text.contains("done"), "{}", out.text);
    assert!(ws.path().join("bench.txt").exists(), "the command ran");
    wall
}

/// The host's sandbox for the role, its spawn directory in `spawn`, the model's port the one
/// it may reach.
fn confiner(agent: AcpAgent, bin: &Path, base: &str, spawn: &Path) -> RoleConfiner {
    let config = HostConfig::parse(&agent.role("coder", bin, base), Path::new("b.toml")).unwrap();
    let mut c = RoleConfiner::new(
        "coder",
        &config.roles["coder"],
        spawn,
        Duration::from_secs(120),
        |k| std::env::var(k).ok(),
        Arc::new(NullSink),
    );
    c.fence.connect_ports = vec![base.rsplit(':').next().unwrap().parse().unwrap()];
    c
}

/// A project whose role `coder` is `agent` against `base`, and its host (native allowed).
fn project(agent: AcpAgent, bin: &Path, base: &str) -> (tempfile::TempDir, Host) {
    let dir = tempfile::tempdir().unwrap();
    metash_store::Store::init(dir.path(), Some("# Project: bench\n")).unwrap();
    std::fs::write(
        dir.path().join(".meta/config.toml"),
        agent.role("coder", bin, base),
    )
    .unwrap();
    let host = Host::open(
        dir.path(),
        HostOptions::silent()
            .with_env("METASH_TEST_CLI_KEY", KEY)
            .with_yes_to(["native".parse().unwrap()]),
    )
    .unwrap();
    (dir, host)
}

/// One turn of the role under metash.
fn metash_turn(host: &Host, dir: &Path) -> Duration {
    let _ = std::fs::remove_file(dir.join("bench.txt"));
    let mut req = SpawnRequest::new("coder", "You are a bench.", "Bench turn.");
    req.options.timeout_seconds = Some(120.0);
    let t = Instant::now();
    let r = host.spawn_agent(&req).unwrap();
    let wall = t.elapsed();
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(dir.join("bench.txt").exists(), "the command ran");
    wall
}

fn main() {
    // Under `cargo test --all-targets` (no `--bench`): one round, as a smoke test of the setup.
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("METASH_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 7 });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("ACP agent turn (one shell tool call, then the answer), median of {n}:");
    println!(
        "{:<16} {:>10} {:>12} {:>10} {:>8}",
        "agent", "bare", "sandbox only", "metash", "ratio"
    );
    for agent in AcpAgent::ALL {
        let Some(bin) = agent.bin() else {
            println!("{:<16} not installed (run scripts/setup)", agent.name());
            continue;
        };
        let cli = agent.wire();
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
        let (dir, host) = project(agent, &bin, &server.base);
        if !quick {
            // Warm-up: page cache, node's compile cache.
            bare_turn(&rt, agent, &bin, &server.base, false);
            bare_turn(&rt, agent, &bin, &server.base, true);
            metash_turn(&host, dir.path());
        }
        let (mut bare, mut boxed, mut under) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            bare.push(bare_turn(&rt, agent, &bin, &server.base, false));
            boxed.push(bare_turn(&rt, agent, &bin, &server.base, true));
            under.push(metash_turn(&host, dir.path()));
        }
        let (b, x, s) = (median(bare), median(boxed), median(under));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{:<16} {:>8.0}ms {:>10.0}ms {:>8.0}ms {:>7.3}x",
            agent.name(),
            ms(b),
            ms(x),
            ms(s),
            s.as_secs_f64() / b.as_secs_f64()
        );
    }
}
