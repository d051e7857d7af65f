//! `metash rollback` of tasks that landed through the merge queue (issue 33): a task whose branch
//! was brought up to date with the project before it landed, cleanly or through a resolution
//! that rewrote the lines its own commit changed, is rolled back as a task landed before the
//! queue existed is: its work leaves `HEAD` (one revert of its landing merge against the
//! checkout's side), the other tasks' work stays, and the next run redoes it.

use std::path::Path;

use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};
use serde_json::Value;

use super::common::{commits_of, git, phase_limit, statuses, Project, Sim};

/// Tasks `ids` (independent, one phase) each rewriting the one line of `shared.txt`.
fn same_line_project(ids: &[&str]) -> (Project, Sim) {
    let p = Project::new("");
    std::fs::write(p.path().join("shared.txt"), "base\n").unwrap();
    git(p.path(), &["add", "shared.txt"]);
    git(p.path(), &["commit", "-q", "-m", "shared"]);
    let mut sim = Sim::new(&p);
    sim.same_file = true;
    let tasks: Vec<String> = ids
        .iter()
        .map(|id| format!(r#"{{"id": "{id}", "title": "{}"}}"#, id.to_uppercase()))
        .collect();
    sim.planner_script
        .lock()
        .unwrap()
        .push_back(format!(r#"{{"tasks": [{}]}}"#, tasks.join(", ")));
    (p, sim)
}

fn run(p: &Project, sim: &Sim, jobs: usize, max_phases: u32) -> RunOutcome {
    let host = p.host();
    let mut orch = Orchestrator::new(&host, sim).unwrap();
    orch.run(&RunOptions {
        jobs: Some(jobs),
        max_phases: Some(max_phases),
        ..RunOptions::default()
    })
    .unwrap()
}

fn merged_at(state: &Value, id: &str) -> String {
    state["variables"]["metash"]["merged"][id]
        .as_str()
        .unwrap_or_else(|| panic!("task {id} did not land: {state}"))
        .to_string()
}

/// The merge commits between the checkout's side of landing merge `landed` and the task's tip:
/// the queue's update (and resolution) merges.
fn updates_in(root: &Path, landed: &str) -> Vec<String> {
    let range = format!("{landed}^1..{landed}^2");
    git(root, &["rev-list", "--merges", &range])
        .lines()
        .map(str::to_string)
        .collect()
}

/// Of tasks `ids`, the one whose landing was made on the other's (it landed second).
fn landed_second<'a>(root: &Path, state: &Value, ids: [&'a str; 2]) -> (&'a str, &'a str) {
    let first_in_second = std::process::Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["merge-base", "--is-ancestor"])
        .args([merged_at(state, ids[0]), merged_at(state, ids[1])])
        .status()
        .unwrap()
        .success();
    if first_in_second {
        (ids[0], ids[1])
    } else {
        (ids[1], ids[0])
    }
}

#[test]
fn a_task_landed_after_a_resolution_rolls_back_and_is_redone() {
    let (p, sim) = same_line_project(&["a", "b"]);
    assert_eq!(run(&p, &sim, 2, 1), phase_limit(1));
    let state = p.state();
    let (first, second) = landed_second(p.path(), &state, ["a", "b"]);
    let shared = p.file_at_head("shared.txt");
    let mut lines: Vec<&str> = shared.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["a", "b"], "the resolver kept both: {shared:?}");
    // The second task's branch was brought up to date with the first's landing, and its executor
    // rewrote the line the task's own commit changed.
    let landed = merged_at(&state, second);
    let updates = updates_in(p.path(), &landed);
    assert_eq!(updates.len(), 1, "{second}'s branch holds the update merge");
    let subject = git(p.path(), &["log", "-1", "--format=%s", &updates[0]]);
    assert!(subject.contains("conflicts resolved"), "{subject}");
    let commits = commits_of(&state, second);
    assert_eq!(commits.len(), 1);

    let host = p.host();
    let orch = Orchestrator::new(&host, &sim).unwrap();
    let plan = orch.rollback_plan(second).unwrap();
    assert!(plan.dependents.is_empty());
    let done = orch.rollback(&plan, false).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(
        done[0].commits, commits,
        "what was undone: the task's commits"
    );
    assert_eq!(done[0].reverts.len(), 1, "one revert: the landing");
    let revert = &done[0].reverts[0];
    assert_eq!(git(p.path(), &["rev-parse", "HEAD"]), *revert);
    let said = git(p.path(), &["log", "-1", "--format=%B", revert]);
    assert!(said.contains(&landed), "{said}");
    // Its work, the resolution included, left HEAD; the first task's stayed; the checkout is
    // clean.
    assert_eq!(p.file_at_head("shared.txt"), first);
    assert_eq!(
        std::fs::read_to_string(p.path().join("shared.txt")).unwrap(),
        format!("{first}\n")
    );
    assert_eq!(
        git(p.path(), &["status", "--porcelain", "--", ".", ":!.meta"]),
        ""
    );
    let state = p.state();
    assert_eq!(state["status"], "planning");
    let st = statuses(&state);
    assert!(st.contains(&(first.into(), "complete".into())), "{st:?}");
    assert!(st.contains(&(second.into(), "pending".into())), "{st:?}");
    assert_eq!(
        state["variables"]["metash"]["rolledBack"][second]["reverts"][0],
        revert.as_str()
    );
    drop(orch);
    drop(host);

    // Redone by the next run: executed again on top of the first task, it lands without a
    // conflict.
    let mut sim2 = Sim::new(&p);
    sim2.same_file = true;
    assert_eq!(run(&p, &sim2, 2, 1), phase_limit(1));
    assert!(statuses(&p.state()).iter().all(|(_, s)| s == "complete"));
    assert_eq!(p.file_at_head("shared.txt"), second);
}

/// The example's hello and bye run in parallel and land through the queue, the second on the
/// first's landing (a merge the queue made on `HEAD`); rolling the second back (with its
/// dependents) takes its file out of `HEAD` and leaves the first's.
#[test]
fn a_task_landed_by_a_queue_merge_rolls_back_with_its_dependents() {
    let p = Project::new("");
    p.decide("english");
    let sim = Sim::new(&p);
    assert_eq!(run(&p, &sim, 2, 1), phase_limit(1));
    let state = p.state();
    let (first, second) = landed_second(p.path(), &state, ["hello", "bye"]);
    let landed = merged_at(&state, second);
    let parents = git(p.path(), &["rev-list", "--parents", "-n", "1", &landed]);
    assert_eq!(parents.split(' ').count(), 3, "a merge: {parents}");
    let file = format!("{second}.txt");
    let other = format!("{first}.txt");
    let before = p.file_at_head(&other);

    let host = p.host();
    let orch = Orchestrator::new(&host, &sim).unwrap();
    let plan = orch.rollback_plan(second).unwrap();
    let done = orch.rollback(&plan, true).unwrap();
    let mine = done.iter().find(|d| d.task == second).unwrap();
    assert!(!mine.reverts.is_empty(), "{done:?}");
    let files = git(p.path(), &["ls-tree", "--name-only", "HEAD"]);
    assert!(!files.lines().any(|f| f == file), "{files}");
    assert_eq!(
        p.file_at_head(&other),
        before,
        "the other task's work stays"
    );
    assert_eq!(
        git(p.path(), &["status", "--porcelain", "--", ".", ":!.meta"]),
        ""
    );
    drop(orch);
    drop(host);

    // The next run redoes it.
    let sim2 = Sim::new(&p);
    assert_eq!(run(&p, &sim2, 2, 1), phase_limit(1));
    assert!(git(p.path(), &["ls-tree", "--name-only", "HEAD"])
        .lines()
        .any(|f| f == file));
}
