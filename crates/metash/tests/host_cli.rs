#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `metash spawn` and `metash resume` as a user runs them, including a host killed while it waits
//! for a checkpoint answer.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn metash(ws: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metash"));
    c.arg("-C")
        .arg(ws)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    c
}

fn run(ws: &Path, args: &[&str]) -> Output {
    metash(ws).args(args).output().unwrap()
}

fn agent(ws: &Path, id: &str, lines: &[&str]) {
    let dir = ws.join(".meta/agents").join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let lines: Vec<String> = lines
        .iter()
        .map(|l| metash_testkit::wasm::agent_msg(l))
        .collect();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    std::fs::write(
        dir.join("agent.wat"),
        metash_testkit::wasm::wat_agent(&lines, false),
    )
    .unwrap();
    std::fs::write(
        dir.join("manifest.toml"),
        format!("schema_version = \"0.1\"\nname = \"{id}\"\nversion = \"0.1.0\"\nentry = \"agent.wat\"\nsandbox = \"wasm\"\ncapabilities = []\n"),
    )
    .unwrap();
}

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    assert!(run(dir.path(), &["init"]).status.success());
    agent(
        dir.path(),
        "asker",
        &[
            r#"{"type":"checkpoint","reason":"decision_required","message":"Which auth provider?","options":["Auth0","Supabase"],"resume_id":"auth"}"#,
        ],
    );
    agent(
        dir.path(),
        "echo",
        &[
            r#"{"type":"output","agent_id":"echo","chunk_id":"1","content_type":"text/plain","data":"hi"}"#,
            r#"{"type":"done"}"#,
        ],
    );
    agent(
        dir.path(),
        "broken",
        &[r#"{"type":"done","status":"error","summary":"nope"}"#],
    );
    dir
}

fn spawn_events(ws: &Path) -> Vec<Value> {
    let out = run(ws, &["log", "export"]);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["kind"] == "spawn")
        .collect()
}

#[test]
fn spawn_prints_the_response_with_distinct_exit_codes() {
    let dir = project();
    let ws = dir.path();
    let out = run(ws, &["spawn", "echo", "--message", "go", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["status"], "success");
    assert_eq!(r["data"], "hi");
    assert!(r["metadata"]["duration_ms"].is_u64());

    assert_eq!(
        run(ws, &["spawn", "broken", "--message", "go"])
            .status
            .code(),
        Some(3)
    );

    let out = run(ws, &["spawn", "nobody", "--message", "go"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown agent `nobody`"));

    let out = run(ws, &["spawn", "asker", "--message", "go"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stderr).contains("metash resume --answer"));
}

/// The host is killed while waiting for the answer; the checkpoint was already durable, so a new
/// `metash resume --answer` delivers it to the next spawn once, and a second answer is refused.
#[test]
fn checkpoint_survives_a_killed_host() {
    let dir = project();
    let ws = dir.path();
    let mut waiting = metash(ws)
        .args(["spawn", "asker", "--message", "go", "--wait-for-answer"])
        .stdin(Stdio::piped()) // held open, never written: the host waits
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    loop {
        let state: Value =
            serde_json::from_slice(&std::fs::read(ws.join(".meta/session.json")).unwrap()).unwrap();
        if state["pendingCheckpoint"]["id"] == "auth" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the checkpoint never became pending"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "the host should be waiting for an answer"
    );
    waiting.kill().unwrap(); // SIGKILL
    waiting.wait().unwrap();

    let out = run(
        ws,
        &[
            "resume",
            "--answer",
            "supabase",
            "--checkpoint",
            "auth",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let data: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(data["user_input"], "Supabase");

    assert!(run(ws, &["spawn", "echo", "--message", "go"])
        .status
        .success());
    assert!(run(ws, &["spawn", "echo", "--message", "again"])
        .status
        .success());
    let spawns = spawn_events(ws);
    let n = spawns.len();
    assert_eq!(
        spawns[n - 2]["data"]["resume_data"]["user_input"],
        "Supabase"
    );
    assert_eq!(
        spawns[n - 2]["data"]["resume_data"]["checkpoint_id"],
        "auth"
    );
    assert!(
        spawns[n - 1]["data"]["resume_data"].is_null(),
        "delivered twice"
    );

    let out = run(ws, &["resume", "--answer", "Auth0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no checkpoint is pending"));
}

#[test]
fn a_wrong_command_line_is_exit_64_and_json_goes_before_or_after_the_command() {
    let bin = env!("CARGO_BIN_EXE_metash");
    let ws = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(bin)
            .current_dir(ws.path())
            .args(args)
            .output()
            .unwrap()
    };
    let bad = run(&["status", "--no-such-flag"]);
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--no-such-flag"));
    assert_eq!(run(&["--help"]).status.code(), Some(0));
    assert_eq!(run(&["init"]).status.code(), Some(0));
    let before = run(&["--json", "state", "get"]);
    let after = run(&["state", "get", "--json"]);
    assert_eq!(before.status.code(), Some(0), "{before:?}");
    assert_eq!(before.stdout, after.stdout);
    let v: serde_json::Value = serde_json::from_slice(&before.stdout).unwrap();
    assert!(v.is_object(), "{v}");
}
