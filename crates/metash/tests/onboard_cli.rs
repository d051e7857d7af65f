#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A newcomer's first steps (issue 13 item 6): `metash doctor` says what is missing with the fix,
//! `metash init` detects an installed CLI and its key (or takes `--agent`) and writes roles that
//! `metash doctor` then finds ready.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// Starts with `sk-real`: what the sandboxed CLIs' key probe (`metash_testkit::cli::META_PROBES`)
/// looks for in every process it can read, this one (which holds it) included.
const FAKE_KEY: &str = "sk-real-onboard-test-0123456789abcdef";

fn pi_bin() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/node_modules/.bin/pi");
    if p.exists() {
        return Some(p);
    }
    metash_testkit::skip(
        "onboard tests with pi",
        "pi is not installed under .tools (run scripts/setup)",
    );
    None
}

/// metash with a clean environment: no keys, no CLIs on PATH, pi (when given) found through
/// `METASH_PI_BIN` as a user's PATH would find it.
fn metash(ws: &Path, pi: Option<&Path>, key: bool) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metash"));
    c.arg("-C")
        .arg(ws)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", ws)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    if let Some(pi) = pi {
        c.env("METASH_PI_BIN", pi);
    }
    if key {
        c.env("OPENAI_API_KEY", FAKE_KEY);
    }
    c
}

/// The project's vision, as a newcomer writes it after `init` (`metash context set`).
fn set_context(ws: &Path, pi: &Path) {
    let file = ws.join("vision.md");
    std::fs::write(
        &file,
        "# Project: first\n\n## Current Phase Focus\n\nPhase 1: three files.\n",
    )
    .unwrap();
    let out = metash(ws, Some(pi), true)
        .args(["context", "set"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::fs::remove_file(file).unwrap();
}

fn doctor(ws: &Path, pi: Option<&Path>, key: bool) -> (Output, Value) {
    let out = metash(ws, pi, key)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        !stdout.contains(FAKE_KEY),
        "doctor printed the key: {stdout}"
    );
    let v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("doctor --json: {e}: {stdout} {:?}", out.stderr));
    (out, v)
}

fn find<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check `{name}` in {v}"))
}

/// What the kernel offers, as the runtime sees it: doctor must agree.
fn kernel_ready() -> bool {
    let k = metash_runtime::native::probe::probe();
    k.landlock_abi >= 4 && k.seccomp_user_notif.is_ok()
}

#[test]
fn doctor_names_what_is_missing_and_the_fix() {
    let Some(pi) = pi_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (out, v) = doctor(dir.path(), Some(&pi), false);
    // No key: no real agent can run, whatever else is there.
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(out.status.code(), Some(1));
    let agent = find(&v, "agent");
    assert_eq!(agent["status"], "fail");
    assert!(
        agent["fix"]
            .as_str()
            .unwrap()
            .contains("OPENAI_API_KEY=<key>"),
        "{agent}"
    );
    let claude = find(&v, "claude");
    assert_eq!(
        claude["status"], "warn",
        "claude is not on this PATH: {claude}"
    );
    assert_eq!(claude["fix"], "npm install -g @anthropic-ai/claude-code");
    let found = find(&v, "pi");
    assert_eq!(found["status"], "ok");
    let detail = found["detail"].as_str().unwrap();
    assert!(
        detail.chars().next().is_some_and(|c| c.is_ascii_digit()) && detail.contains(" at "),
        "pi's version and path: {detail}"
    );
    let landlock = find(&v, "landlock");
    let abi = metash_runtime::native::isolate::landlock_abi();
    assert_eq!(
        landlock["detail"].as_str().unwrap().split(' ').nth(1),
        Some(abi.to_string().as_str())
    );
    assert_eq!(landlock["status"], if abi >= 4 { "ok" } else { "fail" });
    assert_eq!(find(&v, "project")["status"], "warn");

    // With the key, doctor is satisfied exactly when the kernel is.
    let (out, v) = doctor(dir.path(), Some(&pi), true);
    assert_eq!(v["ok"], kernel_ready(), "{v}");
    assert_eq!(out.status.success(), kernel_ready());
    assert_eq!(find(&v, "OPENAI_API_KEY")["status"], "ok");
}

#[test]
fn init_detects_pi_and_its_key_and_doctor_finds_the_roles_ready() {
    let Some(pi) = pi_bin() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("new-project");
    let out = metash(&ws, Some(&pi), true).arg("init").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("run pi"), "{printed}");
    let config = std::fs::read_to_string(ws.join(".meta/config.toml")).unwrap();
    assert!(config.contains("frontend = \"pi-sdk\""), "{config}");
    assert!(config.contains("executor = \"executor\""), "{config}");
    assert!(
        !config.contains(FAKE_KEY),
        "the key is never written: {config}"
    );
    let (_, v) = doctor(&ws, Some(&pi), true);
    for role in ["planner", "executor", "verifier"] {
        assert_eq!(find(&v, &format!("role {role}"))["status"], "ok", "{v}");
    }
    // Without the key the roles are not ready, and doctor says which variable.
    let (_, v) = doctor(&ws, Some(&pi), false);
    let exec = find(&v, "role executor");
    assert_eq!(exec["status"], "fail");
    assert!(
        exec["detail"].as_str().unwrap().contains("OPENAI_API_KEY"),
        "{exec}"
    );
}

#[test]
fn init_agent_writes_the_chosen_roles_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let out = metash(ws, None, false)
        .args([
            "init",
            "--agent",
            "codex",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m-\"quoted\"",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let path = ws.join(".meta/config.toml");
    let config = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        config.matches("frontend = \"codex-cli\"").count(),
        3,
        "{config}"
    );
    assert!(
        config.contains("base_url = \"http://127.0.0.1:9/v1\""),
        "{config}"
    );
    assert!(
        config.contains(r#"model_smart = "m-\"quoted\"""#),
        "{config}"
    );
    // The file is valid for the host: doctor reads it and names the missing program.
    let (_, v) = doctor(ws, None, true);
    let exec = find(&v, "role executor");
    assert_eq!(exec["status"], "fail");
    assert!(exec["detail"].as_str().unwrap().contains("codex"), "{exec}");
    // A second init --agent keeps the user's file and says so.
    std::fs::write(&path, "# mine\n").unwrap();
    let out = metash(ws, None, false)
        .args(["init", "--agent", "pi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("config.toml exists"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "# mine\n");
}

#[test]
fn init_without_an_agent_says_how_to_get_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = metash(dir.path(), None, false)
        .arg("init")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("metash doctor"));
    assert!(!dir.path().join(".meta/config.toml").exists());
}

#[test]
fn init_agent_pi_then_run_completes_a_plan_in_the_sandbox() {
    let Some(pi) = pi_bin() else { return };
    use metash_testkit::cli::Cli;
    let server = metash_testkit::anthropic::ModelServer::start(|c| Cli::Pi.scripted_run(&c.text()));
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("first-project");
    std::fs::create_dir_all(&ws).unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(&ws)
            .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "empty"]);
    let base = format!("{}/v1", server.base);
    let out = metash(&ws, Some(&pi), true)
        .args([
            "init",
            "--agent",
            "pi",
            "--base-url",
            &base,
            "--model",
            "test-model",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    set_context(&ws, &pi);
    let out = metash(&ws, Some(&pi), true)
        .args(["run", "--non-interactive", "--yes-to", "native", "--json"])
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@localhost")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for t in ["a", "b", "c"] {
        assert_eq!(
            git(&["show", &format!("HEAD:{t}.txt")]).trim(),
            format!("{t}-from-pi")
        );
    }
    // Every CLI turn ran confined, and the key the run used is nowhere in the project.
    let log = std::fs::read_to_string(ws.join(".meta/events.jsonl")).unwrap();
    assert!(
        log.matches("\"frontend\":\"pi-sdk\"").count() >= 5,
        "planner, 3 executors, verifiers"
    );
    assert!(!log.contains(FAKE_KEY));
    // From inside each executor's sandbox, no readable process held the key (metash, holding it
    // in its environment, is out of the sandbox's reach).
    let key_step = metash_testkit::cli::META_PROBES.len();
    let key_counts: Vec<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "tool_result")
        .filter_map(|e| {
            let out = e["data"]["output"].as_str()?.to_string();
            let (_, step, rest) = metash_testkit::cli::scripted_step(&out)?;
            (step == key_step).then(|| rest.trim().lines().next().unwrap_or("").to_string())
        })
        .collect();
    assert_eq!(key_counts, vec!["0"; 3], "{key_counts:?}");
    // Without the consent, the same run refuses to start the CLI and says how to allow it.
    let ws2 = dir.path().join("second");
    std::fs::create_dir_all(&ws2).unwrap();
    let init = Command::new("git")
        .arg("-C")
        .arg(&ws2)
        .args(["init", "-q"])
        .status()
        .unwrap();
    assert!(init.success());
    assert!(metash(&ws2, Some(&pi), true)
        .args(["init", "--agent", "pi", "--base-url", &base])
        .status()
        .unwrap()
        .success());
    set_context(&ws2, &pi);
    let out = metash(&ws2, Some(&pi), true)
        .args(["run", "--non-interactive"])
        .output()
        .unwrap();
    // At once (exit 8, refused consent), the planner asked once, never three rejected plans.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(
        stderr.contains("metash consent grant planner native --sensitive --duration-s 86400")
            && stderr.contains("metash run --yes-to native"),
        "{stderr}"
    );
    let log = std::fs::read_to_string(ws2.join(".meta/events.jsonl")).unwrap();
    let spawns = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "spawn")
        .count();
    assert_eq!(spawns, 1, "{log}");
}
