//! The merge queue with `metash run --workers` (issue 33): two parallel tasks rewrite the one line
//! of `shared.txt`, every executor turn runs on a worker (its own clone of the project, the store
//! on a real PostgreSQL), and so does the resolution turn of the task that lands second: the
//! worker makes the update merge again in its worktree, where its executor finds the conflict as
//! git leaves it (markers in the file, both sides in the index), resolves it, and the coordinator
//! takes the merge commit, re-verifies and lands it. The main checkout never holds a marker nor
//! `MERGE_HEAD` (watched for the whole run).
//!
//! The worker is the real loop (`worker::serve`: leases, heartbeats, a process per turn); each
//! turn's process is this test binary re-executed (`worker_task_child`, ignored unless asked
//! for), which runs the turn with the example agents in-process and writes down, for a
//! resolution turn, where it ran and what the executor found there.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metash_host::{Host, HostOptions, SpawnRequest, Spawner};
use metash_orchestrator::worker::{self, WorkerOptions};
use metash_orchestrator::{Orchestrator, RunOptions};
use metash_protocol::AgentResponse;
use metash_store::Store;
use metash_testkit::postgres::{prerequisites, Postgres};
use serde_json::{json, Value};

use super::common::{git, phase_limit, statuses, Sim, CONTEXT};
use super::queue::{main_problem, Watcher};

/// Marks the arguments of a turn's process (this binary re-executed by the worker).
const CHILD: &str = "metash-queue-worker-child";
/// Where a worker's turns write down their resolution turns, next to the worker's clone.
const SEEN: &str = "resolutions.jsonl";

fn server() -> Option<Postgres> {
    match prerequisites().and_then(|bin| Postgres::start(&bin)) {
        Ok(s) => Some(s),
        Err(why) => {
            metash_testkit::skip("the merge queue on workers", &why);
            None
        }
    }
}

/// The coordinator's project at `dir/coord` (tasks a and b, both rewriting `shared.txt`'s one
/// line) on the store `url` names, and a worker's clone of it at `dir/w1`.
fn set_up(dir: &Path, url: &str) -> (PathBuf, PathBuf) {
    let coord = dir.join("coord");
    std::fs::create_dir_all(coord.join(".meta")).unwrap();
    git(&coord, &["init", "-q"]);
    git(&coord, &["commit", "-q", "--allow-empty", "-m", "empty"]);
    std::fs::write(coord.join("shared.txt"), "base\n").unwrap();
    git(&coord, &["add", "shared.txt"]);
    git(&coord, &["commit", "-q", "-m", "shared"]);
    let config = format!("[store]\nurl = \"{url}\"\nproject = \"queue\"\n[orchestrator]\n");
    std::fs::write(coord.join(".meta/config.toml"), &config).unwrap();
    Store::init(&coord, Some(CONTEXT)).unwrap();
    let w1 = dir.join("w1");
    git(
        dir,
        &["clone", "-q", coord.to_str().unwrap(), w1.to_str().unwrap()],
    );
    std::fs::create_dir_all(w1.join(".meta")).unwrap();
    std::fs::write(w1.join(".meta/config.toml"), &config).unwrap();
    (coord, w1)
}

/// Runs the coordinator (`metash run --workers --jobs 2`, one phase) with the example agents
/// in-process; the outcome and every spawn it made itself.
fn coordinate(coord: &Path) -> (metash_orchestrator::RunOutcome, Vec<super::common::Spawned>) {
    let host = Host::open(coord, HostOptions::silent()).unwrap();
    let mut sim = Sim::new_at(&host);
    sim.same_file = true;
    sim.planner_script.lock().unwrap().push_back(
        r#"{"tasks": [{"id": "a", "title": "A"}, {"id": "b", "title": "B"}]}"#.to_string(),
    );
    let mut orch = Orchestrator::new(&host, &sim).unwrap();
    let outcome = orch
        .run(&RunOptions {
            jobs: Some(2),
            max_phases: Some(1),
            workers: true,
            ..RunOptions::default()
        })
        .unwrap();
    (outcome, sim.spawned())
}

#[test]
fn a_resolution_turn_runs_on_a_worker() {
    let Some(server) = server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (coord, w1) = set_up(dir.path(), &server.url("postgres"));
    let stop = Arc::new(AtomicBool::new(false));
    let serving = {
        let (w1, stop) = (w1.clone(), stop.clone());
        std::thread::spawn(move || {
            let store = Store::open(&w1).unwrap();
            let exe = std::env::current_exe().unwrap();
            let mut command: Vec<std::ffi::OsString> = vec![exe.into()];
            for arg in [
                "--exact",
                "suite::queue_workers::worker_task_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
                "--",
                CHILD,
            ] {
                command.push(arg.into());
            }
            command.push(w1.clone().into());
            command.push("w1".into());
            let opts = WorkerOptions {
                id: "w1".into(),
                slots: 2,
                labels: vec![],
                lease: Duration::from_secs(30),
                idle_exit: None,
                task_command: command,
            };
            worker::serve(&store, &opts, &stop).unwrap()
        })
    };
    let watcher = Watcher::start(&coord);
    let (outcome, spawned) = coordinate(&coord);
    let (problems, _) = watcher.finish();
    stop.store(true, Ordering::SeqCst);
    let report = serving.join().unwrap();

    assert_eq!(outcome, phase_limit(1));
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(main_problem(&coord), None);
    let store = Store::open(&coord).unwrap();
    let state = store.get("").unwrap();
    for (id, status) in statuses(&state) {
        assert_eq!(status, "complete", "task {id}");
        assert_eq!(
            state["variables"]["metash"]["queue"][&id]["state"], "landed",
            "task {id}"
        );
    }
    let shared = git(&coord, &["show", "HEAD:shared.txt"]);
    let mut lines: Vec<&str> = shared.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["a", "b"], "both changes, as resolved: {shared:?}");
    // The refs the worker's bundles were fetched to (two turns, one resolution) are gone.
    assert_eq!(git(&coord, &["for-each-ref", "refs/metash/result/"]), "");
    // No executor ran here: both tasks' turns and the resolution ran on the worker.
    assert!(
        spawned.iter().all(|s| s.agent != "executor"),
        "{:?}",
        spawned.iter().map(|s| &s.agent).collect::<Vec<_>>()
    );
    assert_eq!(report.completed, 3, "two executor turns and one resolution");
    assert_eq!((report.refused, report.lost), (0, 0));
    // The resolution ran in the worker's clone, on the conflict as git leaves it.
    let seen = std::fs::read_to_string(dir.path().join(SEEN)).unwrap_or_default();
    let seen: Vec<Value> = seen
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let turn = &seen[0];
    let wt = PathBuf::from(turn["workdir"].as_str().unwrap());
    assert!(wt.starts_with(&w1), "ran in {}", wt.display());
    assert_eq!(turn["markers"], true, "{turn}");
    assert_eq!(turn["stages"], json!(["1", "2", "3"]), "both sides: {turn}");
    assert_eq!(turn["merging"], true, "{turn}");
    // The coordinator took the worker's resolution and had it verified again.
    let said: Vec<String> = store
        .log()
        .read_all()
        .unwrap()
        .into_iter()
        .filter_map(|r| r.data["message"].as_str().map(str::to_string))
        .collect();
    assert!(
        said.iter()
            .any(|m| m.contains("the executor on w1 resolved the conflict")),
        "{said:#?}"
    );
    assert!(
        said.iter()
            .any(|m| m.contains("re-verifying after the update")),
        "{said:#?}"
    );
    let verified = spawned.iter().filter(|s| s.agent == "verifier").count();
    assert!(verified >= 3, "two verifications and the re-verification");
}

/// One turn's process, as `metash worker-task` (re-executed by the worker loop above; does
/// nothing when run otherwise).
#[test]
#[ignore = "run by a_resolution_turn_runs_on_a_worker's worker"]
fn worker_task_child() {
    let args: Vec<String> = std::env::args().collect();
    let Some(at) = args.iter().position(|a| a == CHILD) else {
        return;
    };
    let [ws, worker, qid, out] = [1, 2, 3, 4].map(|i| args[at + i].clone());
    let host = Host::open(Path::new(&ws), HostOptions::silent()).unwrap();
    let mut sim = Sim::new_at(&host);
    sim.same_file = true;
    let probe = Probe {
        sim,
        seen: Path::new(&ws).parent().unwrap().join(SEEN),
    };
    let result = match worker::run_task_with(&host, &probe, &qid, &worker) {
        Ok(r) => r,
        Err(e) => worker::error_result(&worker, &format!("{e:#}")),
    };
    std::fs::write(out, serde_json::to_vec(&result).unwrap()).unwrap();
}

/// The example agents, and for a resolution turn a note of where it ran and what it found.
struct Probe {
    sim: Sim,
    seen: PathBuf,
}

impl Spawner for Probe {
    fn spawn_agent(&self, req: &SpawnRequest) -> metash_host::Result<AgentResponse> {
        let resolving = req.user_message.contains("## Resolve a merge conflict");
        if let (true, Some(wt)) = (resolving, req.workdir.as_ref()) {
            let text = std::fs::read_to_string(wt.join("shared.txt")).unwrap_or_default();
            let stages: Vec<String> = git(wt, &["ls-files", "-u", "--", "shared.txt"])
                .lines()
                .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
                .collect();
            let merging = git(wt, &["rev-parse", "-q", "--verify", "MERGE_HEAD"]);
            let note = json!({
                "workdir": wt,
                "markers": text.lines().any(|l| l.starts_with("<<<<<<< ")),
                "stages": stages,
                "merging": !merging.is_empty(),
            });
            let mut seen = std::fs::read_to_string(&self.seen).unwrap_or_default();
            seen.push_str(&format!("{note}\n"));
            std::fs::write(&self.seen, seen).unwrap();
        }
        self.sim.spawn_agent(req)
    }
}
