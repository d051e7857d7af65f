//! Bad plans are rejected with the reason, which goes back to the planner; bounded attempts.

use metash_orchestrator::plan::{self, PlannedTask, TaskNode};
use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};

use super::common::{Project, Sim};

fn t(id: &str, deps: &[&str]) -> PlannedTask {
    PlannedTask {
        id: id.into(),
        title: format!("task {id}"),
        dependencies: deps.iter().map(|d| d.to_string()).collect(),
        phase: None,
        expects_change: None,
        labels: vec![],
        paths: vec![],
    }
}

#[test]
fn labels_are_kept_and_a_bad_one_is_named() {
    let mut gpu = t("a", &[]);
    gpu.labels = vec!["gpu".into()];
    let ok = plan::validate(&[], &[gpu.clone()], 1).unwrap();
    assert_eq!(ok[0].labels, vec!["gpu".to_string()]);
    gpu.labels = vec!["no spaces".into()];
    let err = plan::validate(&[], &[gpu], 1).unwrap_err();
    assert!(err.contains("label `no spaces`"), "{err}");
}

/// `paths` are kept (a leading `./` dropped); one that leaves the project is named; overlap is
/// by path or directory prefix, never by a name's prefix.
#[test]
fn paths_are_kept_checked_and_compared() {
    let mut a = t("a", &[]);
    a.paths = vec!["./src/db/".into(), "Cargo.toml".into()];
    let ok = plan::validate(&[], &[a.clone()], 1).unwrap();
    assert_eq!(
        ok[0].paths,
        vec!["src/db/".to_string(), "Cargo.toml".to_string()]
    );
    for bad in ["../etc", "/abs", "src/../../x", " "] {
        a.paths = vec![bad.into()];
        let err = plan::validate(&[], &[a.clone()], 1).unwrap_err();
        assert!(err.contains("has path"), "{bad}: {err}");
    }
    let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(plan::paths_overlap(
        &p(&["src/db/"]),
        &p(&["src/db/schema.rs"])
    ));
    assert!(plan::paths_overlap(&p(&["a.txt"]), &p(&["b.txt", "a.txt"])));
    assert!(!plan::paths_overlap(&p(&["src/db"]), &p(&["src/dbx.rs"])));
    assert!(!plan::paths_overlap(&p(&[]), &p(&["a.txt"])));
}

#[test]
fn validation_names_the_broken_rule() {
    let cycle =
        plan::validate(&[], &[t("a", &["c"]), t("b", &["a"]), t("c", &["b"])], 1).unwrap_err();
    assert!(
        cycle.contains("cycle") && cycle.contains("a") && cycle.contains("c"),
        "{cycle}"
    );
    let unknown = plan::validate(&[], &[t("a", &["zz"])], 1).unwrap_err();
    assert!(unknown.contains("unknown task `zz`"), "{unknown}");
    let dup = plan::validate(&[], &[t("a", &[]), t("a", &[])], 1).unwrap_err();
    assert!(dup.contains("duplicate task id `a`"), "{dup}");
    let dotted = plan::validate(&[], &[t("a.b", &[])], 1).unwrap_err();
    assert!(dotted.contains("a.b"), "{dotted}");
    let mut later = t("b", &["a"]);
    later.phase = Some(1);
    let mut a = t("a", &[]);
    a.phase = Some(2);
    let err = plan::validate(&[], &[a, later], 1).unwrap_err();
    assert!(err.contains("later phase"), "{err}");
    let existing = [TaskNode {
        id: "a".into(),
        title: "a".into(),
        dependencies: vec![],
        phase: 1,
        expects_change: true,
        labels: vec![],
        paths: vec![],
    }];
    let clash = plan::validate(&existing, &[t("a", &[])], 2).unwrap_err();
    assert!(clash.contains("duplicate"), "{clash}");
    let ok = plan::validate(&existing, &[t("b", &["a"])], 2).unwrap();
    assert_eq!(ok.len(), 2);
    assert_eq!(ok[1].phase, 2);
}

#[test]
fn a_planner_sending_bad_plans_gets_the_reasons_and_the_run_halts() {
    let p = Project::new("max_plan_attempts = 3");
    p.decide("english");
    let sim = Sim::new(&p);
    sim.planner_script.lock().unwrap().extend([
        r#"{"tasks":[{"id":"a","title":"A","dependencies":["b"]},{"id":"b","title":"B","dependencies":["a"]}]}"#.to_string(),
        "```json\n{\"tasks\":[{\"id\":\"a\",\"title\":\"A\",\"dependencies\":[\"nope\"]}]}\n```".to_string(),
        r#"{"tasks":[{"id":"a","title":"A"},{"id":"a","title":"again"}]}"#.to_string(),
    ]);
    let host = p.host();
    let mut orch = Orchestrator::new(&host, &sim).unwrap();
    let RunOutcome::Halted(h) = orch.run(&RunOptions::default()).unwrap() else {
        panic!("halts after three bad plans");
    };
    assert_eq!(h.reason, "plan_rejected");
    assert!(h.message.contains("duplicate task id `a`"), "{}", h.message);
    let prompts: Vec<String> = sim
        .spawned()
        .iter()
        .filter(|s| s.agent == "planner")
        .map(|s| s.user_message.clone())
        .collect();
    assert_eq!(prompts.len(), 3);
    assert!(!prompts[0].contains("rejected"));
    assert!(prompts[1].contains("dependency cycle"), "{}", prompts[1]);
    assert!(prompts[2].contains("unknown task `nope`"), "{}", prompts[2]);
    assert!(p.state()["plan"].is_null(), "no bad plan became state");
}

#[test]
fn role_prompts_ship_with_the_crate_and_a_project_may_override_them() {
    use metash_orchestrator::prompts::{system_prompt, Role};
    let p = Project::new("");
    assert!(system_prompt(p.path(), Role::Planner).starts_with("You are the planner"));
    assert!(system_prompt(p.path(), Role::Verifier).contains("\"pass\""));
    std::fs::create_dir_all(p.path().join(".meta/prompts")).unwrap();
    std::fs::write(
        p.path().join(".meta/prompts/executor.md"),
        "Custom executor.",
    )
    .unwrap();
    assert_eq!(system_prompt(p.path(), Role::Executor), "Custom executor.");
    assert!(system_prompt(p.path(), Role::Planner).starts_with("You are the planner"));
}
