//! Snapshots of argv/env/cwd for both CLIs in every mode, with and without a continuation, and
//! the materialization rules (deterministic, under aspHome, nothing written on a refusal).

use std::path::{Path, PathBuf};

use metash_harness::{
    build_invocation, build_process_invocation_spec, materialize,
    BuildProcessInvocationSpecRequest, Endpoint, Programs,
};
use metash_protocol::{
    HarnessContinuationRef, HarnessErrorCode, HarnessFrontend, InteractionMode, IoMode,
    ProviderDomain,
};
use serde_json::json;
use HarnessFrontend::{ClaudeCode, CodexCli, PiSdk};
use InteractionMode::{Headless, Interactive};

fn programs() -> Programs {
    Programs {
        claude: Some("/opt/claude".into()),
        codex: Some("/opt/codex".into()),
        pi: Some("/opt/pi".into()),
    }
}

fn req(
    frontend: HarnessFrontend,
    asp: &Path,
    mode: InteractionMode,
    key: Option<&str>,
) -> BuildProcessInvocationSpecRequest {
    let mut r = BuildProcessInvocationSpecRequest::new(frontend, asp, "/work/project");
    r.interaction_mode = mode;
    r.io_mode = if mode == Interactive {
        IoMode::Pty
    } else {
        IoMode::Pipes
    };
    r.continuation = key.map(|k| HarnessContinuationRef {
        provider: frontend.provider(),
        key: Some(k.into()),
    });
    if mode == Headless {
        r.prompt = Some("hello world".into());
    }
    r
}

/// The spec as JSON with the temp aspHome replaced by `$ASP`.
fn snapshot(r: &BuildProcessInvocationSpecRequest) -> serde_json::Value {
    let resp = build_process_invocation_spec(r, &programs()).unwrap();
    let text = serde_json::to_string(&resp.spec)
        .unwrap()
        .replace(&*r.asp_home.to_string_lossy(), "$ASP");
    serde_json::from_str(&text).unwrap()
}

/// The snapshot of one frontend's spec in one mode, resuming `key` when given.
fn snap(
    frontend: HarnessFrontend,
    asp: &Path,
    mode: InteractionMode,
    key: Option<&str>,
) -> serde_json::Value {
    snapshot(&req(frontend, asp, mode, key))
}

fn assert_continuation(s: &serde_json::Value, provider: &str, key: &str) {
    assert_eq!(s["continuation"], json!({"provider": provider, "key": key}));
}

fn quiet_claude_env() -> serde_json::Value {
    json!({
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_INSTALLATION_CHECKS": "1",
        "DISABLE_TELEMETRY": "1"
    })
}

const CODEX_QUIET: [&str; 12] = [
    "-c",
    "analytics.enabled=false",
    "-c",
    "check_for_update_on_startup=false",
    "--disable",
    "plugins",
    "--disable",
    "apps",
    "--disable",
    "remote_plugin",
    "--disable",
    "in_app_updates",
];

/// Claude Code's headless argv: its fixed flags, `extra`, then the prompt.
fn claude_headless_argv(extra: &[&str]) -> serde_json::Value {
    let mut v = vec![
        "/opt/claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
    ];
    v.extend(extra);
    v.extend(["--", "hello world"]);
    json!(v)
}

fn codex_argv(head: &[&str], tail: &[&str]) -> serde_json::Value {
    let mut v: Vec<&str> = head.to_vec();
    v.extend(CODEX_QUIET);
    v.extend(tail);
    json!(v)
}

#[test]
fn claude_code_headless_and_interactive_with_and_without_continuation() {
    let asp = tempfile::tempdir().unwrap();
    let s = snap(ClaudeCode, asp.path(), Headless, None);
    assert_eq!(s["argv"], claude_headless_argv(&[]));
    assert_eq!(s["env"], quiet_claude_env());
    assert_eq!(s["cwd"], "/work/project");
    assert_eq!(s["provider"], "anthropic");
    assert_eq!(s["frontend"], "claude-code");
    assert_eq!(s["interactionMode"], "headless");
    assert_eq!(s["ioMode"], "pipes");
    assert!(s.get("continuation").is_none());

    let s = snap(ClaudeCode, asp.path(), Headless, Some("5f1c"));
    assert_eq!(s["argv"], claude_headless_argv(&["--resume", "5f1c"]));
    assert_continuation(&s, "anthropic", "5f1c");

    let s = snap(ClaudeCode, asp.path(), Interactive, None);
    assert_eq!(s["argv"], json!(["/opt/claude"]));
    assert_eq!(s["ioMode"], "pty");
    assert_eq!(s["interactionMode"], "interactive");

    let s = snap(ClaudeCode, asp.path(), Interactive, Some("5f1c"));
    assert_eq!(s["argv"], json!(["/opt/claude", "--resume", "5f1c"]));
    assert_eq!(s["displayCommand"], "cd /work/project && env CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL=1 DISABLE_AUTOUPDATER=1 DISABLE_ERROR_REPORTING=1 DISABLE_INSTALLATION_CHECKS=1 DISABLE_TELEMETRY=1 /opt/claude --resume 5f1c");
}

#[test]
fn claude_code_passes_every_option_through() {
    let asp = tempfile::tempdir().unwrap();
    let mut r = req(ClaudeCode, asp.path(), Headless, None);
    r.model = Some("claude-sonnet-4-5".into());
    r.prompt = Some("-starts with a dash".into());
    r.env.insert("ANTHROPIC_API_KEY".into(), "sk".into());
    r.env
        .insert("TMUX".into(), "/tmp/tmux-0/default,1,0".into());
    let o = &mut r.options;
    o.isolated_home = true;
    o.endpoint = Some(Endpoint {
        base_url: "http://127.0.0.1:9".into(),
        api_key_env: None,
        provider_name: None,
    });
    o.skip_permissions = true;
    o.system_prompt = Some("You are terse.".into());
    o.append_system_prompt = Some("Also polite.".into());
    o.extra_dirs = vec![PathBuf::from("/data/a"), PathBuf::from("/data/b")];
    o.max_budget_usd = Some(1.5);
    o.max_turns = Some(3);
    o.allowed_tools = vec!["Read".into(), "Bash(git:*)".into()];
    o.mcp_servers = Some(json!({"files": {"command": "mcp-files", "args": ["--root", "/work"]}}));
    o.include_partial_messages = true;
    let s = snapshot(&r);
    assert_eq!(
        s["argv"],
        json!([
            "/opt/claude",
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-partial-messages",
            "--model",
            "claude-sonnet-4-5",
            "--dangerously-skip-permissions",
            "--system-prompt-file",
            "$ASP/claude/sessions/default/system-prompt.md",
            "--append-system-prompt",
            "Also polite.",
            "--mcp-config",
            "$ASP/claude/sessions/default/mcp.json",
            "--strict-mcp-config",
            "--add-dir",
            "/data/a",
            "--add-dir",
            "/data/b",
            "--allowedTools",
            "Read,Bash(git:*)",
            "--max-budget-usd",
            "1.5",
            "--max-turns",
            "3",
            "--",
            "-starts with a dash"
        ])
    );
    assert_eq!(
        s["env"],
        json!({
            "ANTHROPIC_API_KEY": "sk",
            "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
            "CLAUDE_CONFIG_DIR": "$ASP/claude/home/.claude",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_INSTALLATION_CHECKS": "1",
            "DISABLE_TELEMETRY": "1",
            "HOME": "$ASP/claude/home",
            "IS_SANDBOX": "1"
        }),
        "no TMUX in the delta"
    );
    let mcp = std::fs::read_to_string(asp.path().join("claude/sessions/default/mcp.json")).unwrap();
    assert!(mcp.contains("\"mcpServers\""));
    assert_eq!(
        std::fs::read_to_string(asp.path().join("claude/sessions/default/system-prompt.md"))
            .unwrap(),
        "You are terse."
    );
    assert!(s["displayCommand"]
        .as_str()
        .unwrap()
        .ends_with("-- '-starts with a dash'"));
}

#[test]
fn codex_cli_headless_and_interactive_with_and_without_continuation() {
    let asp = tempfile::tempdir().unwrap();
    let s = snap(CodexCli, asp.path(), Headless, None);
    assert_eq!(
        s["argv"],
        codex_argv(
            &["/opt/codex", "exec", "--json", "--skip-git-repo-check"],
            &["--", "hello world"]
        )
    );
    assert_eq!(s["env"], json!({}));
    assert_eq!(s["provider"], "openai");

    let s = snap(CodexCli, asp.path(), Headless, Some("0199-t"));
    assert_eq!(
        s["argv"],
        codex_argv(
            &[
                "/opt/codex",
                "exec",
                "resume",
                "--json",
                "--skip-git-repo-check"
            ],
            &["--", "0199-t", "hello world"]
        )
    );
    assert_continuation(&s, "openai", "0199-t");

    let s = snap(CodexCli, asp.path(), Interactive, None);
    assert_eq!(s["argv"], codex_argv(&["/opt/codex"], &[]));

    let s = snap(CodexCli, asp.path(), Interactive, Some("0199-t"));
    assert_eq!(
        s["argv"],
        codex_argv(&["/opt/codex", "resume"], &["--", "0199-t"])
    );
}

#[test]
fn codex_cli_provider_definition_is_deterministic_and_materialized() {
    let asp = tempfile::tempdir().unwrap();
    let mut r = req(CodexCli, asp.path(), Headless, None);
    r.model = Some("gpt-5.1-codex".into());
    r.options.isolated_home = true;
    r.options.skip_permissions = true;
    r.options.endpoint = Some(Endpoint {
        base_url: "http://127.0.0.1:9/v1".into(),
        api_key_env: Some("TEST_KEY".into()),
        provider_name: None,
    });
    r.options.append_system_prompt = Some("Say \"hi\".".into());
    let s = snapshot(&r);
    let mut head = vec!["/opt/codex", "exec", "--json", "--skip-git-repo-check"];
    head.extend([
        "-c",
        "analytics.enabled=false",
        "-c",
        "check_for_update_on_startup=false",
    ]);
    head.extend([
        "-c",
        "model_provider=\"metash\"",
        "-c",
        "model_providers.metash.name=\"metash\"",
        "-c",
        "model_providers.metash.base_url=\"http://127.0.0.1:9/v1\"",
        "-c",
        "model_providers.metash.wire_api=\"responses\"",
        "-c",
        "model_providers.metash.env_key=\"TEST_KEY\"",
        "-c",
        "developer_instructions=\"Say \\\"hi\\\".\"",
    ]);
    // The `--disable` half of the quiet flags (the `-c` half is overridden above).
    head.extend(&CODEX_QUIET[4..]);
    head.extend([
        "-m",
        "gpt-5.1-codex",
        "--dangerously-bypass-approvals-and-sandbox",
        "--",
        "hello world",
    ]);
    assert_eq!(s["argv"], json!(head));
    assert_eq!(
        s["env"],
        json!({"CODEX_HOME": "$ASP/codex/home", "HOME": "$ASP/codex/home"})
    );
    let config = asp.path().join("codex/home/config.toml");
    let first = std::fs::read(&config).unwrap();
    // Same input, same bytes; build_invocation alone writes nothing.
    let m = materialize(&r).unwrap();
    assert_eq!(std::fs::read(&config).unwrap(), first);
    std::fs::remove_file(&config).unwrap();
    let again = build_invocation(&r, &m, &programs()).unwrap();
    assert!(!config.exists());
    assert_eq!(
        again.spec.argv,
        build_process_invocation_spec(&r, &programs())
            .unwrap()
            .spec
            .argv
    );
    assert_eq!(std::fs::read(&config).unwrap(), first);
    assert!(String::from_utf8_lossy(&first)
        .contains("model_providers.metash.base_url = \"http://127.0.0.1:9/v1\""));
}

#[test]
fn refusals_happen_before_anything_is_written() {
    let asp = tempfile::tempdir().unwrap();
    let home = asp.path().join("nested");
    let mut r = req(ClaudeCode, &home, Headless, None);
    r.continuation = Some(HarnessContinuationRef {
        provider: ProviderDomain::Openai,
        key: Some("t".into()),
    });
    let err = build_process_invocation_spec(&r, &programs()).unwrap_err();
    assert_eq!(err.code(), HarnessErrorCode::ProviderMismatch);
    assert!(!home.exists());

    let mut r = req(CodexCli, &home, Headless, None);
    r.model = Some("claude-opus-4-5".into());
    assert_eq!(
        build_process_invocation_spec(&r, &programs())
            .unwrap_err()
            .code(),
        HarnessErrorCode::ModelNotSupported
    );
    let r = req(HarnessFrontend::AnthropicApi, &home, Headless, None);
    assert_eq!(
        build_process_invocation_spec(&r, &programs())
            .unwrap_err()
            .code(),
        HarnessErrorCode::UnsupportedFrontend
    );
    let mut r = req(CodexCli, &home, Headless, None);
    r.cwd = "relative/dir".into();
    assert_eq!(
        build_process_invocation_spec(&r, &programs())
            .unwrap_err()
            .code(),
        HarnessErrorCode::InvalidRequest
    );
    assert!(!home.exists());
}

#[test]
fn the_request_and_spec_round_trip_as_json() {
    let asp = tempfile::tempdir().unwrap();
    let r = req(CodexCli, asp.path(), Headless, Some("k"));
    let text = serde_json::to_string(&r).unwrap();
    let back: BuildProcessInvocationSpecRequest = serde_json::from_str(&text).unwrap();
    assert_eq!(back, r);
    assert!(text.contains("\"cpSessionId\""));
    assert!(text.contains("\"interactionMode\":\"headless\""));
}

#[test]
fn materialization_is_deterministic_for_every_cli() {
    let build = |root: &Path| {
        let mut files = Vec::new();
        for frontend in [ClaudeCode, CodexCli, PiSdk] {
            let mut r = req(frontend, root, Interactive, None);
            r.cwd = PathBuf::from("/work/project");
            r.model = Some(
                if frontend == ClaudeCode {
                    "claude-sonnet-4-5"
                } else {
                    "gpt-5.1"
                }
                .into(),
            );
            r.env.insert(
                "ANTHROPIC_API_KEY".into(),
                "sk-ant-0123456789abcdefghijKLMNOP".into(),
            );
            r.options.isolated_home = true;
            r.options.trust_cwd = true;
            r.options.system_prompt = Some("sys".into());
            r.options.mcp_servers = Some(json!({"m": {"command": "x"}}));
            r.options.endpoint = Some(Endpoint {
                base_url: "http://127.0.0.1:1/v1".into(),
                api_key_env: Some("K".into()),
                provider_name: None,
            });
            materialize(&r).unwrap();
            materialize(&r).unwrap();
        }
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    let rel = p.strip_prefix(root).unwrap().to_path_buf();
                    let text = std::fs::read_to_string(&p)
                        .unwrap()
                        .replace(&*root.to_string_lossy(), "$ASP");
                    files.push((rel, text));
                }
            }
        }
        files.sort();
        files
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (fa, fb) = (build(a.path()), build(b.path()));
    assert_eq!(fa, fb);
    let names: Vec<String> = fa
        .iter()
        .map(|(p, _)| p.to_string_lossy().into_owned())
        .collect();
    for expected in [
        "claude/home/.claude/.claude.json",
        "claude/sessions/default/mcp.json",
        "claude/sessions/default/system-prompt.md",
        "codex/home/config.toml",
        "pi/agent/models.json",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not in {names:?}"
        );
    }
    let state = &fa
        .iter()
        .find(|(p, _)| p.ends_with(".claude.json"))
        .unwrap()
        .1;
    // Claude approves a key by its last 20 characters.
    assert!(state.contains("\"6789abcdefghijKLMNOP\""), "{state}");
    assert!(state.contains("hasTrustDialogAccepted"));
}

#[test]
fn a_pi_key_resumes_only_its_own_session_file() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions/--work--");
    std::fs::create_dir_all(&sessions).unwrap();
    let file = sessions.join("2026-11-25T10-00-00-000Z_0199abcd-1234.jsonl");
    std::fs::write(&file, "{}\n").unwrap();
    let find = |id: &str| metash_harness::invocation::pi_session_file(dir.path(), id);
    assert_eq!(find("0199abcd-1234"), Some(file));
    // Part of the id, or of the timestamp, is another key: not this session.
    for partial in [
        "1234",
        "abcd-1234",
        "0199abcd",
        "2026-11-25",
        "10-00-00-000Z",
    ] {
        assert_eq!(find(partial), None, "{partial}");
    }
}

/// Seed 003's `spec: SpaceSpec` and `artifactDir`: the spec is materialized for the harness
/// (`space.json`, `ASP_SPACE_SPEC`), the built spec recorded in the artifact directory
/// (`invocation.json`, `ASP_ARTIFACT_DIR`); a spec that is not an object, or a relative
/// artifact directory, is refused before anything is written.
#[test]
fn space_specs_and_artifact_dirs_reach_the_harness_process() {
    let asp = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    for frontend in [HarnessFrontend::ClaudeCode, HarnessFrontend::CodexCli] {
        let mut r = req(frontend, asp.path(), Headless, None);
        r.cp_session_id = "cp/7".into();
        r.spec = Some(json!({"name": "docs", "plugins": ["lint"]}));
        r.artifact_dir = Some(out.path().join(frontend.as_str()));
        let resp = build_process_invocation_spec(&r, &programs()).unwrap();
        let env = &resp.spec.env;
        let space = PathBuf::from(&env["ASP_SPACE_SPEC"]);
        assert!(space.starts_with(asp.path()), "{}", space.display());
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&space).unwrap()).unwrap();
        assert_eq!(written, r.spec.clone().unwrap());
        let dir = r.artifact_dir.clone().unwrap();
        assert_eq!(env["ASP_ARTIFACT_DIR"], dir.to_string_lossy());
        let recorded: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("invocation.json")).unwrap()).unwrap();
        assert_eq!(recorded["spec"]["argv"], json!(resp.spec.argv));
        assert_eq!(
            recorded["spec"]["env"]["ASP_SPACE_SPEC"],
            env["ASP_SPACE_SPEC"]
        );
    }
    let fresh = tempfile::tempdir().unwrap();
    for (spec, dir, why) in [
        (Some(json!(["not", "an", "object"])), None, "JSON object"),
        (None, Some(PathBuf::from("rel/out")), "absolute"),
    ] {
        let mut r = req(HarnessFrontend::ClaudeCode, fresh.path(), Headless, None);
        r.spec = spec;
        r.artifact_dir = dir;
        let err = build_process_invocation_spec(&r, &programs()).unwrap_err();
        assert!(err.to_string().contains(why), "{err}");
    }
    assert_eq!(
        std::fs::read_dir(fresh.path()).unwrap().count(),
        0,
        "written before the refusal"
    );
}
