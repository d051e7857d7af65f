//! Independent tasks run at the same time in separate worktrees (their intervals overlap in the
//! log) and merge cleanly.

use std::time::Duration;

use chrono::DateTime;
use metash_orchestrator::{Orchestrator, RunOptions};

use super::common::{git, phase_limit, Project, Sim};

/// `[start, end]` of each task's executing attempt(s), from the log: `running.<id>` set, then the
/// task's status set to complete.
fn intervals(p: &Project, id: &str) -> (i64, i64) {
    let updates = p.state_updates();
    let ts = |t: &str| DateTime::parse_from_rfc3339(t).unwrap().timestamp_micros();
    let start = updates
        .iter()
        .find(|(_, k, v)| k == &format!("variables.metash.running.{id}") && !v.is_null())
        .map(|(t, _, _)| ts(t))
        .unwrap();
    let end = updates
        .iter()
        .find(|(_, k, v)| k == &format!("plan.tasks.{id}.status") && v == "complete")
        .map(|(t, _, _)| ts(t))
        .unwrap();
    (start, end)
}

#[test]
fn independent_tasks_overlap_in_separate_worktrees_and_merge_cleanly() {
    let p = Project::new("");
    p.decide("english");
    let mut sim = Sim::new(&p);
    // Each executor ends only once the other has started: if the loop ran them one after the
    // other, the first would give up waiting after 20 s and the intervals would not overlap.
    sim.meet = vec!["hello".into(), "bye".into()];
    let host = p.host();
    let mut orch = Orchestrator::new(&host, &sim).unwrap();
    let outcome = orch
        .run(&RunOptions {
            jobs: Some(2),
            max_phases: Some(1),
            ..RunOptions::default()
        })
        .unwrap();
    assert_eq!(outcome, phase_limit(1));
    let (h0, h1) = intervals(&p, "hello");
    let (b0, b1) = intervals(&p, "bye");
    assert!(
        h0 < b1 && b0 < h1,
        "hello {h0}..{h1} and bye {b0}..{b1} overlap"
    );
    // Each ran in its own worktree, and the agents themselves overlapped.
    let spawns = sim.spawned();
    let first = |id: &str| {
        spawns
            .iter()
            .find(|s| s.agent == "executor" && s.task.as_deref() == Some(id))
            .unwrap()
            .clone()
    };
    let (h, b) = (first("hello"), first("bye"));
    assert!(h.start < b.end && b.start < h.end);
    assert_ne!(h.workdir, b.workdir);
    assert!(h
        .workdir
        .as_ref()
        .unwrap()
        .ends_with(".meta/worktrees/hello"));
    // The merge of both is clean: both files and the README on HEAD, a merge commit per task.
    assert_eq!(p.file_at_head("hello.txt"), "Hello, world!");
    assert_eq!(p.file_at_head("bye.txt"), "Goodbye!");
    let merges = git(p.path(), &["log", "--merges", "--oneline"]);
    for id in ["hello", "bye", "readme"] {
        assert!(merges.contains(&format!("merge task {id}")), "{merges}");
    }
    assert!(git(p.path(), &["status", "--porcelain", "--untracked-files=no"]).is_empty());
}

/// Before the merge queue, the second of two tasks writing one file conflicted in the main
/// checkout and a person was asked there. Now its executor resolves the conflict in the task's
/// worktree and the run completes without a checkpoint; the checkout was never mid-merge.
#[test]
fn a_merge_conflict_goes_to_the_executor_not_the_main_checkout() {
    let p = Project::new("");
    p.decide("english");
    let mut sim = Sim::new(&p);
    sim.same_file = true;
    sim.planner_script.lock().unwrap().push_back(
        r#"{"tasks": [{"id": "x", "title": "X"}, {"id": "y", "title": "Y"}]}"#.to_string(),
    );
    let host = p.host();
    let mut orch = Orchestrator::new(&host, &sim).unwrap();
    let opts = RunOptions {
        jobs: Some(2),
        max_phases: Some(1),
        ..RunOptions::default()
    };
    assert_eq!(orch.run(&opts).unwrap(), phase_limit(1));
    assert_eq!(p.file_at_head("shared.txt"), "y\nx");
    assert!(!p.path().join(".git/MERGE_HEAD").exists());
    let state = p.state();
    assert!(state["variables"]["metash"]["merged"]["x"].is_string());
    assert!(state["variables"]["metash"]["merged"]["y"].is_string());
    assert!(state["pendingCheckpoint"].is_null());
}

/// Tasks whose `paths` overlap are not run at the same time, even with free slots; a task
/// whose paths do not overlap runs beside them.
#[test]
fn tasks_whose_paths_overlap_do_not_run_at_once() {
    let p = Project::new("");
    p.decide("english");
    let mut sim = Sim::new(&p);
    // Long enough for bye to start beside hello were the loop to allow it (then they overlap).
    sim.executor_sleep = Duration::from_millis(300);
    // Hello and other each end only once the other has started: they overlap however slow
    // the machine is.
    sim.meet = vec!["hello".into(), "other".into()];
    sim.planner_script.lock().unwrap().push_back(
        r#"{"tasks": [{"id": "hello", "title": "Hello", "paths": ["greetings/"]},
                      {"id": "bye", "title": "Bye", "paths": ["greetings/bye.txt"]},
                      {"id": "other", "title": "Other", "paths": ["other.txt"]}]}"#
            .to_string(),
    );
    sim.verifier_passes = vec!["hello".into(), "bye".into(), "other".into()];
    let host = p.host();
    let mut orch = Orchestrator::new(&host, &sim).unwrap();
    let outcome = orch
        .run(&RunOptions {
            jobs: Some(3),
            max_phases: Some(1),
            ..RunOptions::default()
        })
        .unwrap();
    assert_eq!(outcome, phase_limit(1));
    let (h0, h1) = intervals(&p, "hello");
    let (b0, b1) = intervals(&p, "bye");
    let (o0, o1) = intervals(&p, "other");
    assert!(
        h1 <= b0 || b1 <= h0,
        "hello {h0}..{h1} and bye {b0}..{b1} overlap"
    );
    assert!(
        h0 < o1 && o0 < h1,
        "other {o0}..{o1} ran beside hello {h0}..{h1}"
    );
    assert_eq!(
        p.state()["variables"]["metash"]["paths"]["bye"],
        serde_json::json!(["greetings/bye.txt"])
    );
}
