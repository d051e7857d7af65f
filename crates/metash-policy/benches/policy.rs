//! `cargo bench -p metash-policy`: the policy layer's hot paths, each against its own baseline
//! measured in the same run on the same disk.
//!
//! - `check` (declared + granted, reading the persisted grants) vs reading the consent doc alone;
//!   and the undeclared fast path, which never touches the disk;
//! - export redaction throughput (MB/s of JSONL written) vs the same export without redaction, and
//!   vs reading the raw log file.
//!
//! Each figure is the median of 5 runs. Set `METASH_BENCH_DIR` to measure another disk.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use metash_protocol::LogKind;

use metash_policy::ledger::{self, Filter, Format};
use metash_policy::{Agent, CapabilityRequest, Policy, Redactor, Registry, Source};
use metash_store::{NewEvent, Store};
use serde_json::json;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

fn per_op_ns(n: u32, mut f: impl FnMut()) -> f64 {
    median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..n {
                    f();
                }
                t.elapsed().as_nanos() as f64 / f64::from(n)
            })
            .collect(),
    )
}

fn mb_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

fn throughput(mut f: impl FnMut() -> u64) -> f64 {
    median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                let bytes = f();
                mb_s(bytes, t.elapsed())
            })
            .collect(),
    )
}

fn main() {
    let base = std::env::var_os("METASH_BENCH_DIR").map(std::path::PathBuf::from);
    let dir = match &base {
        Some(b) => tempfile::tempdir_in(b).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let store = Store::init(&ws, None).unwrap();
    let agent_dir = ws.join(".meta/agents/a");
    std::fs::create_dir_all(&agent_dir).unwrap();
    std::fs::write(
        agent_dir.join("manifest.toml"),
        "schema_version = \"0.1\"\nname = \"A\"\nversion = \"0.1.0\"\nentry = \"a.wasm\"\nsandbox = \"wasm\"\ncapabilities = [\"network\", \"files.read\", \"files.write:docs\", \"codegen\", \"memory\"]\n",
    )
    .unwrap();
    let agent = Agent::load(&agent_dir.join("manifest.toml"), Source::Project).unwrap();
    let policy = Policy::new(Store::open(&ws).unwrap(), Registry::from_agents([agent]));
    // A realistic consent doc: 40 grants, the one we look up last.
    for i in 0..39 {
        policy
            .grant(
                "a",
                &format!("network:host{i}.example.com").parse().unwrap(),
                3600,
                false,
                "bench",
            )
            .unwrap();
    }
    policy
        .grant(
            "a",
            &"network:api.github.com".parse().unwrap(),
            3600,
            false,
            "bench",
        )
        .unwrap();
    let granted = CapabilityRequest::network("api.github.com", false, "bench");
    let undeclared = CapabilityRequest::parse("process.spawn:git", "bench").unwrap();
    assert!(policy.check("a", &granted).unwrap().is_allow());

    let n = 2_000;
    let doc_ns = per_op_ns(n, || {
        std::hint::black_box(store.read_doc("consent").unwrap());
    });
    let check_ns = per_op_ns(n, || {
        std::hint::black_box(policy.check("a", &granted).unwrap());
    });
    let undeclared_ns = per_op_ns(n * 10, || {
        std::hint::black_box(policy.check("a", &undeclared).unwrap());
    });
    println!(
        "check, declared + granted (40 grants persisted): {:>9.1} µs/op",
        check_ns / 1e3
    );
    println!(
        "baseline: read_doc(\"consent\") alone:             {:>9.1} µs/op",
        doc_ns / 1e3
    );
    println!(
        "  ratio check / read_doc:                         {:>9.2}x",
        check_ns / doc_ns
    );
    println!(
        "check, undeclared (no disk):                      {:>9.3} µs/op",
        undeclared_ns / 1e3
    );

    // A log of 20,000 events: agent actions with env, argv and free text, one in ten carrying a
    // secret.
    let mut batch = Vec::new();
    for i in 0..20_000u32 {
        let secret = if i % 10 == 0 {
            format!("Bearer tok_{i:08}abcdefgh sk-ant-api03-{i:08}xyzXYZ")
        } else {
            String::new()
        };
        batch.push(NewEvent::new(
            LogKind::AgentAction,
            Some("a"),
            json!({
                "capability": "network:api.github.com",
                "detail": {
                    "method": "GET",
                    "url": format!("https://api.github.com/repos/metash/metash/issues/{i}"),
                    "env": {"LANG": "C.UTF-8", "PATH": "/usr/bin:/bin", "GITHUB_TOKEN": if i % 10 == 0 { "ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZ012345" } else { "" }},
                    "message": format!("fetched issue {i} in 120 ms; headers ok {secret}"),
                    "status": 200,
                },
            }),
        ));
        if batch.len() == 1_000 {
            store.append_batch(&batch).unwrap();
            batch.clear();
        }
    }
    let log_path = store.log().path().to_path_buf();
    let log_bytes = std::fs::metadata(&log_path).unwrap().len();
    let all = Filter {
        all: true,
        ..Filter::default()
    };
    let redactor = Redactor::new(b"bench-salt");
    let raw = throughput(|| std::hint::black_box(std::fs::read(&log_path).unwrap()).len() as u64);
    let plain = throughput(|| {
        let mut bytes = 0u64;
        store
            .log()
            .for_each(|r| {
                let mut s = serde_json::to_string(&r).unwrap();
                s.push('\n');
                bytes += s.len() as u64;
                std::hint::black_box(s);
                Ok(())
            })
            .unwrap();
        bytes
    });
    let redacted = throughput(|| {
        let mut sink = std::io::sink();
        ledger::export(&store, &all, Format::Jsonl, &redactor, &mut sink)
            .unwrap()
            .bytes
    });
    let csv = throughput(|| {
        let mut sink = std::io::sink();
        ledger::export(&store, &all, Format::Csv, &redactor, &mut sink)
            .unwrap()
            .bytes
    });
    println!("log: {} events, {:.1} MB", 20_001, log_bytes as f64 / 1e6);
    println!("export jsonl, redacted:                           {redacted:>9.1} MB/s");
    println!("export csv, redacted:                             {csv:>9.1} MB/s");
    println!("baseline: plain JSONL copy (read, verify, write): {plain:>9.1} MB/s");
    println!("baseline: raw read of events.jsonl:               {raw:>9.1} MB/s");
    println!(
        "  ratio redacted / plain copy:                    {:>9.2}x",
        redacted / plain
    );
}
