//! Issue 13: the real coding CLIs as planner, executor and verifier of a run, each under metash's
//! native sandbox, against a loopback model speaking its wire protocol. A three-task plan (`c`
//! depends on `a` and `b`): each executor writes its file with a shell tool call in its task's
//! worktree, runs git there, is refused `.meta/` from inside the worktree, and the run ends with
//! every task committed and merged.

use metash_host::{ConsentMode, Host, HostOptions, Terminal};
use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};
use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

use super::common::{commits_of, git, statuses, Project};

const KEY: &str = "sk-real-orchestrated-cli-key-0123456789";

fn run_plan(cli: Cli, test: &str) {
    let Some(tools) = cli.tools() else {
        metash_testkit::skip(
            test,
            &format!(
                "{} is not installed under .tools (run scripts/setup)",
                cli.name()
            ),
        );
        return;
    };
    let server = ModelServer::start(move |c| cli.scripted_run(&c.text()));
    let p = Project::new("max_gap_retries = 1");
    std::os::unix::fs::symlink(&tools, p.path().join(".tools")).expect("link");
    std::fs::write(p.path().join(".git/info/exclude"), ".tools\n").expect("exclude");
    let mut config = String::from("[orchestrator]\nmax_gap_retries = 1\n");
    for role in ["planner", "executor", "verifier"] {
        config.push_str(&cli.role(role, &server.base));
    }
    std::fs::write(p.path().join(".meta/config.toml"), config).expect("config");
    let h = Host::open(
        p.path(),
        HostOptions {
            terminal: Terminal::Silent,
            env: [("METASH_TEST_CLI_KEY".to_string(), KEY.to_string())].into(),
            consent: ConsentMode::NonInteractive,
            yes_to: vec!["native".parse().expect("capability")],
            ..HostOptions::default()
        },
    )
    .expect("host");
    let mut orch = Orchestrator::new(&h, &h).expect("orchestrator");
    let outcome = orch.run(&RunOptions::default()).expect("run");
    let log = std::fs::read_to_string(p.path().join(".meta/events.jsonl")).unwrap_or_default();
    assert_eq!(
        outcome,
        RunOutcome::Complete {
            phases_completed: 1
        },
        "{}",
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
    let tag = cli.name().replace(' ', "-");
    for t in ["a", "b", "c"] {
        assert_eq!(commits_of(&state, t).len(), 1, "task {t}");
        assert_eq!(
            p.file_at_head(&format!("{t}.txt")),
            format!("{t}-from-{tag}")
        );
    }
    let files = git(p.path(), &["ls-tree", "--name-only", "HEAD"]);
    assert!(
        !files.contains(".tools") && !files.contains(".meta"),
        "{files}"
    );
    // Inside each worktree: git worked; metash's state was out of reach, and the log says so.
    let results: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["kind"] == "tool_result")
        .map(|e| e["data"]["output"].clone())
        .collect();
    let git_ok = results
        .iter()
        .filter(|o| {
            o.as_str()
                .is_some_and(|o| o.contains("GIT-OK") && o.contains(".txt"))
        })
        .count();
    assert_eq!(git_ok, 3, "{results:#?}");
    let refused: Vec<&str> = results
        .iter()
        .filter_map(|o| o.as_str())
        .filter(|o| o.contains("events.jsonl") || o.contains("../.."))
        .collect();
    assert_eq!(refused.len(), 3, "{results:#?}");
    for o in refused {
        eprintln!("{tag}: {o}");
        assert!(o.contains("denied"), "{o}");
        assert!(
            !o.contains("session_init") && !o.contains("session.json"),
            "{o}"
        );
    }
    assert!(!p.path().join(".meta/planted").exists());
}

#[test]
fn claude_code_executes_a_three_task_plan_in_sandboxed_worktrees() {
    run_plan(
        Cli::Claude,
        "claude_code_executes_a_three_task_plan_in_sandboxed_worktrees",
    );
}

#[test]
fn codex_executes_a_three_task_plan_in_sandboxed_worktrees() {
    run_plan(
        Cli::Codex,
        "codex_executes_a_three_task_plan_in_sandboxed_worktrees",
    );
}

#[test]
fn pi_executes_a_three_task_plan_in_sandboxed_worktrees() {
    run_plan(
        Cli::Pi,
        "pi_executes_a_three_task_plan_in_sandboxed_worktrees",
    );
}
