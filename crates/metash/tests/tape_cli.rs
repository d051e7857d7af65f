#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `metash tape list|show` and `metash gc` on tapes (issue 36, docs/replay.md): a real Claude
//! Code turn run by `metash spawn` against a loopback model is listed and shown, its bodies
//! printed on request; `[record] keep_days` makes `metash gc` remove it and its blobs; what a
//! model or agent sent reaches the terminal only with its control characters made visible.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use metash_store::tape::{Tape, TapeExchange, Tapes, TAPE_SCHEMA_VERSION};
use metash_store::Store;
use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

const KEY: &str = "sk-tape-cli-real-key-0123456789";

fn metash(ws: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(ws)
        .args(args)
        .env("METASH_TEST_CLI_KEY", KEY)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn ok(ws: &Path, args: &[&str]) -> String {
    let out = metash(ws, args);
    assert!(
        out.status.success(),
        "metash {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn project() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    ok(d.path(), &["init"]);
    d
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

#[test]
fn a_recorded_turn_is_listed_shown_and_collected() {
    let test = "a_recorded_turn_is_listed_shown_and_collected";
    let Some(tools) = Cli::Claude.installed(test) else {
        return;
    };
    if let Some(why) = sandbox_unavailable() {
        metash_testkit::skip(test, &why);
        return;
    }
    let server = ModelServer::start(|c| {
        if c.text().contains("Record me.") {
            Cli::Claude.text("the answer on tape")
        } else {
            Cli::Claude.text("ok")
        }
    });
    let p = project();
    let ws = p.path();
    std::os::unix::fs::symlink(&tools, ws.join(".tools")).unwrap();
    let role = Cli::Claude.role("coder", &server.base);
    std::fs::write(ws.join(".meta/config.toml"), &role).unwrap();
    let out = ok(
        ws,
        &[
            "spawn",
            "coder",
            "--message",
            "Record me.",
            "--timeout",
            "300",
            "--yes-to",
            "native",
            "--non-interactive",
        ],
    );
    assert!(out.contains("the answer on tape"), "{out}");

    let list: serde_json::Value =
        serde_json::from_str(&ok(ws, &["--json", "tape", "list"])).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    let id = list[0]["id"].as_str().unwrap().to_string();
    assert_eq!(list[0]["agent"], "coder");
    let text = ok(ws, &["tape", "list"]);
    assert!(text.contains(&id) && text.contains("coder"), "{text}");

    let shown = ok(ws, &["tape", "show", &id]);
    assert!(shown.contains("POST /v1/messages"), "{shown}");
    assert!(shown.contains("model=claude-sonnet-4-5"), "{shown}");
    assert!(shown.contains("-> 200"), "{shown}");
    let bodies = ok(ws, &["tape", "show", &id, "--bodies"]);
    assert!(bodies.contains("the answer on tape"), "{bodies}");
    assert!(bodies.contains("Record me."), "{bodies}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(ws, &["--json", "tape", "show", &id])).unwrap();
    assert!(!json["exchanges"].as_array().unwrap().is_empty());
    for out in [&shown, &bodies] {
        assert!(!out.contains(KEY) && !out.contains("metash-placeholder"));
    }

    // Kept under the defaults; gone with `keep_days = 0`, blobs and all.
    assert!(ok(ws, &["gc"]).contains("removed 0 tapes"));
    std::fs::write(
        ws.join(".meta/config.toml"),
        format!("{role}\n[record]\nkeep_days = 0\n"),
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let gc: serde_json::Value = serde_json::from_str(&ok(ws, &["--json", "gc"])).unwrap();
    assert_eq!(gc["tapes"]["removed"][0], id.as_str(), "{gc}");
    assert!(ok(ws, &["tape", "list"]).contains("no tapes"));
    let blobs = std::fs::read_dir(ws.join(".meta/tapes/blobs"))
        .unwrap()
        .count();
    assert_eq!(blobs, 0);
}

/// A tape whose every text field and body carries terminal escapes.
fn hostile_tape(ws: &Path) -> String {
    let store = Store::open(ws).unwrap();
    let tapes = Tapes::new(&store);
    let evil = "\x1b]52;c;cGF3bmVk\x07\x1b[2J";
    let body = format!("{{\"model\":\"m{evil}\",\"messages\":[]}}");
    let exchange = TapeExchange {
        seq: 1,
        route: "model".into(),
        method: "POST".into(),
        target: format!("/v1/messages{evil}"),
        at_ms: 0,
        request_headers: vec![],
        request_body: tapes.put_blob(body.as_bytes(), false).unwrap(),
        status: 200,
        response_headers: vec![],
        head_ms: 1,
        chunks: vec![(1, evil.len() as u64)],
        response_body: tapes.put_blob(evil.as_bytes(), false).unwrap(),
        end: "complete".into(),
        duration_ms: 2,
    };
    let tape = Tape {
        schema_version: TAPE_SCHEMA_VERSION,
        id: "hostile".into(),
        session_id: None,
        agent: "coder".into(),
        frontend: None,
        task: Some(format!("t{evil}")),
        attempt: None,
        started_at: "2026-11-27T00:00:00Z".into(),
        ended_at: "2026-11-27T00:00:01Z".into(),
        exchanges: vec![exchange],
        spawn: None,
    };
    tapes.save(&tape).unwrap();
    tape.id
}

#[test]
fn what_a_model_sent_reaches_the_terminal_escaped() {
    let p = project();
    let id = hostile_tape(p.path());
    for args in [
        vec!["tape", "list"],
        vec!["tape", "show", &id],
        vec!["tape", "show", &id, "--bodies"],
    ] {
        let out = ok(p.path(), &args);
        assert!(
            !out.contains('\x1b') && !out.contains('\x07'),
            "{args:?}: {out:?}"
        );
        assert!(out.contains("\\x1b"), "{args:?}: {out}");
    }
    let err = metash(p.path(), &["tape", "show", "../session"]);
    assert!(!err.status.success());
}
