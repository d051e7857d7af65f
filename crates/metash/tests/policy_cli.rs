//! `metash agents|consent|ledger` end to end, through the built binary, in temp dirs only (the
//! child's XDG_CONFIG_HOME and HOME point into the temp dir).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use metash_protocol::LogKind;

use metash_policy::{Authorization, CapabilityRequest, DenyAll, DenyCode, Policy, Registry};
use metash_protocol::AgentEvent;
use serde_json::{json, Value};

const SEED: &str = metash_testkit::SEED_MANIFEST;

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        metash_store::Store::init(&dir.path().join("ws"), None).unwrap();
        Self { dir }
    }

    fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn agent(&self, id: &str, text: &str) -> PathBuf {
        let d = self.ws().join(".meta/agents").join(id);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("manifest.toml"), text).unwrap();
        d.join("manifest.toml")
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_metash"))
            .arg("-C")
            .arg(self.ws())
            .args(args)
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env("HOME", self.dir.path().join("home"))
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    fn policy(&self) -> Policy {
        let dirs = metash_policy::AgentDirs::new(&self.ws(), Some(&self.dir.path().join("config")));
        Policy::new(
            metash_store::Store::open(&self.ws()).unwrap(),
            Registry::discover(&dirs),
        )
    }
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

#[test]
fn agents_list_show_and_validate() {
    let e = Env::new();
    let m = e.agent("claude", SEED);
    let user = e.dir.path().join("config/metash/agents/helper");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::write(
        user.join("manifest.toml"),
        SEED.replace("Claude Code", "Helper"),
    )
    .unwrap();
    let list = e.json(&["agents", "list", "--json"]);
    let ids: Vec<&str> = list["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["claude", "helper"]);
    assert_eq!(list["agents"][1]["source"], "user");
    let show = e.json(&["agents", "show", "claude", "--json"]);
    assert_eq!(
        show["entry"],
        json!(std::fs::canonicalize(m.parent().unwrap())
            .unwrap()
            .join("claude_agent.wasm"))
    );
    assert_eq!(show["sandbox"], "wasm");
    assert!(e.ok(&["agents", "validate"]).contains("ok"));

    let bad = e.agent(
        "bad",
        &SEED.replace("sandbox = \"wasm\"", "sandbox = \"wsam\""),
    );
    let out = e.run(&["agents", "validate", bad.to_str().unwrap()]);
    assert_eq!(code(&out), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}:5:11: field `sandbox`: expected \"wasm\" or \"native\", found \"wsam\"",
            bad.display()
        )),
        "{err}"
    );
    let v = e.run(&[
        "agents",
        "validate",
        "--json",
        bad.parent().unwrap().to_str().unwrap(),
    ]);
    let v: Value = serde_json::from_slice(&v.stdout).unwrap();
    assert_eq!(v[0]["errors"][0]["line"], 5);
    assert_eq!(v[0]["errors"][0]["field"], "sandbox");
    // Registration is in the ledger, once.
    e.ok(&["agents", "list"]);
    let ledger = e.json(&["ledger", "view", "--kind", "agent_registered", "--json"]);
    let ids: Vec<&str> = ledger
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["agent"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["claude", "helper"]);
}

#[test]
fn migrate_check_then_migrate_keeps_comments_and_validates() {
    let e = Env::new();
    let old = SEED.replace("schema_version = \"0.1\"\n", "# my agent\n\n");
    let m = e.agent("old", &old);
    let out = e.run(&["agents", "migrate", "--check"]);
    assert_eq!(code(&out), 1, "--check reports a needed change");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("would change") && stdout.contains("line 3: + schema_version = \"0.1\""),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(&m).unwrap(),
        old,
        "--check writes nothing"
    );
    let stdout = e.ok(&["agents", "migrate", m.to_str().unwrap()]);
    assert!(stdout.contains("migrated"), "{stdout}");
    let new = std::fs::read_to_string(&m).unwrap();
    assert!(
        new.starts_with("# my agent\n\nschema_version = \"0.1\"\nname = \"Claude Code\""),
        "{new}"
    );
    assert!(new.contains("# wasm | native"));
    e.ok(&["agents", "validate", m.to_str().unwrap()]);
    assert!(e
        .ok(&["agents", "migrate", "--check"])
        .contains("up to date"));
}

#[test]
fn consent_grant_list_revoke() {
    let e = Env::new();
    e.agent("claude", SEED);
    let g = e.json(&[
        "consent",
        "grant",
        "claude",
        "network:api.github.com",
        "--duration-s",
        "120",
        "--json",
    ]);
    assert_eq!(g["duration_s"], 120);
    let list = e.json(&["consent", "list", "--json"]);
    assert_eq!(list[0]["capability"], "network:api.github.com");
    assert_eq!(list[0]["live"], true);
    let out = e.run(&["consent", "grant", "claude", "process.spawn:git"]);
    assert_eq!(code(&out), 1);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("does not declare capability `process.spawn:git`"));
    e.ok(&["consent", "revoke", "claude", "network"]);
    assert_eq!(e.json(&["consent", "list", "--json"]), json!([]));
    assert_eq!(
        e.json(&["consent", "list", "--all", "--json"])
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_revoke_from_a_second_process_takes_effect_at_once() {
    let e = Env::new();
    e.agent("claude", SEED);
    let policy = e.policy();
    policy
        .grant("claude", &"network".parse().unwrap(), 3600, false, "test")
        .unwrap();
    let req = CapabilityRequest::network("api.github.com", false, "fetch");
    assert!(policy
        .authorize("claude", &req, &mut DenyAll)
        .unwrap()
        .is_allowed());
    e.ok(&["consent", "revoke", "claude", "network"]);
    // Same Policy value, no reload: the next use sees the revocation and gets a clear error.
    let auth = policy.authorize("claude", &req, &mut DenyAll).unwrap();
    let Authorization::Denied {
        code,
        event: AgentEvent::Error { code: c, hint, .. },
        ..
    } = auth
    else {
        panic!("{auth:?}")
    };
    assert_eq!(code, DenyCode::ConsentRevoked);
    assert_eq!(c, "consent_revoked");
    assert!(hint.unwrap().contains("metash consent grant claude"));
}

#[test]
fn consent_check_never_hangs_and_follows_flags_and_policy() {
    let e = Env::new();
    e.agent("claude", SEED);
    // Undeclared: refused, never asked.
    let out = e.run(&[
        "consent",
        "check",
        "claude",
        "process.spawn:git",
        "--yes-to",
        "process.spawn",
    ]);
    assert_eq!(code(&out), 7, "refused is exit 7 (docs/cli.md)");
    assert!(String::from_utf8_lossy(&out.stdout).contains("capability_undeclared"));
    // Nobody to ask (stdin is not a terminal, no policy): deny.
    let out = e.run(&[
        "consent",
        "check",
        "claude",
        "network:api.github.com",
        "--interactive",
    ]);
    assert_eq!(code(&out), 7, "refused is exit 7 (docs/cli.md)");
    assert!(String::from_utf8_lossy(&out.stdout).contains("consent_denied"));
    // --yes-to answers.
    e.ok(&[
        "consent",
        "check",
        "claude",
        "network:api.github.com",
        "--action",
        "network-write",
        "--yes-to",
        "network",
    ]);
    // A policy file answers, and its duration records a grant.
    let pf = e.dir.path().join("policy.toml");
    std::fs::write(&pf, "schema_version = \"0.1\"\n[[allow]]\nagent = \"claude\"\ncapability = \"files.read\"\nduration_s = 600\n").unwrap();
    e.ok(&[
        "consent",
        "check",
        "claude",
        "files.read:src",
        "--policy",
        pf.to_str().unwrap(),
    ]);
    let d = e.json(&[
        "consent",
        "check",
        "claude",
        "files.read:src",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(d["decision"], "allow");
    let kinds: Vec<String> = e
        .json(&["ledger", "view", "--agent", "claude", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap().to_string())
        .collect();
    for k in [
        "agent_registered",
        "error",
        "consent_request",
        "consent_answer",
        "consent_grant",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
    }
}

#[test]
fn ledger_view_and_export_redact_planted_secrets() {
    let e = Env::new();
    e.agent("claude", SEED);
    e.ok(&["consent", "grant", "claude", "network"]);
    let key = "sk-ant-api03-PlantedKey0123456789abcdef";
    let bearer = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJtZSJ9.c2lnbmF0dXJlLXNpZ25hdHVyZQ";
    let opaque = "tok_plantedBearer123456";
    let store = metash_store::Store::open(&e.ws()).unwrap();
    store
        .append(
            LogKind::AgentAction,
            Some("claude"),
            json!({
                "capability": "network:api.anthropic.com",
                "detail": {
                    "env": {"ANTHROPIC_API_KEY": key, "TERM": "xterm"},
                    "request": format!("POST /v1/messages Authorization: Bearer {opaque} (and {bearer})"),
                    "status": 201,
                },
            }),
        )
        .unwrap();
    for format in ["jsonl", "csv"] {
        let out = e.ok(&["ledger", "export", "--format", format]);
        for s in [key, bearer, opaque] {
            assert!(!out.contains(s), "{format} leaks {s}");
        }
        for kept in [
            "POST /v1/messages",
            "xterm",
            "network:api.anthropic.com",
            "201",
            "consent_grant",
            "[REDACTED:anthropic_key:",
        ] {
            assert!(out.contains(kept), "{format} lost {kept}:\n{out}");
        }
    }
    let file = e.dir.path().join("ledger.jsonl");
    e.ok(&[
        "ledger",
        "export",
        "--format",
        "jsonl",
        "--agent",
        "claude",
        "--capability",
        "network:api.anthropic.com",
        "-o",
        file.to_str().unwrap(),
    ]);
    let lines: Vec<Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["data"]["detail"]["env"]["TERM"], "xterm");
    let table = e.ok(&["ledger", "view", "--since", "1h"]);
    assert!(
        table.starts_with("SEQ") && table.contains("consent_grant") && !table.contains(key),
        "{table}"
    );
    assert_eq!(
        e.ok(&["ledger", "view", "--until", "2000-01-01", "--json"])
            .trim(),
        "[]"
    );
}

/// `metash agent suspend` of an agent nothing runs: no one answers, the request is withdrawn (it
/// would otherwise freeze the agent's next run) and the command fails saying why.
#[test]
fn suspending_an_agent_nothing_runs_fails_and_leaves_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    let init = std::process::Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(ws)
        .arg("init")
        .output()
        .unwrap();
    assert!(init.status.success());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(ws)
        .args(["agent", "suspend", "idle", "--wait-ms", "300"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is `idle` running?") && err.contains("withdrawn"),
        "{err}"
    );
    let control = std::fs::read_to_string(ws.join(".meta/control.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&control).unwrap();
    assert_eq!(doc["data"], serde_json::json!({}), "{control}");
}

/// `metash consent pending` lists the questions waiting for any client; `metash consent answer`
/// answers one, first come first served (`metash ui` and JSON-RPC answer the same records).
#[test]
fn consent_pending_and_answer() {
    let env = Env::new();
    assert!(env
        .ok(&["consent", "pending"])
        .contains("no question is waiting"));
    let store = metash_store::Store::open(&env.ws()).unwrap();
    let q = metash_policy::ConsentQuestion::new(
        "fetcher",
        "network:api.example.com".parse().unwrap(),
        "fetch the docs",
        None,
    );
    let id = metash_host::asks::post(&store, &q, std::time::Duration::from_secs(60)).unwrap();
    let listed = env.json(&["--json", "consent", "pending"]);
    assert_eq!(listed[0]["id"], id.as_str());
    let text = env.ok(&["consent", "pending"]);
    assert!(
        text.contains("fetcher asks for `network:api.example.com` (one action)"),
        "{text}"
    );
    let missing = env.run(&["consent", "answer", &id, "for"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("--seconds"));
    assert!(env
        .ok(&["consent", "answer", &id, "for", "--seconds", "30"])
        .contains("answered"));
    let again = env.run(&["consent", "answer", &id, "deny"]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already answered (allow_for, by cli)"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(env
        .ok(&["consent", "pending"])
        .contains("no question is waiting"));
}
