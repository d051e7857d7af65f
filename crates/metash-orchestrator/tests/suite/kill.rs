//! SIGKILL `metash run` at random points 20 times and continue each time: the run always
//! completes, no task's work is applied twice, and the final state equals an uninterrupted run's.
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

/// A project to run: in-process agents (`policy` none) or the WASM example (`policy` set).
struct Target {
    dir: tempfile::TempDir,
    policy: Option<PathBuf>,
}

impl Target {
    fn sim() -> Self {
        let p = Project::new("");
        p.decide("english");
        Self {
            dir: p.dir,
            policy: None,
        }
    }

    fn wasm() -> Self {
        let (dir, policy) = super::wasm_example::example_project();
        let t = Self {
            dir,
            policy: Some(policy),
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

/// One run, as `metash run --jobs 2` does it.
fn run_once(dir: &Path, policy: Option<&Path>) -> RunOutcome {
    let options = RunOptions {
        jobs: Some(2),
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
    run_once(Path::new(&dir), policy.as_deref());
}

/// A tiny xorshift, seeded from the clock (printed, so a failure can be replayed).
struct Rng(u64);
impl Rng {
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
    let outcome = run_once(reference.path(), reference.policy.as_deref());
    assert!(
        matches!(outcome, RunOutcome::Complete { .. }),
        "{outcome:?}"
    );
    let reference_ms = started.elapsed().as_millis();
    let want = summary(reference.path());
    // Kill points spread over the whole run: each child may make up to 1/16 of the reference
    // run's log progress before it is killed (20 kills cover most of a run, and a run whose git
    // work is in-process takes only a few hundred ms, so the extra wait is short too).
    let reference_events = std::fs::read_to_string(reference.path().join(".meta/events.jsonl"))
        .unwrap()
        .lines()
        .count();
    let step = (reference_events as u64 / 16).max(6);

    let t = make();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("kill test seed {seed}");
    let mut rng = Rng(seed);
    let exe = std::env::current_exe().unwrap();
    let events = t.path().join(".meta/events.jsonl");
    let lines = || {
        std::fs::read_to_string(&events)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    let mut interrupted = 0;
    for _ in 0..20 {
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
        let mut child = cmd.spawn().unwrap();
        // Kill after a random amount of progress (new log events), then a random few ms: the
        // kills land all along the run, not only in the child's startup.
        let target = lines() + 1 + rng.next(step) as usize;
        let deadline = Instant::now() + Duration::from_secs(20);
        while lines() < target && child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(rng.next(3)));
        if child.try_wait().unwrap().is_none() {
            interrupted += 1;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    eprintln!(
        "{interrupted} of 20 kills interrupted a live run (an uninterrupted run takes {reference_ms} ms, \
         {reference_events} events); log after the kills: {} events",
        lines()
    );
    assert!(
        interrupted >= 10,
        "most kills must land mid-run ({interrupted})"
    );
    let outcome = run_once(t.path(), t.policy.as_deref());
    assert!(
        matches!(outcome, RunOutcome::Complete { .. }),
        "{outcome:?}"
    );
    let got = summary(t.path());
    assert_eq!(got.0, want.0, "final state");
    assert_eq!(got.1, want.1, "commits per task (no task applied twice)");
    assert_eq!(got.2, want.2, "the project's files");
    // Every recorded commit is in HEAD exactly once, and HEAD holds no task commit that is not
    // recorded.
    let state = state(t.path());
    let log = git(t.path(), &["log", "--no-merges", "--format=%H %s", "HEAD"]);
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
