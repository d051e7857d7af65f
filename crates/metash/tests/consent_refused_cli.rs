#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 32 item 5 through the binary: in a run where nobody granted native execution, the
//! native planner's spawn is refused once and the run stops at once with exit 8, the halt
//! `consent_refused` and the exact commands that grant it; no plan is asked for again. The next
//! run, given the grant, takes the session up again without `--retry`.

use std::path::Path;
use std::process::{Command, Output, Stdio};

const GRANT: &str = "metash consent grant planner native --sensitive --duration-s 86400";

fn git(ws: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(ws)
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

/// A git project whose planner, executor and verifier are one native agent in
/// `.meta/agents/planner/`: a script that ends without answering (so, once allowed, the planner
/// fails the ordinary way).
fn project(dir: &Path) -> std::path::PathBuf {
    let ws = dir.join("p");
    std::fs::create_dir_all(&ws).unwrap();
    git(&ws, &["init", "-q"]);
    git(&ws, &["commit", "-q", "--allow-empty", "-m", "empty"]);
    let context = "# Project: refused\n\n## Current Phase Focus\n\nPhase 1: one file.\n";
    metash_store::Store::init(&ws, Some(context)).unwrap();
    std::fs::write(
        ws.join(".meta/config.toml"),
        "[orchestrator]\nplanner = \"planner\"\nexecutor = \"planner\"\nverifier = \"planner\"\n\
         max_plan_attempts = 3\n",
    )
    .unwrap();
    let agent = ws.join(".meta/agents/planner");
    std::fs::create_dir_all(&agent).unwrap();
    std::fs::write(
        agent.join("manifest.toml"),
        "schema_version = \"0.1\"\nname = \"planner\"\nversion = \"0.1.0\"\n\
         entry = \"planner.sh\"\nsandbox = \"native\"\ncapabilities = []\n",
    )
    .unwrap();
    std::fs::write(agent.join("planner.sh"), "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::set_permissions(
        agent.join("planner.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    ws
}

fn metash(ws: &Path, home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(ws)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The planner's `spawn` events in the log.
fn planner_spawns(ws: &Path) -> usize {
    let log = std::fs::read_to_string(ws.join(".meta/events.jsonl")).unwrap();
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["kind"] == "spawn" && e["agent"] == "planner")
        .count()
}

#[test]
fn a_refused_native_consent_stops_the_run_at_once_with_exit_8() {
    let dir = tempfile::tempdir().unwrap();
    let ws = project(dir.path());
    let out = metash(&ws, dir.path(), &["--json", "run", "--non-interactive"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(stderr.contains(GRANT), "{stderr}");
    assert!(stderr.contains("metash run --yes-to native"), "{stderr}");
    assert!(!stderr.contains("plans were rejected"), "{stderr}");
    assert_eq!(planner_spawns(&ws), 1, "the planner is asked once");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["halt"]["reason"], "consent_refused", "{report}");
    // One spawn, one refusal: the spawn's end says which capability.
    let log = std::fs::read_to_string(ws.join(".meta/events.jsonl")).unwrap();
    assert!(log.contains("\"refused\":\"native\""), "{log}");

    // A single spawn is refused the same way, with the same exit code.
    let out = metash(&ws, dir.path(), &["spawn", "planner", "--message", "hi"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(stderr.contains(GRANT), "{stderr}");

    // With the grant, the next run goes on without `--retry`: the planner runs (and fails the
    // ordinary way, asked again up to max_plan_attempts).
    let before = planner_spawns(&ws);
    let out = metash(
        &ws,
        dir.path(),
        &["--json", "run", "--non-interactive", "--yes-to", "native"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["halt"]["reason"], "plan_rejected", "{report}");
    assert_eq!(planner_spawns(&ws) - before, 3, "{stderr}");
}
