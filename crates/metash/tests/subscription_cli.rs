#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 32 item 4: a newcomer signed in with a subscription and no API key. `metash doctor`
//! recognises the signed-in CLI (`CLAUDE_CODE_OAUTH_TOKEN`, `codex login`) as a usable agent and
//! never prints the token; `metash init` then writes roles that use the sign-in.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use metash_testkit::cli::Cli;
use serde_json::Value;

const TOKEN: &str = "sk-ant-oat01-doctor-subscription-token-0123456789";

/// metash in a fresh HOME, the CLIs found in `tools`, no key, and the given variables.
fn metash(ws: &Path, home: &Path, tools: &Path, env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metash"));
    c.arg("-C")
        .arg(ws)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .env("NO_COLOR", "1")
        .env("METASH_TOOLS_DIR", tools)
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Neither stream holds any of `secrets`.
fn never_printed(out: &Output, secrets: &[&str]) -> String {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for s in secrets {
        assert!(!all.contains(s), "printed a token: {all}");
    }
    all
}

fn doctor_json(cmd: &mut Command, secrets: &[&str]) -> Value {
    let out = cmd.args(["doctor", "--json"]).output().unwrap();
    let text = never_printed(&out, secrets);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("doctor --json: {e}: {text}"))
}

fn find<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check `{name}` in {v}"))
}

/// A fresh HOME and project under a temporary directory, and Claude Code's `.tools`.
fn fresh(
    test: &str,
) -> Option<(
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
    std::path::PathBuf,
)> {
    let tools = Cli::Claude.installed(test)?;
    let dir = tempfile::tempdir().unwrap();
    let (home, ws) = (dir.path().join("home"), dir.path().join("project"));
    std::fs::create_dir_all(&home).unwrap();
    Some((dir, home, ws, tools))
}

const SIGNED_IN: [(&str, &str); 1] = [("CLAUDE_CODE_OAUTH_TOKEN", TOKEN)];

#[test]
fn doctor_finds_a_usable_agent_in_a_claude_subscription_token_without_printing_it() {
    let Some((_dir, home, ws, tools)) = fresh("doctor_finds_a_claude_subscription_token") else {
        return;
    };
    let v = doctor_json(&mut metash(&ws, &home, &tools, &SIGNED_IN), &[TOKEN]);
    let agent = find(&v, "agent");
    assert_eq!(agent["status"], "ok", "{agent}");
    assert!(
        agent["detail"]
            .as_str()
            .unwrap()
            .contains("claude-code with your subscription"),
        "{agent}"
    );
    let sign_in = find(&v, "claude sign-in");
    assert_eq!(sign_in["status"], "ok", "{sign_in}");
    assert!(sign_in["detail"]
        .as_str()
        .unwrap()
        .contains("CLAUDE_CODE_OAUTH_TOKEN"));
    assert_eq!(find(&v, "ANTHROPIC_API_KEY")["status"], "warn");
    // The human report too.
    let out = metash(&ws, &home, &tools, &SIGNED_IN)
        .arg("doctor")
        .output()
        .unwrap();
    let text = never_printed(&out, &[TOKEN]);
    assert!(text.contains("claude sign-in"), "{text}");
    // Signed out, no agent can run.
    let v = doctor_json(&mut metash(&ws, &home, &tools, &[]), &[TOKEN]);
    assert_eq!(find(&v, "agent")["status"], "fail");
    assert_eq!(find(&v, "claude sign-in")["status"], "warn");
}

#[test]
fn init_writes_roles_on_the_claude_subscription_and_doctor_finds_them_ready() {
    let Some((_dir, home, ws, tools)) = fresh("init_writes_roles_on_the_claude_subscription")
    else {
        return;
    };
    // `init` picks Claude Code for its sign-in and writes roles that use it.
    let out = metash(&ws, &home, &tools, &SIGNED_IN)
        .arg("init")
        .output()
        .unwrap();
    never_printed(&out, &[TOKEN]);
    assert!(out.status.success(), "{out:?}");
    let config = std::fs::read_to_string(ws.join(".meta/config.toml")).unwrap();
    assert_eq!(
        config.matches("auth = \"subscription\"").count(),
        3,
        "{config}"
    );
    assert!(config.contains("frontend = \"agent-sdk\""), "{config}");
    assert!(
        !config.lines().any(|l| l.starts_with("api_key_env")),
        "{config}"
    );
    assert!(!config.contains(TOKEN));
    let v = doctor_json(&mut metash(&ws, &home, &tools, &SIGNED_IN), &[TOKEN]);
    for role in ["planner", "executor", "verifier"] {
        let r = find(&v, &format!("role {role}"));
        assert_eq!(r["status"], "ok", "{r}");
        assert!(
            r["detail"]
                .as_str()
                .unwrap()
                .contains("CLAUDE_CODE_OAUTH_TOKEN"),
            "{r}"
        );
    }
    // Signed out, the same roles say how to sign in.
    let v = doctor_json(&mut metash(&ws, &home, &tools, &[]), &[TOKEN]);
    let r = find(&v, "role executor");
    assert_eq!(r["status"], "fail", "{r}");
    assert!(
        r["detail"].as_str().unwrap().contains("claude login"),
        "{r}"
    );
}

#[test]
fn init_agent_claude_code_takes_the_key_when_set_else_the_sign_in() {
    let Some((dir, home, ws, tools)) = fresh("init_agent_claude_code_takes_the_key") else {
        return;
    };
    let out = metash(&ws, &home, &tools, &SIGNED_IN)
        .args(["init", "--agent", "claude-code"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let config = std::fs::read_to_string(ws.join(".meta/config.toml")).unwrap();
    assert!(config.contains("auth = \"subscription\""), "{config}");
    let ws2 = dir.path().join("with-key");
    let with_key = [
        ("CLAUDE_CODE_OAUTH_TOKEN", TOKEN),
        ("ANTHROPIC_API_KEY", "sk-ant-api-doctor-key"),
    ];
    let out = metash(&ws2, &home, &tools, &with_key)
        .args(["init", "--agent", "claude-code"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let config = std::fs::read_to_string(ws2.join(".meta/config.toml")).unwrap();
    assert!(
        config.contains("api_key_env = \"ANTHROPIC_API_KEY\""),
        "{config}"
    );
    assert!(!config.contains("auth ="), "{config}");
}

/// An ID token naming account `acct-doc` on the `pro` plan (unsigned: only its claims are read).
const ID_TOKEN: &str =
    "eyJhbGciOiJub25lIn0.eyJodHRwczovL2FwaS5vcGVuYWkuY29tL2F1dGgiOnsiY2hhdGdwdF9\
hY2NvdW50X2lkIjoiYWNjdC1kb2MiLCJjaGF0Z3B0X3BsYW5fdHlwZSI6InBybyJ9fQ.c2ln";

#[test]
fn doctor_recognises_a_codex_chatgpt_login_without_printing_it() {
    let Some(tools) = Cli::Codex.installed("doctor_recognises_a_codex_chatgpt_login") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (home, ws) = (dir.path().join("home"), dir.path().join("project"));
    std::fs::create_dir_all(home.join(".codex")).unwrap();
    let (access, refresh) = ("codex-access-doctor-secret", "codex-refresh-doctor-secret");
    std::fs::write(
        home.join(".codex/auth.json"),
        serde_json::json!({"OPENAI_API_KEY": null, "tokens": {"id_token": ID_TOKEN,
            "access_token": access, "refresh_token": refresh, "account_id": "acct-doc"},
            "last_refresh": "2025-01-01T00:00:00Z"})
        .to_string(),
    )
    .unwrap();
    let secrets = [access, refresh, ID_TOKEN];
    let v = doctor_json(&mut metash(&ws, &home, &tools, &[]), &secrets);
    let sign_in = find(&v, "codex sign-in");
    assert_eq!(sign_in["status"], "ok", "{sign_in}");
    assert!(
        sign_in["detail"].as_str().unwrap().contains("pro plan"),
        "{sign_in}"
    );
    let agent = find(&v, "agent");
    assert_eq!(agent["status"], "ok", "{agent}");
    assert!(agent["detail"]
        .as_str()
        .unwrap()
        .contains("codex with your subscription"));
    let out = metash(&ws, &home, &tools, &[])
        .args(["init", "--agent", "codex"])
        .output()
        .unwrap();
    never_printed(&out, &secrets);
    assert!(out.status.success(), "{out:?}");
    let config = std::fs::read_to_string(ws.join(".meta/config.toml")).unwrap();
    assert_eq!(
        config.matches("auth = \"subscription\"").count(),
        3,
        "{config}"
    );
}
