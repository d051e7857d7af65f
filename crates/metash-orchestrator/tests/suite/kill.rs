//! SIGKILL `metash run` at random points 20 times and continue each time: the run always
//! completes, no task's work is applied twice, and the final state equals an uninterrupted run's.
//! A third target has three parallel tasks conflict on one line, and at least 30 kills land while
//! the merge queue updates, resolves, re-verifies and lands them: after every kill the main
//! checkout holds no conflict marker, no `MERGE_HEAD` and no change.
//!
//! The run under test is this test binary re-executed (`kill_child`, ignored unless asked for) so
//! it can be killed like a real `metash run`: once with the example agents in-process (fast, many
//! fine-grained kill points), once with the real host spawning the WASM example agents (what
//! `metash run` does in the example project).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use metash_host::{Host, HostOptions};
use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};
use serde_json::Value;

use super::common::{commits_of, git, statuses, Project, Sim};

const CHILD_DIR: &str = "METASH_ORCH_KILL_CHILD";
const CHILD_POLICY: &str = "METASH_ORCH_KILL_POLICY";
const CHILD_QUEUE: &str = "METASH_ORCH_KILL_QUEUE";

/// A project to run: in-process agents (`policy` none) or the WASM example (`policy` set);
/// `queue`: three in-process tasks that conflict.
struct Target {
    dir: tempfile::TempDir,
    policy: Option<PathBuf>,
    queue: bool,
}

impl Target {
    fn sim() -> Self {
        let p = Project::new("");
        p.decide("english");
        Self {
            dir: p.dir,
            policy: None,
            queue: false,
        }
    }

    /// Tasks x, y and z (phase 1, independent) each rewrite the one line of `shared.txt`; the
    /// plan is in the context (the example planner plans it phase by phase, whatever run asks).
    fn queue() -> Self {
        let p = Project::new("");
        std::fs::write(p.path().join("shared.txt"), "base\n").unwrap();
        git(p.path(), &["add", "shared.txt"]);
        git(p.path(), &["commit", "-q", "-m", "shared"]);
        let plan = r#"{"phases": [[{"id": "x", "title": "X"}, {"id": "y", "title": "Y"}, {"id": "z", "title": "Z"}]]}"#;
        p.store()
            .set_context(&format!(
                "{}\n```plan\n{plan}\n```\n",
                super::common::CONTEXT
            ))
            .unwrap();
        Self {
            dir: p.dir,
            policy: None,
            queue: true,
        }
    }

    fn wasm() -> Self {
        let (dir, policy) = super::wasm_example::example_project();
        let t = Self {
            dir,
            policy: Some(policy),
            queue: false,
        };
        // The planner's question is answered up front, as a decision.
        metash_store::Store::open(t.path())
            .unwrap()
            .update_state(
                "variables.metash.decisions",
                serde_json::json!([{"id": "greeting-language", "question": "language?", "answer": "english"}]),
            )
            .unwrap();
        t
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// One run, as `metash run --jobs 2` does it (`--jobs 3` for the queue's three tasks).
fn run_once(dir: &Path, policy: Option<&Path>, queue: bool) -> RunOutcome {
    let options = RunOptions {
        jobs: Some(if queue { 3 } else { 2 }),
        ..RunOptions::default()
    };
    match policy {
        Some(policy) => {
            let host = super::wasm_example::host(dir, policy);
            let mut orch = Orchestrator::new(&host, &host).unwrap();
            orch.run(&options).unwrap()
        }
        None => {
            let host = Host::open(dir, HostOptions::silent()).unwrap();
            let mut sim = Sim::new_at(&host);
            sim.executor_sleep = Duration::from_millis(40);
            sim.same_file = queue;
            let mut orch = Orchestrator::new(&host, &sim).unwrap();
            orch.run(&options).unwrap()
        }
    }
}

/// The child: one run on the project named by the environment.
#[test]
#[ignore = "run by the sigkill tests"]
fn kill_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let policy = std::env::var_os(CHILD_POLICY).map(PathBuf::from);
    let queue = std::env::var_os(CHILD_QUEUE).is_some();
    run_once(Path::new(&dir), policy.as_deref(), queue);
}

/// A tiny xorshift, seeded from the clock (printed, so a failure can be replayed).
struct Rng(u64);
impl Rng {
    fn seeded() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
        eprintln!("kill test seed {seed}");
        Self(seed)
    }

    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

fn state(dir: &Path) -> Value {
    metash_store::Store::open(dir).unwrap().get("").unwrap()
}

fn summary(dir: &Path) -> (Value, Vec<(String, usize)>, String) {
    let state = state(dir);
    let counts = statuses(&state)
        .into_iter()
        .map(|(id, _)| {
            let n = commits_of(&state, &id).len();
            (id, n)
        })
        .collect();
    let tree = git(dir, &["rev-parse", "HEAD^{tree}"]);
    let keep = serde_json::json!({
        "status": state["status"], "currentPhase": state["currentPhase"], "gapCount": state["gapCount"],
        "statuses": statuses(&state), "halt": state["variables"]["metash"]["halt"]["reason"],
    });
    (keep, counts, tree)
}

fn kill_20_times_then_continue(make: fn() -> Target) {
    let reference = make();
    let started = Instant::now();
    let outcome = run_once(
        reference.path(),
        reference.policy.as_deref(),
        reference.queue,
    );
    assert!(
        matches!(outcome, RunOutcome::Complete { .. }),
        "{outcome:?}"
    );
    let reference_ms = started.elapsed().as_millis();
    let want = summary(reference.path());
    // Kill points spread over the whole run: each child may make up to 1/16 of the reference
    // run's log progress before it is killed (20 kills cover most of a run, and a run whose git
    // work is in-process takes only a few hundred ms, so the extra wait is short too).
    let reference_events = lines_of(reference.path());
    let step = (reference_events as u64 / 16).max(6);
    let t = make();
    let mut rng = Rng::seeded();
    let mut interrupted = 0;
    for _ in 0..20 {
        if kill_once(&t, &mut rng, step, false) {
            interrupted += 1;
        }
    }
    eprintln!(
        "{interrupted} of 20 kills interrupted a live run (an uninterrupted run takes \
         {reference_ms} ms, {reference_events} events); log after the kills: {} events",
        lines_of(t.path())
    );
    assert!(
        interrupted >= 10,
        "most kills must land mid-run ({interrupted})"
    );
    let outcome = run_once(t.path(), t.policy.as_deref(), t.queue);
    assert!(
        matches!(outcome, RunOutcome::Complete { .. }),
        "{outcome:?}"
    );
    check_final(t.path(), &want);
}

/// Rounds of a fresh queue project: each child runs until the merge queue is at work, then is
/// killed a random few events (and ms) later, and the main checkout is checked; when a round's
/// queue is through, the run is resumed to completion and compared with an uninterrupted one.
/// Until `at_least` kills have landed in a queue.
fn kill_in_the_queue(at_least: usize) {
    let reference = Target::queue();
    let outcome = run_once(reference.path(), None, true);
    assert!(
        matches!(outcome, RunOutcome::Complete { .. }),
        "{outcome:?}"
    );
    let want = summary(reference.path());
    let mut rng = Rng::seeded();
    let (mut landed, mut rounds) = (0, 0);
    let mut states = std::collections::BTreeMap::<String, usize>::new();
    while landed < at_least && rounds < 40 {
        rounds += 1;
        let t = Target::queue();
        for _ in 0..40 {
            if state(t.path())["status"] == "halted" {
                break;
            }
            // Up to a dozen events: sometimes a task's whole turn in the queue, mostly part of it.
            let live = kill_once(&t, &mut rng, 12, true);
            check_main_checkout(t.path());
            if live && in_queue(t.path()) {
                landed += 1;
                *states.entry(queue_states(t.path())).or_insert(0) += 1;
            }
        }
        let outcome = run_once(t.path(), None, true);
        assert!(
            matches!(outcome, RunOutcome::Complete { .. }),
            "{outcome:?}"
        );
        check_final(t.path(), &want);
    }
    eprintln!("{landed} kills landed in the merge queue, in {rounds} round(s); queue states at the kills: {states:?}");
    assert!(landed >= at_least, "{landed} kills in the queue");
}

fn lines_of(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join(".meta/events.jsonl"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Starts a child run on `t` and SIGKILLs it after a random amount of progress (new log
/// events; with `queue`, counted from when the merge queue is at work), then a random few ms:
/// the kills land all along the run, not only in the child's startup. Whether the child was
/// still running when killed.
fn kill_once(t: &Target, rng: &mut Rng, step: u64, queue: bool) -> bool {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(&exe);
    cmd.args([
        "--exact",
        "suite::kill::kill_child",
        "--ignored",
        "--test-threads=1",
    ])
    .env(CHILD_DIR, t.path())
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    if let Some(p) = &t.policy {
        cmd.env(CHILD_POLICY, p);
    }
    if t.queue {
        cmd.env(CHILD_QUEUE, "1");
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while queue
        && !in_queue(t.path())
        && child.try_wait().unwrap().is_none()
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let target = lines_of(t.path()) + 1 + rng.next(step) as usize;
    while lines_of(t.path()) < target
        && child.try_wait().unwrap().is_none()
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(rng.next(3)));
    let live = child.try_wait().unwrap().is_none();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    live
}

/// Whether the merge queue was at work: some task has a queue entry that has not landed.
fn in_queue(dir: &Path) -> bool {
    let s = state(dir);
    s["variables"]["metash"]["queue"]
        .as_object()
        .is_some_and(|q| q.values().any(|e| e.is_object() && e["state"] != "landed"))
}

/// The queue states of the tasks not landed, as `y:resolving z:waiting`.
fn queue_states(dir: &Path) -> String {
    let s = state(dir);
    let mut out: Vec<String> = s["variables"]["metash"]["queue"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, e)| e.is_object() && e["state"] != "landed")
        .map(|(id, e)| format!("{id}:{}", e["state"].as_str().unwrap_or("?")))
        .collect();
    out.sort();
    out.join(" ")
}

/// After a kill (once a git the dead run started has finished: it holds the run lock), the main
/// checkout holds no `MERGE_HEAD` and no conflict marker, and its tree is clean, unless an
/// in-process landing was cut short mid-write (its marker says so; the next run finishes it).
fn check_main_checkout(dir: &Path) {
    let lock = metash_store::lock::acquire(&dir.join(".meta/run.lock"), Duration::from_secs(10))
        .expect("the dead run's git finishes");
    assert_eq!(super::queue::main_problem(dir), None);
    let status = git(
        dir,
        &[
            "--no-optional-locks",
            "status",
            "--porcelain",
            "--untracked-files=no",
        ],
    );
    assert!(
        status.is_empty() || dir.join(".git/metash-merging").exists(),
        "the main checkout is dirty after a kill: {status}"
    );
    drop(lock);
}

/// The resumed run ended where an uninterrupted one does: same state, commits per task (no task
/// applied twice) and files; every recorded commit is in HEAD exactly once, and HEAD holds no
/// task commit that is not recorded.
fn check_final(dir: &Path, want: &(Value, Vec<(String, usize)>, String)) {
    let got = summary(dir);
    assert_eq!(got.0, want.0, "final state");
    assert_eq!(got.1, want.1, "commits per task (no task applied twice)");
    assert_eq!(got.2, want.2, "the project's files");
    assert_eq!(super::queue::main_problem(dir), None);
    let state = state(dir);
    let log = git(dir, &["log", "--no-merges", "--format=%H %s", "HEAD"]);
    for (id, _) in statuses(&state) {
        let mut recorded = commits_of(&state, &id);
        recorded.sort();
        let mut in_head: Vec<String> = log
            .lines()
            .filter(|l| l.contains(&format!("metash: task {id}:")))
            .map(|l| l.split(' ').next().unwrap().to_string())
            .collect();
        in_head.sort();
        assert_eq!(recorded, in_head, "task {id}");
    }
}

#[test]
fn sigkill_at_random_points_then_continue() {
    kill_20_times_then_continue(Target::sim);
}

#[test]
fn sigkill_the_real_host_with_wasm_agents_then_continue() {
    kill_20_times_then_continue(Target::wasm);
}

/// Three parallel tasks rewrite one line: the merge queue updates, resolves (the executor keeps
/// both sides), re-verifies and lands them. At least 30 kills land while it works; the main
/// checkout is clean after every one, and the resumed run ends as an uninterrupted one.
#[test]
fn sigkill_in_the_merge_queue_leaves_the_checkout_clean_then_continue() {
    kill_in_the_queue(30);
}
