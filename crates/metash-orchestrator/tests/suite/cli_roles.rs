//! Issue 13: the real coding CLIs as planner, executor and verifier of a run, each under metash's
//! native sandbox, against a loopback model speaking its wire protocol. A three-task plan (`c`
//! depends on `a` and `b`): each executor writes its file with a shell tool call in its task's
//! worktree, runs git there, is refused `.meta/` from inside the worktree, and the run ends with
//! every task committed and merged.

use metash_host::{Host, HostOptions};
use metash_orchestrator::{Orchestrator, RunOptions};
use metash_testkit::anthropic::ModelServer;
use metash_testkit::cli::{scripted_step, Cli, META_PROBES};

use super::common::{commits_of, complete, git, statuses, Project};

const KEY: &str = "sk-real-orchestrated-cli-key-0123456789";

fn run_plan(cli: Cli, test: &str) {
    let Some(tools) = cli.installed(test) else {
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
    // Inside each worktree: git worked; every try at metash's state failed, and the log says so.
    let before_consent = consent_before;
    check_meta_probes(&log, &tag);
    assert_eq!(
        std::fs::read(p.path().join(".meta/consent.json")).ok(),
        before_consent,
        "consent.json changed"
    );
    assert!(!p.path().join(".meta/cache/wasm/planted.cwasm").exists());
    metash_store::Store::open(p.path())
        .expect("store")
        .log()
        .verify()
        .expect("the log verifies");
    // The key is in no file of the project (the log and the worktrees included).
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

/// Each executor's work succeeded with git, and each of its probes at `.meta/` failed.
pub(super) fn check_meta_probes(log: &str, tag: &str) {
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let results: Vec<(usize, usize, String)> = lines
        .iter()
        .filter(|e| e["kind"] == "tool_result")
        .filter_map(|e| {
            let (task, step, out) = scripted_step(e["data"]["output"].as_str()?)?;
            Some((task, step, out.to_string()))
        })
        .collect();
    for task in 0..3 {
        let of = |step: usize| {
            results
                .iter()
                .find(|(t, s, _)| *t == task && *s == step)
                .map(|(.., o)| o.clone())
                .unwrap_or_else(|| {
                    panic!("{tag}: task {task} step {step} did not run: {results:#?}")
                })
        };
        let work = of(0);
        assert!(
            work.contains("GIT-OK") && work.contains(".txt"),
            "{tag}: {work}"
        );
        for (k, (name, _)) in META_PROBES.iter().enumerate() {
            let out = of(k + 1);
            eprintln!("{tag} task {task} {name}: {out}");
            if *name == "key" {
                assert_eq!(
                    out.lines().find(|l| !l.trim().is_empty()).map(str::trim),
                    Some("0"),
                    "{tag} {name}: {out}"
                );
                continue;
            }
            assert!(
                out.contains("denied")
                    || out.contains("not permitted")
                    // Landlock refuses a link or rename across its rules with EXDEV.
                    || out.contains("Invalid cross-device link"),
                "{tag} {name} must be refused: {out}"
            );
            // What the files hold (their names appear in the error messages).
            for leak in ["session_init", "gapCount", "\"plan\"", "schema_version"] {
                assert!(!out.contains(leak), "{tag} {name} leaked {leak}: {out}");
            }
        }
    }
}
