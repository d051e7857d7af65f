//! Issue 13 item 4: the model key of a CLI role never enters the CLI. The real Claude Code runs
//! headless against a loopback Anthropic server through metash's credential proxy: the server
//! receives the real key; the CLI's environment and arguments hold only a placeholder.

use metash_host::{Host, HostOptions, SpawnRequest, Spawner};
use metash_protocol::AgentStatus;
use metash_testkit::anthropic::{sse_text, sse_tool_use, ModelServer};
use metash_testkit::cli::Cli;

use super::common::Project;

const REAL_KEY: &str = "sk-ant-real-0123456789-never-in-the-sandbox";
/// Passed through to this test's CLI only (`LANGUAGE` is in the allowlisted environment), so its
/// processes are told apart from the other tests' Claude Code running at the same time.
const OURS: &str = "en:metash-cli-key-test";

/// Every live process whose command line names `needle`: (cmdline, environ), as text.
fn processes(needle: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let p = e.path();
        let (Ok(cmd), Ok(env)) = (
            std::fs::read(p.join("cmdline")),
            std::fs::read(p.join("environ")),
        ) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) {
            out.push((cmd, String::from_utf8_lossy(&env).replace('\0', "\n")));
        }
    }
    out
}

#[test]
fn a_cli_role_gets_a_placeholder_and_the_upstream_the_real_key() {
    let Some(tools) =
        Cli::Claude.installed("a_cli_role_gets_a_placeholder_and_the_upstream_the_real_key")
    else {
        return;
    };
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let server = {
        let seen = seen.clone();
        ModelServer::start(move |c| {
            // While the CLI waits for this answer, look at what it holds.
            seen.lock().expect("lock").extend(processes("claude.exe"));
            let body = c.text();
            if body.contains("tool_result") {
                sse_text("the answer from the model")
            } else if body.contains("Say something.") {
                sse_tool_use(
                    "toolu_1",
                    "Bash",
                    &serde_json::json!({"command": "echo from-the-tool", "description": "echo"}),
                )
            } else {
                sse_text("ok")
            }
        })
    };
    let p = Project::new();
    std::os::unix::fs::symlink(
        std::fs::canonicalize(&tools).expect("tools"),
        p.path().join(".tools"),
    )
    .expect("link .tools");
    p.config(&format!(
        "[roles.coder]\nfrontend = \"agent-sdk\"\nmodel_smart = \"claude-sonnet-4-5\"\n\
         base_url = \"{}\"\napi_key_env = \"METASH_TEST_CLI_KEY\"\n",
        server.base
    ));
    let host = Host::open(
        p.path(),
        HostOptions::silent()
            .with_env("METASH_TEST_CLI_KEY", REAL_KEY)
            .with_env("LANGUAGE", OURS)
            .with_yes_to(["native".parse().expect("capability")]),
    )
    .expect("host");
    let mut req = SpawnRequest::new("coder", "Answer briefly.", "Say something.");
    req.options.timeout_seconds = Some(120.0);
    let r = host.spawn_agent(&req).expect("spawn");
    assert_eq!(r.status, AgentStatus::Success, "{r:?}");
    assert!(r.data.contains("the answer from the model"), "{}", r.data);

    let posts = server.posts();
    assert!(!posts.is_empty());
    for c in &posts {
        assert_eq!(
            c.header("x-api-key"),
            Some(REAL_KEY),
            "the upstream gets the real key"
        );
        assert!(
            c.headers.iter().all(|(_, v)| !v.contains("placeholder")),
            "{:?}",
            c.headers
        );
    }
    let seen = seen.lock().expect("lock").clone();
    // No Claude Code on the machine holds the key; this test's own hold the placeholder.
    for (cmd, env) in &seen {
        assert!(
            !cmd.contains(REAL_KEY) && !env.contains(REAL_KEY),
            "the key reached the CLI: {cmd}"
        );
    }
    let ours: Vec<_> = seen
        .iter()
        .filter(|(_, env)| env.contains(&format!("LANGUAGE={OURS}")))
        .collect();
    assert!(!ours.is_empty(), "the CLI was running during its request");
    for (cmd, env) in ours {
        assert!(
            env.contains("metash-placeholder"),
            "the CLI has the placeholder: {cmd}"
        );
    }
    // The CLI's stream became metash events: one line per tool call and per result.
    let calls = p.log_data("tool_call");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["tool"], "Bash");
    assert!(calls[0]["args"]
        .as_str()
        .is_some_and(|a| a.contains("from-the-tool")));
    let results = p.log_data("tool_result");
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["id"], calls[0]["id"]);
    assert!(matches!(
        results[0]["status"].as_str(),
        Some("ok" | "error")
    ));
    assert!(p
        .log_data("harness_event")
        .iter()
        .all(|e| e["payload"]["type"] != "tool_call"));
    // Nor is the key anywhere in the project's files (the log included).
    for e in metash_testkit::procs::files_under(p.path()) {
        let text = std::fs::read(&e).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains(REAL_KEY),
            "{} holds the key",
            e.display()
        );
    }
}
