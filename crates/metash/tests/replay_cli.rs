#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `metash replay` (issue 36, docs/replay.md): a real `metash run` of a one-task plan with pi as
//! planner, executor and verifier against a loopback model records the executor's turn; with the
//! roles then pointing at a dead port, the model answering nothing useful (and asserted never
//! asked again) and no key in the environment, `metash replay a` runs that
//! turn again from its tape in a fresh worktree and finds the task's tree identical; with the
//! executor role's model changed in the config, the replay stops at the first request, names it
//! and exits non-zero.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

const KEY: &str = "sk-replay-cli-real-key-0123456789";
const CONTEXT: &str = "# Replay\n\nA project whose one task is replayed.\n\n\
                       ## Current phase\n\nWrite a.txt.\n";
const PLAN: &str = r#"{"tasks": [{"id": "a", "title": "Write a.txt", "dependencies": []}]}"#;

fn metash(ws: &Path, args: &[&str], key: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_metash"));
    cmd.arg("-C").arg(ws).args(args).stdin(Stdio::null());
    if key {
        cmd.env("METASH_TEST_CLI_KEY", KEY);
    } else {
        cmd.env_remove("METASH_TEST_CLI_KEY");
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

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The scripted model: the planner plans task `a`; its executor writes `a.txt` with one shell
/// call, then reports; the verifier passes. After `stopped`, every request is answered with
/// an error text (a replay must not ask).
fn model(stopped: Arc<AtomicBool>) -> ModelServer {
    ModelServer::start(move |c| {
        let body = c.text();
        let pi = Cli::Pi;
        if stopped.load(Ordering::SeqCst) {
            return pi.text("the model was asked after it stopped");
        }
        if body.contains("You are the planner") {
            let plan = if body.contains("Current State: Phase 1 ") {
                PLAN
            } else {
                r#"{"tasks": [], "done": true}"#
            };
            return pi.text(plan);
        }
        if body.contains("You are the verifier") {
            return pi.text(r#"{"pass": true, "findings": []}"#);
        }
        match pi.results(&body) {
            0 => pi.shell(1, &body, "printf 'replayed %s\\n' a > a.txt"),
            _ => pi.text("wrote a.txt"),
        }
    })
}

/// Why a CLI role cannot run here (its sandbox needs Landlock), if it cannot.
fn sandbox_unavailable() -> Option<String> {
    // SAFETY: the VERSION query of landlock_create_ruleset reads nothing.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    (abi < 1).then(|| "Landlock is not available in this kernel".to_string())
}

fn project(tools: &Path, base: &str) -> tempfile::TempDir {
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
    std::os::unix::fs::symlink(tools, ws.join(".tools")).unwrap();
    std::fs::write(ws.join(".git/info/exclude"), ".tools\n").unwrap();
    let mut config = String::from("[orchestrator]\nmax_gap_retries = 1\n");
    for role in ["planner", "executor", "verifier"] {
        config.push_str(&Cli::Pi.role(role, base));
    }
    std::fs::write(ws.join(".meta/config.toml"), config).unwrap();
    d
}

#[test]
fn a_recorded_task_replays_to_the_identical_tree_with_the_model_stopped() {
    let test = "a_recorded_task_replays_to_the_identical_tree_with_the_model_stopped";
    let Some(tools) = Cli::Pi.installed(test) else {
        return;
    };
    if let Some(why) = sandbox_unavailable() {
        metash_testkit::skip(test, &why);
        return;
    }
    let stopped = Arc::new(AtomicBool::new(false));
    let server = model(Arc::clone(&stopped));
    let p = project(&tools, &server.base);
    let ws = p.path();
    let yes = ["--yes-to", "native", "--non-interactive"];
    let run = metash(ws, &[&["run"][..], &yes].concat(), true);
    assert!(run.status.success(), "{}", text(&run));
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "replayed a\n"
    );
    // The model is gone: every role now points at a port nobody listens on, and the loopback
    // server (which cannot be shut down) answers nothing useful and must not be asked.
    stopped.store(true, Ordering::SeqCst);
    let asked = server.posts().len();
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let config = std::fs::read_to_string(ws.join(".meta/config.toml")).unwrap();
    std::fs::write(
        ws.join(".meta/config.toml"),
        config.replace(&server.base, &dead),
    )
    .unwrap();

    // No key in the environment: a replay asks for no credential.
    let out = metash(ws, &[&["replay", "a"][..], &yes].concat(), false);
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("identical"), "{shown}");
    assert_eq!(server.posts().len(), asked, "the model was asked: {shown}");
    let wt = ws.join(".meta/worktrees/replay-a-1");
    assert_eq!(
        std::fs::read_to_string(wt.join("a.txt")).unwrap(),
        "replayed a\n"
    );
    let json = metash(ws, &[&["--json", "replay", "a"][..], &yes].concat(), false);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["identical"], true, "{}", text(&json));
    assert_eq!(v["served"], v["recorded"], "{v}");

    // The executor role changed: the replay stops at its first request, naming it.
    let config = std::fs::read_to_string(ws.join(".meta/config.toml")).unwrap();
    let executor = Cli::Pi.role("executor", &dead);
    let changed = executor.replace("test-model", "another-model");
    std::fs::write(
        ws.join(".meta/config.toml"),
        config.replace(&executor, &changed),
    )
    .unwrap();
    let out = metash(ws, &[&["replay", "a"][..], &yes].concat(), false);
    let shown = text(&out);
    assert!(!out.status.success(), "{shown}");
    assert!(shown.contains("the replay stopped at request 1"), "{shown}");
    assert!(
        shown.contains("another-model") && shown.contains("test-model"),
        "{shown}"
    );
    assert!(!shown.contains("identical"), "{shown}");
    assert_eq!(server.posts().len(), asked, "the model was asked: {shown}");
}
