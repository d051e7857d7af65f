#![allow(clippy::unwrap_used, clippy::expect_used)]
//! An interactive `metash spawn` (its stdin a real terminal: a pseudo-terminal made here) with
//! `[host] consent_wait_seconds` set: the question is asked at the terminal and waits for any
//! other client at once; the first answer wins, the other is refused, and the terminal says when
//! the answer came from elsewhere.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn metash(ws: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metash"));
    c.arg("-C").arg(ws).env("NO_COLOR", "1");
    c
}

fn run(ws: &Path, args: &[&str]) -> Output {
    metash(ws).args(args).stdin(Stdio::null()).output().unwrap()
}

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    assert!(run(ws, &["init"]).status.success());
    let agent = ws.join(".meta/agents/echo");
    std::fs::create_dir_all(&agent).unwrap();
    let lines = [
        metash_testkit::wasm::agent_msg(
            r#"{"type":"output","agent_id":"echo","chunk_id":"1","content_type":"text/plain","data":"hi"}"#,
        ),
        metash_testkit::wasm::agent_msg(r#"{"type":"done"}"#),
    ];
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    std::fs::write(
        agent.join("agent.wat"),
        metash_testkit::wasm::wat_agent(&lines, false),
    )
    .unwrap();
    std::fs::write(
        agent.join("manifest.toml"),
        "schema_version = \"0.1\"\nname = \"echo\"\nversion = \"0.1.0\"\nentry = \"agent.wat\"\n\
         sandbox = \"wasm\"\ncapabilities = [\"codegen\"]\n",
    )
    .unwrap();
    std::fs::write(
        ws.join(".meta/config.toml"),
        "[host]\nconsent_wait_seconds = 30\n",
    )
    .unwrap();
    dir
}

/// `metash spawn echo` with its stdin the terminal `tty`.
fn spawn_at(ws: &Path, tty: &str) -> Child {
    metash(ws)
        .args(["spawn", "echo", "--message", "go"])
        .stdin(File::options().read(true).write(true).open(tty).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The id of the question waiting (within 20 s).
fn waiting_id(ws: &Path) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        let out = run(ws, &["--json", "consent", "pending"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if let Some(id) = v.get(0).and_then(|a| a["id"].as_str()) {
            return id.to_string();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no question waited");
}

fn replies(ws: &Path) -> Vec<Value> {
    let store = metash_store::Store::open(ws).unwrap();
    store
        .log()
        .read_all()
        .unwrap()
        .into_iter()
        .filter(|r| r.kind == metash_protocol::LogKind::ConsentReplied)
        .map(|r| r.data)
        .collect()
}

#[test]
fn the_terminal_answers_first_and_another_client_is_refused() {
    let dir = project();
    let ws = dir.path();
    let (mut master, tty) = metash_testkit::pty::open();
    let child = spawn_at(ws, &tty);
    let id = waiting_id(ws);
    master.write_all(b"d\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("asks for `codegen`"), "{err}");
    assert!(
        err.contains(&format!("metash consent answer {id}")),
        "{err}"
    );
    assert!(!err.contains("answered elsewhere"), "{err}");
    let replied = replies(ws);
    assert_eq!(replied.len(), 1, "{replied:?}");
    assert_eq!(
        (replied[0]["by"].as_str(), replied[0]["answer"].as_str()),
        (Some("terminal"), Some("deny"))
    );
    let late = run(ws, &["consent", "answer", &id, "once"]);
    assert!(!late.status.success());
    assert!(
        String::from_utf8_lossy(&late.stderr).contains("already answered (deny, by terminal)"),
        "{}",
        String::from_utf8_lossy(&late.stderr)
    );
}

#[test]
fn another_client_answers_first_and_the_terminal_says_so() {
    let dir = project();
    let ws = dir.path();
    let (mut master, tty) = metash_testkit::pty::open();
    let child = spawn_at(ws, &tty);
    let id = waiting_id(ws);
    let answered = run(ws, &["consent", "answer", &id, "once"]);
    assert!(answered.status.success(), "{answered:?}");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("answered elsewhere: allow once"), "{err}");
    assert!(out.status.success(), "{err}");
    // Typing now answers nothing: the question is gone.
    master.write_all(b"d\n").unwrap();
    let replied = replies(ws);
    assert_eq!(replied.len(), 1, "{replied:?}");
    assert_eq!(replied[0]["by"], "cli");
    let answers: Vec<Value> = {
        let store = metash_store::Store::open(ws).unwrap();
        let all = store.log().read_all().unwrap().into_iter();
        all.filter(|r| r.kind == metash_protocol::LogKind::ConsentAnswer)
            .map(|r| r.data)
            .collect()
    };
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["answer"], "allow_once");
}
