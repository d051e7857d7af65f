#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The store commands as a user runs them: the real binary, a temp project.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn metash(ws: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(ws)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

fn ok(ws: &Path, args: &[&str]) -> String {
    let out = metash(ws, args);
    assert!(
        out.status.success(),
        "metash {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn err(ws: &Path, args: &[&str]) -> String {
    let out = metash(ws, args);
    assert!(!out.status.success(), "metash {args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn init_set_get_rebuild_verify() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let ctx = ws.join("vision.md");
    std::fs::write(&ctx, "# Project: CLI test\n").unwrap();
    ok(ws, &["init", "--context", ctx.to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(ws.join(".meta/context.md")).unwrap(),
        "# Project: CLI test\n"
    );
    assert!(err(ws, &["init"]).contains("already holds a metash project"));

    let set: Value = serde_json::from_str(&ok(
        ws,
        &["state", "set", "variables.retry_count", "2", "--json"],
    ))
    .unwrap();
    assert_eq!(set["revision"], 2);
    ok(ws, &["state", "set", "status", "\"executing\""]);
    assert_eq!(ok(ws, &["state", "get", "status"]).trim(), "executing");
    let all: Value = serde_json::from_str(&ok(ws, &["state", "get", "--json"])).unwrap();
    assert_eq!(all["variables"]["retry_count"], 2);

    // Bad input: clear message, nothing changed.
    let before = std::fs::read(ws.join(".meta/session.json")).unwrap();
    assert!(err(ws, &["state", "set", "status", "executing"]).contains("is not a JSON value"));
    assert!(err(ws, &["state", "set", "status", "\"paused\""]).contains("unknown variant `paused`"));
    assert!(err(ws, &["state", "set", "nope", "1"]).contains("unknown key path `nope`"));
    assert!(err(
        ws,
        &["state", "set", "variables.x", "1", "--expect-revision", "1"]
    )
    .contains("stale write refused"));
    assert_eq!(
        std::fs::read(ws.join(".meta/session.json")).unwrap(),
        before
    );

    std::fs::write(ws.join(".meta/session.json"), "{ not json").unwrap();
    let msg = err(ws, &["state", "get"]);
    assert!(
        msg.contains("session.json:1:") && msg.contains("metash state rebuild"),
        "{msg}"
    );
    ok(ws, &["state", "rebuild"]);
    assert_eq!(
        ok(ws, &["state", "get", "variables.retry_count"]).trim(),
        "2"
    );
    assert!(ok(ws, &["log", "verify"]).contains("3 events"));

    let tail = ok(ws, &["log", "tail", "-n", "2", "--json"]);
    let recs: Vec<Value> = tail
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[1]["seq"], 3);
    let export = ok(ws, &["log", "export"]);
    assert_eq!(export.lines().count(), 3);
}

#[test]
fn log_verify_names_the_broken_event_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    ok(ws, &["init"]);
    for i in 0..3 {
        ok(ws, &["state", "set", "variables.i", &i.to_string()]);
    }
    let path = ws.join(".meta/events.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"value\":1", "\"value\":5")).unwrap();
    let out = metash(ws, &["log", "verify", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["first_broken_seq"], 3);
}

#[test]
fn changed_context_stops_commands() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    ok(ws, &["init"]);
    std::fs::write(ws.join(".meta/context.md"), "# changed\n").unwrap();
    let msg = err(ws, &["state", "set", "variables.x", "1"]);
    assert!(
        msg.contains("context.md changed behind metash's back")
            && msg.contains("metash context edit"),
        "{msg}"
    );
}

/// Issue 32: `metash context set` and `edit` (from inside the project, `-C` left to its default)
/// change the context on purpose; `metash run` refuses the template's placeholders.
#[test]
fn the_context_is_changed_with_context_set_and_edit() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    ok(ws, &["init"]);
    let msg = err(ws, &["run"]);
    assert!(
        msg.contains("placeholders") && msg.contains("<name>"),
        "{msg}"
    );
    let file = ws.join("vision.md");
    std::fs::write(&file, "# Project: P\n\n## Vision\n\nA real one.\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_metash"))
        .current_dir(ws)
        .args(["context", "set", "vision.md", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["changed"], true);
    assert!(v["diff"].as_str().unwrap().contains("+A real one."));
    assert_eq!(v["placeholders"], serde_json::json!([]));
    assert!(ok(ws, &["context", "show"]).contains("A real one."));
    // `edit`: the editor gets a copy; what it saves is installed.
    let editor = ws.join("ed.sh");
    std::fs::write(&editor, "#!/bin/sh\necho 'Phase 2: more.' >> \"$1\"\n").unwrap();
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_metash"))
        .current_dir(ws)
        .args(["context", "edit"])
        .env("EDITOR", &editor)
        .env_remove("VISUAL")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(ws.join(".meta/context.md")).unwrap();
    assert!(text.ends_with("A real one.\nPhase 2: more.\n"), "{text}");
    let log = ok(ws, &["log", "tail", "-n", "5"]);
    assert_eq!(log.matches("context_changed").count(), 2, "{log}");
    // Every command accepts the changed context.
    ok(ws, &["state", "get"]);
}

#[test]
fn kv_is_per_agent() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    ok(ws, &["init"]);
    ok(ws, &["kv", "set", "pref", "\"dark\"", "--agent", "alice"]);
    assert_eq!(
        ok(ws, &["kv", "get", "pref", "--agent", "alice"]).trim(),
        "dark"
    );
    assert!(err(ws, &["kv", "get", "pref", "--agent", "bob"]).contains("no key `pref`"));
    let list: Value =
        serde_json::from_str(&ok(ws, &["kv", "list", "--agent", "alice", "--json"])).unwrap();
    assert_eq!(list["pref"], "dark");
}

#[test]
fn schema_prints_each_checked_in_schema() {
    let dir = tempfile::tempdir().unwrap();
    let names = ok(dir.path(), &["schema", "--list"]);
    assert!(names.lines().any(|l| l == "session"));
    for name in names.lines() {
        let printed = ok(dir.path(), &["schema", name]);
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../schemas/{name}.json"));
        assert_eq!(printed, std::fs::read_to_string(&file).unwrap(), "{name}");
    }
    assert!(err(dir.path(), &["schema", "nope"]).contains("no schema `nope`"));
}

#[test]
fn gc_refuses_nonsense_ages_and_keeps_everything_for_inf() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    ok(ws, &["init"]);
    let artifact = ws.join(".meta/artifacts/report.txt");
    std::fs::create_dir_all(artifact.parent().unwrap()).unwrap();
    std::fs::write(&artifact, "keep me").unwrap();
    for bad in ["NaN", "-1", "soon"] {
        let out = metash(ws, &["gc", &format!("--max-age-days={bad}")]);
        assert_eq!(out.status.code(), Some(64), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("not a number of days >= 0"),
            "{bad}: {stderr}"
        );
        assert!(artifact.exists(), "{bad} removed the artifact");
    }
    ok(ws, &["gc", "--max-age-days", "inf"]);
    assert!(artifact.exists(), "inf is never too old");
}

/// A project whose path is not UTF-8 (Linux allows any bytes but `/` and NUL): every store
/// command works there, and none panics.
#[test]
fn a_project_path_that_is_not_utf8_works() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"proj-\xff\xfe"));
    std::fs::create_dir(&ws).unwrap();
    ok(&ws, &["init"]);
    ok(&ws, &["state", "set", "variables.a", "1"]);
    assert_eq!(ok(&ws, &["state", "get", "variables.a"]).trim(), "1");
    ok(&ws, &["status"]);
    ok(&ws, &["log", "verify"]);
    ok(&ws, &["log", "export"]);
    ok(&ws, &["gc"]);
}

#[test]
fn artifacts_list_show_and_gc_under_the_configured_policy() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    ok(ws, &["init"]);
    assert_eq!(ok(ws, &["artifacts", "list"]).trim(), "no artifacts");
    let kept = ws.join(".meta/artifacts");
    std::fs::create_dir_all(&kept).unwrap();
    std::fs::write(kept.join("report.md"), "# report\n").unwrap();
    let list: Value = serde_json::from_str(&ok(ws, &["artifacts", "list", "--json"])).unwrap();
    assert_eq!(list[0]["id"], "report.md");
    assert_eq!(list[0]["bytes"], 9);
    assert!(ok(ws, &["artifacts", "list"]).contains("report.md"));
    assert_eq!(
        ok(ws, &["artifacts", "show", "report.md", "--content"]),
        "# report\n"
    );
    assert!(err(ws, &["artifacts", "show", "nope"]).contains("no artifact `nope`"));
    // The policy comes from config.toml: nothing may be kept.
    std::fs::write(
        ws.join(".meta/config.toml"),
        "[artifacts]\nmax_total_mib = 0\n",
    )
    .unwrap();
    assert!(ok(ws, &["artifacts", "gc"]).contains("removed 1 artifacts"));
    assert!(!kept.join("report.md").exists());
    std::fs::write(
        ws.join(".meta/config.toml"),
        "[artifacts]\nmax_age_days = nan\n",
    )
    .unwrap();
    assert!(err(ws, &["artifacts", "gc"]).contains("max_age_days must be a number of days"));
}

/// `metash migrate`: files from before versioning get their version and nothing else changes;
/// `--check` reports and writes nothing; a newer file is refused by file and line, untouched.
#[test]
fn migrate_versions_old_files_and_refuses_newer_ones() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    ok(ws, &["init"]);
    let config = ws.join(".meta/config.toml");
    let old_config = "# my settings\n\n# the budget I can afford\n[budget]\nmax_tokens = 1000\n";
    std::fs::write(&config, old_config).unwrap();
    std::fs::create_dir_all(ws.join(".meta/kv")).unwrap();
    std::fs::write(ws.join(".meta/kv/writer.json"), r#"{"note": "kept"}"#).unwrap();

    let out = metash(ws, &["migrate", "--check"]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("would upgrade") && said.contains("config.toml"),
        "{said}"
    );
    assert!(said.contains("kv/writer.json"), "{said}");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), old_config);

    ok(ws, &["migrate"]);
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "# my settings\n\nschema_version = 1\n# the budget I can afford\n[budget]\nmax_tokens = 1000\n"
    );
    let kv: Value =
        serde_json::from_slice(&std::fs::read(ws.join(".meta/kv/writer.json")).unwrap()).unwrap();
    assert_eq!(
        kv,
        serde_json::json!({"schema_version": 1, "data": {"note": "kept"}})
    );
    assert_eq!(
        ok(ws, &["kv", "get", "note", "--agent", "writer"]).trim(),
        "kept"
    );
    assert!(ok(ws, &["migrate"]).contains("up to date"));
    assert!(metash(ws, &["migrate", "--check"]).status.success());

    let newer = "# from the future\nschema_version = 7\n";
    std::fs::write(&config, newer).unwrap();
    let e = err(ws, &["migrate"]);
    assert!(
        e.contains("config.toml:2") && e.contains("schema_version 7"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&config).unwrap(), newer);
    // Every command that reads the config stops the same way.
    assert!(err(ws, &["run"]).contains("config.toml:2"), "run");
}
