//! Issue 34: real ACP agents from npm (`@zed-industries/claude-code-acp` 0.16.2 and
//! `@zed-industries/codex-acp` 0.16.0, pinned in scripts/setup) as planner, executor and verifier
//! of a run (`frontend = "acp"`), each under metash's native sandbox, against a loopback model
//! speaking the wire protocol of the CLI the agent wraps. The same scripted run as the coding
//! CLIs' (`cli_roles`): a three-task plan (`c` depends on `a` and `b`); each executor writes its
//! file and runs git with its own shell tool in its task's worktree, then tries every probe at
//! metash's `.meta/` and at a real key from inside its tool calls (all refused); the run ends
//! with every task committed and merged, and the key is in no file of the project.

use metash_host::{Host, HostOptions};
use metash_orchestrator::{Orchestrator, RunOptions};
use metash_testkit::acp::AcpAgent;
use metash_testkit::anthropic::ModelServer;

use super::cli_roles::check_meta_probes;
use super::common::{commits_of, complete, git, statuses, Project};

const KEY: &str = "sk-real-orchestrated-acp-key-0123456789";

fn run_plan(agent: AcpAgent, test: &str) {
    let Some(bin) = agent.installed(test) else {
        return;
    };
    let cli = agent.wire();
    let server = ModelServer::start(move |c| agent.scripted_run(&c.text()));
    let p = Project::new("max_gap_retries = 1");
    let mut config = String::from("[orchestrator]\nmax_gap_retries = 1\n");
    for role in ["planner", "executor", "verifier"] {
        config.push_str(&agent.role(role, &bin, &server.base));
    }
    std::fs::write(p.path().join(".meta/config.toml"), config).expect("config");
    let h = Host::open(
        p.path(),
        HostOptions::silent()
            .with_env("METASH_TEST_CLI_KEY", KEY)
            .with_yes_to(["native".parse().expect("capability")]),
    )
    .expect("host");
    // The compile cache exists, so a plant there would be a real file.
    std::fs::create_dir_all(p.path().join(".meta/cache/wasm")).expect("cache dir");
    let consent_before = std::fs::read(p.path().join(".meta/consent.json")).ok();
    let mut orch = Orchestrator::new(&h, &h).expect("orchestrator");
    let outcome = orch.run(&RunOptions::default()).expect("run");
    let log = std::fs::read_to_string(p.path().join(".meta/events.jsonl")).unwrap_or_default();
    assert_eq!(
        outcome,
        complete(1),
        "{}: {}",
        agent.name(),
        log.lines()
            .filter(|l| l.contains("tool_result") || l.contains("error"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let state = p.state();
    assert!(
        statuses(&state).iter().all(|(_, s)| s == "complete"),
        "{state}"
    );
    check_acp_spawns(&log);
    let tag = cli.name().replace(' ', "-");
    for t in ["a", "b", "c"] {
        assert_eq!(commits_of(&state, t).len(), 1, "task {t}");
        assert_eq!(
            p.file_at_head(&format!("{t}.txt")),
            format!("{t}-from-{tag}")
        );
    }
    let files = git(p.path(), &["ls-tree", "--name-only", "HEAD"]);
    assert!(!files.contains(".meta"), "{files}");
    // Inside each worktree: git worked; every try at metash's state and at the key failed.
    check_meta_probes(&log, &format!("{} ({tag})", agent.name()));
    assert_eq!(
        std::fs::read(p.path().join(".meta/consent.json")).ok(),
        consent_before,
        "consent.json changed"
    );
    assert!(!p.path().join(".meta/cache/wasm/planted.cwasm").exists());
    metash_store::Store::open(p.path())
        .expect("store")
        .log()
        .verify()
        .expect("the log verifies");
    check_key(&p, &server);
}

/// Every spawn of the run was the ACP agent, in the sandbox.
fn check_acp_spawns(log: &str) {
    let started: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["kind"] == "agent_started" && e["data"].get("frontend").is_some())
        .map(|e| e["data"].clone())
        .collect();
    assert!(
        started.len() >= 7,
        "a planner, three executors, three verifiers: {started:#?}"
    );
    assert!(
        started
            .iter()
            .all(|s| s["frontend"] == "acp" && s["sandbox"] == "native"),
        "{started:#?}"
    );
}

/// The upstream got the real key; the key is in no file of the project (the log and the
/// worktrees included).
fn check_key(p: &Project, server: &ModelServer) {
    let posts = server.posts();
    assert!(!posts.is_empty());
    for c in &posts {
        let auth = [c.header("x-api-key"), c.header("authorization")];
        assert!(
            auth.iter().flatten().any(|v| v.contains(KEY)),
            "the upstream gets the real key"
        );
    }
    for f in metash_testkit::procs::files_under(p.path()) {
        let text = std::fs::read(&f).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains(KEY),
            "{} holds the key",
            f.display()
        );
    }
}

#[test]
fn claude_code_acp_plans_executes_and_verifies_a_three_task_plan_in_the_sandbox() {
    run_plan(
        AcpAgent::ClaudeCode,
        "claude_code_acp_plans_executes_and_verifies_a_three_task_plan_in_the_sandbox",
    );
}

#[test]
fn codex_acp_plans_executes_and_verifies_a_three_task_plan_in_the_sandbox() {
    run_plan(
        AcpAgent::Codex,
        "codex_acp_plans_executes_and_verifies_a_three_task_plan_in_the_sandbox",
    );
}
