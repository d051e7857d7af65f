#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 31, part 4: an agent's escape sequences never reach the user's terminal raw. Two
//! hostile WASM agents send one payload (OSC 52 clipboard write, OSC 0 title, an OSC 8 link,
//! `\r` + `ESC[2K` line erase with a fake line after it, the C1 CSI U+009B and the
//! right-to-left override U+202E) as their output, as a consent request's reason, and as a
//! checkpoint's message and options. `metash spawn`, the consent prompt, `metash log tail`,
//! `metash status` and `metash ledger view` run on a pseudo-terminal made here (output
//! post-processing off, so any `\r` would be the payload's), and what the terminal received
//! holds no ESC, no `\r`, no U+009B and no U+202E, but holds their escaped forms. `--raw` and
//! `--json` still give the bytes (which also proves the payload reached metash).

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

/// What the hostile agents send wherever they can.
const PAYLOAD: &str = "\x1b]52;c;cHduZWQ=\x07 \x1b]0;owned\x07 \x1b]8;;http://evil.example/\x1b\\\
                       docs\x1b]8;;\x1b\\ real\r\x1b[2Kmetash: nothing to allow \u{9b}31m \
                       \u{202e}txt.exe";
/// The same, as the terminal must show it (one-line fields escape nothing more here).
const SHOWN: [&str; 6] = [
    "\\x1b]52;c;cHduZWQ=\\x07",
    "\\x1b]0;owned\\x07",
    "\\x1b]8;;http://evil.example/\\x1b\\docs",
    "real\\r\\x1b[2Kmetash: nothing to allow",
    "\\u{9b}31m",
    "\\u{202e}txt.exe",
];

fn metash(ws: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metash"));
    c.arg("-C").arg(ws).env("NO_COLOR", "1");
    c
}

/// A WASM agent that writes `events` (agent-protocol objects) and exits.
fn agent(ws: &Path, id: &str, caps: &str, events: &[serde_json::Value]) {
    let dir = ws.join(".meta/agents").join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let lines: Vec<String> = events
        .iter()
        .map(|e| metash_testkit::wasm::agent_msg(&e.to_string()))
        .collect();
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    std::fs::write(
        dir.join("agent.wat"),
        metash_testkit::wasm::wat_agent(&lines, false),
    )
    .unwrap();
    std::fs::write(
        dir.join("manifest.toml"),
        format!(
            "schema_version = \"0.1\"\nname = \"{id}\"\nversion = \"0.1.0\"\nentry = \
             \"agent.wat\"\nsandbox = \"wasm\"\ncapabilities = [{caps}]\n"
        ),
    )
    .unwrap();
}

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let init = metash(ws)
        .arg("init")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    agent(
        ws,
        "talker",
        "\"codegen\"",
        &[
            json!({"type": "consent_request", "capability": "codegen", "reason": PAYLOAD,
                   "duration_s": 60}),
            json!({"type": "output", "agent_id": "talker", "chunk_id": "1",
                   "content_type": "text/plain", "data": PAYLOAD}),
            json!({"type": "done"}),
        ],
    );
    agent(
        ws,
        "asker",
        "",
        &[
            json!({"type": "checkpoint", "reason": "decision_required", "message": PAYLOAD,
                 "options": [PAYLOAD, "b"], "resume_id": "pick"}),
        ],
    );
    dir
}

/// Runs metash with stdin, stdout and stderr on a fresh pseudo-terminal. At each step it waits
/// until the terminal has shown `needle` `n` times, then types `keys`. Returns the exit code
/// and every byte the terminal received.
fn on_terminal(ws: &Path, args: &[&str], steps: &[(&str, usize, &[u8])]) -> (Option<i32>, Vec<u8>) {
    let (mut master, tty) = metash_testkit::pty::open_raw_output();
    let slave = || File::options().read(true).write(true).open(&tty).unwrap();
    let mut child = metash(ws)
        .args(args)
        .stdin(slave())
        .stdout(slave())
        .stderr(slave())
        .spawn()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let (seen, mut master) = (Arc::clone(&seen), master.try_clone().unwrap());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends with EIO once the last holder of the terminal (metash) has exited.
            while let Ok(n @ 1..) = master.read(&mut buf) {
                seen.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    };
    for (needle, n, keys) in steps {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let text = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
            if text.matches(needle).count() >= *n {
                break;
            }
            assert!(
                Instant::now() < until,
                "no {needle:?} (x{n}) on the terminal: {text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        master.write_all(keys).unwrap();
    }
    let status = child.wait().unwrap();
    reader.join().unwrap();
    let out = seen.lock().unwrap().clone();
    (status.code(), out)
}

/// No byte of the payload's controls reached the terminal; their escaped forms did (`want` of
/// them at least, with the command's name for the message).
fn assert_escaped(what: &str, out: &[u8], want: &[&str]) {
    let text = String::from_utf8_lossy(out);
    for (bad, name) in [
        (&b"\x1b"[..], "ESC"),
        (&b"\r"[..], "CR"),
        (&b"\x07"[..], "BEL"),
        ("\u{9b}".as_bytes(), "U+009B"),
        ("\u{202e}".as_bytes(), "U+202E"),
    ] {
        assert!(
            !out.windows(bad.len()).any(|w| w == bad),
            "{what}: a raw {name} reached the terminal:\n{text}"
        );
    }
    for shown in want {
        assert!(text.contains(shown), "{what}: no `{shown}` in:\n{text}");
    }
}

#[test]
fn agent_escape_sequences_reach_the_terminal_only_escaped() {
    let dir = project();
    let ws = dir.path();

    // The consent prompt (start, then the agent's own request) and the agent's output.
    let prompt = "[d] deny > ";
    let (code, out) = on_terminal(
        ws,
        &["spawn", "talker", "--message", "go"],
        &[(prompt, 1, b"d\n"), (prompt, 2, b"d\n")],
    );
    let text = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(code, Some(0), "{text}");
    assert_escaped("metash spawn and its consent prompt", &out, &SHOWN);
    // The prompt: metash's record first, whole, then the reason, marked as the agent's.
    let record = "metash: agent talker asks for `codegen` (60 s suggested)\n  reason (the \
                  agent's words): \\x1b]52;c;";
    assert!(text.contains(record), "{text}");
    assert_eq!(
        text.matches(SHOWN[5]).count(),
        2,
        "reason and output: {text}"
    );

    // A checkpoint: its message and options, then nobody answers (end of input).
    let (code, out) = on_terminal(
        ws,
        &["spawn", "asker", "--message", "go"],
        &[("answer> ", 1, b"\x04")],
    );
    assert_eq!(code, Some(4), "{}", String::from_utf8_lossy(&out));
    assert_escaped("the checkpoint of metash spawn", &out, &SHOWN);
    assert!(String::from_utf8_lossy(&out).contains("  1. \\x1b]52;c;"));

    for (args, want) in [
        (
            &["log", "tail", "-n", "100"][..],
            &["\\u{9b}31m", "\\u{202e}txt.exe"][..],
        ),
        (&["status"][..], &SHOWN[..]),
        (&["ledger", "view"][..], &SHOWN[..]),
    ] {
        let (code, out) = on_terminal(ws, args, &[]);
        assert_eq!(code, Some(0), "{}", String::from_utf8_lossy(&out));
        assert_escaped(&format!("metash {}", args.join(" ")), &out, want);
    }
}

/// The payload did reach metash: `--raw` prints it as sent, and `--json` keeps it for programs.
#[test]
fn raw_and_json_keep_the_agents_bytes() {
    let dir = project();
    let ws = dir.path();
    let out = metash(ws)
        .args([
            "spawn",
            "talker",
            "--message",
            "go",
            "--raw",
            "--yes-to",
            "codegen",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{PAYLOAD}\n"));
    let cooked = metash(ws)
        .args(["spawn", "talker", "--message", "go", "--yes-to", "codegen"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_escaped("metash spawn (piped)", &cooked.stdout, &SHOWN);

    let tail = |extra: &[&str]| {
        let out = metash(ws)
            .args(["log", "tail", "-n", "100"])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let raw = tail(&["--raw"]);
    assert!(
        raw.contains("\u{9b}31m") && raw.contains("\u{202e}txt.exe"),
        "{raw}"
    );
    let json = tail(&["--json"]);
    assert!(
        json.contains("\\u001b]52;c;") && json.contains('\u{202e}'),
        "{json}"
    );
}

/// The consent prompt that races other clients (`[host] consent_wait_seconds`) draws the same
/// record first and the same escaped reason; `metash consent pending`, asked meanwhile from
/// another process, lists the question escaped too.
#[test]
fn the_racing_consent_prompt_and_pending_list_escape_the_reason() {
    let dir = project();
    let ws = dir.path().to_path_buf();
    std::fs::write(
        ws.join(".meta/config.toml"),
        "[host]\nconsent_wait_seconds = 30\n",
    )
    .unwrap();
    // Another terminal lists the questions until the agent's own is among them, then answers it.
    let lister = {
        let ws = ws.clone();
        std::thread::spawn(move || {
            let run = |args: &[&str]| {
                let out = metash(&ws)
                    .args(args)
                    .stdin(Stdio::null())
                    .output()
                    .unwrap();
                out.stdout
            };
            let until = Instant::now() + Duration::from_secs(60);
            let id = loop {
                let asks: serde_json::Value =
                    serde_json::from_slice(&run(&["--json", "consent", "pending"])).unwrap();
                let agents = asks.as_array().into_iter().flatten();
                let mut own = agents.filter(|a| a["duration_s"] == 60);
                if let Some(a) = own.next() {
                    break a["id"].as_str().unwrap().to_string();
                }
                assert!(Instant::now() < until, "the agent's question never waited");
                std::thread::sleep(Duration::from_millis(50));
            };
            let listed = run(&["consent", "pending"]);
            run(&["consent", "answer", &id, "deny"]);
            listed
        })
    };
    // Two questions race: the spawn's own (`codegen` for one action, no suggested duration),
    // answered here at the terminal as soon as it shows, then the agent's (60 s suggested),
    // which only the lister answers (it picks the question by its 60 s). The typed line is read
    // by the first question's prompt, which is already waiting when it is drawn, so it can never
    // answer the agent's (the terminal winning a race is consent_race_cli.rs's test).
    let prompt = "denied in 30 s) > ";
    let (code, out) = on_terminal(
        &ws,
        &["spawn", "talker", "--message", "go"],
        &[(prompt, 1, b"d\n")],
    );
    let listed = lister.join().unwrap();
    assert_escaped("metash consent pending", &listed, &SHOWN);
    let text = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(code, Some(0), "{text}");
    assert_escaped("the racing consent prompt", &out, &SHOWN);
    assert!(text.contains("answered elsewhere: deny"), "{text}");
    let record = "metash: agent talker asks for `codegen` (60 s suggested)\n  reason (the \
                  agent's words): \\x1b]52;c;";
    assert!(text.contains(record), "{text}");
}

/// `metash run` on a terminal: the planner's task title and the verifier's finding are the
/// payload; its progress lines, the halt report and the failed task's line show them only
/// escaped.
#[test]
fn a_runs_titles_and_findings_reach_the_terminal_only_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(ws)
            .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "empty"]);
    let context = "# Project: hostile\n\n## Current Phase Focus\n\nPhase 1: one task.\n";
    metash_store::Store::init(ws, Some(context)).unwrap();
    std::fs::write(
        ws.join(".meta/config.toml"),
        "[orchestrator]\nplanner = \"hplanner\"\nexecutor = \"hexec\"\nverifier = \"hverify\"\n\
         max_gap_retries = 1\n",
    )
    .unwrap();
    let plan = json!({"tasks": [{"id": "t1", "title": PAYLOAD, "dependencies": [],
                                 "expects_change": false}]});
    let say = |id: &str, data: String| {
        [
            json!({"type": "output", "agent_id": id, "chunk_id": "1",
                   "content_type": "text/plain", "data": data}),
            json!({"type": "done"}),
        ]
    };
    agent(ws, "hplanner", "", &say("hplanner", plan.to_string()));
    agent(ws, "hexec", "", &say("hexec", "nothing to change".into()));
    let verdict = json!({"pass": false, "findings": [PAYLOAD]});
    agent(ws, "hverify", "", &say("hverify", verdict.to_string()));
    let (code, out) = on_terminal(ws, &["run"], &[]);
    let text = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(code, Some(5), "the run halts on its gap limit: {text}");
    assert!(text.contains("task t1"), "{text}");
    assert_escaped("run", &out, &SHOWN);
}
