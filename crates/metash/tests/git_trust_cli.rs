#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `metash git check|trust` as a user runs them: `init` records the repository's executable git
//! configuration; a planted filter is reported (its escape sequences shown, never sent to the
//! terminal) until a person accepts it; nothing is recorded without `--yes` when nobody can be
//! asked.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

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

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn trust_events(ws: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(ws.join(".meta/events.jsonl")).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["kind"] == "git_trust")
        .map(|r| r["data"].clone())
        .collect()
}

#[test]
fn a_planted_filter_is_reported_until_a_person_accepts_it() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    git(ws, &["init", "-q"]);
    let out = metash(ws, &["init"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(ws.join(".meta/git-trust.json").exists(), "init records it");
    assert_eq!(trust_events(ws)[0]["action"], "recorded");
    assert!(metash(ws, &["git", "check"]).status.success());

    // A filter whose command carries a terminal escape (OSC 52: set the clipboard).
    git(
        ws,
        &[
            "config",
            "filter.evil.clean",
            "sh -c x\u{1b}]52;c;ZXZpbA==\u{7}",
        ],
    );
    std::fs::write(ws.join(".git/info/attributes"), "* filter=evil\n").unwrap();
    let check = metash(ws, &["git", "check"]);
    assert_eq!(check.status.code(), Some(1));
    let shown = String::from_utf8(check.stdout).unwrap();
    assert!(
        shown.contains(".git/config: filter.evil.clean added"),
        "{shown}"
    );
    assert!(shown.contains(".git/info/attributes added"), "{shown}");
    assert!(shown.contains("\\u{1b}]52"), "the escape is shown: {shown}");
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{7}'),
        "never sent"
    );

    // Nobody to ask and no --yes: nothing recorded.
    let asked = metash(ws, &["git", "trust"]);
    assert_eq!(asked.status.code(), Some(1));
    assert_eq!(metash(ws, &["git", "check"]).status.code(), Some(1));

    let json = metash(ws, &["--json", "git", "trust", "--yes"]);
    assert!(
        json.status.success(),
        "{}",
        String::from_utf8_lossy(&json.stderr)
    );
    let v: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["accepted"], true);
    assert_eq!(v["changes"][0]["key"], "filter.evil.clean");
    assert!(metash(ws, &["git", "check"]).status.success());
    let accepted = trust_events(ws);
    let last = accepted.last().unwrap();
    assert_eq!(last["action"], "accepted");
    assert_eq!(last["by"], "user");
}

#[test]
fn init_outside_a_repository_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = metash(dir.path(), &["init"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir.path().join(".meta/git-trust.json").exists());
    let check = metash(dir.path(), &["git", "check"]);
    assert_eq!(check.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&check.stderr).contains("not in a git repository"));
}
