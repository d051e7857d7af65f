//! Issue 32: the owner changes the context between two runs (`Store::set_context`, what `metash
//! context edit` calls); the planner's next request says that it changed and carries the diff,
//! once: the request after that is news-free again.

use metash_orchestrator::{Orchestrator, RunOptions};

use super::common::{phase_limit, Project, Sim};

#[test]
fn the_planner_is_told_once_what_changed_in_the_context() {
    let p = Project::new("jobs = 2");
    p.decide("english");
    let sim = Sim::new(&p);
    let host = p.host();
    let one_phase = || RunOptions {
        max_phases: Some(1),
        ..RunOptions::default()
    };
    let outcome = Orchestrator::new(&host, &sim)
        .unwrap()
        .run(&one_phase())
        .unwrap();
    assert_eq!(outcome, phase_limit(1));
    let planners = |sim: &Sim| -> Vec<String> {
        sim.spawned()
            .into_iter()
            .filter(|s| s.agent == "planner")
            .map(|s| s.user_message)
            .collect()
    };
    let first = planners(&sim);
    assert!(!first.is_empty());
    assert!(first.iter().all(|m| !m.contains("The context changed")));

    let context = p.store().context().unwrap();
    let changed = format!("{context}\nConstraint: every greeting ends with an exclamation mark.\n");
    p.store().set_context(&changed).unwrap();
    let host = p.host();
    Orchestrator::new(&host, &sim)
        .unwrap()
        .run(&one_phase())
        .unwrap();
    let all = planners(&sim);
    let after = &all[first.len()..];
    assert!(!after.is_empty(), "the planner planned phase 2");
    assert!(
        after[0].contains("## The context changed since your last plan")
            && after[0].contains("+Constraint: every greeting ends with an exclamation mark."),
        "{}",
        after[0]
    );
    // Told once: later planner requests of the same context carry no note.
    assert!(after[1..]
        .iter()
        .all(|m| !m.contains("The context changed")));
    assert_eq!(
        p.state()["variables"]["metash"]["contextSeen"],
        metash_store::context_sha256(changed.as_bytes()).as_str()
    );
}
