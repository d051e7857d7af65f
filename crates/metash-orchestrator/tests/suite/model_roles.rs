//! Model-backed roles through the host's harness, against a loopback model server: a plan, edits
//! as JSON files, a failing then passing verification (gapCount, retry), the halt at
//! `max_gap_retries`, rollback; and the preflight that stops before spending when the key is
//! missing.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use metash_host::{Host, HostOptions, Terminal};
use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};
use serde_json::{json, Value};

use super::common::{commits_of, complete, git, statuses, Project};
use super::provider::Provider;

const KEY: &str = "METASH_ORCH_TEST_KEY";

fn roles_config(base_url: &str, orchestrator: &str) -> String {
    let mut c = format!("[orchestrator]\n{orchestrator}\n");
    for role in ["planner", "executor", "verifier"] {
        c.push_str(&format!(
            "[roles.{role}]\nfrontend = \"anthropic-api\"\nmodel_smart = \"test-model\"\n\
             base_url = \"{base_url}\"\napi_key_env = \"{KEY}\"\nmax_tokens = 2000\n"
        ));
    }
    c
}

fn project(base_url: &str, orchestrator: &str) -> Project {
    let p = Project::new("");
    std::fs::write(
        p.path().join(".meta/config.toml"),
        roles_config(base_url, orchestrator),
    )
    .unwrap();
    p
}

fn host(p: &Path, with_key: bool) -> Host {
    let env = if with_key {
        [(KEY.to_string(), "sk-test".to_string())].into()
    } else {
        Default::default()
    };
    Host::open(
        p,
        HostOptions {
            terminal: Terminal::Silent,
            env,
            ..HostOptions::default()
        },
    )
    .unwrap()
}

fn text_of(body: &Value) -> String {
    body.to_string()
}

/// The scripted model: plans `a` then `b` (after `a`) for phase 1 and nothing after; writes each
/// task's file as JSON; the verifier rejects `a` the first `fail_a` times it sees it.
fn script(fail_a: usize) -> impl Fn(&Value) -> String + Send + Sync + 'static {
    let seen: Mutex<HashMap<String, usize>> = Mutex::new(HashMap::new());
    move |body| {
        let t = text_of(body);
        if t.contains("You are the planner") {
            if t.contains("Current State: Phase 1 ") {
                return "```json\n{\"tasks\": [{\"id\": \"a\", \"title\": \"Write a.txt\", \"dependencies\": []}, \
                        {\"id\": \"b\", \"title\": \"Write b.txt\", \"dependencies\": [\"a\"]}]}\n```"
                    .into();
            }
            return "{\"tasks\": [], \"done\": true}".into();
        }
        let task = if t.contains("Task a: Write a.txt") {
            "a"
        } else {
            "b"
        };
        if t.contains("You are an executor") {
            let fixed = t.contains("fix these findings");
            let content = if fixed { "alpha, fixed\n" } else { "alpha\n" };
            let content = if task == "a" { content } else { "beta\n" };
            return json!({"summary": format!("wrote {task}.txt"),
                          "files": [{"path": format!("{task}.txt"), "content": content}]})
            .to_string();
        }
        let mut seen = seen.lock().unwrap();
        let n = seen.entry(task.to_string()).or_insert(0);
        *n += 1;
        if task == "a" && *n <= fail_a {
            return json!({"pass": false, "findings": ["a.txt: say it is fixed"]}).to_string();
        }
        json!({"pass": true, "findings": []}).to_string()
    }
}

#[test]
fn model_roles_plan_edit_fail_then_pass_and_rollback() {
    let provider = Provider::start(script(1));
    let p = project(&provider.base_url, "max_gap_retries = 3");
    let h = host(p.path(), true);
    let mut orch = Orchestrator::new(&h, &h).unwrap();
    let outcome = orch.run(&RunOptions::default()).unwrap();
    assert_eq!(outcome, complete(1));
    let state = p.state();
    assert!(statuses(&state).iter().all(|(_, s)| s == "complete"));
    assert_eq!(
        commits_of(&state, "a").len(),
        2,
        "first attempt, then the fix"
    );
    assert_eq!(commits_of(&state, "b").len(), 1);
    assert_eq!(p.file_at_head("a.txt"), "alpha, fixed");
    assert_eq!(p.file_at_head("b.txt"), "beta");
    // gapCount went to 1, then reset when the phase completed.
    let gaps: Vec<Value> = p
        .state_updates()
        .into_iter()
        .filter(|(_, k, _)| k == "gapCount")
        .map(|(_, _, v)| v)
        .collect();
    assert_eq!(gaps.first(), Some(&json!(1)));
    assert_eq!(state["gapCount"], 0);
    // The retry carried the verifier's findings to the model.
    let bodies = provider.bodies();
    let executor_a: Vec<String> = bodies
        .iter()
        .map(text_of)
        .filter(|t| t.contains("You are an executor") && t.contains("Task a: Write a.txt"))
        .collect();
    assert_eq!(executor_a.len(), 2);
    assert!(executor_a[1].contains("say it is fixed"));
    // The budget the host charged is shown by status.
    let report = metash_orchestrator::report(h.store()).unwrap();
    let tokens = report
        .budget
        .as_ref()
        .and_then(|b| b["tokens_used"].as_u64())
        .unwrap_or(0);
    assert!(tokens >= 30 * bodies.len() as u64, "{:?}", report.budget);

    // Rollback of `a` takes `b` with it.
    let plan = orch.rollback_plan("a").unwrap();
    assert_eq!(plan.dependents, vec!["b".to_string()]);
    let done = orch.rollback(&plan, true).unwrap();
    assert_eq!(
        done.iter().map(|d| d.task.as_str()).collect::<Vec<_>>(),
        vec!["b", "a"]
    );
    assert_eq!(done[1].reverts.len(), 2);
    let files = git(p.path(), &["ls-tree", "--name-only", "HEAD"]);
    assert!(
        !files.contains("a.txt") && !files.contains("b.txt"),
        "{files}"
    );
    let state = p.state();
    assert!(statuses(&state).iter().all(|(_, s)| s == "pending"));
    assert_eq!(state["status"], "planning");
}

#[test]
fn model_roles_halt_at_max_gap_retries() {
    let provider = Provider::start(script(usize::MAX));
    let p = project(&provider.base_url, "max_gap_retries = 2");
    let h = host(p.path(), true);
    let mut orch = Orchestrator::new(&h, &h).unwrap();
    let RunOutcome::Halted(halt) = orch.run(&RunOptions::default()).unwrap() else {
        panic!("halts");
    };
    assert_eq!(halt.reason, "gap_limit");
    assert_eq!(halt.failed.len(), 1);
    assert_eq!(halt.failed[0].id, "a");
    assert_eq!(
        halt.failed[0].why,
        vec!["a.txt: say it is fixed".to_string()]
    );
    let state = p.state();
    assert_eq!(state["gapCount"], 2);
    assert_eq!(state["status"], "halted");
    // b depends on a: it was never judged on a's rejected work, and waits to be redone.
    let verifier_b = provider
        .bodies()
        .iter()
        .map(text_of)
        .filter(|t| t.contains("You are the verifier") && t.contains("Task b:"))
        .count();
    assert_eq!(verifier_b, 0);
    assert_eq!(
        statuses(&state)[1],
        ("b".to_string(), "pending".to_string())
    );
}

#[test]
fn a_model_role_without_its_key_stops_before_spending() {
    let provider = Provider::start(script(0));
    let p = project(&provider.base_url, "");
    let h = host(p.path(), false);
    let mut orch = Orchestrator::new(&h, &h).unwrap();
    let err = orch.run(&RunOptions::default()).unwrap_err().to_string();
    assert!(err.contains(KEY), "{err}");
    assert!(provider.bodies().is_empty(), "nothing was sent");
    let spawned = h
        .store()
        .log()
        .read_all()
        .unwrap()
        .iter()
        .filter(|r| r.kind == "spawn")
        .count();
    assert_eq!(spawned, 0);
}

#[test]
fn a_role_naming_nothing_is_refused_up_front() {
    let provider = Provider::start(script(0));
    let p = project(&provider.base_url, "executor = \"nobody\"");
    let h = host(p.path(), true);
    let orch = Orchestrator::new(&h, &h).unwrap();
    let err = orch.check_roles_resolve().unwrap_err().to_string();
    assert!(err.contains("executor = \"nobody\""), "{err}");
    assert!(err.contains("planner"), "lists what is known: {err}");
}
