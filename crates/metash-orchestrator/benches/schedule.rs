//! Orchestrator benchmarks (not timed tests; `cargo bench -p metash-orchestrator`):
//!
//! 1. Scheduling overhead of a generated 1,000-task DAG with instant agents: the pure scheduler
//!    and plan validation (target: < 100 ms for the whole DAG), and the full loop per task (state
//!    updates, git worktree, commit, verification and merge) on a smaller DAG, as host time per
//!    task.
//! 2. Makespan of N independent sleeping tasks with `--jobs N` versus the longest task (target:
//!    <= 1.1x the longest plus spawn overhead).
//! 3. The merge queue (issue 33): landing N independent, non-conflicting tasks through the queue
//!    (each merged onto the project's `HEAD` away from its worktree, re-verified in the queue's
//!    worktree, then the checkout fast-forwarded to that merge) versus a bare `git merge --no-ff`
//!    of the same commits, one after another, in a clone of the same run (target: <= 1.5x).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use metash_host::{Host, HostOptions, SpawnRequest, Spawner};
use metash_orchestrator::plan::{self, PlannedTask};
use metash_orchestrator::schedule::Scheduler;
use metash_orchestrator::{Orchestrator, RunOptions};
use metash_protocol::{AgentResponse, AgentStatus, ResponseMetadata};
use serde_json::json;

/// A DAG of `n` tasks, each depending on up to 3 of the 20 tasks before it (deterministic).
fn dag(n: usize) -> Vec<PlannedTask> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    (0..n)
        .map(|i| {
            let mut deps = Vec::new();
            if i > 0 {
                for _ in 0..rnd(4) {
                    let back = 1 + rnd(20.min(i as u64)) as usize;
                    let d = format!("t{:04}", i - back);
                    if !deps.contains(&d) {
                        deps.push(d);
                    }
                }
            }
            PlannedTask {
                id: format!("t{i:04}"),
                title: format!("task {i}"),
                dependencies: deps,
                phase: None,
                expects_change: None,
                labels: Vec::new(),
                paths: vec![],
            }
        })
        .collect()
}

fn pure_scheduling(n: usize) -> (Duration, Duration) {
    let tasks = dag(n);
    let t0 = Instant::now();
    let nodes = plan::validate(&[], &tasks, 1).unwrap();
    let validate = t0.elapsed();
    let t1 = Instant::now();
    let refs: Vec<_> = nodes.iter().collect();
    let mut s = Scheduler::new(&refs, &HashSet::new());
    let mut done = 0;
    while let Some(id) = s.next_ready() {
        s.complete(&id);
        done += 1;
    }
    assert_eq!(done, n);
    (validate, t1.elapsed())
}

/// Instant (or sleeping) in-process agents.
struct Agents {
    plan: String,
    sleep: fn(&str) -> Duration,
}

impl Spawner for Agents {
    fn spawn_agent(&self, req: &SpawnRequest) -> metash_host::Result<AgentResponse> {
        let data = match req.agent_name.as_str() {
            "planner" if req.user_message.contains("Current State: Phase 1 ") => self.plan.clone(),
            "planner" => r#"{"tasks": [], "done": true}"#.to_string(),
            "executor" => {
                let id = req.task_id.clone().unwrap_or_default();
                std::thread::sleep((self.sleep)(&id));
                json!({"summary": "ok", "files": [{"path": format!("{id}.txt"), "content": id}]})
                    .to_string()
            }
            _ => r#"{"pass": true}"#.to_string(),
        };
        Ok(AgentResponse {
            status: AgentStatus::Success,
            data,
            metadata: ResponseMetadata::default(),
        })
    }
}

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .arg("-C")
            .arg(dir.path())
            .args(["-c", "user.name=b", "-c", "user.email=b@localhost"])
            .args(args)
            .status()
            .unwrap()
            .success();
        assert!(ok);
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "empty"]);
    metash_store::Store::init(dir.path(), Some("# bench\n")).unwrap();
    dir
}

fn run(dir: &Path, agents: &Agents, jobs: usize) -> Duration {
    let host = Host::open(dir, HostOptions::silent()).unwrap();
    let mut orch = Orchestrator::new(&host, agents).unwrap();
    let t = Instant::now();
    let outcome = orch
        .run(&RunOptions {
            jobs: Some(jobs),
            ..RunOptions::default()
        })
        .unwrap();
    let took = t.elapsed();
    // A run that stopped early would time less work.
    assert!(
        matches!(outcome, metash_orchestrator::RunOutcome::Complete { .. }),
        "{outcome:?}"
    );
    took
}

/// Start and end of the executing phase, from the log.
fn executing_span(dir: &Path) -> Duration {
    let store = metash_store::Store::open(dir).unwrap();
    let recs = store.log().read_all().unwrap();
    let ts = |r: &metash_protocol::LogRecord| {
        chrono::DateTime::parse_from_rfc3339(&r.ts)
            .unwrap()
            .timestamp_micros()
    };
    let is_status = |r: &metash_protocol::LogRecord, s: &str| {
        if r.kind != "state_update" {
            return false;
        }
        let hit = |u: &serde_json::Value| u["key"] == "status" && u["value"] == s;
        hit(&r.data)
            || r.data["updates"]
                .as_array()
                .is_some_and(|us| us.iter().any(hit))
    };
    let start = recs
        .iter()
        .find(|r| is_status(r, "executing"))
        .map(ts)
        .unwrap();
    let end = recs
        .iter()
        .find(|r| is_status(r, "verifying"))
        .map(ts)
        .unwrap();
    Duration::from_micros((end - start) as u64)
}

/// When a `state_update` key starting with `prefix` (or one of a multi-key update's) was set to
/// something not null, in microseconds, in log order.
fn key_times(dir: &Path, prefix: &str) -> Vec<i64> {
    let store = metash_store::Store::open(dir).unwrap();
    let mut out = Vec::new();
    for r in store.log().read_all().unwrap() {
        if r.kind != "state_update" {
            continue;
        }
        let ts = chrono::DateTime::parse_from_rfc3339(&r.ts)
            .unwrap()
            .timestamp_micros();
        let hit = |u: &serde_json::Value| {
            u["key"].as_str().is_some_and(|k| k.starts_with(prefix)) && !u["value"].is_null()
        };
        if hit(&r.data)
            || r.data["updates"]
                .as_array()
                .is_some_and(|us| us.iter().any(hit))
        {
            out.push(ts);
        }
    }
    out
}

/// 3. The merge queue against bare `git merge`: `(queue per task, git merge per task)`.
fn queue_vs_bare_merge(n: usize) -> (Duration, Duration) {
    let ids: Vec<String> = (0..n).map(|i| format!("q{i}")).collect();
    let plan = json!({"tasks": ids.iter().map(|id| json!({"id": id, "title": id, "dependencies": []})).collect::<Vec<_>>()}).to_string();
    let agents = Agents {
        plan,
        sleep: |_| Duration::ZERO,
    };
    let dir = project();
    run(dir.path(), &agents, n);
    // From the queue's first entry to the last task's merge.
    let start = key_times(dir.path(), "variables.metash.queue.")[0];
    let end = *key_times(dir.path(), "variables.metash.merged.")
        .last()
        .unwrap();
    let queue = Duration::from_micros((end - start) as u64) / n as u32;
    // The same commits merged by hand into a clone at the run's first commit.
    let state = metash_store::Store::open(dir.path())
        .unwrap()
        .state()
        .unwrap();
    let clone = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .arg("-C")
            .arg(clone.path())
            .args(["-c", "user.name=b", "-c", "user.email=b@localhost"])
            .args(args)
            .output()
            .unwrap();
        assert!(ok.status.success(), "{args:?}");
    };
    let src = dir.path().display().to_string();
    git(&["clone", "-q", &src, "."]);
    let first = Command::new("git")
        .args(["-C", &src, "rev-list", "--max-parents=0", "HEAD"])
        .output()
        .unwrap();
    git(&[
        "checkout",
        "-q",
        "-B",
        "bare",
        String::from_utf8_lossy(&first.stdout).trim(),
    ]);
    let t = Instant::now();
    for id in &ids {
        let commit = state.task(id).unwrap().commits.clone().unwrap()[0].clone();
        git(&[
            "merge",
            "-q",
            "--no-ff",
            "-m",
            &format!("merge {id}"),
            &commit,
        ]);
    }
    (queue, t.elapsed() / n as u32)
}

/// Issue 33: the merge queue's share of the full loop's `n` tasks in `dir` (from its first
/// entry to the last task's merge).
fn report_queue_share(dir: &Path, n: usize) {
    let queued = key_times(dir, "variables.metash.queue.");
    let merged = key_times(dir, "variables.metash.merged.");
    if let (Some(first), Some(last)) = (queued.first(), merged.last()) {
        println!(
            "  of which the merge queue (update, re-verify, land): {:.2} ms per task",
            (last - first) as f64 / 1e3 / n as f64
        );
    }
}

/// 3. The merge queue vs bare `git merge` of the same, non-conflicting work.
fn report_queue() {
    let (queue, bare) = queue_vs_bare_merge(8);
    println!(
        "merge queue, 8 independent non-conflicting tasks: {:.2} ms per task to land (merge on \
         HEAD, re-verify in the queue's worktree, fast-forward, bookkeeping) vs bare `git merge \
         --no-ff` {:.2} ms per task = {:.3}x (target <= 1.5x)",
        queue.as_secs_f64() * 1e3,
        bare.as_secs_f64() * 1e3,
        queue.as_secs_f64() / bare.as_secs_f64().max(1e-9)
    );
}

fn main() {
    // 1a. Pure scheduling and validation of 1,000 tasks.
    let (validate, schedule) = pure_scheduling(1000);
    println!(
        "1000-task DAG: validation {:.2} ms, scheduling {:.2} ms; total {:.2} ms = {:.3}x the 100 ms target",
        validate.as_secs_f64() * 1e3,
        schedule.as_secs_f64() * 1e3,
        (validate + schedule).as_secs_f64() * 1e3,
        (validate + schedule).as_secs_f64() / 0.1
    );

    // 1b. The full loop with instant agents: host time per task.
    let n = std::env::var("BENCH_LOOP_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let tasks = dag(n);
    let agents = Agents {
        plan: json!({"tasks": tasks.iter().map(|t| json!({"id": t.id, "title": t.title, "dependencies": t.dependencies})).collect::<Vec<_>>()}).to_string(),
        sleep: |_| Duration::ZERO,
    };
    let dir = project();
    let checks_before = metash_orchestrator::cost::checks_time();
    let total = run(dir.path(), &agents, 1);
    let checks = metash_orchestrator::cost::checks_time() - checks_before;
    let per = total / n as u32;
    println!(
        "full loop, {n}-task DAG, instant agents, --jobs 1: {:.1} ms total, {:.2} ms host time per task \
         (plan + execute + commit + verify + merge + worktree cleanup); a 1000-task DAG would take ~{:.1} s",
        total.as_secs_f64() * 1e3,
        per.as_secs_f64() * 1e3,
        per.as_secs_f64() * 1000.0
    );
    report_queue_share(dir.path(), n);
    // Issue 30: the trust checks (git trust before each git operation, the tree check before
    // each merge, the recorded-branch checks), timed where they run in this same loop.
    let without = total.saturating_sub(checks);
    println!(
        "  of which trust checks: {:.3} ms per task; host time per task with the checks vs \
         without them: {:.3}x (target <= 1.10x)",
        checks.as_secs_f64() * 1e3 / n as f64,
        total.as_secs_f64() / without.as_secs_f64().max(1e-9)
    );

    report_queue();

    // 2. Makespan: N independent sleeping tasks, --jobs N, versus the longest.
    for (count, longest_ms) in [(4usize, 1000u64), (8, 1000)] {
        let ids: Vec<String> = (0..count).map(|i| format!("s{i}")).collect();
        let plan = json!({"tasks": ids.iter().map(|id| json!({"id": id, "title": id, "dependencies": []})).collect::<Vec<_>>()}).to_string();
        // Sleeps from longest/2 to longest; s0 is the longest.
        let agents = Agents {
            plan,
            sleep: |id| {
                let i: u64 = id.trim_start_matches('s').parse().unwrap_or(0);
                Duration::from_millis(1000 - i * 50)
            },
        };
        let dir = project();
        run(dir.path(), &agents, count);
        let span = executing_span(dir.path());
        let longest = Duration::from_millis(longest_ms);
        println!(
            "makespan, {count} independent tasks, --jobs {count}: executing phase {:.0} ms vs longest task {:.0} ms \
             = {:.3}x (overhead {:.0} ms = {:.1} ms per task)",
            span.as_secs_f64() * 1e3,
            longest.as_secs_f64() * 1e3,
            span.as_secs_f64() / longest.as_secs_f64(),
            (span.saturating_sub(longest)).as_secs_f64() * 1e3,
            (span.saturating_sub(longest)).as_secs_f64() * 1e3 / count as f64
        );
    }
}
