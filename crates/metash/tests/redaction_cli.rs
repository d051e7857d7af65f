#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 18: every output of metash passes through the same redaction as the ledger export.
//! Secrets of each known shape, and the value of a key variable a role names (which has no
//! telltale shape), are planted in the state and in progress messages; then `log export`,
//! `log tail` (text and JSON), `metash serve`'s responses, notifications and progress lines, and
//! an error message quoting one are searched for them.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// A key with no shape a pattern could know: only the role's configuration says it is one.
const PLAIN_KEY: &str = "plainvalue-no-shape-1234";

const SECRETS: &[&str] = &[
    "sk-ant-api03-PLANTEDsecret0001",
    "sk-proj-PLANTEDopenaikey00001",
    "ghp_PLANTEDabcdefghijklmnopqrst1234",
    "github_pat_PLANTED0123456789abcdefghij",
    "xoxb-PLANTED-slack-0001",
    "AKIAPLANTED123456789",
    "eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.c2lnbmF0dXJlLXBsYW50",
    "PLANTEDbearertoken99",
    PLAIN_KEY,
];

fn planted() -> String {
    let mut s: Vec<String> = SECRETS.iter().map(|s| s.to_string()).collect();
    // A bearer token is a secret by its place, after the scheme.
    s[7] = format!("Authorization: Bearer {}", SECRETS[7]);
    s.join(" | ")
}

fn metash(ws: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(ws)
        .args(args)
        .env("METASH_TEST_KEY", PLAIN_KEY)
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn assert_clean(what: &str, out: &Output) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for s in SECRETS {
        assert!(!text.contains(s), "{what} leaks {s}:\n{text}");
    }
    assert!(
        text.contains("[REDACTED:"),
        "{what} shows no marker:\n{text}"
    );
}

#[test]
fn no_output_carries_a_planted_secret() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    assert!(metash(ws, &["init"], None).status.success());
    std::fs::write(
        ws.join(".meta/config.toml"),
        "[roles.writer]\nfrontend = \"anthropic-api\"\napi_key_env = \"METASH_TEST_KEY\"\n",
    )
    .unwrap();
    let value = serde_json::to_string(&planted()).unwrap();
    let set = metash(ws, &["state", "set", "variables.note", &value], None);
    assert!(set.status.success(), "{set:?}");

    let requests = [
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "logProgress",
                           "params": {"message": planted()}}),
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "getState",
                           "params": {"key": "variables.note"}}),
        serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "updateState",
                           "params": {"key": "status", "value": planted()}}),
    ];
    let lines: String = requests.iter().map(|r| format!("{r}\n")).collect();
    let served = metash(ws, &["serve", "--stdio"], Some(&lines));
    assert!(served.status.success(), "{served:?}");
    let stdout = String::from_utf8_lossy(&served.stdout);
    assert!(
        stdout.contains("\"method\":\"event\""),
        "a notification: {stdout}"
    );
    assert!(
        String::from_utf8_lossy(&served.stderr).contains("[info]"),
        "the progress line: {served:?}"
    );
    assert_clean(
        "metash serve (responses, notifications, progress lines)",
        &served,
    );

    for args in [
        &["log", "export"][..],
        &["log", "tail", "--lines", "50"][..],
        &["log", "tail", "--lines", "50", "--json"][..],
    ] {
        let out = metash(ws, args, None);
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert_clean(&format!("metash {}", args.join(" ")), &out);
    }

    // An error quoting what was given: the value is refused, and named only by its marker.
    let refused = metash(ws, &["state", "set", "status", &value], None);
    assert!(!refused.status.success());
    assert_clean("an error message", &refused);

    // The log on disk keeps what happened (its export is what is redacted).
    let log = std::fs::read_to_string(ws.join(".meta/events.jsonl")).unwrap();
    assert!(log.contains(SECRETS[0]));
}
