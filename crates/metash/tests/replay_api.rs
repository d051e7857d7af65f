#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `metash replay` of an API role (issue 36, docs/replay.md "API roles"): a real `metash run` of
//! a one-task plan whose planner, executor and verifier are metash's own Anthropic client
//! (`anthropic-api`) against a loopback model records the executor's turn through the credential
//! proxy (the key never stored: searched for in every byte under `.meta/tapes/`, though the model
//! echoes it back); then, with the roles pointing at a dead port, the model asserted never asked
//! again and no key in the environment, `metash replay a` runs the turn again from its tape and
//! finds the task's tree identical (the reply's files applied as the orchestrator applies them);
//! with the executor's model changed in the config, the replay stops at request 1, naming both.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use metash_testkit::anthropic::{sse_text, ModelServer};

const KEY: &str = "sk-ant-replay-api-real-key-0123456789";
const MODEL: &str = "api-model";
const CONTEXT: &str = "# Replay\n\nA project whose one task is replayed.\n\n\
                       ## Current phase\n\nWrite a.txt.\n";
const PLAN: &str = r#"{"tasks": [{"id": "a", "title": "Write a.txt", "dependencies": []}]}"#;

fn metash(ws: &Path, args: &[&str], key: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_metash"));
    cmd.arg("-C").arg(ws).args(args).stdin(Stdio::null());
    if key {
        cmd.env("METASH_TEST_KEY", KEY);
    } else {
        cmd.env_remove("METASH_TEST_KEY");
    }
    cmd.output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", text(&out));
}

/// The scripted model: the planner plans task `a`, the executor answers with `a.txt` as a file
/// of its JSON reply (and the key it was sent, as a leaky upstream might), the verifier passes.
/// After `stopped`, every request is answered with an error text.
fn model(stopped: Arc<AtomicBool>) -> ModelServer {
    ModelServer::start(move |c| {
        let body = c.text();
        if stopped.load(Ordering::SeqCst) {
            return sse_text("the model was asked after it stopped");
        }
        if body.contains("You are the planner") {
            if body.contains("Current State: Phase 1 ") {
                return sse_text(PLAN);
            }
            return sse_text(r#"{"tasks": [], "done": true}"#);
        }
        if body.contains("You are the verifier") {
            return sse_text(r#"{"pass": true, "findings": []}"#);
        }
        let sent = c.header("x-api-key").unwrap_or("none");
        let reply = serde_json::json!({
            "summary": format!("wrote a.txt (sent {sent})"),
            "files": [{"path": "a.txt", "content": "replayed a\n"}],
        });
        sse_text(&reply.to_string())
    })
}

fn role(name: &str, base: &str) -> String {
    format!(
        "[roles.{name}]\nfrontend = \"anthropic-api\"\nmodel_smart = \"{MODEL}\"\n\
         base_url = \"{base}\"\napi_key_env = \"METASH_TEST_KEY\"\nmax_tokens = 512\n"
    )
}

fn project(base: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let ws = d.path();
    git(ws, &["init", "-q"]);
    std::fs::write(ws.join("README.md"), "replay me\n").unwrap();
    git(ws, &["add", "README.md"]);
    git(ws, &["commit", "-q", "-m", "first"]);
    let out = metash(ws, &["init"], true);
    assert!(out.status.success(), "{}", text(&out));
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), CONTEXT).unwrap();
    let out = metash(
        ws,
        &["context", "set", &file.path().to_string_lossy()],
        true,
    );
    assert!(out.status.success(), "{}", text(&out));
    let mut config = String::from("[orchestrator]\nmax_gap_retries = 1\n");
    for name in ["planner", "executor", "verifier"] {
        config.push_str(&role(name, base));
    }
    std::fs::write(ws.join(".meta/config.toml"), config).unwrap();
    d
}

/// Every file under `.meta/tapes/` holds neither the key nor the placeholder.
fn no_key_stored(ws: &Path) {
    let mut stack = vec![ws.join(".meta/tapes")];
    let mut files = 0;
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            for secret in [KEY, "metash-placeholder"] {
                assert!(!text.contains(secret), "{} holds {secret}", path.display());
            }
            files += 1;
        }
    }
    assert!(files >= 2, "an index and its blobs");
}

#[test]
fn a_recorded_api_role_task_replays_to_the_identical_tree_with_the_model_stopped() {
    let stopped = Arc::new(AtomicBool::new(false));
    let server = model(Arc::clone(&stopped));
    let dir = project(&server.base);
    let ws = dir.path();
    let run = metash(ws, &["run", "--non-interactive"], true);
    assert!(run.status.success(), "{}", text(&run));
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "replayed a\n"
    );
    // The executor got the real key (through the proxy), and echoed it back.
    let echoed = server
        .posts()
        .iter()
        .any(|c| c.header("x-api-key") == Some(KEY));
    assert!(echoed, "the model never got the key");
    let list = metash(ws, &["tape", "list"], false);
    assert!(
        text(&list).contains("executor  task a #1"),
        "{}",
        text(&list)
    );
    no_key_stored(ws);

    stopped.store(true, Ordering::SeqCst);
    let asked = server.posts().len();
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let config = std::fs::read_to_string(ws.join(".meta/config.toml")).unwrap();
    let config = config.replace(&server.base, &dead);
    std::fs::write(ws.join(".meta/config.toml"), &config).unwrap();

    let out = metash(ws, &["replay", "a", "--non-interactive"], false);
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("identical"), "{shown}");
    assert_eq!(
        std::fs::read_to_string(ws.join(".meta/worktrees/replay-a-1/a.txt")).unwrap(),
        "replayed a\n"
    );
    assert_eq!(server.posts().len(), asked, "the model was asked: {shown}");

    // The executor's model changed: the replay stops at request 1 and names both models.
    let executor = role("executor", &dead);
    let changed = executor.replace(MODEL, "another-model");
    std::fs::write(
        ws.join(".meta/config.toml"),
        config.replace(&executor, &changed),
    )
    .unwrap();
    let out = metash(ws, &["replay", "a", "--non-interactive"], false);
    let shown = text(&out);
    assert!(!out.status.success(), "{shown}");
    assert!(shown.contains("the replay stopped at request 1"), "{shown}");
    assert!(
        shown.contains("another-model") && shown.contains(MODEL),
        "{shown}"
    );
    assert_eq!(server.posts().len(), asked, "the model was asked: {shown}");
}
