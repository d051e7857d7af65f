//! `cargo bench -p metash-host --bench acp_turn`: one turn of each real ACP agent
//! (claude-code-acp, codex-acp) as a metash role (`Host::spawn_agent`: the user's consent, the
//! credential proxy with its usage tap, the native sandbox, every event to the log) against the
//! same agent driven by a bare ACP client (metash's ACP client with no sandbox, no proxy, no
//! host: the agent talks to the model directly), side by side in one run, against the same
//! loopback model. Each turn runs one shell tool call and answers. Alternating runs, medians of
//! N (METASH_BENCH_N, default 9) with their spread and the load. The bar: under metash /
//! bare ≤ 1.05. Each metash turn is on a task of its own, so it opens a new ACP session as the
//! bare client's does (docs/acp.md, "Continuity").

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
        keep_session: true,
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

/// One turn of the role under metash, on a task of its own (`task`): a new ACP session, as the
/// bare client's, not the continuation of the last one (docs/acp.md, "Continuity").
fn metash_turn(host: &Host, dir: &Path, task: &str) -> Duration {
    let _ = std::fs::remove_file(dir.join("bench.txt"));
    let mut req = SpawnRequest::new("coder", "You are a bench.", "Bench turn.");
    req.options.timeout_seconds = Some(120.0);
    req.task_id = Some(task.to_string());
    let t = Instant::now();
    let r = host.spawn_agent(&req).unwrap();
    let wall = t.elapsed();
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(dir.join("bench.txt").exists(), "the command ran");
    wall
}

/// Removes the spawn directories metash kept for the bench's tasks (docs/acp.md, "Continuity":
/// each named by a record under `.meta/acp/`).
fn remove_kept(project: &Path) {
    let mut dirs = vec![project.join(".meta/acp")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if let Ok(b) = std::fs::read(&p) {
                let rec: serde_json::Value = serde_json::from_slice(&b).unwrap_or_default();
                if let Some(kept) = rec["spawn_dir"].as_str() {
                    let _ = std::fs::remove_dir_all(kept);
                }
            }
        }
    }
}

/// `n` alternating rounds of `agent` (bare, sandbox only, metash): each side's walls.
fn measure(
    rt: &tokio::runtime::Runtime,
    agent: AcpAgent,
    bin: &Path,
    n: usize,
    quick: bool,
) -> [Vec<Duration>; 3] {
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
    let (dir, host) = project(agent, bin, &server.base);
    if !quick {
        // Warm-up: page cache, node's compile cache.
        bare_turn(rt, agent, bin, &server.base, false);
        bare_turn(rt, agent, bin, &server.base, true);
        metash_turn(&host, dir.path(), "warm");
    }
    let mut walls: [Vec<Duration>; 3] = Default::default();
    for i in 0..n {
        walls[0].push(bare_turn(rt, agent, bin, &server.base, false));
        walls[1].push(bare_turn(rt, agent, bin, &server.base, true));
        walls[2].push(metash_turn(&host, dir.path(), &format!("t{i}")));
    }
    remove_kept(dir.path());
    walls
}

/// The machine's load averages, as `uptime` gives them.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    // Under `cargo test --all-targets` (no `--bench`): one round, as a smoke test of the setup.
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::var("METASH_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 9 });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("ACP agent turn (one shell tool call, then the answer), median [min-max] of {n}:");
    println!(
        "{:<16} {:>18} {:>18} {:>18} {:>8} {:>8}",
        "agent", "bare", "sandbox only", "metash", "ratio", "paired"
    );
    // METASH_BENCH_AGENT=codex-acp (or claude-code-acp): that agent only.
    let only = std::env::var("METASH_BENCH_AGENT").ok();
    for agent in AcpAgent::ALL {
        if only.as_deref().is_some_and(|o| o != agent.name()) {
            continue;
        }
        let Some(bin) = agent.bin() else {
            println!("{:<16} not installed (run scripts/setup)", agent.name());
            continue;
        };
        let before = load();
        let walls = measure(&rt, agent, &bin, n, quick);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let col = |xs: &Vec<Duration>| {
            let (lo, hi) = (xs.iter().min().unwrap(), xs.iter().max().unwrap());
            format!(
                "{:.0} [{:.0}-{:.0}]",
                ms(median(xs.clone())),
                ms(*lo),
                ms(*hi)
            )
        };
        // Each round's metash turn against the bare turn just before it (same load), then the
        // median of those: steadier than the ratio of the medians on a busy machine.
        let mut paired: Vec<f64> = walls[2]
            .iter()
            .zip(&walls[0])
            .map(|(m, b)| m.as_secs_f64() / b.as_secs_f64())
            .collect();
        paired.sort_by(f64::total_cmp);
        println!(
            "{:<16} {:>18} {:>18} {:>18} {:>7.3}x {:>7.3}x   (load {before} -> {})",
            agent.name(),
            col(&walls[0]),
            col(&walls[1]),
            col(&walls[2]),
            median(walls[2].clone()).as_secs_f64() / median(walls[0].clone()).as_secs_f64(),
            paired[paired.len() / 2],
            load()
        );
    }
}
