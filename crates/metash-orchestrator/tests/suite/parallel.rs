//! Independent tasks run at the same time in separate worktrees (their intervals overlap in the
//! log) and merge cleanly.

use std::time::Duration;

use chrono::DateTime;
use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};

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
    sim.executor_sleep = Duration::from_millis(400);
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

#[test]
fn a_merge_conflict_is_a_checkpoint_for_a_person() {
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
    let RunOutcome::Checkpoint(cp) = orch.run(&opts).unwrap() else {
        panic!("the second merge conflicts");
    };
    assert_eq!(cp.agent, "orchestrator");
    assert_eq!(
        cp.signal.reason,
        metash_protocol::CheckpointReason::HumanAction
    );
    assert!(
        cp.signal.message.contains("shared.txt"),
        "{}",
        cp.signal.message
    );
    assert_eq!(p.state()["pendingCheckpoint"]["agent"], "orchestrator");
    // Not answered yet: the run stops at once.
    assert!(matches!(
        orch.run(&opts).unwrap(),
        RunOutcome::Checkpoint(_)
    ));
    // A person resolves it and commits the merge.
    std::fs::write(p.path().join("shared.txt"), "x and y\n").unwrap();
    git(p.path(), &["add", "shared.txt"]);
    git(p.path(), &["commit", "-q", "--no-edit"]);
    let outcome = orch
        .run(&RunOptions {
            answer: Some("done".into()),
            ..opts
        })
        .unwrap();
    assert_eq!(outcome, phase_limit(1));
    assert_eq!(p.file_at_head("shared.txt"), "x and y");
    let state = p.state();
    assert!(state["variables"]["metash"]["merged"]["x"].is_string());
    assert!(state["variables"]["metash"]["merged"]["y"].is_string());
    assert!(
        state["resumeData"].is_null(),
        "no agent receives the orchestrator's own answer"
    );
}
