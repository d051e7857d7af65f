//! The merge queue (issue 33): parallel tasks that edit the same lines of one file are brought up
//! to date with the project in their own worktrees, their executors resolve the conflicts (a
//! scripted resolver that keeps both sides), the verifier checks the resolution, and the main
//! checkout never holds a conflict marker nor `MERGE_HEAD`: a watcher looks at it every time the
//! event log grows (and every millisecond besides) for the whole run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};

use super::common::{git, phase_limit, statuses, Project, Sim};

/// Watches the main checkout while a run goes on: `MERGE_HEAD`, and a marker line in
/// `shared.txt`, each time the event log grows.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    looks: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    pub fn start(root: &Path) -> Self {
        let (stop, looks, seen) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(Mutex::new(Vec::new())),
        );
        let root: PathBuf = root.to_path_buf();
        let (s, l, bad) = (stop.clone(), looks.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let events = root.join(".meta/events.jsonl");
            let mut last = 0;
            while !s.load(Ordering::SeqCst) {
                let len = std::fs::metadata(&events).map(|m| m.len()).unwrap_or(0);
                if len != last {
                    last = len;
                    l.fetch_add(1, Ordering::SeqCst);
                }
                if let Some(problem) = main_problem(&root) {
                    bad.lock().unwrap().push(problem);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Self {
            stop,
            looks,
            seen,
            thread: Some(thread),
        }
    }

    /// Stops watching: the problems seen, and how many times the log grew under watch.
    pub fn finish(mut self) -> (Vec<String>, usize) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let seen = self.seen.lock().unwrap().clone();
        (seen, self.looks.load(Ordering::SeqCst))
    }
}

/// What is wrong with the main checkout at `root` now, if anything: a merge in progress, or a
/// conflict marker in one of its files.
pub fn main_problem(root: &Path) -> Option<String> {
    if root.join(".git/MERGE_HEAD").exists() {
        return Some("MERGE_HEAD in the main checkout".into());
    }
    let entries = std::fs::read_dir(root).ok()?;
    for e in entries.flatten() {
        let p = e.path();
        if !p.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        if text
            .lines()
            .any(|l| l.starts_with("<<<<<<< ") || l.starts_with(">>>>>>> "))
        {
            return Some(format!("conflict markers in {}", p.display()));
        }
    }
    None
}

/// A project whose `shared.txt` holds one line every task rewrites, and a plan of `ids`, all
/// independent.
fn project(ids: &[&str], config: &str) -> (Project, Sim) {
    let p = Project::new(config);
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

fn run(p: &Project, sim: &Sim, jobs: usize, answer: Option<&str>) -> RunOutcome {
    let host = p.host();
    let mut orch = Orchestrator::new(&host, sim).unwrap();
    orch.run(&RunOptions {
        jobs: Some(jobs),
        max_phases: Some(1),
        answer: answer.map(str::to_string),
        ..RunOptions::default()
    })
    .unwrap()
}

/// The spawns of `agent` for `task`, with whether each was a resolution turn.
fn turns(sim: &Sim, task: &str) -> Vec<(String, bool, std::time::Instant)> {
    sim.spawned()
        .into_iter()
        .filter(|s| s.task.as_deref() == Some(task))
        .map(|s| {
            let resolving = s.user_message.contains("## Resolve a merge conflict");
            (s.agent, resolving, s.start)
        })
        .collect()
}

fn same_lines(ids: &[&str]) {
    let (p, sim) = project(ids, "");
    let watcher = Watcher::start(p.path());
    let outcome = run(&p, &sim, ids.len(), None);
    let (problems, looks) = watcher.finish();
    assert_eq!(outcome, phase_limit(1));
    assert!(problems.is_empty(), "{problems:?}");
    assert!(looks > 10, "the watcher saw the log grow {looks} times");
    for (id, status) in statuses(&p.state()) {
        assert_eq!(status, "complete", "task {id}");
        assert!(
            p.state()["variables"]["metash"]["merged"][&id].is_string(),
            "task {id} landed"
        );
        assert_eq!(
            p.state()["variables"]["metash"]["queue"][&id]["state"],
            "landed"
        );
    }
    // Every task's change is in the merged file, as the executors resolved it.
    let shared = p.file_at_head("shared.txt");
    for id in ids {
        assert!(
            shared.lines().any(|l| l == *id),
            "{id} missing in {shared:?}"
        );
    }
    assert!(!shared.contains("base"), "{shared:?}");
    // Every task after the first resolved a conflict, and the verifier checked each resolution.
    let resolved: Vec<&&str> = ids
        .iter()
        .filter(|id| turns(&sim, id).iter().any(|t| t.1))
        .collect();
    assert_eq!(resolved.len(), ids.len() - 1, "{resolved:?}");
    // The request names the conflicting file and the landed tasks it conflicts with.
    let request = sim
        .spawned()
        .into_iter()
        .find(|s| s.task.as_deref() == Some(ids[1]) && s.user_message.contains("## Resolve"))
        .unwrap()
        .user_message;
    assert!(
        request.contains(r#""files":["shared.txt"]"#)
            && request.contains(r#""with":["x"]"#)
            && request.contains("conflicts with the work of task(s) x, in: shared.txt"),
        "{request}"
    );
    for id in resolved {
        let t = turns(&sim, id);
        let resolution = t.iter().rposition(|t| t.1).unwrap();
        assert!(
            t[resolution + 1..].iter().any(|t| t.0 == "verifier"),
            "no verifier after {id}'s resolution: {t:?}"
        );
    }
    assert_eq!(
        git(p.path(), &["status", "--porcelain", "--untracked-files=no"]),
        ""
    );
}

#[test]
fn two_parallel_tasks_on_the_same_lines_are_resolved_and_land() {
    same_lines(&["x", "y"]);
}

#[test]
fn three_parallel_tasks_on_the_same_lines_are_resolved_and_land() {
    same_lines(&["x", "y", "z"]);
}

/// A resolver that leaves the markers fails twice: the task waits on a person, in its worktree;
/// the main checkout is clean; the person resolves there and `--answer done` lands it.
#[test]
fn a_resolution_failing_twice_asks_a_person_in_the_worktree() {
    let (p, mut sim) = project(&["x", "y"], "");
    sim.resolver_fails = true;
    let watcher = Watcher::start(p.path());
    let outcome = run(&p, &sim, 2, None);
    let RunOutcome::Checkpoint(cp) = outcome else {
        panic!("a person is asked: {outcome:?}");
    };
    assert_eq!(cp.agent, "orchestrator");
    let msg = &cp.signal.message;
    assert!(msg.contains("failed 2 time(s)"), "{msg}");
    assert!(
        msg.contains("shared.txt") && msg.contains("task x"),
        "{msg}"
    );
    let wt = p.path().join(".meta/worktrees/y");
    assert!(msg.contains(&wt.display().to_string()), "{msg}");
    assert_eq!(
        turns(&sim, "y").iter().filter(|t| t.1).count(),
        2,
        "two resolution turns"
    );
    assert_eq!(
        p.state()["variables"]["metash"]["queue"]["y"]["state"],
        "waiting_on_person"
    );
    // The conflict waits in the task's worktree; the main checkout is clean.
    assert!(p.path().join(".git/worktrees/y/MERGE_HEAD").exists());
    assert!(std::fs::read_to_string(wt.join("shared.txt"))
        .unwrap()
        .contains("<<<<<<< "));
    assert_eq!(main_problem(p.path()), None);
    assert_eq!(
        git(p.path(), &["status", "--porcelain", "--untracked-files=no"]),
        ""
    );
    assert_eq!(p.file_at_head("shared.txt"), "x");
    // Not answered: the run stops at once.
    assert!(matches!(run(&p, &sim, 2, None), RunOutcome::Checkpoint(_)));
    // The person resolves in the worktree and answers.
    std::fs::write(wt.join("shared.txt"), "x and y\n").unwrap();
    git(&wt, &["add", "shared.txt"]);
    git(&wt, &["commit", "-q", "--no-edit"]);
    let outcome = run(&p, &sim, 2, Some("done"));
    let (problems, _) = watcher.finish();
    assert_eq!(outcome, phase_limit(1));
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(p.file_at_head("shared.txt"), "x and y");
    let state = p.state();
    assert!(state["variables"]["metash"]["merged"]["y"].is_string());
    assert!(state["resumeData"].is_null(), "the answer reached no agent");
}

/// `--answer abort` halts and puts the worktree back; nothing reached the main checkout.
#[test]
fn aborting_the_persons_resolution_halts_with_the_worktree_reset() {
    let (p, mut sim) = project(&["x", "y"], "max_resolve_attempts = 1");
    sim.resolver_fails = true;
    assert!(matches!(run(&p, &sim, 2, None), RunOutcome::Checkpoint(_)));
    assert_eq!(turns(&sim, "y").iter().filter(|t| t.1).count(), 1);
    let outcome = run(&p, &sim, 2, Some("abort"));
    let RunOutcome::Halted(h) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(
        h.reason,
        metash_orchestrator::book::HaltReason::MergeAborted
    );
    assert!(!p.path().join(".git/worktrees/y/MERGE_HEAD").exists());
    assert_eq!(main_problem(p.path()), None);
    assert_eq!(p.file_at_head("shared.txt"), "x");
}

/// With `reverify_after_update = false` an update that changed the tree lands without the
/// verifier; with the default it is checked again (`same_lines` covers the conflict case).
#[test]
fn a_clean_update_is_reverified_unless_configured_off() {
    let verifier_turns = |config: &str| {
        let p = Project::new(config);
        p.decide("english");
        let sim = Sim::new(&p);
        let outcome = {
            let host = p.host();
            let mut orch = Orchestrator::new(&host, &sim).unwrap();
            orch.run(&RunOptions {
                jobs: Some(2),
                max_phases: Some(1),
                ..RunOptions::default()
            })
            .unwrap()
        };
        assert_eq!(outcome, phase_limit(1));
        assert_eq!(p.file_at_head("hello.txt"), "Hello, world!");
        assert_eq!(p.file_at_head("bye.txt"), "Goodbye!");
        assert_eq!(main_problem(p.path()), None);
        sim.spawned()
            .iter()
            .filter(|s| s.agent == "verifier")
            .count()
    };
    // hello and bye run in parallel: the second to land is updated with the first, which
    // changes its tree; readme holds both already and is not.
    let on = verifier_turns("");
    let off = verifier_turns("reverify_after_update = false");
    assert_eq!(
        on,
        off + 1,
        "one re-verification ({on} vs {off} verifier turns)"
    );
}

/// `update = "rebase"`: the task's own commits are replayed on the project's branch and recorded
/// as its commits; conflicts fall back to a merge the executor resolves.
#[test]
fn rebase_updates_record_the_replayed_commits() {
    let p = Project::new("update = \"rebase\"");
    p.decide("english");
    let sim = Sim::new(&p);
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
    assert_eq!(p.file_at_head("bye.txt"), "Goodbye!");
    let state = p.state();
    let log = git(p.path(), &["log", "--no-merges", "--format=%H %s", "HEAD"]);
    for (id, _) in statuses(&state) {
        for c in super::common::commits_of(&state, &id) {
            assert!(log.contains(&c), "task {id}'s commit {c} is in HEAD: {log}");
        }
    }
    let (p2, sim2) = project(&["x", "y"], "update = \"rebase\"");
    assert_eq!(run(&p2, &sim2, 2, None), phase_limit(1));
    let shared = p2.file_at_head("shared.txt");
    assert!(shared.contains('x') && shared.contains('y'), "{shared}");
}

/// Fails task `b`'s first verification made after the queue brought it up to date (its worktree
/// then holds `a`'s file); everything else as the `Sim`.
struct FailsAfterUpdate {
    sim: Sim,
    failed: AtomicBool,
    /// An executor turn at `b` found `a`'s work in its worktree.
    executor_saw_a: AtomicBool,
}

impl metash_host::Spawner for FailsAfterUpdate {
    fn spawn_agent(
        &self,
        req: &metash_host::SpawnRequest,
    ) -> metash_host::Result<metash_protocol::AgentResponse> {
        let wt = req.workdir.clone().unwrap_or_default();
        let updated = wt.join("tasks/a.txt").exists();
        if req.agent_name == "executor" && req.task_id.as_deref() == Some("b") && updated {
            self.executor_saw_a.store(true, Ordering::SeqCst);
        }
        if req.agent_name == "verifier"
            && req.task_id.as_deref() == Some("b")
            && updated
            && !self.failed.swap(true, Ordering::SeqCst)
        {
            return Ok(metash_protocol::AgentResponse {
                status: metash_protocol::AgentStatus::Success,
                data: r#"{"pass": false, "findings": ["b breaks next to a"]}"#.into(),
                metadata: Default::default(),
            });
        }
        self.sim.spawn_agent(req)
    }
}

/// A re-verification after a clean update that fails is a gap like any other: the task goes back
/// to its executor, on the updated branch, with the findings; then it lands.
#[test]
fn a_failed_reverification_is_a_gap_on_the_updated_branch() {
    let p = Project::new("");
    let sim = Sim::new(&p);
    sim.planner_script.lock().unwrap().push_back(
        r#"{"tasks": [{"id": "a", "title": "A"}, {"id": "b", "title": "B"}]}"#.to_string(),
    );
    let spawner = FailsAfterUpdate {
        sim,
        failed: AtomicBool::new(false),
        executor_saw_a: AtomicBool::new(false),
    };
    let watcher = Watcher::start(p.path());
    let host = p.host();
    let mut orch = Orchestrator::new(&host, &spawner).unwrap();
    let outcome = orch
        .run(&RunOptions {
            jobs: Some(2),
            max_phases: Some(1),
            ..RunOptions::default()
        })
        .unwrap();
    let (problems, _) = watcher.finish();
    assert_eq!(outcome, phase_limit(1));
    assert!(problems.is_empty(), "{problems:?}");
    assert!(
        spawner.failed.load(Ordering::SeqCst),
        "the re-verification failed once"
    );
    let updates = p.state_updates();
    assert!(updates.iter().any(|(_, k, v)| k == "gapCount" && v == 1));
    // b's second executor turn had the finding, in a worktree holding a's work.
    let retry = spawner
        .sim
        .spawned()
        .into_iter()
        .filter(|s| s.agent == "executor" && s.task.as_deref() == Some("b"))
        .nth(1)
        .expect("b was executed again");
    assert!(retry.user_message.contains("b breaks next to a"));
    assert!(spawner.executor_saw_a.load(Ordering::SeqCst));
    assert_eq!(p.file_at_head("tasks/a.txt"), "A");
    assert_eq!(p.file_at_head("tasks/b.txt"), "B");
}
