//! SIGKILL `metash run` at random points 20 times and continue each time: the run always
//! completes, no task's work is applied twice, and the final state equals an uninterrupted run's.
//!
//! The run under test is this test binary re-executed (`kill_child`, ignored unless asked for) so
//! it can be killed like a real `metash run`, with the example agents in-process.

use std::process::{Command, Stdio};
use std::time::Duration;

use metash_orchestrator::{Orchestrator, RunOptions, RunOutcome};
use serde_json::Value;

use super::common::{commits_of, git, statuses, Project, Sim};

const CHILD_ENV: &str = "METASH_ORCH_KILL_CHILD";

fn sim_for(p: &Project) -> Sim {
    let mut sim = Sim::new(p);
    sim.executor_sleep = Duration::from_millis(40);
    sim
}

fn run_to_end(p: &Project) -> RunOutcome {
    let sim = sim_for(p);
    let host = p.host();
    let mut orch = Orchestrator::new(&host, &sim).unwrap();
    orch.run(&RunOptions {
        jobs: Some(2),
        ..RunOptions::default()
    })
    .unwrap()
}

/// The child: one `metash run` on the project named by the environment.
#[test]
#[ignore = "run by sigkill_at_random_points_then_continue"]
fn kill_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else { return };
    let host = metash_host::Host::open(
        std::path::Path::new(&dir),
        metash_host::HostOptions {
            terminal: metash_host::Terminal::Silent,
            ..Default::default()
        },
    )
    .unwrap();
    let mut sim = Sim::new_at(&host);
    sim.executor_sleep = Duration::from_millis(40);
    let mut orch = Orchestrator::new(&host, &sim).unwrap();
    let _ = orch.run(&RunOptions {
        jobs: Some(2),
        ..RunOptions::default()
    });
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

fn summary(p: &Project) -> (Value, Vec<(String, usize)>, String) {
    let state = p.state();
    let counts = statuses(&state)
        .into_iter()
        .map(|(id, _)| {
            let n = commits_of(&state, &id).len();
            (id, n)
        })
        .collect();
    let tree = git(p.path(), &["rev-parse", "HEAD^{tree}"]);
    let keep = serde_json::json!({
        "status": state["status"], "currentPhase": state["currentPhase"], "gapCount": state["gapCount"],
        "statuses": statuses(&state), "halt": state["variables"]["metash"]["halt"]["reason"],
    });
    (keep, counts, tree)
}

#[test]
fn sigkill_at_random_points_then_continue() {
    let reference = Project::new("");
    reference.decide("english");
    let started = std::time::Instant::now();
    assert!(matches!(run_to_end(&reference), RunOutcome::Complete { .. }));
    let reference_ms = started.elapsed().as_millis();
    let want = summary(&reference);

    let p = Project::new("");
    p.decide("english");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("kill test seed {seed}");
    let mut rng = Rng(seed);
    let exe = std::env::current_exe().unwrap();
    let mut interrupted = 0;
    for _ in 0..20 {
        let mut child = Command::new(&exe)
            .args(["--exact", "suite::kill::kill_child", "--ignored", "--test-threads=1"])
            .env(CHILD_ENV, p.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Kill after a random amount of progress (1 to 6 new log events), then a random few ms:
        // the kills land all along the run, not only in the child's startup.
        let events = p.path().join(".meta/events.jsonl");
        let lines = || std::fs::read_to_string(&events).map(|t| t.lines().count()).unwrap_or(0);
        let target = lines() + 1 + rng.next(6) as usize;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while lines() < target
            && child.try_wait().unwrap().is_none()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(rng.next(8)));
        if child.try_wait().unwrap().is_none() {
            interrupted += 1;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
    eprintln!(
        "{interrupted} of 20 kills interrupted a live run (an uninterrupted run takes {reference_ms} ms); log: {} events",
        p.store().log().read_all().unwrap().len()
    );
    assert!(interrupted >= 10, "most kills must land mid-run ({interrupted})");
    assert!(matches!(run_to_end(&p), RunOutcome::Complete { .. }));
    let got = summary(&p);
    assert_eq!(got.0, want.0, "final state");
    assert_eq!(got.1, want.1, "commits per task (no task applied twice)");
    assert_eq!(got.2, want.2, "the project's files");
    // Every recorded commit is in HEAD exactly once, and HEAD holds no task commit that is not
    // recorded.
    let state = p.state();
    let log = git(p.path(), &["log", "--no-merges", "--format=%H %s", "HEAD"]);
    for (id, _) in statuses(&state) {
        let recorded = commits_of(&state, &id);
        let in_head: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(&format!("metash: task {id}:")))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let mut a = recorded.clone();
        a.sort();
        let mut b: Vec<String> = in_head.iter().map(|s| s.to_string()).collect();
        b.sort();
        assert_eq!(a, b, "task {id}");
    }
}
