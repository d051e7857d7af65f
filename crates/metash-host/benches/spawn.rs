//! `cargo bench -p metash-host --bench spawn`: what the host adds to a spawn (resolution, policy,
//! budget, checkpoint bookkeeping, durable event logging), against the raw runtime or harness call
//! on the same agent in the same run. Medians of N runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use metash_testkit::anthropic::{sse_text, ModelServer};
use metash_testkit::wasm::{agent_msg, wat_agent};

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metash_host::{Host, HostOptions, SpawnRequest, Spawner, Terminal};
use metash_protocol::{HarnessFrontend, Manifest, SandboxKind};
use metash_runtime::{AgentSpec, NullSink, Runtime, RuntimeConfig};

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn time(n: usize, mut f: impl FnMut()) -> Duration {
    f(); // warm-up (module cache, page cache)
    median(
        (0..n)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn manifest(sandbox: SandboxKind) -> Manifest {
    Manifest::new("bench", "x", sandbox)
}

fn register(ws: &Path, id: &str, sandbox: &str, entry: &Path) {
    let dir = ws.join(".meta/agents").join(id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("manifest.toml"),
        format!("schema_version = \"0.1\"\nname = \"{id}\"\nversion = \"0.1.0\"\nentry = {entry:?}\nsandbox = \"{sandbox}\"\n"),
    )
    .unwrap();
}

fn raw_agent(rt: &Runtime, ws: &Path, sandbox: SandboxKind, entry: &Path, prompt: &str) {
    let mut spec = AgentSpec::new("a", manifest(sandbox), entry, ws);
    spec.allow_native = true;
    spec.timeout = Duration::from_secs(30);
    let mut a = rt.register(spec).unwrap();
    a.start().unwrap();
    let out = a.invoke(prompt, &[], &mut |_| {}).unwrap();
    assert_eq!(
        out.status.agent_status(),
        metash_protocol::AgentStatus::Success
    );
    let _ = a.shutdown();
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let n = if quick { 3 } else { 41 };
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    metash_store::Store::init(ws, Some("# bench\n")).unwrap();
    let wat = ws.join("echo.wat");
    let out = agent_msg(
        r#"{"type":"output","agent_id":"a","chunk_id":"1","content_type":"text/plain","data":"hi"}"#,
    );
    std::fs::write(
        &wat,
        wat_agent(&[&out, &agent_msg(r#"{"type":"done"}"#)], false),
    )
    .unwrap();
    let native = Path::new(env!("CARGO_BIN_EXE_metash-host-test-agent"));
    register(ws, "wasm", "wasm", &wat);
    register(ws, "native", "native", native);
    let provider = ModelServer::start(|_| sse_text("hello"));
    std::fs::write(
        ws.join(".meta/config.toml"),
        format!("[roles.model]\nfrontend = \"anthropic-api\"\nbase_url = \"{}\"\napi_key_env = \"BENCH_KEY\"\nmax_tokens = 64\n", provider.base),
    )
    .unwrap();
    let host = Host::open(
        ws,
        HostOptions {
            terminal: Terminal::Silent,
            yes_to: vec!["native".parse().unwrap()],
            env: [("BENCH_KEY".to_string(), "k".to_string())].into(),
            ..HostOptions::default()
        },
    )
    .unwrap();
    let rt = Runtime::new(
        RuntimeConfig {
            cache_dir: ws.join("rawcache"),
            cache_key: metash_runtime::CacheKey::ephemeral().expect("cache key"),
        },
        Arc::new(NullSink),
    )
    .unwrap();

    let spawn = |name: &str, msg: &str| {
        let r = host.spawn_agent(&SpawnRequest::new(name, "", msg)).unwrap();
        assert_eq!(r.status, metash_protocol::AgentStatus::Success, "{r:?}");
    };
    let wasm_raw = time(n, || raw_agent(&rt, ws, SandboxKind::Wasm, &wat, "go"));
    let wasm_host = time(n, || spawn("wasm", "go"));
    let native_raw = time(n, || {
        raw_agent(&rt, ws, SandboxKind::Native, native, "echo hi")
    });
    let native_host = time(n, || spawn("native", "echo hi"));

    let harness = metash_harness::Harness::new(metash_harness::Programs::discover(None)).unwrap();
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let model_raw = time(n, || {
        let asp = tempfile::tempdir().unwrap();
        let mut req = metash_harness::RunTurnNonInteractiveRequest::new(
            HarnessFrontend::AnthropicApi,
            asp.path(),
            ws,
            "hi",
        );
        req.max_tokens = Some(64);
        req.env.insert("BENCH_KEY".into(), "k".into());
        req.options.endpoint = Some(metash_harness::Endpoint {
            base_url: provider.base.clone(),
            api_key_env: Some("BENCH_KEY".into()),
            provider_name: None,
        });
        let cancel = metash_harness::CancellationToken::new();
        let r = tokio
            .block_on(harness.run_turn_non_interactive(&req, &cancel, &mut |_| {}))
            .unwrap();
        assert!(r.result.success);
    });
    let model_host = time(n, || spawn("model", "hi"));

    let row = |name: &str, raw: Duration, host: Duration| {
        println!(
            "  {name:<28} raw {:>9.3} ms   via host {:>9.3} ms   overhead {:>8.3} ms   {:.2}x raw",
            raw.as_secs_f64() * 1e3,
            host.as_secs_f64() * 1e3,
            host.saturating_sub(raw).as_secs_f64() * 1e3,
            host.as_secs_f64() / raw.as_secs_f64()
        );
    };
    println!("metash-host spawn_agent overhead (medians of {n})");
    row("WASM agent (module cached)", wasm_raw, wasm_host);
    row("native agent (sandboxed)", native_raw, native_host);
    row("model role (loopback API)", model_raw, model_host);
}
