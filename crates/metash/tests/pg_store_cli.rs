#![allow(clippy::unwrap_used, clippy::expect_used)]
//! metash's main job on the PostgreSQL store: the example project (`examples/greetings`: WASM
//! planner, executor and verifier) run by the real binary with `[store] url` in its config, a
//! real server started by the test. `metash run` stops at the planner's question, `metash run
//! --answer` plans, executes in worktrees, verifies, merges and completes; the session, the log
//! and the documents are on the server, and nothing of the store is written under `.meta/`.

#[path = "support/pg_project.rs"]
mod support;

use metash_testkit::postgres::{prerequisites, Postgres};
use support::{metash, ok, project, store_toml, EXAMPLE_GRANTS};

#[test]
fn the_example_project_runs_to_completion_on_postgres() {
    let server = match prerequisites().and_then(|bin| Postgres::start(&bin)) {
        Ok(s) => s,
        Err(why) => return metash_testkit::skip("example on postgres", &why),
    };
    let dir = tempfile::tempdir().unwrap();
    let head = store_toml(&server.url("postgres"), "greetings");
    let context = metash_testkit::greetings::context();
    let (ws, said) = project(dir.path(), "p", &head, &context, EXAMPLE_GRANTS);
    let ws = ws.as_path();
    assert!(
        said.contains("project greetings on its PostgreSQL store"),
        "{said}"
    );

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
