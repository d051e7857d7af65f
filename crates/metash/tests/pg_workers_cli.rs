#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Tasks executed by `metash worker`s: the example project on a real PostgreSQL, a coordinator
//! (`metash run --workers`) that plans, verifies and merges, and workers, each in its own clone
//! of the project, that run the executor turns. Code moves by git bundles through the server;
//! each task is completed once, by a worker, and its commit lands in the coordinator's
//! repository. A question a worker's agent asks waits in the database and is answered from the
//! coordinator's machine.
#![cfg(target_os = "linux")]

#[path = "support/pg_project.rs"]
mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use metash_testkit::postgres::{prerequisites, Postgres};
use serde_json::Value;
use support::{clone, metash, ok, project, store_toml, EXAMPLE_GRANTS};

fn worker(ws: &Path, id: &str, store: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_metash"))
        .arg("-C")
        .arg(ws)
        .args(["--json", "worker", "--id", id, "--slots", "2"])
        .args(["--lease-seconds", "5", "--idle-exit-seconds", "4"])
        .args(store)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for each worker to stop when idle; the turns they completed.
fn finish(workers: Vec<Child>) -> u64 {
    let mut completed = 0;
    for w in workers {
        let out = w.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
        assert_eq!(report["refused"], 0);
        completed += report["completed"].as_u64().unwrap();
    }
    completed
}

/// The log's records of `kind`.
fn records(ws: &Path, kind: &str) -> Vec<Value> {
    ok(ws, &["--json", "log", "export"])
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["kind"] == kind)
        .collect()
}

fn server() -> Option<Postgres> {
    match prerequisites().and_then(|bin| Postgres::start(&bin)) {
        Ok(s) => Some(s),
        Err(why) => {
            metash_testkit::skip("workers on postgres", &why);
            None
        }
    }
}

#[test]
fn workers_in_their_own_clones_execute_the_example_project() {
    let Some(server) = server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("postgres");
    let head = store_toml(&url, "greetings");
    let context = metash_testkit::greetings::context();
    let (coord, _) = project(dir.path(), "coordinator", &head, &context, EXAMPLE_GRANTS);
    // Each worker: its own clone, the same config and agents. w2 is told its store on the
    // command line (`--store`), not in its config.
    let (w1, w2) = (dir.path().join("w1"), dir.path().join("w2"));
    clone(&coord, &w1, &head);
    clone(&coord, &w2, "");

    let first = metash(&coord, &["run", "--workers"]);
    assert_eq!(
        first.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let by_flag = ["--store", url.as_str(), "--project", "greetings"];
    let workers = vec![worker(&w1, "w1", &[]), worker(&w2, "w2", &by_flag)];
    ok(&coord, &["run", "--workers", "--answer", "french"]);
    let completed = finish(workers);

    // The project is done, in the coordinator's repository, with the workers' commits.
    assert_eq!(
        std::fs::read_to_string(coord.join("hello.txt"))
            .unwrap()
            .trim(),
        "Bonjour, le monde !"
    );
    let status: Value = serde_json::from_str(&ok(&coord, &["--json", "status"])).unwrap();
    assert_eq!(status["halt"]["reason"], "complete", "{status}");
    let done = records(&coord, "task_completed");
    let queued = records(&coord, "tasks_enqueued").len();
    assert_eq!(done.len(), queued, "every queued turn completed once");
    assert_eq!(done.len() as u64, completed, "as the workers counted");
    assert!(done.len() >= 4, "the four tasks at least ({})", done.len());
    assert!(
        done.iter()
            .all(|r| r["agent"] == "w1" || r["agent"] == "w2"),
        "each by a worker"
    );
    // The refs the workers' bundles were fetched to are gone once merged (they piled up).
    let fetched = std::process::Command::new("git")
        .arg("-C")
        .arg(&coord)
        .args(["for-each-ref", "refs/metash/result/"])
        .output()
        .unwrap();
    assert!(fetched.status.success());
    assert_eq!(String::from_utf8_lossy(&fetched.stdout), "", "left behind");
    let verified = ok(&coord, &["log", "verify"]);
    assert!(verified.contains("hash chain intact"), "{verified}");
    // `metash status` shows the workers, the leases (none left) and the queue.
    let fleet = &status["fleet"];
    let seen: Vec<&str> = fleet["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert_eq!(seen, vec!["w1", "w2"], "{fleet}");
    assert_eq!(fleet["queue"]["done"].as_u64(), Some(completed), "{fleet}");
    assert!(fleet["leases"].as_array().unwrap().is_empty(), "{fleet}");
    let text = ok(&coord, &["status"]);
    assert!(
        text.contains("store: PostgreSQL, project greetings") && text.contains("worker w2 on "),
        "{text}"
    );
}

/// The executor has no `files.write` yet: on the worker, its spawn asks. The question waits in
/// the database (`[host] consent_wait_seconds`), is answered from the coordinator's workspace
/// (`metash consent answer`), and the worker's agent goes on.
#[test]
fn a_question_from_a_workers_agent_is_answered_from_another_machine() {
    let Some(server) = server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let head = format!(
        "{}\n[host]\nconsent_wait_seconds = 60\n",
        store_toml(&server.url("postgres"), "asking")
    );
    let context = metash_testkit::greetings::context();
    let grants = [("executor", "files.read"), ("verifier", "files.read")];
    let (coord, _) = project(dir.path(), "coordinator", &head, &context, &grants);
    let w1 = dir.path().join("w1");
    clone(&coord, &w1, &head);
    let first = metash(&coord, &["run", "--workers"]);
    assert_eq!(first.status.code(), Some(4));
    let workers = vec![worker(&w1, "w1", &[])];
    let run = {
        let coord = coord.clone();
        std::thread::spawn(move || metash(&coord, &["run", "--workers", "--answer", "french"]))
    };
    // Each question appears on the server, and is answered here, by another process (the two
    // tasks of phase 1 may both ask before the first answer is a grant).
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut answered = Vec::new();
    while !run.is_finished() {
        if Instant::now() > deadline {
            for mut w in workers {
                let _ = w.kill();
                let out = w.wait_with_output().unwrap();
                eprintln!("worker: {}", String::from_utf8_lossy(&out.stderr));
            }
            panic!("the run did not end: {}", ok(&coord, &["status"]));
        }
        let pending: Value =
            serde_json::from_str(&ok(&coord, &["--json", "consent", "pending"])).unwrap();
        for ask in pending.as_array().into_iter().flatten() {
            assert_eq!(ask["agent"], "executor", "{ask}");
            assert_eq!(ask["capability"], "files.write", "{ask}");
            let id = ask["id"].as_str().unwrap();
            ok(
                &coord,
                &["consent", "answer", id, "for", "--seconds", "3600"],
            );
            answered.push(id.to_string());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!answered.is_empty(), "the worker's agent asked");
    let out = run.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    finish(workers);
    let status: Value = serde_json::from_str(&ok(&coord, &["--json", "status"])).unwrap();
    assert_eq!(status["halt"]["reason"], "complete", "{status}");
    let grants = records(&coord, "consent_grant");
    assert!(
        grants
            .iter()
            .any(|g| g["data"]["capability"] == "files.write" && g["agent"] == "executor"),
        "the answer is a grant: {grants:?}"
    );
}

/// The executor becomes a native script nobody allowed to run natively.
fn native_executor(ws: &Path) {
    let agent = ws.join(".meta/agents/executor");
    std::fs::write(
        agent.join("manifest.toml"),
        "schema_version = \"0.1\"\nname = \"executor\"\nversion = \"0.1.0\"\n\
         entry = \"executor.sh\"\nsandbox = \"native\"\ncapabilities = []\n",
    )
    .unwrap();
    std::fs::write(agent.join("executor.sh"), "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::set_permissions(
        agent.join("executor.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
}

/// Issue 32: an executor turn refused native consent on a worker halts the coordinator's run at
/// once (`consent_refused`, exit 8, the grant command), as a local executor's refusal does: no
/// attempt is retried, since nothing would change.
#[test]
fn a_consent_refused_on_a_worker_halts_the_run_at_once() {
    let Some(server) = server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("postgres");
    let head = store_toml(&url, "refused");
    let context = metash_testkit::greetings::context();
    let (coord, _) = project(dir.path(), "coordinator", &head, &context, EXAMPLE_GRANTS);
    native_executor(&coord);
    let w1 = dir.path().join("w1");
    clone(&coord, &w1, &head);
    native_executor(&w1);
    assert_eq!(metash(&coord, &["run", "--workers"]).status.code(), Some(4));
    let workers = vec![worker(&w1, "w1", &[])];
    let out = metash(&coord, &["run", "--workers", "--answer", "french"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(
        stderr.contains("metash consent grant executor native"),
        "{stderr}"
    );
    let status: Value = serde_json::from_str(&ok(&coord, &["--json", "status"])).unwrap();
    assert_eq!(status["halt"]["reason"], "consent_refused", "{status}");
    // Each task the worker took was refused once; none was attempted again.
    let attempts: Vec<Value> = records(&coord, "tasks_enqueued");
    let queued: usize = attempts
        .iter()
        .map(|r| r["data"]["tasks"].as_array().map_or(1, Vec::len))
        .sum();
    assert!(queued <= 2, "queued turns: {attempts:?}");
    finish(workers);
}
