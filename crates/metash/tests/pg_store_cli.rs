#![allow(clippy::unwrap_used, clippy::expect_used)]
//! metash's main job on the PostgreSQL store: the example project (`examples/greetings`: WASM
//! planner, executor and verifier) run by the real binary with `[store] url` in its config, a
//! real server started by the test. `metash run` stops at the planner's question, `metash run
//! --answer` plans, executes in worktrees, verifies, merges and completes; the session, the log
//! and the documents are on the server, and nothing of the store is written under `.meta/`.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use metash_testkit::postgres::{prerequisites, Postgres};

fn metash(ws: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(ws)
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn ok(ws: &Path, args: &[&str]) -> String {
    let out = metash(ws, args);
    assert!(
        out.status.success(),
        "metash {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn git(ws: &Path, args: &[&str]) {
    let st = Command::new("git")
        .arg("-C")
        .arg(ws)
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .status()
        .unwrap();
    assert!(st.success(), "git {args:?}");
}

#[test]
fn the_example_project_runs_to_completion_on_postgres() {
    let server = match prerequisites().and_then(|bin| Postgres::start(&bin)) {
        Ok(s) => s,
        Err(why) => return metash_testkit::skip("example on postgres", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    git(ws, &["init", "-q"]);
    git(
        ws,
        &["commit", "-q", "--allow-empty", "-m", "empty project"],
    );
    let store_toml = format!(
        "[store]\nurl = \"{}\"\nproject = \"greetings\"\n",
        server.url("postgres")
    );
    std::fs::create_dir_all(ws.join(".meta")).unwrap();
    std::fs::write(ws.join(".meta/config.toml"), &store_toml).unwrap();
    let context = ws.join("vision.md");
    std::fs::write(&context, metash_testkit::greetings::context()).unwrap();
    let said = ok(ws, &["init", "--context", context.to_str().unwrap()]);
    assert!(
        said.contains("project greetings on its PostgreSQL store"),
        "{said}"
    );
    // The example's agents and config, with the store's table kept.
    metash_testkit::greetings::copy_into(ws);
    let example = std::fs::read_to_string(ws.join(".meta/config.toml")).unwrap();
    std::fs::write(
        ws.join(".meta/config.toml"),
        format!("{store_toml}\n{example}"),
    )
    .unwrap();
    for (agent, cap) in [
        ("executor", "files.read"),
        ("executor", "files.write"),
        ("verifier", "files.read"),
    ] {
        ok(ws, &["consent", "grant", agent, cap]);
    }

    let first = metash(ws, &["run"]);
    assert_eq!(
        first.status.code(),
        Some(4),
        "the planner's question: {}",
        String::from_utf8_lossy(&first.stderr)
    );
    ok(ws, &["run", "--answer", "french"]);
    assert_eq!(
        std::fs::read_to_string(ws.join("hello.txt"))
            .unwrap()
            .trim(),
        "Bonjour, le monde !"
    );
    assert!(ws.join("shout.txt").is_file() && ws.join("README.md").is_file());

    // Another process reads the same session from the server.
    let status = ok(ws, &["--json", "status"]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["halt"]["reason"], "complete", "{status}");
    let tasks = status["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 4);
    assert!(
        tasks
            .iter()
            .all(|t| t["status"] == "complete" && t["merged"] == true),
        "{status}"
    );
    let verified = ok(ws, &["log", "verify"]);
    assert!(verified.contains("hash chain intact"), "{verified}");
    for local in ["events.jsonl", "session.json", "consent.json", "kv"] {
        assert!(
            !ws.join(".meta").join(local).exists(),
            ".meta/{local} is on the server, not here"
        );
    }
    // The server holds it: the session row, and a log that matches what the CLI verified.
    let mut db = metash_store::pg::Db::open(&server.url("postgres"), None).unwrap();
    let n: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM metash.log WHERE project = 'greetings'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(n > 20, "{n} records on the server");
    let doc: serde_json::Value = db
        .client()
        .query_one(
            "SELECT doc FROM metash.sessions WHERE project = 'greetings'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(doc["status"], "halted", "{doc}");
    assert_eq!(doc["revision"], status["revision"]);
}
