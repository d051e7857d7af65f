//! The merge queue with a real coding CLI as every role (each driven by a scripted loopback
//! model): two parallel tasks rewrite the one line of `shared.txt`; when the second is brought up
//! to date with the first, its executor, the real CLI, gets the resolution turn in its worktree,
//! looks at the conflict markers (its shell call counts them: the count reaches the log) and
//! rewrites the file with both lines; the verifier checks the resolution; both land, and the
//! main checkout never holds a marker nor `MERGE_HEAD` (watched for the whole run).

use metash_host::{Host, HostOptions};
use metash_orchestrator::{Orchestrator, RunOptions};
use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::Cli;

use super::common::{complete, git, statuses, Project};
use super::queue::{main_problem, Watcher};

const KEY: &str = "sk-real-queue-cli-key-0123456789";

fn script(cli: Cli, body: &str) -> String {
    let done = cli.results(body);
    if body.contains("You are the planner") {
        if !body.contains("Current State: Phase 1 ") {
            return cli.text(r#"{"tasks": [], "done": true}"#);
        }
        return cli.text(
            r#"{"tasks": [{"id": "x", "title": "Write x", "dependencies": []}, {"id": "y", "title": "Write y", "dependencies": []}]}"#,
        );
    }
    if body.contains("You are the verifier") {
        return cli.text(r#"{"pass": true, "findings": []}"#);
    }
    let Some(task) = ["x", "y"]
        .into_iter()
        .find(|t| body.contains(&format!("Task {t}: Write {t}")))
    else {
        return cli.text("ok");
    };
    let id = if task == "x" { 100 } else { 200 };
    // (The executor's system prompt explains resolution turns too: the state line tells.)
    if body.contains("Resolving a merge conflict of Task") {
        return match done {
            0 => cli.shell(
                id + 10,
                body,
                "echo MARKERS:$(grep -c '^<<<<<<< ' shared.txt); printf 'x\\ny\\n' > shared.txt \
                 && echo RESOLVED",
            ),
            _ => cli.text("resolved shared.txt: both lines kept"),
        };
    }
    match done {
        0 => cli.shell(id, body, &format!("echo {task} > shared.txt && echo WROTE")),
        _ => cli.text(&format!("wrote shared.txt for {task}")),
    }
}

fn tool_outputs(root: &std::path::Path) -> Vec<String> {
    let log = std::fs::read_to_string(root.join(".meta/events.jsonl")).unwrap_or_default();
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["kind"] == "tool_result")
        .filter_map(|e| e["data"]["output"].as_str().map(str::to_string))
        .collect()
}

fn resolve_with(cli: Cli, test: &str) {
    let Some(tools) = cli.installed(test) else {
        return;
    };
    let p = Project::new("");
    std::fs::write(p.path().join("shared.txt"), "base\n").expect("shared");
    git(p.path(), &["add", "shared.txt"]);
    git(p.path(), &["commit", "-q", "-m", "shared"]);
    let server = ModelServer::start(move |c| script(cli, &c.text()));
    std::os::unix::fs::symlink(&tools, p.path().join(".tools")).expect("link");
    std::fs::write(p.path().join(".git/info/exclude"), ".tools\n").expect("exclude");
    let mut config = String::from("[orchestrator]\njobs = 2\n");
    for role in ["planner", "executor", "verifier"] {
        config.push_str(&cli.role(role, &server.base));
    }
    std::fs::write(p.path().join(".meta/config.toml"), config).expect("config");
    let h = Host::open(
        p.path(),
        HostOptions::silent()
            .with_env("METASH_TEST_CLI_KEY", KEY)
            .with_yes_to(["native".parse().expect("capability")]),
    )
    .expect("host");
    let watcher = Watcher::start(p.path());
    let mut orch = Orchestrator::new(&h, &h).expect("orchestrator");
    let outcome = orch.run(&RunOptions::default()).expect("run");
    let (problems, _) = watcher.finish();
    let outputs = tool_outputs(p.path());
    let tag = cli.name();
    assert_eq!(outcome, complete(1), "{tag}: {outputs:#?}");
    assert!(problems.is_empty(), "{tag}: {problems:?}");
    assert!(
        statuses(&p.state()).iter().all(|(_, s)| s == "complete"),
        "{tag}"
    );
    // The CLI saw the markers git left in its worktree, and resolved them.
    let resolved = outputs
        .iter()
        .find(|o| o.contains("RESOLVED"))
        .unwrap_or_else(|| panic!("{tag}: no resolution ran: {outputs:#?}"));
    assert!(resolved.contains("MARKERS:1"), "{tag}: {resolved}");
    assert_eq!(p.file_at_head("shared.txt"), "x\ny", "{tag}");
    let log = std::fs::read_to_string(p.path().join(".meta/events.jsonl")).expect("log");
    assert!(
        log.contains("the executor resolved the conflict")
            && log.contains("re-verifying after the update"),
        "{tag}: the resolution was committed and verified"
    );
    assert_eq!(main_problem(p.path()), None, "{tag}");
}

#[test]
fn claude_code_resolves_a_merge_queue_conflict() {
    resolve_with(Cli::Claude, "claude_code_resolves_a_merge_queue_conflict");
}

#[test]
fn codex_resolves_a_merge_queue_conflict() {
    resolve_with(Cli::Codex, "codex_resolves_a_merge_queue_conflict");
}

#[test]
fn pi_resolves_a_merge_queue_conflict() {
    resolve_with(Cli::Pi, "pi_resolves_a_merge_queue_conflict");
}
