//! The merge queue's clean path (issue 33): a task whose update does not conflict is merged onto
//! the project's `HEAD` away from its worktree, re-verified in the queue's worktree, and the
//! checkout is fast-forwarded to that merge; SIGKILLs while it works leave the checkout clean,
//! and a fast-forward cut short is undone and finished by the next run.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};

use super::common::{git, phase_limit, statuses, Project, Sim};
use super::queue::{main_problem, Watcher};

/// Leaves a stray file wherever the verifier checks a task in the queue's worktree, and notes
/// any stray file an earlier check left there; everything else as the `Sim`.
struct StrayVerifier {
    sim: Sim,
    written: AtomicUsize,
    found: Mutex<Vec<String>>,
}

impl metash_host::Spawner for StrayVerifier {
    fn spawn_agent(
        &self,
        req: &metash_host::SpawnRequest,
    ) -> metash_host::Result<metash_protocol::AgentResponse> {
        let wt = req.workdir.clone().unwrap_or_default();
        if req.agent_name == "verifier" && wt.ends_with("metash.queue") {
            for e in std::fs::read_dir(&wt).unwrap().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("stray-") {
                    self.found.lock().unwrap().push(name);
                }
            }
            let task = req.task_id.clone().unwrap_or_default();
            std::fs::write(wt.join(format!("stray-{task}.txt")), "a verifier was here").unwrap();
            self.written.fetch_add(1, Ordering::SeqCst);
        }
        self.sim.spawn_agent(req)
    }
}

/// Three parallel tasks that do not conflict: each after the first is merged onto `HEAD` away
/// from its worktree (no update commit on its branch), re-verified in the queue's worktree
/// (which holds exactly what lands: a verifier's leftovers are gone before the next check and
/// never land), and the checkout is fast-forwarded to that merge, whose parents are `HEAD` and
/// the task's own commit. The queue's worktree and branch are gone when the phase completes.
#[test]
fn a_clean_update_is_made_and_verified_in_the_queue_worktree() {
    let p = Project::new("");
    let sim = Sim::new(&p);
    sim.planner_script.lock().unwrap().push_back(
        r#"{"tasks": [{"id": "a", "title": "A"}, {"id": "b", "title": "B"}, {"id": "c", "title": "C"}]}"#
            .to_string(),
    );
    let spawner = StrayVerifier {
        sim,
        written: AtomicUsize::new(0),
        found: Mutex::new(vec![]),
    };
    let watcher = Watcher::start(p.path());
    let host = p.host();
    let mut orch = Orchestrator::new(&host, &spawner).unwrap();
    let outcome = orch
        .run(&RunOptions {
            jobs: Some(3),
            max_phases: Some(1),
            ..RunOptions::default()
        })
        .unwrap();
    let (problems, _) = watcher.finish();
    assert_eq!(outcome, phase_limit(1));
    assert!(problems.is_empty(), "{problems:?}");
    // The first to land held HEAD already; the other two were checked in the queue's worktree.
    assert_eq!(spawner.written.load(Ordering::SeqCst), 2);
    assert_eq!(*spawner.found.lock().unwrap(), Vec::<String>::new());
    let state = p.state();
    for id in ["a", "b", "c"] {
        assert_eq!(
            p.file_at_head(&format!("tasks/{id}.txt")),
            id.to_uppercase()
        );
        assert_eq!(state["variables"]["metash"]["queue"][id]["state"], "landed");
        let merged = state["variables"]["metash"]["merged"][id].as_str().unwrap();
        let parents = git(p.path(), &["rev-list", "--parents", "-n", "1", merged]);
        let parents: Vec<&str> = parents.split_whitespace().skip(1).collect();
        let own = super::common::commits_of(&state, id);
        assert_eq!(parents.len(), 2, "task {id} lands as a merge: {parents:?}");
        assert_eq!(Some(&parents[1].to_string()), own.last(), "task {id}");
    }
    let subjects = git(p.path(), &["log", "--format=%s", "HEAD"]);
    assert!(!subjects.contains("metash: update task"), "{subjects}");
    let files = git(p.path(), &["ls-tree", "-r", "--name-only", "HEAD"]);
    assert!(!files.contains("stray-"), "{files}");
    assert!(!p.path().join(".meta/worktrees/metash.queue").exists());
    assert_eq!(git(p.path(), &["branch", "--list", "metash/queue"]), "");
    assert_eq!(
        git(p.path(), &["status", "--porcelain", "--untracked-files=no"]),
        ""
    );
}

/// The child of `sigkill_on_the_clean_path_leaves_the_checkout_clean_then_continue`: one run on
/// the project named by this variable.
const KILL_CHILD_DIR: &str = "METASH_QUEUE_CLEAN_KILL_CHILD";

/// Eight independent tasks that do not conflict (phase 1, from the context's plan): the first to
/// land holds `HEAD`, the other seven take the clean path (merged on `HEAD`, re-verified in the
/// queue's worktree, the checkout fast-forwarded).
fn clean_path_project(config: &str) -> Project {
    let p = Project::new(config);
    let tasks: Vec<String> = ["a", "b", "c", "d", "e", "f", "g", "h"]
        .iter()
        .map(|id| format!(r#"{{"id": "{id}", "title": "{}"}}"#, id.to_uppercase()))
        .collect();
    let plan = format!(r#"{{"phases": [[{}]]}}"#, tasks.join(", "));
    p.store()
        .set_context(&format!(
            "{}\n```plan\n{plan}\n```\n",
            super::common::CONTEXT
        ))
        .unwrap();
    p
}

fn clean_path_run(dir: &Path) -> RunOutcome {
    let host = metash_host::Host::open(dir, metash_host::HostOptions::silent()).unwrap();
    let sim = Sim::new_at(&host);
    let mut orch = Orchestrator::new(&host, &sim).unwrap();
    orch.run(&RunOptions {
        jobs: Some(8),
        ..RunOptions::default()
    })
    .unwrap()
}

#[test]
#[ignore = "run by sigkill_on_the_clean_path_leaves_the_checkout_clean_then_continue"]
fn clean_path_kill_child() {
    if let Some(dir) = std::env::var_os(KILL_CHILD_DIR) {
        clean_path_run(Path::new(&dir));
    }
}

/// What a finished run left: its state's outcome, each task's commits and the files of `HEAD`.
fn clean_path_summary(dir: &Path) -> (serde_json::Value, Vec<(String, Vec<String>)>, String) {
    let state = metash_store::Store::open(dir).unwrap().get("").unwrap();
    let commits = statuses(&state)
        .into_iter()
        .map(|(id, _)| {
            let c = super::common::commits_of(&state, &id);
            (id, c)
        })
        .collect();
    let keep = serde_json::json!({"status": state["status"], "gapCount": state["gapCount"],
        "statuses": statuses(&state)});
    (keep, commits, git(dir, &["rev-parse", "HEAD^{tree}"]))
}

/// Whether some task has a queue entry that has not landed.
fn queue_at_work(dir: &Path) -> bool {
    let state = metash_store::Store::open(dir).unwrap().get("").unwrap();
    state["variables"]["metash"]["queue"]
        .as_object()
        .is_some_and(|q| q.values().any(|e| e.is_object() && e["state"] != "landed"))
}

fn events(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join(".meta/events.jsonl")).map_or(0, |s| s.lines().count())
}

/// Starts a child run on `dir` and SIGKILLs it `wait` events (and `ms` ms) after the merge
/// queue is at work; whether it was still running then, with the queue at work.
fn kill_in_clean_path(dir: &Path, wait: usize, ms: u64) -> bool {
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args([
            "--exact",
            "suite::queue_clean::clean_path_kill_child",
            "--ignored",
        ])
        .env(KILL_CHILD_DIR, dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let running = |c: &mut std::process::Child| {
        c.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline
    };
    while !queue_at_work(dir) && running(&mut child) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let target = events(dir) + wait;
    while events(dir) < target && running(&mut child) {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(ms));
    let live = child.try_wait().unwrap().is_none() && queue_at_work(dir);
    child.kill().unwrap();
    child.wait().unwrap();
    live
}

/// SIGKILL at random points (at least 30) while the clean path lands tasks: after every kill
/// (once the run lock is free) the main checkout holds no `MERGE_HEAD`, no marker and no change,
/// unless a fast-forward was cut short mid-write (its marker says so; the next run undoes and
/// finishes it); each resumed run ends as an uninterrupted one, with every task's commits in
/// `HEAD` exactly once.
#[test]
fn sigkill_on_the_clean_path_leaves_the_checkout_clean_then_continue() {
    kill_on_the_clean_path("");
}

/// The same with `update = "rebase"`: the replayed commits become each task's before they land.
#[test]
fn sigkill_on_the_clean_path_with_rebase_updates_then_continue() {
    kill_on_the_clean_path("update = \"rebase\"");
}

/// Kill rounds on projects with the `[orchestrator]` settings `config`, until 30 kills landed
/// while the queue was at work.
fn kill_on_the_clean_path(config: &str) {
    let reference = clean_path_project(config);
    assert!(matches!(
        clean_path_run(reference.path()),
        RunOutcome::Complete { .. }
    ));
    let want = clean_path_summary(reference.path());
    // The reference took the clean path: no task's branch was updated in its worktree.
    let subjects = git(reference.path(), &["log", "--format=%s", "HEAD"]);
    assert!(!subjects.contains("metash: update task"), "{subjects}");
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("clean-path kill seed {seed}");
    let mut next = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let (mut landed, mut rounds) = (0, 0);
    let mut steps = std::collections::BTreeMap::<String, usize>::new();
    while landed < 30 && rounds < 12 {
        rounds += 1;
        let p = clean_path_project(config);
        for _ in 0..30 {
            let state = metash_store::Store::open(p.path())
                .unwrap()
                .get("")
                .unwrap();
            if state["status"] == "complete" {
                break;
            }
            if kill_in_clean_path(p.path(), next(6) as usize, next(4)) {
                landed += 1;
                // The queue's step at the kill (and whether a fast-forward was cut short).
                let live = std::fs::read_to_string(p.path().join(".meta/queue-now.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .map_or("-".to_string(), |v| v["state"].to_string());
                let cut = p.path().join(".git/metash-merging").exists();
                *steps.entry(format!("{live} cut={cut}")).or_insert(0) += 1;
            }
            let lock = metash_store::lock::acquire(
                &p.path().join(".meta/run.lock"),
                Duration::from_secs(10),
            )
            .unwrap();
            assert_eq!(main_problem(p.path()), None);
            let status = git(p.path(), &["status", "--porcelain", "--untracked-files=no"]);
            assert!(
                status.is_empty() || p.path().join(".git/metash-merging").exists(),
                "the main checkout is dirty after a kill: {status}"
            );
            drop(lock);
        }
        assert!(matches!(
            clean_path_run(p.path()),
            RunOutcome::Complete { .. }
        ));
        let got = clean_path_summary(p.path());
        assert_eq!((&got.0, &got.2), (&want.0, &want.2), "state and files");
        let log = git(p.path(), &["log", "--no-merges", "--format=%H %s", "HEAD"]);
        for (id, commits) in &got.1 {
            let in_head: Vec<&str> = log
                .lines()
                .filter(|l| l.contains(&format!("metash: task {id}:")))
                .map(|l| l.split(' ').next().unwrap())
                .collect();
            assert_eq!(in_head.len(), commits.len(), "task {id}: {log}");
            assert!(
                commits.iter().all(|c| in_head.contains(&c.as_str())),
                "{id}"
            );
        }
        assert_eq!(main_problem(p.path()), None);
    }
    eprintln!("{landed} kills landed on the clean path, in {rounds} round(s); steps: {steps:?}");
    assert!(landed >= 30, "{landed} kills in the queue");
}

/// The first time the verifier checks task `b` in the queue's worktree, it asks a person.
struct AsksInQueue {
    sim: Sim,
    asked: AtomicBool,
}

impl metash_host::Spawner for AsksInQueue {
    fn spawn_agent(
        &self,
        req: &metash_host::SpawnRequest,
    ) -> metash_host::Result<metash_protocol::AgentResponse> {
        let in_queue = req
            .workdir
            .as_ref()
            .is_some_and(|w| w.ends_with("metash.queue"));
        if req.agent_name == "verifier"
            && in_queue
            && req.task_id.as_deref() == Some("b")
            && !self.asked.swap(true, Ordering::SeqCst)
        {
            let signal = metash_protocol::CheckpointSignal {
                kind: Default::default(),
                reason: metash_protocol::CheckpointReason::HumanVerify,
                message: "does b look right next to a?".into(),
                options: vec!["yes".into()],
                resume_id: None,
            };
            return Ok(metash_protocol::AgentResponse {
                status: metash_protocol::AgentStatus::Checkpoint,
                data: serde_json::to_string(&signal).unwrap(),
                metadata: Default::default(),
            });
        }
        self.sim.spawn_agent(req)
    }
}

/// A verifier that asks a person while it checks a clean update in the queue's worktree stops
/// the run with nothing of the task landed; then a fast-forward cut short is faked in the
/// checkout (the task's new file half written, a stale index lock, the in-process merge's
/// marker). The answered run clears the lock, undoes the half-written file, asks the verifier
/// again there (with the answer) and lands the task: the checkout ends clean.
#[test]
fn a_cut_short_fast_forward_and_a_verifier_checkpoint_in_the_queue_are_taken_up_again() {
    let p = Project::new("");
    let sim = Sim::new(&p);
    sim.planner_script.lock().unwrap().push_back(
        r#"{"tasks": [{"id": "a", "title": "A"}, {"id": "b", "title": "B"}]}"#.to_string(),
    );
    let spawner = AsksInQueue {
        sim,
        asked: AtomicBool::new(false),
    };
    let run = |answer: Option<&str>| {
        let host = p.host();
        let mut orch = Orchestrator::new(&host, &spawner).unwrap();
        orch.run(&RunOptions {
            jobs: Some(2),
            max_phases: Some(1),
            answer: answer.map(str::to_string),
            ..RunOptions::default()
        })
        .unwrap()
    };
    let outcome = run(None);
    assert!(matches!(outcome, RunOutcome::Checkpoint(_)), "{outcome:?}");
    let state = p.state();
    assert!(state["variables"]["metash"]["merged"]["a"].is_string());
    assert!(state["variables"]["metash"]["merged"]["b"].is_null());
    assert_eq!(
        git(
            p.path(),
            &[
                "status",
                "--porcelain",
                "--untracked-files=all",
                "--",
                ".",
                ":!.meta"
            ]
        ),
        ""
    );
    // What a run killed while fast-forwarding the checkout to b's landing leaves.
    std::fs::write(p.path().join("tasks/b.txt"), "").unwrap();
    std::fs::write(p.path().join(".git/index.lock"), "").unwrap();
    std::fs::write(p.path().join(".git/metash-merging"), "4242").unwrap();
    assert_eq!(run(Some("yes")), phase_limit(1));
    assert_eq!(p.file_at_head("tasks/b.txt"), "B");
    assert_eq!(
        std::fs::read_to_string(p.path().join("tasks/b.txt")).unwrap(),
        "B\n"
    );
    assert!(!p.path().join(".git/metash-merging").exists());
    assert!(!p.path().join(".git/index.lock").exists());
    assert_eq!(
        git(
            p.path(),
            &[
                "status",
                "--porcelain",
                "--untracked-files=all",
                "--",
                ".",
                ":!.meta"
            ]
        ),
        ""
    );
    let asked_again = spawner.sim.spawned().into_iter().any(|s| {
        s.agent == "verifier"
            && s.task.as_deref() == Some("b")
            && s.workdir.is_some_and(|w| w.ends_with("metash.queue"))
            && s.resume.is_some()
    });
    assert!(
        asked_again,
        "the verifier had the answer in the queue's worktree"
    );
}
