//! A task given rather than planned (`metash acp`'s turn mode): `turn::add_turn` puts it in the
//! current phase and one phase of the loop lands it through the executor, the verifier and the
//! merge queue, with no planner turn; `turn::withdraw_turn` takes a task that did not land out of
//! the session (worktree, branch, plan, book), lifting a halt that named only it.

use metash_orchestrator::turn::{add_turn, withdraw_turn};
use metash_orchestrator::{Orchestrator, OrchestratorError, RunOptions, RunOutcome};

use super::common::{git, phase_limit, statuses, Project, Sim};

fn one_phase(p: &Project, sim: &Sim) -> RunOutcome {
    let host = p.host();
    let mut orch = Orchestrator::new(&host, sim).unwrap();
    orch.run(&RunOptions {
        max_phases: Some(1),
        ..RunOptions::default()
    })
    .unwrap()
}

fn branches(p: &Project) -> String {
    git(p.path(), &["branch", "--list", "metash/task/*"])
}

#[test]
fn given_tasks_land_one_phase_each_without_a_planner() {
    let p = Project::new("jobs = 2");
    let sim = Sim::new(&p);
    let t = add_turn(&p.store(), "Write the first note.").unwrap();
    assert_eq!((t.id.as_str(), t.phase), ("turn-1", 1));
    assert_eq!(one_phase(&p, &sim), phase_limit(1));
    assert_eq!(p.file_at_head("tasks/turn-1.txt"), "Write the first note.");

    let t = add_turn(&p.store(), "Write the second note.").unwrap();
    assert_eq!((t.id.as_str(), t.phase), ("turn-2", 2));
    assert_eq!(one_phase(&p, &sim), phase_limit(1));
    assert_eq!(p.file_at_head("tasks/turn-2.txt"), "Write the second note.");

    let spawns = sim.spawned();
    assert!(spawns.iter().all(|s| s.agent != "planner"), "{spawns:?}");
    for id in ["turn-1", "turn-2"] {
        for role in ["executor", "verifier"] {
            assert!(
                spawns
                    .iter()
                    .any(|s| s.agent == role && s.task.as_deref() == Some(id)),
                "{role} {id}"
            );
        }
        assert!(p.state()["variables"]["metash"]["merged"][id].is_string());
    }
    assert_eq!(
        statuses(&p.state()),
        [
            ("turn-1".to_string(), "complete".to_string()),
            ("turn-2".to_string(), "complete".to_string())
        ]
    );
    assert_eq!(branches(&p), "");
}

#[test]
fn a_complete_project_takes_a_given_task_as_more_work() {
    let p = Project::new("jobs = 2");
    p.decide("english");
    let sim = Sim::new(&p);
    let host = p.host();
    let done = Orchestrator::new(&host, &sim)
        .unwrap()
        .run(&RunOptions::default())
        .unwrap();
    assert!(matches!(done, RunOutcome::Complete { .. }), "{done:?}");
    add_turn(&p.store(), "One more note.").unwrap();
    assert_eq!(one_phase(&p, &sim), phase_limit(1));
    assert_eq!(p.file_at_head("tasks/turn-1.txt"), "One more note.");
}

#[test]
fn a_rejected_task_is_withdrawn_and_the_next_starts_clean() {
    let p = Project::new("max_gap_retries = 2");
    let mut sim = Sim::new(&p);
    sim.verifier_fails = vec!["turn-1".into()];
    add_turn(&p.store(), "Never good enough.").unwrap();
    let RunOutcome::Halted(h) = one_phase(&p, &sim) else {
        panic!("the verifier rejects it past the retries");
    };
    assert_eq!(h.failed[0].id, "turn-1");
    assert!(branches(&p).contains("metash/task/turn-1"));

    assert!(withdraw_turn(&p.store(), "turn-1").unwrap());
    let state = p.state();
    assert!(statuses(&state).is_empty(), "{state}");
    assert_eq!(state["status"], "planning");
    assert!(state["variables"]["metash"]["halt"].is_null());
    assert_eq!(branches(&p), "");
    assert!(!p.path().join(".meta/worktrees/turn-1").exists());
    assert_eq!(git(p.path(), &["rev-list", "--count", "HEAD"]), "1");
    // Gone already: nothing to do.
    assert!(!withdraw_turn(&p.store(), "turn-1").unwrap());

    // The number is free again, and the new task starts with no attempts or findings.
    let sim = Sim::new(&p);
    assert_eq!(
        add_turn(&p.store(), "Good this time.").unwrap().id,
        "turn-1"
    );
    assert_eq!(one_phase(&p, &sim), phase_limit(1));
    assert_eq!(p.file_at_head("tasks/turn-1.txt"), "Good this time.");
    // A landed task stays.
    assert!(!withdraw_turn(&p.store(), "turn-1").unwrap());
}

#[test]
fn no_task_is_given_while_a_checkpoint_waits() {
    let p = Project::new("jobs = 2");
    let sim = Sim::new(&p);
    let host = p.host();
    let asked = Orchestrator::new(&host, &sim)
        .unwrap()
        .run(&RunOptions::default())
        .unwrap();
    assert!(matches!(asked, RunOutcome::Checkpoint(_)), "{asked:?}");
    match add_turn(&p.store(), "Anything.") {
        Err(OrchestratorError::Refused(why)) => assert!(why.contains("greeting-language"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(statuses(&p.state()).is_empty());
}
