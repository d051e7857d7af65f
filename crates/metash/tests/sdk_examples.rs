//! The SDKs' examples end to end (issue 20), through the built `metash` binary:
//! - each language's example agent, built by its `build.sh` and installed as a user agent, run by
//!   `metash spawn` in the native sandbox: its events in the log, `memory` granted then revoked by
//!   another process while it runs (it hears it and falls back), its KV read back, its artifact
//!   saved, its checkpoint answered with `metash resume` and the answer acted on;
//! - each language's orchestrator script driving a real `metash serve --stdio` over JSON-RPC.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use metash_protocol::LogRecord;
use metash_testkit::sdk::{self, Lang};
use serde_json::Value;

struct World {
    dir: tempfile::TempDir,
    agent: String,
}

impl World {
    /// A project, and `lang`'s example agent built (natively, or as a WASI component) and
    /// installed as the user agent `notes-<lang>[-wasm]`.
    fn new(lang: Lang, wasm: bool, test: &str) -> Option<Self> {
        if let Some(why) = sdk::missing() {
            metash_testkit::skip(test, &why);
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let agent = format!("notes-{}{}", lang.name(), if wasm { "-wasm" } else { "" });
        let installed = dir.path().join("config/metash/agents").join(&agent);
        if wasm {
            if let Err(why) = sdk::componentizer(lang) {
                metash_testkit::skip(test, &why);
                return None;
            }
            sdk::build_wasm(lang, &installed).unwrap();
        } else {
            sdk::build(lang, &installed).unwrap();
        }
        let w = Self { dir, agent };
        std::fs::create_dir_all(w.ws()).unwrap();
        w.ok(&["init"]);
        Some(w)
    }

    fn ws(&self) -> PathBuf {
        self.dir.path().join("project")
    }

    fn installed(&self) -> PathBuf {
        self.dir
            .path()
            .join("config/metash/agents")
            .join(&self.agent)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_metash"));
        cmd.arg("-C")
            .arg(self.ws())
            .args(args)
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env("HOME", self.dir.path().join("home"))
            .stdin(Stdio::null());
        cmd
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.command(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn spawn(&self, message: &str) -> std::process::Child {
        self.command(&[
            "spawn",
            &self.agent,
            "--message",
            message,
            "--yes-to",
            "native",
            "--yes-to",
            "files.read",
            "--yes-to",
            "files.write",
            "--non-interactive",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    }

    fn records(&self) -> Vec<LogRecord> {
        metash_store::Store::open(&self.ws())
            .unwrap()
            .log()
            .read_all()
            .unwrap()
    }

    /// The agent's output chunks, in log order.
    fn outputs(&self) -> Vec<String> {
        self.records()
            .into_iter()
            .filter(|r| {
                r.kind == "agent_event"
                    && r.agent.as_deref() == Some(&self.agent)
                    && r.data["type"] == "output"
            })
            .map(|r| r.data["data"].as_str().unwrap().to_string())
            .collect()
    }

    fn wait_for_output(&self, needle: &str, child: &mut std::process::Child) {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if self.outputs().iter().any(|o| o.contains(needle)) {
                return;
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "the spawn ended ({status}) before `{needle}`: {:?}",
                    self.outputs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no `{needle}` within 60 s: {:?}", self.outputs());
    }
}

fn finished(child: std::process::Child) -> (i32, Value) {
    let out: Output = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let json = serde_json::from_str(&text).unwrap_or_else(|_| {
        panic!(
            "spawn printed no JSON: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
}

fn the_example_agent_runs_under_metash(lang: Lang, wasm: bool) {
    let sandbox = if wasm { "wasm" } else { "native" };
    let test = format!("{} example agent ({sandbox})", lang.name());
    let Some(w) = World::new(lang, wasm, &test) else {
        return;
    };
    let agent = w.agent.clone();
    w.ok(&["consent", "grant", &agent, "memory", "--duration-s", "600"]);
    let prompt = "remember the launch, then wait for revoke";
    let mut child = w.spawn(prompt);
    w.wait_for_output("waiting for memory to be revoked", &mut child);
    // Another process revokes while the agent runs: it must hear it at once and fall back.
    w.ok(&["consent", "revoke", &agent, "memory"]);
    let (code, response) = finished(child);
    assert_eq!(code, 4, "a checkpoint: {response}");
    assert_eq!(response["status"], "checkpoint", "{response}");

    let outputs = w.outputs();
    let expected = [
        format!("you said: {prompt}"),
        format!("kv read back: {prompt}"),
        format!("scratchpad read back: {prompt}"),
        "waiting for memory to be revoked".to_string(),
        "memory revoked: falling back to no memory".to_string(),
        "kv refused after revocation: state_denied".to_string(),
    ];
    let mut at = 0;
    for want in &expected {
        let found = outputs[at..].iter().position(|o| o.contains(want.as_str()));
        let Some(i) = found else {
            panic!("`{want}` missing (or out of order) in {outputs:?}")
        };
        at += i + 1;
    }
    let records = w.records();
    let of = |kind: &str| -> Vec<&LogRecord> {
        records
            .iter()
            .filter(|r| r.kind == kind && r.agent.as_deref() == Some(agent.as_str()))
            .collect()
    };
    // It ran in the sandbox asked for, confined.
    let started = of("agent_started");
    assert_eq!(started[0].data["sandbox"], sandbox, "{:?}", started[0].data);
    if !wasm {
        assert!(started[0].data["landlock_abi"].as_i64().unwrap() >= 1);
        assert_eq!(started[0].data["seccomp"], true);
    }
    // The revocation reached it once, as a revocation.
    let sent = of("consent_revoke_sent");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].data["capability"], "memory");
    assert_eq!(sent[0].data["why"], "revoked");
    // KV and scratchpad are in the store, as the agent read them back.
    let kv = w.ok(&["kv", "get", "--agent", &agent, "last_prompt", "--json"]);
    assert_eq!(serde_json::from_str::<Value>(&kv).unwrap(), prompt);
    // The artifact was copied into the store.
    let id = format!("notes-{}", lang.name());
    let content = w.ok(&["artifacts", "show", &id, "--content"]);
    assert!(content.contains(prompt), "{content}");
    assert!(w.ws().join(format!("{id}.md")).is_file());
    // The checkpoint, answered from the terminal, reaches the next spawn once.
    w.ok(&["resume", "--answer", "publish"]);
    let (code, response) = finished(w.spawn("go on"));
    assert_eq!(code, 0, "{response}");
    assert!(
        response["data"]
            .as_str()
            .unwrap()
            .contains("resumed with answer: publish"),
        "{response}"
    );
    assert!(w.installed().join("manifest.toml").is_file());
}

#[test]
fn the_typescript_example_agent_runs_under_metash() {
    the_example_agent_runs_under_metash(Lang::TypeScript, false);
}

#[test]
fn the_python_example_agent_runs_under_metash() {
    the_example_agent_runs_under_metash(Lang::Python, false);
}

/// The same `agent.py`, componentized: the WASM sandbox, the same behaviour.
#[test]
fn the_python_example_agent_runs_under_metash_as_a_wasm_component() {
    the_example_agent_runs_under_metash(Lang::Python, true);
}

/// The same `notes.mjs`, bundled and componentized: the WASM sandbox, the same behaviour.
#[test]
fn the_typescript_example_agent_runs_under_metash_as_a_wasm_component() {
    the_example_agent_runs_under_metash(Lang::TypeScript, true);
}

/// A policy for `metash serve` (nobody can be asked over stdio): what the example needs.
const POLICY: &str = r#"schema_version = "0.1"

[[allow]]
agent = "*"
capability = "native"
sensitive = true

[[allow]]
agent = "*"
capability = "memory"
duration_s = 600

[[allow]]
agent = "*"
capability = "files.read"

[[allow]]
agent = "*"
capability = "files.write"
"#;

/// The orchestrator script of `lang`, run against a real `metash serve --stdio`.
fn orchestrate(w: &World, lang: Lang) -> Value {
    let policy = w.dir.path().join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let mut cmd = match lang {
        Lang::TypeScript => {
            // Beside the built agent, whose node_modules holds the SDK.
            let script = w.installed().join("orchestrator.mjs");
            std::fs::copy(lang.example_dir().join("orchestrator.mjs"), &script).unwrap();
            let mut c = Command::new("node");
            c.arg(script);
            c
        }
        Lang::Python => {
            let mut c = Command::new(sdk::python());
            c.arg(lang.example_dir().join("orchestrator.py"))
                .env("PYTHONPATH", sdk::repo().join("sdk/python/src"));
            c
        }
    };
    let out = cmd
        .arg(w.ws())
        .arg(&w.agent)
        .arg("orchestrated hello")
        .env("METASH", env!("CARGO_BIN_EXE_metash"))
        .env("METASH_POLICY", &policy)
        .env("XDG_CONFIG_HOME", w.dir.path().join("config"))
        .env("HOME", w.dir.path().join("home"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{} orchestrator: {text}{}",
        lang.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn the_orchestrator_drives_metash_serve(lang: Lang) {
    let test = format!("{} orchestrator", lang.name());
    let Some(w) = World::new(lang, false, &test) else {
        return;
    };
    let summary = orchestrate(&w, lang);
    assert_eq!(summary["first"]["status"], "checkpoint", "{summary}");
    assert_eq!(summary["answered"]["user_input"], "publish", "{summary}");
    assert_eq!(summary["second"]["status"], "success", "{summary}");
    assert!(
        summary["second"]["data"]
            .as_str()
            .unwrap()
            .contains("resumed with answer: publish"),
        "{summary}"
    );
    assert_eq!(summary["orchestrator"], lang.name(), "{summary}");
    assert!(summary["revision"].as_u64().unwrap() >= 1, "{summary}");
    for kind in [
        "state_update",
        "progress",
        "spawn",
        "agent_event",
        "spawn_end",
    ] {
        assert!(
            summary["events"][kind].as_u64().unwrap_or(0) >= 1,
            "no `{kind}` notification: {summary}"
        );
    }
    // What the client was told is what the store holds.
    let state: Value = serde_json::from_str(&w.ok(&["state", "get", "--json"])).unwrap();
    assert_eq!(state["variables"]["orchestrator"], lang.name(), "{state}");
    let spawns = w
        .records()
        .iter()
        .filter(|r| r.kind == "spawn_end" && r.agent.as_deref() == Some(w.agent.as_str()))
        .count();
    assert_eq!(spawns, 2);
    let out = w.ok(&["kv", "get", "--agent", &w.agent, "last_prompt", "--json"]);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        "orchestrated hello"
    );
}

#[test]
fn the_typescript_orchestrator_drives_metash_serve() {
    the_orchestrator_drives_metash_serve(Lang::TypeScript);
}

#[test]
fn the_python_orchestrator_drives_metash_serve() {
    the_orchestrator_drives_metash_serve(Lang::Python);
}

/// The installed agent is a directory of its own (`build.sh` output), nothing outside it.
#[test]
fn the_built_examples_hold_their_sdk() {
    if let Some(why) = sdk::missing() {
        return metash_testkit::skip("built examples", &why);
    }
    let dir = tempfile::tempdir().unwrap();
    for lang in Lang::ALL {
        let dest = dir.path().join(lang.name());
        sdk::build(lang, &dest).unwrap();
        for stem in ["agent", "echo"] {
            assert!(dest.join(lang.entry(stem)).is_file(), "{lang:?} {stem}");
        }
        let sdk_copy: &Path = &dest.join("node_modules/@metash/sdk");
        if lang == Lang::TypeScript {
            let meta = std::fs::symlink_metadata(sdk_copy).unwrap();
            assert!(
                meta.is_dir(),
                "a copy, not a symlink out of the agent's directory"
            );
            assert!(sdk_copy.join("dist/index.js").is_file());
        }
    }
}
